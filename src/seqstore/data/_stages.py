"""Mixture schedules' stages (:class:`MixtureSchedule`) and the walk that finds where stages in tokens
start (:class:`StageWalk`); see :mod:`seqstore.data.schedule`, which uses them."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, overload

import numpy as np

from ._lengths import IntArray, check_int

__all__ = ["MixtureSchedule", "StageWalk", "sample_array"]

_UNITS = 1 << 24
#: stages a schedule's repr lists (the first ones and the last)
_REPR_STAGES = 6
_MAX_SAMPLE = 1 << 38  # n * units < 2**63 for every n below this


def _quantise(weights: Mapping[str, Any], names: Sequence[str], where: str) -> IntArray:
    unknown = [k for k in weights if k not in names]
    if unknown:
        raise ValueError(f"{where}: unknown source(s) {unknown}; sources are {list(names)}")
    ws: list[float] = []
    for name in names:
        w = weights.get(name, 0)
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise ValueError(f"{where}: weight of {name!r} must be a number, got {w!r}")
        if not math.isfinite(float(w)) or w < 0:
            raise ValueError(f"{where}: weight of {name!r} must be finite and >= 0, got {w!r}")
        ws.append(float(w))
    total = sum(ws)
    if total <= 0:
        raise ValueError(f"{where}: the weights must not all be zero")
    units = np.array([round(w / total * _UNITS) for w in ws], dtype=np.int64)
    if units.sum() == 0:
        units[int(np.argmax(ws))] = 1
    return units


def sample_array(g: Any) -> IntArray:
    arr = np.asarray(g)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"sample numbers must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _rows(n: IntArray, units: IntArray) -> tuple[IntArray, IntArray]:
    """``units`` per sample ((K,) for every one, or (B, K)) and their suffix sums ``r_k`` (B, K)."""
    u = np.broadcast_to(units, (len(n), units.shape[-1]))
    return u, np.cumsum(u[:, ::-1], axis=1)[:, ::-1]


def _chain_counts(n: IntArray, units: IntArray) -> IntArray:
    """Per source, samples among the first ``n`` of a stage (``n`` int64 (B,); ``units`` the stage's (K,),
    or each sample's stage's (B, K)) -> (B, K). Where ``r_k`` is 0 the sources from ``k`` on have no weight
    and nothing left to take (the source before took every sample): 0."""
    u, rest = _rows(n, units)
    k_all = u.shape[1]
    out = np.zeros((len(n), k_all), dtype=np.int64)
    m = n.astype(np.int64, copy=True)
    for k in range(k_all - 1):
        r = rest[:, k]
        c = np.where(r > 0, (m * u[:, k] + r // 2) // np.maximum(r, 1), 0)
        out[:, k] = c
        m = m - c
    out[:, k_all - 1] = np.where(rest[:, k_all - 1] > 0, m, 0)
    return out


def _chain_assign(n: IntArray, units: IntArray) -> tuple[IntArray, IntArray]:
    """(source, index among that source's samples of the stage) of stage-local samples ``n`` (``units``
    as :func:`_chain_counts`: the stage's, or each sample's stage's)."""
    u, rest = _rows(n, units)
    k_all = u.shape[1]
    src = np.full(len(n), k_all - 1, dtype=np.int64)
    idx = np.zeros(len(n), dtype=np.int64)
    m = n.astype(np.int64, copy=True)
    active = np.ones(len(n), dtype=bool)
    for k in range(k_all - 1):
        if not active.any():
            break
        r, w = rest[:, k], u[:, k]
        d = np.maximum(r, 1)  # (r = 0: no weight from k on; c0 = c1 = 0, nothing taken)
        c0 = np.where(r > 0, (m * w + r // 2) // d, 0)
        c1 = np.where(r > 0, ((m + 1) * w + r // 2) // d, 0)
        hit = active & (c1 > c0)
        src[hit] = k
        idx[hit] = c0[hit]
        m = m - c0
        active &= ~hit
    idx[active] = m[active]
    return src, idx


class MixtureSchedule:
    """Stages ``[(start, {source: weight}), ...]`` over ``names`` (see the module docstring).

    ``start`` is in samples (``unit="tokens"``: in tokens, applied through a :class:`MixtureStream`),
    the first 0, strictly increasing. A source missing from a stage has
    weight 0 there. Weights are normalised per stage and kept to 2**-24. O(stages x sources).
    """

    def __init__(self, stages: Sequence[tuple[int, Mapping[str, float]]] | Mapping[str, float],
                 names: Sequence[str], *, unit: str = "samples") -> None:
        if unit not in ("samples", "tokens"):
            raise ValueError(f"MixtureSchedule: unit must be 'samples' or 'tokens', got {unit!r}")
        self.unit = unit
        self.names = [str(n) for n in names]
        if not self.names:
            raise ValueError("MixtureSchedule needs at least one source")
        if isinstance(stages, Mapping):
            stages = [(0, stages)]
        elif isinstance(stages, (str, bytes)) or not isinstance(stages, Iterable):
            raise ValueError(f"MixtureSchedule: stages must be {{source: weight}} or a list of (start, {{source: "
                             f"weight}}), got {type(stages).__name__} {stages!r:.60}")
        stages = list(stages)
        if not stages:
            raise ValueError("MixtureSchedule needs at least one stage (start, {source: weight})")
        starts: list[int] = []
        units: list[IntArray] = []
        for i, stage in enumerate(stages):
            if not isinstance(stage, (tuple, list)) or len(stage) != 2 or not isinstance(stage[1], Mapping):
                raise ValueError(f"stage {i} must be (start sample, {{source: weight}}), got {stage!r}")
            start = check_int(stage[0], f"stage {i}: start ({unit})", 0)
            if i == 0 and start != 0:
                raise ValueError(f"the first stage must start at {unit[:-1]} 0, got {start}")
            if starts and start <= starts[-1]:
                raise ValueError(f"stage {i}: starts must increase, got {start} after {starts[-1]}")
            starts.append(start)
            units.append(_quantise(stage[1], self.names, f"stage {i}"))
        self.starts = np.array(starts, dtype=np.int64)
        self.units = np.stack(units)
        self._set_bases()

    def _set_bases(self) -> None:
        """Per stage, each source's count at the stage's start (zeros in tokens: only samples count)."""
        self._base = np.zeros_like(self.units)
        if self.unit == "samples" and len(self.starts) > 1:  # (every stage's span at once)
            np.cumsum(_chain_counts(np.diff(self.starts), self.units[:-1]), axis=0, out=self._base[1:])

    @classmethod
    def sampled(cls, weights: Callable[[int], Mapping[str, float]], names: Sequence[str], *, every: int,
                until: int, unit: str = "samples") -> MixtureSchedule:
        """A schedule from a callable ``weights(g) -> {source: weight}`` evaluated at every ``every``-th
        sample (``unit="tokens"``: token) below ``until`` (after ``until`` the last value holds); equal
        neighbours merge into one stage. O(until / every) stages."""
        every = check_int(every, "MixtureSchedule.sampled: every", 1)
        until = check_int(until, "MixtureSchedule.sampled: until", 1)
        stages: list[tuple[int, Mapping[str, float]]] = []
        prev: Any = None
        for g in range(0, until, every):
            w = weights(g)
            if not isinstance(w, Mapping):
                raise ValueError(f"MixtureSchedule.sampled: weights({g}) returned {w!r}, not a mapping")
            key = _quantise(w, [str(n) for n in names], f"weights({g})").tolist()
            if key != prev:
                stages.append((g, dict(w)))
                prev = key
        return cls(stages, names, unit=unit)

    def to_json(self) -> Any:
        """The stages as JSON-able ``[[start, {name: units}], ...]`` (weights as their 2**-24 units);
        a schedule in tokens as ``{"unit": "tokens", "stages": [...]}``."""
        rows = [[int(s), {n: int(u) for n, u in zip(self.names, row) if u}] for s, row in zip(self.starts, self.units)]
        return rows if self.unit == "samples" else {"unit": self.unit, "stages": rows}

    @classmethod
    def from_json(cls, data: Any, names: Sequence[str]) -> MixtureSchedule:
        """The schedule of :meth:`to_json`, with exactly the saved units (quantising them again can move
        one by a unit, as they need not sum to 2**24, and so change which source a sample comes from)."""
        rows, unit = (data["stages"], str(data["unit"])) if isinstance(data, dict) else (data, "samples")
        out = cls([(int(s), dict(w)) for s, w in rows], names, unit=unit)
        out.units = np.array([[int(w.get(n, 0)) for n in out.names] for _, w in rows], dtype=np.int64)
        if (out.units < 0).any() or (out.units > _UNITS).any():
            raise ValueError(f"schedule units must be in [0, 2**24], got {out.units.tolist()}")
        out._set_bases()
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MixtureSchedule) and self.to_json() == other.to_json() and self.names == other.names

    __hash__ = None  # type: ignore[assignment]

    def weights(self, g: int) -> dict[str, float]:
        """The (quantised, normalised) weights in force at sample ``g`` (an integer >= 0)."""
        g = check_int(g, "MixtureSchedule.weights: the sample number", 0)
        row = self.units[int(np.searchsorted(self.starts, g, side="right")) - 1]
        return {n: float(u) / float(row.sum()) for n, u in zip(self.names, row)}

    def _check(self, g: IntArray) -> None:
        if self.unit != "samples":
            raise ValueError("a schedule in tokens assigns samples only through a MixtureStream, which finds the "
                             "sample where each stage starts as it walks the documents' lengths")
        if g.size and (int(g.min()) < 0 or int(g.max()) >= _MAX_SAMPLE):
            raise ValueError(f"sample numbers must be in [0, 2**38), got {int(g.min())}..{int(g.max())}")

    def counts(self, g: Any) -> IntArray:
        """Per source, the samples among ``[0, g)``: (K,) for a scalar ``g``, (B, K) for an array."""
        arr = sample_array(g)
        flat = arr.reshape(-1)
        self._check(flat)
        out = self._in_stages(flat, _chain_counts)
        return out[0] if arr.ndim == 0 else out.reshape(*arr.shape, len(self.names))

    def assign(self, g: Any) -> tuple[IntArray, IntArray]:
        """(source number, samples of that source before it) of samples ``g`` (int64 arrays)."""
        flat = sample_array(g).reshape(-1)
        self._check(flat)
        return self._in_stages(flat, _chain_assign)

    @overload
    def _in_stages(self, g: IntArray, rule: Callable[[IntArray, IntArray], IntArray]) -> IntArray: ...

    @overload
    def _in_stages(self, g: IntArray,
                   rule: Callable[[IntArray, IntArray], tuple[IntArray, IntArray]]) -> tuple[IntArray, IntArray]: ...

    def _in_stages(self, g: IntArray, rule: Callable[[IntArray, IntArray], Any]) -> Any:
        """``rule`` (:func:`_chain_counts` or :func:`_chain_assign`) of samples ``g``, each in its stage, made
        counts of the whole schedule: one vectorised pass whatever the number of stages the samples span
        (a pass per stage cost a Python step per stage in a batch: thousands in a sampled schedule)."""
        stage = np.searchsorted(self.starts, g, side="right") - 1
        if len(self.starts) == 1 or (len(g) and stage.min() == stage.max()):  # (one stage: its row for all)
            i = int(stage[0]) if len(g) else 0
            local, units, base = g - self.starts[i], self.units[i], self._base[i : i + 1]
        else:
            local, units, base = g - self.starts[stage], self.units[stage], self._base[stage]
        out = rule(local, units)
        if isinstance(out, tuple):  # (source, samples of it before): the source's count at the stage start
            src, idx = out
            return src, idx + np.take_along_axis(np.broadcast_to(base, (len(g), base.shape[1])), src[:, None],
                                                 axis=1)[:, 0]
        return base + out

    def __repr__(self) -> str:
        """The first stages and the last (a schedule sampled from a callable has thousands: the whole list made
        every error message that names a mixture megabytes long)."""
        shown = [(int(s), self.weights(int(s))) for s in self.starts[:_REPR_STAGES]]
        if len(self.starts) <= _REPR_STAGES:
            return f"MixtureSchedule({shown})"
        last = int(self.starts[-1])
        return (f"MixtureSchedule({shown[:-1]} ... {len(self.starts) - _REPR_STAGES} more ... "
                f"{[(last, self.weights(last))]}, {len(self.starts)} stages)")


class StageWalk:
    """A schedule in tokens applied from sample ``g0``: the samples where its stages start, as found so
    far (``starts``), and how far the lengths were walked (sample ``f``, ``t`` tokens before it)."""

    def __init__(self, schedule: MixtureSchedule, g0: int, tokens: int, starts: list[int] | None = None,
                 f: int | None = None, t: int | None = None) -> None:
        self.schedule, self.g0 = schedule, int(g0)
        self.f = self.g0 if f is None else int(f)
        self.t = int(tokens) if t is None else int(t)
        self.starts: list[int] = [] if starts is None else [int(s) for s in starts]
        # the effective schedule in samples of ``starts[:_built]``, kept stage by stage (rebuilding it at every
        # stage found cost O(stages) each): starts, units and bases of its ``_kept`` stages in buffers that
        # double, and the sample where the last kept one starts (of equal starts the last wins)
        k = len(schedule.names)
        self._buf = (np.zeros(4, dtype=np.int64), np.zeros((4, k), dtype=np.int64), np.zeros((4, k), dtype=np.int64))
        self._kept = self._built = 0
        self._last = -1
        if starts is None:
            self.resolve()

    def pending(self) -> bool:
        return len(self.starts) < len(self.schedule.starts)

    def next_start(self) -> int | None:
        return int(self.schedule.starts[len(self.starts)]) if self.pending() else None

    def resolve(self) -> None:
        """Every stage whose token start is reached at the walk's point starts at sample ``f``."""
        while self.pending() and int(self.schedule.starts[len(self.starts)]) <= self.t:
            self.starts.append(self.f)

    def effective(self) -> MixtureSchedule:
        """The schedule in samples of the stages found (of equal starts the last wins; the first stage covers
        from 0): the stages found since the last call added, O(1) each."""
        for i in range(self._built, len(self.starts)):
            start, units = self.starts[i], self.schedule.units[i]
            st, un, ba = self._buf
            n = self._kept
            if n and start == self._last:  # (the same sample: this stage replaces the last one)
                un[n - 1] = units
                continue
            if n == len(st):
                st, un, ba = (np.concatenate([b, np.zeros_like(b)]) for b in self._buf)
                self._buf = st, un, ba
            st[n] = 0 if n == 0 else start  # (the first stage covers from sample 0)
            ba[n] = 0 if n == 0 else ba[n - 1] + _chain_counts(st[n : n + 1] - st[n - 1], un[n - 1])[0]
            un[n] = units
            self._kept, self._last = n + 1, start
        self._built = len(self.starts)
        out = MixtureSchedule.__new__(MixtureSchedule)
        out.unit, out.names = "samples", self.schedule.names
        n = self._kept
        # views of the buffers: only the walk's last effective schedule is in use when a stage is replaced in place
        out.starts, out.units, out._base = self._buf[0][:n], self._buf[1][:n], self._buf[2][:n]
        return out

    def to_json(self) -> dict[str, Any]:
        return {"schedule": self.schedule.to_json(), "stage_samples": list(self.starts), "walk": [self.f, self.t]}

    @classmethod
    def from_json(cls, data: Any, names: Sequence[str], g0: int) -> StageWalk:
        sched = MixtureSchedule.from_json(data["schedule"], names)
        f, t = (int(v) for v in data["walk"])
        found = [int(s) for s in data["stage_samples"]]
        # as a walk writes them: the first stage found at the segment's start, then in order up to the point
        # the walk reached (sample f, t >= 0 tokens before it), at most one sample per stage
        if (not 1 <= len(found) <= len(sched.starts) or found[0] != g0 or any(b < a for a, b in zip(found, found[1:]))
                or f < found[-1] or t < 0):
            raise ValueError(f"the walk of the last segment (from sample {g0}) found stages at samples {found[:8]} "
                             f"(of {len(found)}) and reached sample {f} with {t} tokens; expected 1 to "
                             f"{len(sched.starts)} samples, the first {g0}, non-decreasing, up to the sample reached")
        return cls(sched, g0, 0, found, f, t)
