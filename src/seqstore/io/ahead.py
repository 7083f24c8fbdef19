"""Walking a known sequence of requests with the next ones already in flight.

:func:`lookahead` is the loop behind ``Store.iter_batches`` and the datasets' ``iter_batches``: it pulls
items (an epoch's batches) from any iterable lazily and starts each one's reads ``depth`` items ahead of
the consumer (more while ``deeper`` allows: a remote source with few requests pending). Memory: the
window's items and their tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["lookahead", "GROWTH"]

#: items that ``deeper`` may add to the window after each yield, at most
GROWTH = 4

T = TypeVar("T")
S = TypeVar("S")


def lookahead(
    items: Iterable[T],
    depth: int,
    request: Callable[[T], S],
    ready: Callable[[S], object] | None = None,
    deeper: Callable[[int], bool] | None = None,
) -> Iterator[tuple[T, S]]:
    """Yield ``(item, request(item))`` in order; ``request`` runs ``depth`` items before the item is
    yielded (at once for the first ``depth + 1``), ``ready`` just before the item before it is yielded.
    ``deeper(n)``: with ``n`` items ahead, whether to take one more ahead than ``depth``; asked after
    each yield (at most :data:`GROWTH` more items each time, so the first item never waits behind a
    deep window's requests); while it refuses, a window deeper than ``depth`` shrinks back."""
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
        if len(window) <= depth:  # only now: while an item is consumed, ``depth`` more are in flight
            pull()
        if deeper is not None:  # or more while ``deeper`` allows; a window past ``depth`` that it does not
            # allow any more shrinks by one item per item consumed
            for _ in range(GROWTH):
                if not deeper(len(window)):
                    break
                pull()
