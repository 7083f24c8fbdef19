"""One retry policy for every object-store back end (obstore, fsspec, the direct reader, waves).

A :class:`RetryPolicy` belongs to one :class:`~seqstore.io.objects.ObjectClient` and holds its settings and
the failure streak its requests share; each failing operation counts its tries in an :class:`Attempts`.
A transient failure is tried again after a backoff (50 ms doubling up to :data:`MAX_BACKOFF`, jittered)
within ``retry_timeout`` counted from the first failure of the streak (requests queued behind a failing
one give up with it), and at most ``max_retries`` times; an answer ends the streak. An endpoint that has
never answered gets :data:`UNREACHED_S` seconds, then an error naming it unreachable (docs/remote.md,
"Retries, unreachable endpoints and credentials").
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from ..errors import RemoteError

__all__ = ["MAX_BACKOFF", "UNREACHED_S", "Attempts", "RetryPolicy", "Transient", "parse_retry_after"]

#: longest wait between two attempts of a request (seconds, before jitter)
MAX_BACKOFF = 5.0
#: seconds an endpoint that has never answered is retried at most (counted from the first failure)
UNREACHED_S = 3.0

T = TypeVar("T")


class Transient(Exception):
    """A failure worth retrying; ``answered``: the server answered (an HTTP status), so it is reachable;
    ``retry_after``: the seconds its ``Retry-After`` asked the client to wait before the next try (None: none)."""

    def __init__(self, message: str, *, answered: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.answered = answered
        self.retry_after = retry_after


def parse_retry_after(value: str | None) -> float | None:
    """The seconds a ``Retry-After`` header value asks for (delay-seconds or an HTTP date, RFC 9110 10.2.3;
    a date past: 0), or None where there is none or it is neither."""
    value = (value or "").strip()
    if value.isascii() and value.isdigit():
        return float(int(value)) if len(value) < 10 else 1e9
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # (an HTTP date is in GMT)
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


class RetryPolicy:
    """The retry settings of a client for ``endpoint`` (named in the unreachable error) and the failure
    streak its requests share. Pickled without the streak (a worker starts with none), with whether the
    endpoint has answered."""

    def __init__(self, endpoint: str, *, retry_timeout: float = 120.0, max_retries: int | None = None,
                 timeout: float = 30.0, connect_timeout: float = 5.0) -> None:
        self.endpoint = endpoint
        self.retry_timeout, self.max_retries = retry_timeout, max_retries
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.reached = False  # the endpoint has answered at least once
        self.failing_since: float | None = None  # monotonic time the current streak began (None: no streak)
        self.last_failure = 0.0  # monotonic time of the streak's latest failure

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "failing_since": None, "last_failure": 0.0}

    def ok(self) -> None:
        """The endpoint answered a request (it succeeded, or a definite answer such as a missing object or
        a failed precondition): it is reachable and the failure streak, if any, is over."""
        if self.failing_since is not None or not self.reached:
            self.reached, self.failing_since = True, None

    def patience(self) -> float:
        """Seconds a request may take at most, all its attempts and backoffs counted (plus slack)."""
        attempt = self.timeout + self.connect_timeout
        most = self.retry_timeout + 2 * attempt + 30.0  # the first failure, the budget, a last attempt
        if self.max_retries is not None:
            most = min(most, (self.max_retries + 1) * (attempt + MAX_BACKOFF * 1.5) + 30.0)
        return most

    def delay(self, attempt: int, first: float, after: float | None = None) -> float | None:
        """After the ``attempt``-th try of an operation failed (its first failure at monotonic ``first``):
        the seconds to wait before the next, or None when the budget of the streak is spent. ``after``:
        the seconds the server asked for (``Retry-After``): waited for at least, or None (give up now,
        not hammer it) where they go past the budget."""
        now = time.monotonic()  # no lock: threads that race here set times a few microseconds apart
        since = self.failing_since
        if since is not None and now - self.last_failure > self.timeout + self.connect_timeout + 2 * MAX_BACKOFF:
            since = None  # that streak's failures stopped long ago (no request ran since): a new streak
        if since is None:
            self.failing_since = since = first
        self.last_failure = now
        budget = self.retry_timeout if self.reached else min(self.retry_timeout, UNREACHED_S)
        left = min(first, since) + budget - now
        if left <= 0 or (self.max_retries is not None and attempt > self.max_retries) or (after or 0.0) > left:
            return None
        backoff = min(left, min(MAX_BACKOFF, 0.05 * 2.0 ** min(attempt - 1, 16)) * (0.5 + random.random()))
        return backoff if after is None else max(backoff, after)

    def error(self, what: str, attempt: int, first: float, last: BaseException) -> RemoteError:
        """The error of an operation on ``what`` that failed ``attempt`` times since ``first``."""
        spent = time.monotonic() - first
        if not self.reached:
            text = (f"the endpoint {self.endpoint} is unreachable: it has not answered once ({attempt} attempts in "
                    f"{spent:.1f} s; the last: {last}); check the URL, the endpoint option and that the server is "
                    "running")
        else:
            limits = f", max_retries={self.max_retries}" if self.max_retries is not None else ""
            text = (f"failed after {attempt} attempts in {spent:.1f} s ({last}); transient failures are retried for "
                    f"retry_timeout={self.retry_timeout:g} s{limits}")
        err = RemoteError(f"{what}: {text}", url=what, attempts=attempt)
        err.exhausted = True  # type: ignore[attr-defined]  # not an answer: the streak goes on (see run)
        return err

    def run(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, its :class:`Transient` failures tried again within the budget; a
        :class:`~seqstore.errors.RemoteError` it raises is an answer (not retried, the count of tries set)."""
        tries: Attempts | None = None
        while True:
            try:
                out = fn()
            except RemoteError as exc:  # a ConflictError on a later try may refuse our own earlier write
                exc.attempts = max(exc.attempts, tries.n + 1 if tries else 1)
                if not getattr(exc, "exhausted", False):
                    self.ok()
                raise
            except Transient as exc:
                tries = tries or Attempts(self, what)
                time.sleep(tries.failed(exc))
                continue
            self.ok()
            return out


@dataclass(slots=True, eq=False)
class Attempts:
    """The tries of one operation under a :class:`RetryPolicy`: :meth:`failed` after each failure."""

    policy: RetryPolicy
    what: str
    n: int = 0
    first: float = 0.0

    def failed(self, exc: BaseException) -> float:
        """Count a transient failure ``exc``: the seconds to wait before the next try, or raise the
        :class:`~seqstore.errors.RemoteError` that gives up (the budget is spent)."""
        self.n += 1
        if self.n == 1:
            self.first = time.monotonic()
        if getattr(exc, "answered", False):
            self.policy.reached = True  # a server answered (an error status): the endpoint is there
        if (delay := self.policy.delay(self.n, self.first, getattr(exc, "retry_after", None))) is None:
            raise self.policy.error(self.what, self.n, self.first, exc) from None
        return delay
