"""Walking a known sequence of requests with the next ones already in flight.

:func:`lookahead` is the loop behind ``Store.iter_batches`` and the datasets' ``iter_batches``: it
pulls items from any iterable (index arrays of an epoch's batches), calls ``request(item)`` when an
item enters a window of ``depth`` items ahead of the consumer (that is where reads are started), and
``ready(token)`` when the item becomes the next one to be consumed (a second stage, e.g. the value
ranges of ragged records whose offsets the first stage asked for). Memory: ``depth + 1`` items and
their tokens; the iterable is consumed lazily.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["lookahead"]

T = TypeVar("T")
S = TypeVar("S")


def lookahead(
    items: Iterable[T],
    depth: int,
    request: Callable[[T], S],
    ready: Callable[[S], object] | None = None,
) -> Iterator[tuple[T, S]]:
    """Yield ``(item, request(item))`` in order; ``request`` runs ``depth`` items before the item is
    yielded (at once for the first ``depth + 1``), ``ready`` just before the item before it is yielded."""
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ValueError(f"prefetch depth must be an integer >= 0, got {depth!r}")
    it = iter(items)
    window: deque[list[Any]] = deque()  # [item, token, ready called]

    def pull() -> None:
        for item in it:
            window.append([item, request(item), False])
            return

    def next_up() -> None:
        if ready is not None and window and not window[0][2]:
            ready(window[0][1])
            window[0][2] = True

    for _ in range(depth + 1):  # the first item and the ``depth`` after it
        pull()
    while window:
        next_up()
        item, token, _ = window.popleft()
        next_up()
        yield item, token
        pull()  # only now: while an item is consumed, exactly ``depth`` more are in flight
