"""A wave of range requests on the obstore client's event loop, and the limits on what is in flight.

:class:`Budget` counts what a client holds in flight, shared by all its waves: one instance requests
(``max_requests``), another bytes of answers (``max_inflight_bytes``). :class:`Wave` runs the requests of
one ``submit``. A small range inside an object of known size (random reads: a record, its body arriving
with its headers) runs without a coroutine: it starts from a callback when a slot is free and is handed
to ``on_each`` in the request's done-callback, which saves the loop about 10 us of CPU a request (4 KiB
range GETs, 256 in flight: 5,700-6,250 requests/s, as tasks 4,800-5,200). Everything else runs as a task
through the back end's ``fetch_range``: larger ranges, suffixes, requests whose metadata is wanted, and
every retry (the fast path's failure counts as the first attempt's).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

from ..errors import RemoteNotFound
from .object_common import EMPTY_ANSWER, Answer, ClientSettings, ObjectMeta, Request
from .retry import Transient

__all__ = ["Budget", "Wave", "SMALL_BODY"]

#: answers up to this size are taken synchronously once their headers are in (``GetResult.bytes()``:
#: a small body has nearly always arrived with them; awaiting ``bytes_async`` cost ~90 us more CPU)
SMALL_BODY = 64 << 10


class Budget:
    """At most ``limit`` units in flight: a taker waits, in arrival order, until what it takes fits; one
    larger than the limit goes when nothing else is in flight. ``peak``: the most ever held at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        # (units, a future to resolve or a callback to call, the wave a callback is for); a wave of
        # random reads queues hundreds of requests for a slot
        self._waiting: deque[tuple[int, Any, Any]] = deque()
        self._serving = False  # waiters are being served (a callback that gives units back: no recursion)

    def _fits(self, n: int) -> bool:
        return self.used == 0 or self.used + n <= self.limit

    def _take(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def release(self, n: int) -> None:
        self.used -= n
        if self._serving:  # a callback below gave units back: the loop below goes on with them
            return
        self._serving = True
        try:
            while self._waiting and self._fits(self._waiting[0][0]):
                m, waiter, _ = self._waiting.popleft()
                if isinstance(waiter, asyncio.Future):
                    if not waiter.done():
                        self._take(m)
                        waiter.set_result(None)
                else:
                    self._take(m)
                    waiter()
        finally:
            self._serving = False

    def try_take(self, n: int) -> bool:
        """Take ``n`` at once if nobody waits and they fit (no await); give them back with :meth:`release`."""
        if self._waiting or not self._fits(n):
            return False
        self._take(n)
        return True

    def take_or_call(self, n: int, fn: Callable[[], None], owner: Any) -> None:
        """Take ``n`` and call ``fn()``: now if they fit and nobody waits, else when they do, in arrival
        order (``owner``: whose callback it is, for :meth:`forget`)."""
        if self.try_take(n):
            fn()
        else:
            self._waiting.append((n, fn, owner))

    def forget(self, owner: Any) -> None:
        """Drop the callbacks ``owner`` queued (a wave that ended before they were called)."""
        if any(w[2] is owner for w in self._waiting):
            self._waiting = deque(w for w in self._waiting if w[2] is not owner)
            self.release(0)  # those behind them may fit now

    async def take(self, n: int) -> None:
        """Wait, in arrival order, until ``n`` fit, and take them (also on cancellation nothing is left
        taken or queued: no await that a second cancellation could interrupt)."""
        if self.try_take(n):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((n, fut, None))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted just before the cancellation: give it back
                self.release(n)
            else:
                self._waiting = deque(w for w in self._waiting if w[1] is not fut)
                self.release(0)  # those behind it may fit now
            raise


class Backend(Protocol):
    """What a wave needs of the obstore back end (``seqstore.io.object_obstore.ObstoreBackend``)."""

    slots: Budget
    budget: Budget
    c: ClientSettings
    obs: Any
    store: Any

    def if_match(self, tag: str) -> str: ...

    def check_tag(self, result: Any, key: str, tag: str) -> None: ...

    def check_coding(self, result: Any, key: str) -> None: ...

    async def fetch_range(
        self, key: str, start: int, end: int, etag: str | None, with_meta: bool = True,
        prior: BaseException | None = None,
    ) -> Answer: ...


class Wave:
    """The requests of one ``submit`` on ``backend`` (see the module docstring); :meth:`run` returns
    their answers in order, or raises the first error (the rest cancelled). ``on_each(i, data, meta)``:
    called for each answer as it arrives (its place in the result then holds empty bytes);
    ``missing_ok``: a missing object answers ``(empty, None)``."""

    def __init__(
        self, backend: Backend, requests: Sequence[Request], on_each: Any, missing_ok: bool, with_meta: bool
    ) -> None:
        self.b, self.requests, self.on_each = backend, requests, on_each
        self.missing_ok, self.with_meta = missing_ok, with_meta
        self.results: list[Any] = [None] * len(requests)
        self.left = len(requests)
        self.flying: dict[int, Any] = {}  # request -> obstore's future (the fast path)
        self.tasks: set[asyncio.Future[Any]] = set()
        self.done: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()

    async def run(self) -> list[Answer]:
        if not self.requests:
            return []
        slots = self.b.slots
        for i, (_, start, end, _) in enumerate(self.requests):
            if not self.with_meta and 0 <= start < end <= start + SMALL_BODY:
                slots.take_or_call(1, partial(self._go, i), self)
            else:
                self._task(i, None)
            if self.done.done():
                break
        try:
            return await self.done
        except BaseException:
            self._abort()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            raise

    # the fast path ------------------------------------------------------------------------------
    def _go(self, i: int) -> None:
        """Request ``i`` has a slot: start it (or hand it to a task where the byte budget is short)."""
        b = self.b
        slots, budget = b.slots, b.budget
        key, start, end, etag = self.requests[i]
        if self.done.done():  # the wave ended while this waited for its slot
            slots.release(1)
            return
        if not budget.try_take(end - start):  # large answers hold the budget: wait for it as a task
            slots.release(1)
            self._task(i, None)
            return
        opts: dict[str, Any] = {"range": (start, end)}
        if etag and (sent := b.if_match(etag)):
            opts["if_match"] = sent
        try:
            fut = b.obs.get_async(b.store, key, options=opts)
        except Exception as exc:  # noqa: BLE001 - classified by the task, as the first attempt's failure
            budget.release(end - start)
            slots.release(1)
            self._task(i, exc)
            return
        self.flying[i] = fut
        fut.add_done_callback(partial(self._arrived, i))

    def _arrived(self, i: int, fut: asyncio.Future[Any]) -> None:
        b = self.b
        slots, budget = b.slots, b.budget
        self.flying.pop(i, None)
        key, start, end, tag = self.requests[i]
        data: memoryview | None = None
        failed: BaseException | None = None
        try:
            if not fut.cancelled():
                failed = fut.exception()
                if failed is None:
                    got = fut.result()
                    if tag:  # pinned to a version: the answer must be of it
                        b.check_tag(got, key, tag)
                    b.check_coding(got, key)
                    data = memoryview(got.bytes())
        except Exception as exc:  # noqa: BLE001 - e.g. the body cut short: the task retries it
            failed = exc
        finally:
            budget.release(end - start)
            slots.release(1)
        if self.done.done():
            return
        if fut.cancelled():  # not by this wave (it cancels only once it is over): ask again
            self._task(i, None)
            return
        if data is not None and len(data) != end - start:
            failed = Transient(f"range {start}-{end}: body of {len(data)} bytes, expected {end - start}",
                               answered=True)
        if failed is not None or data is None:
            self._task(i, failed)
            return
        b.c.retry.ok()
        self._deliver(i, data, None)

    # answers, tasks, the end ------------------------------------------------------------------------
    def _deliver(self, i: int, data: memoryview, meta: ObjectMeta | None) -> None:
        if self.on_each is not None:
            try:
                self.on_each(i, data, meta)
            except BaseException as exc:  # e.g. the cache write failed: the wave fails with it
                self._fail(exc)
                return
            self._settle(i, (EMPTY_ANSWER, meta))  # the bytes went with the callback
        else:
            self._settle(i, (data, meta))

    def _settle(self, i: int, result: Answer) -> None:
        self.results[i] = result
        self.left -= 1
        if self.left == 0 and not self.done.done():
            self.done.set_result(self.results)

    def _task(self, i: int, prior: BaseException | None) -> None:
        t = asyncio.ensure_future(self._slow(i, prior))
        self.tasks.add(t)
        t.add_done_callback(self._task_done)

    async def _slow(self, i: int, prior: BaseException | None) -> None:
        key, start, end, etag = self.requests[i]
        try:
            data, meta = await self.b.fetch_range(key, start, end, etag, self.with_meta, prior)
        except RemoteNotFound:
            if not self.missing_ok:
                raise
            self._settle(i, (memoryview(b""), None))
            return
        if not self.done.done():
            self._deliver(i, data, meta)

    def _task_done(self, t: asyncio.Future[Any]) -> None:
        self.tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            self._fail(t.exception())  # type: ignore[arg-type]

    def _fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        self._abort()

    def _abort(self) -> None:
        """Cancel what is in flight and queued (the wave failed, or whoever waited for it was cancelled)."""
        self.b.slots.forget(self)
        for fut in list(self.flying.values()):
            fut.cancel()
        for t in list(self.tasks):
            t.cancel()
