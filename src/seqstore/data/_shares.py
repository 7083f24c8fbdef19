"""Share states of a packing run: fresh ones, their counts added up, and :func:`resplit`, which turns the
states of ``S`` shares into those of ``S'`` with no document token repeated or skipped (elastic resume).

A share state (:class:`~seqstore.data._packplan.Planner`): ``ranges`` (``[epoch, start, stop, offset]``
positions of the document stream, or a run of blocks ``{"blocks": [first, stop], "share": s, "of": S}``,
block ``s`` of ``S`` of each of those epochs), ``next_epoch`` (the first epoch whose block it takes
fresh), ``buffered`` (best_fit's window: the first documents of the ranges) and ``stats``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from ..order import block_bounds

__all__ = ["block", "copy_range", "fresh_shares", "new_stats", "resplit", "sum_stats"]


class _Epochs(Protocol):
    def epoch_len(self, epoch: int) -> int: ...


def new_stats(sources: int) -> dict[str, Any]:
    return {"sequences": 0, "tokens": 0, "documents": 0, "padding": 0, "truncated": 0,
            "source_tokens": [0] * sources, "source_documents": [0] * sources}


def sum_stats(shares: list[dict[str, Any]], sources: int) -> dict[str, Any]:
    """The counts of ``shares`` added up (the per-source ones source by source)."""
    tot = new_stats(sources)
    for st in shares:
        for k, v in st["stats"].items():
            tot[k] = [x + y for x, y in zip(tot[k], v)] if isinstance(v, list) else tot[k] + int(v)
    return tot


def fresh_shares(num_shares: int, epoch: int, sources: int) -> list[dict[str, Any]]:
    """States of ``num_shares`` shares that start at the beginning of ``epoch``."""
    return [{"ranges": [], "next_epoch": int(epoch), "buffered": 0, "stats": new_stats(sources)}
            for _ in range(num_shares)]


def copy_range(r: Any) -> Any:
    """A copy of a state's range ``[epoch, start, stop, offset]`` or run of blocks (integers)."""
    if isinstance(r, dict):
        return {"blocks": [int(r["blocks"][0]), int(r["blocks"][1])], "share": int(r["share"]), "of": int(r["of"])}
    return [int(v) for v in r]


def block(stream: _Epochs, e: int, share: int, num_shares: int) -> tuple[int, int]:
    """Positions ``[a, b)`` of block ``share`` of ``num_shares`` of epoch ``e``."""
    n = stream.epoch_len(e)
    return block_bounds(n, share, num_shares) if n else (0, 0)


def resplit(stream: _Epochs, shares: list[dict[str, Any]], num_shares: int, sources: int) -> list[dict[str, Any]]:
    """The remaining work of ``shares`` (old share ``s`` of ``len(shares)``) re-split over ``num_shares``.

    The work: the old shares' ranges (windows' documents too: their pieces already placed are skipped by
    their offsets) and, for every old share behind the latest ``next_epoch``, its blocks of the epochs up to
    there, one run ``{"blocks": [first, stop], "share": s, "of": S}`` (not one range per epoch: the state
    would grow with how far the shares drifted apart). Sorted by first epoch, it is cut into ``num_shares``
    contiguous parts of near-equal document counts (a run cut inside an epoch: a range there and runs
    either side); afterwards every new share takes its own fresh blocks. O(old shares + new shares)
    entries; O(epochs behind) block bounds computed.
    """
    old = len(shares)
    top = max(int(s["next_epoch"]) for s in shares)
    items: list[Any] = []
    for s, st in enumerate(shares):
        items += [copy_range(r) for r in st["ranges"]]
        if int(st["next_epoch"]) < top:
            items.append({"blocks": [int(st["next_epoch"]), top], "share": s, "of": old})

    def key(r: Any) -> tuple[int, int, int]:
        return (r["blocks"][0], 1, r["share"]) if isinstance(r, dict) else (r[0], 0, r[1])

    def size(r: Any) -> int:
        if not isinstance(r, dict):
            return int(r[2] - r[1])
        return sum(b - a for a, b in (block(stream, e, r["share"], r["of"]) for e in range(*r["blocks"])))

    items.sort(key=key)
    total = sum(size(r) for r in items)
    out = fresh_shares(num_shares, top, sources)
    out[0]["stats"] = sum_stats(shares, sources)  # stats are totals of the run: kept on share 0
    queue = deque(items)
    for t in range(num_shares):
        lo, hi = block_bounds(total, t, num_shares)
        want = hi - lo
        mine = out[t]["ranges"]
        while want > 0 and queue:
            cur = queue.popleft()
            if isinstance(cur, dict):  # whole epochs' blocks while they fit, then the epoch cut as a range
                (first, stop), sh, of = cur["blocks"], cur["share"], cur["of"]
                e = first
                while e < stop and (ab := block(stream, e, sh, of))[1] - ab[0] <= want:
                    want -= ab[1] - ab[0]
                    e += 1
                if e > first:
                    mine.append({"blocks": [first, e], "share": sh, "of": of})
                if e < stop:
                    a, b = block(stream, e, sh, of)
                    if e + 1 < stop:
                        queue.appendleft({"blocks": [e + 1, stop], "share": sh, "of": of})
                    queue.appendleft([e, a, b, 0])
                continue
            e, a, b, o = cur
            take = min(b - a, want)
            mine.append([e, a, a + take, o])
            want -= take
            if a + take < b:
                queue.appendleft([e, a + take, b, 0])
    return out
