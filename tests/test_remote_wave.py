"""A wave of range requests (seqstore/io/object_wave.py): small ranges run from callbacks, the rest as
coroutines; both share one request limit and byte budget, answers come back in order, a fast request's
failed first attempt is retried as its coroutine's first, and a failed wave leaves nothing held or queued."""

from __future__ import annotations

import asyncio
import os

import pytest
from support.proxy import FaultProxy
from support.s3 import MotoS3

import seqstore as ss
from seqstore.errors import RemoteError
from seqstore.io.object_wave import Budget
from seqstore.io.objects import ObjectClient

pytestmark = pytest.mark.timeout(120)


def _client(moto_s3: MotoS3, bucket: str, endpoint: str | None = None, **options: object) -> ObjectClient:
    return ObjectClient(f"s3://{bucket}/wave", {**moto_s3.storage_options(endpoint), **options})


def _wave(client: ObjectClient, reqs: list[tuple[str, int, int, None]], on_each: object = None,
          missing_ok: bool = False) -> list[tuple[memoryview, object]]:
    """The reader's kind of wave: no metadata wanted (small ranges take the fast path)."""
    return client.submit(reqs, on_each, missing_ok=missing_ok, with_meta=False).result(timeout=60)


def _held(client: ObjectClient) -> tuple[int, int, int, int]:
    b = client.backend  # type: ignore[attr-defined]
    return b.slots.used, len(b.slots._waiting), b.budget.used, len(b.budget._waiting)


def test_small_and_large_ranges_of_one_wave_come_back_in_order(moto_s3: MotoS3, s3_bucket: str) -> None:
    body = os.urandom(3 << 20)
    moto_s3.put(s3_bucket, "wave/blob.bin", body)
    client = _client(moto_s3, s3_bucket, max_requests=4)
    reqs = [("blob.bin", a, a + 4096, None) for a in range(0, 1 << 20, 40960)]  # small: callbacks
    reqs.insert(5, ("blob.bin", 1 << 20, 3 << 20, None))  # 2 MiB: a coroutine
    reqs.insert(9, ("blob.bin", -100, -1, None))  # a suffix: a coroutine
    seen: list[int] = []
    got = _wave(client, reqs, lambda i, data, meta: seen.append(i))
    assert sorted(seen) == list(range(len(reqs))) and len(got) == len(reqs)
    plain = _wave(client, reqs)  # without a callback the answers carry the bytes
    assert [bytes(d) for d, _ in plain] == [body[a:b] if a >= 0 else body[a:] for _, a, b, _ in reqs]
    b = client.backend  # type: ignore[attr-defined]
    assert b.slots.peak <= 4 and _held(client) == (0, 0, 0, 0)


def test_a_fast_request_that_fails_is_retried_with_its_attempts_counted(moto_s3: MotoS3, s3_bucket: str,
                                                                        s3_proxy: FaultProxy) -> None:
    body = os.urandom(64 << 10)
    moto_s3.put(s3_bucket, "wave/blob.bin", body)
    client = _client(moto_s3, s3_bucket, s3_proxy.url, max_retries=2, timeout=5, connect_timeout=2)
    s3_proxy.fail(2, status=503, path="blob.bin")  # the fast attempt and the first retry fail
    got = _wave(client, [("blob.bin", 8192, 12288, None)])
    assert bytes(got[0][0]) == body[8192:12288]
    assert s3_proxy.count(path="blob.bin") == 3
    s3_proxy.clear_faults()
    s3_proxy.fail(None, status=503, path="blob.bin")  # always: max_retries=2 allows 3 attempts in all
    before = s3_proxy.count(path="blob.bin")
    with pytest.raises(RemoteError) as exc:
        _wave(client, [("blob.bin", 0, 4096, None)])
    assert exc.value.attempts == 3 and s3_proxy.count(path="blob.bin") - before == 3
    assert _held(client) == (0, 0, 0, 0)


def test_a_failed_wave_leaves_nothing_held_or_queued(moto_s3: MotoS3, s3_bucket: str) -> None:
    body = os.urandom(1 << 20)
    moto_s3.put(s3_bucket, "wave/blob.bin", body)
    client = _client(moto_s3, s3_bucket, max_requests=2)
    reqs = [("blob.bin", a, a + 4096, None) for a in range(0, 1 << 20, 8192)]
    reqs.insert(3, ("gone.bin", 0, 4096, None))  # a missing object fails the wave
    with pytest.raises(ss.errors.RemoteNotFound, match="gone.bin"):
        _wave(client, reqs)
    assert _held(client) == (0, 0, 0, 0)
    got = _wave(client, reqs, missing_ok=True)  # the same wave with missing objects allowed
    assert bytes(got[3][0]) == b"" and bytes(got[4][0]) == body[8192 * 3 : 8192 * 3 + 4096]

    def boom(i: int, data: memoryview, meta: object) -> None:
        if i == 7:
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):  # a callback's error fails the wave
        _wave(client, reqs[:3] + reqs[4:], boom)
    assert _held(client) == (0, 0, 0, 0)


def test_queued_callbacks_that_give_their_units_back_do_not_recurse() -> None:
    async def scenario() -> None:
        b = Budget(1)
        assert b.try_take(1)
        calls: list[int] = []

        def give_back(k: int) -> None:  # e.g. a request that finds the byte budget short: its slot goes on
            calls.append(k)
            b.release(1)

        for k in range(5000):  # deeper than the interpreter's recursion limit
            b.take_or_call(1, lambda k=k: give_back(k), owner=None)
        b.release(1)
        assert calls == list(range(5000)) and b.used == 0 and not b._waiting
        owner = object()
        assert b.try_take(1)
        b.take_or_call(1, lambda: calls.append(-1), owner=owner)
        waiter = asyncio.ensure_future(b.take(1))  # behind the callback
        await asyncio.sleep(0)
        b.forget(owner)  # the callback's wave ended: dropped, the waiter behind it stays queued
        assert len(b._waiting) == 1 and -1 not in calls
        b.release(1)
        await waiter
        assert b.used == 1 and -1 not in calls

    asyncio.run(scenario())


def test_a_request_cancelled_outside_the_wave_is_asked_again(moto_s3: MotoS3, s3_bucket: str) -> None:
    body = os.urandom(64 << 10)
    moto_s3.put(s3_bucket, "wave/blob.bin", body)
    client = _client(moto_s3, s3_bucket)
    backend = client.backend  # type: ignore[attr-defined]
    real = backend.obs
    cancelled: list[int] = []

    class CancelsTheFirst:  # obstore, but the future of the first request is cancelled by someone else
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def get_async(self, *args: object, **kwargs: object) -> object:
            fut = real.get_async(*args, **kwargs)
            if not cancelled:
                cancelled.append(1)
                fut.cancel()
            return fut

    backend.obs = CancelsTheFirst()
    try:
        got = _wave(client, [("blob.bin", 0, 4096, None), ("blob.bin", 8192, 12288, None)])
    finally:
        backend.obs = real
    assert cancelled and [bytes(d) for d, _ in got] == [body[:4096], body[8192:12288]]
    assert _held(client) == (0, 0, 0, 0)
