"""``MetaDataset``: fields of several stores that describe the same sequences, zipped by id.

The *control* dataset defines the sequences. For every other child a **row map** (int64 per control
record: the child's row with the same id, or -1) is computed once by :func:`seqstore.data._join.join_rows`
and cached as ``.npy`` (default in ``<control store>.cache/``), keyed by a fingerprint of both
manifests; a JSON sidecar, written last, records the missing counts and marks the cache complete.
Reopening maps the files: O(children).

Missing ids: ``missing="error"`` raises naming how many control ids each child lacks and the first
ten; ``missing="drop"`` keeps the control records every child has (their control rows, cached as
another ``.npy``). Ids a child has but the control lacks are ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..io.nodecache import temporary, used
from ..io.tempfiles import remove_stale
from ._cache import CacheError, default_cache_dir, fingerprint, load_npy, store_fingerprint, write_npy
from ._join import join_rows
from ._lengths import IntArray, LengthsView, as_index_array
from .base import Dataset, check_order_params
from .filter import KeptLengths
from .store_dataset import StoreDataset

__all__ = ["MetaDataset"]

_MISSING = ("error", "drop")
_CHUNK = 1 << 18


def _atomic_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically; CacheError naming the file when it cannot be written
    (its temporary file removed)."""
    tmp = None
    try:
        fd, tmp = temporary(path)
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise CacheError(f"cannot write cache file {path} ({exc}); pass cache_dir= to put the cache somewhere "
                             "writable") from exc
        raise


class MetaDataset(Dataset):
    """Zip datasets by id (see the module docstring).

    ``datasets``: name -> :class:`StoreDataset` (stores with ids). ``control``: the name whose records
    define the sequences (default the first). ``fields``: per child, a list of fields to take or a
    mapping ``{field: new_name}`` (default: all of the child's fields under their own names); two
    children providing the same output name is an error. ``length_from``: the child whose lengths
    count (default the control). ``ordering``/``seed``/``partition_epoch``: the meta dataset's order.
    Memory O(children); row maps are memory-mapped.
    """

    def __init__(self, datasets: Mapping[str, StoreDataset], *, control: str | None = None, missing: str = "error",
                 fields: Mapping[str, Sequence[str] | Mapping[str, str]] | None = None, length_from: str | None = None,
                 ordering: Any = "default", seed: int = 0, partition_epoch: int = 1,
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        if not isinstance(datasets, Mapping) or not datasets:
            raise ValueError("MetaDataset needs a non-empty mapping name -> StoreDataset")
        self.datasets = dict(datasets)
        self.names = list(self.datasets)
        for name, d in self.datasets.items():
            if not isinstance(d, StoreDataset):
                raise TypeError(f"MetaDataset: {name!r} is a {type(d).__name__}; children must be StoreDatasets "
                                "(stores with ids)")
            if len(d.store) and not d.store.has_ids:
                raise ValueError(f"MetaDataset: the store of {name!r} ({d.store.root}) has no ids to join by")
        self.control = self.names[0] if control is None else control
        if self.control not in self.datasets:
            raise ValueError(f"control {self.control!r} is not one of the datasets {self.names}")
        if missing not in _MISSING:
            raise ValueError(f"missing must be one of {_MISSING}, got {missing!r}")
        self.missing = missing
        self.length_from = self.control if length_from is None else length_from
        if self.length_from not in self.datasets:
            raise ValueError(f"length_from {self.length_from!r} is not one of the datasets {self.names}")
        self.ordering, self.seed, self.partition_epoch = check_order_params(ordering, seed, partition_epoch)
        self._fields_arg = None if fields is None else dict(fields)
        self.field_map = self._resolve_fields(fields)
        ctrl = self.datasets[self.control]
        self._dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(ctrl.store)
        self.cache_dir = self._dir
        self._rows: dict[str, Any] = {}
        self._kept: Any = None
        self._n = len(ctrl.store)
        self._join()

    # ------------------------------------------------------------------------------------ join

    def _resolve_fields(
        self, fields: Mapping[str, Sequence[str] | Mapping[str, str]] | None
    ) -> dict[str, dict[str, str]]:
        """child -> {child field: output name}; raises on unknown names and clashes."""
        fields = dict(fields or {})
        unknown = [k for k in fields if k not in self.datasets]
        if unknown:
            raise ValueError(f"fields: unknown dataset name(s) {unknown}; datasets are {self.names}")
        out: dict[str, dict[str, str]] = {}
        owner: dict[str, str] = {}
        for name, d in self.datasets.items():
            have = d.field_names
            spec = fields.get(name)
            if spec is None:
                mapping = {f: f for f in have}
            elif isinstance(spec, Mapping):
                mapping = {str(k): str(v) for k, v in spec.items()}
            else:
                mapping = {str(f): str(f) for f in spec}
            bad = [f for f in mapping if f not in have]
            if bad:
                raise KeyError(f"fields[{name!r}]: no field(s) {bad} in {d.store.root}; fields are {have}")
            for src, dst in mapping.items():
                if dst in owner:
                    raise ValueError(f"field name clash: {dst!r} comes from both {owner[dst]!r} and {name!r}; rename "
                                     f"one, e.g. fields={{{name!r}: {{{src!r}: '{name}/{src}'}}}}, or leave it out "
                                     "with a list")
                owner[dst] = name
            out[name] = mapping
        return out

    def _fp(self, name: str) -> Any:
        return store_fingerprint(self.datasets[name].store, ("_ids.npy", "_ids.offsets.npy"))

    def _join(self) -> None:
        ctrl = self.datasets[self.control].store
        others = [n for n in self.names if n != self.control]
        cfp = self._fp(self.control)
        key = fingerprint("meta", cfp, [self._fp(n) for n in others])
        d = self._dir
        sidecar = d / f"meta-{key}.json"
        try:
            info: dict[str, Any] | None = json.loads(sidecar.read_text())
        except (OSError, ValueError):  # not joined yet, or unreadable: join again
            info = None
        paths = {n: d / f"meta-{fingerprint('rows', cfp, self._fp(n))}.rows.npy" for n in others}
        kept_path = d / f"meta-{key}.kept.npy"
        for p in (sidecar, kept_path, *paths.values()):  # (the temporaries of a join killed part way, as
            remove_stale(p)  # large as its files; also where another process joined since)
        # (a node cache may have evicted any of them)
        if info is not None and all(p.exists() for p in paths.values()) and ("kept" not in info or kept_path.exists()):
            for n in others:
                self._rows[n] = load_npy(paths[n])
                used(paths[n])  # (in a node cache: recently used, not the first to evict)
            if "kept" in info:
                used(kept_path)
        else:
            info = {"records": self._n, "missing": {}, "first_missing": {}}
            try:
                d.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CacheError(f"cannot create cache directory {d} ({exc}); pass cache_dir=") from exc
            for n in others:
                stats = {"missing": 0, "first": []}
                target = self.datasets[n].store
                write_npy(paths[n], self._counting(join_rows(ctrl, target, _CHUNK), stats), self._n, np.int64)
                self._rows[n] = load_npy(paths[n])
                info["missing"][n] = stats["missing"]
                info["first_missing"][n] = stats["first"]
            if self.missing == "drop" or any(info["missing"].values()):
                count = sum(len(c) for c in self._kept_chunks())
                write_npy(kept_path, self._kept_chunks(), count, np.int64)
                info["kept"] = count
            _atomic_json(sidecar, info)
        missing = {n: int(c) for n, c in info["missing"].items() if c}
        if missing and self.missing == "error":
            parts = []
            for n, c in missing.items():
                first = [ctrl.id(int(r)) for r in info["first_missing"][n]]
                parts.append(f"{n!r} lacks {c} of the {self._n} ids of {self.control!r} (first: {first})")
            raise KeyError("MetaDataset: missing ids: " + "; ".join(parts) + "; pass missing='drop' to keep the "
                           "intersection")
        if missing:
            self._kept = load_npy(kept_path)

    @staticmethod
    def _counting(chunks: Iterator[IntArray], stats: dict[str, Any]) -> Iterator[IntArray]:
        base = 0
        for c in chunks:
            bad = np.flatnonzero(c < 0)
            stats["missing"] += len(bad)
            if len(stats["first"]) < 10:
                stats["first"].extend((bad[: 10 - len(stats["first"])] + base).tolist())
            base += len(c)
            yield c

    def _kept_chunks(self) -> Iterator[IntArray]:
        for a in range(0, self._n, _CHUNK):
            b = min(a + _CHUNK, self._n)
            ok = np.ones(b - a, dtype=bool)
            for rows in self._rows.values():
                ok &= np.asarray(rows[a:b]) >= 0
            yield np.flatnonzero(ok) + a

    def __reduce__(self) -> tuple[Any, ...]:
        return (partial(MetaDataset, self.datasets, control=self.control, missing=self.missing, fields=self._fields_arg,
                        length_from=self.length_from, ordering=self.ordering, seed=self.seed,
                        partition_epoch=self.partition_epoch, cache_dir=str(self._dir)), ())

    # ------------------------------------------------------------------------------- protocol

    @property
    def num_seqs(self) -> int:
        return self._n if self._kept is None else len(self._kept)

    def cache_key(self) -> Any:
        """The ids of every child (the row maps and kept rows derive from them), whether records were
        dropped, and which child's lengths count, with that child's own key (its length field and the
        CRCs of that field's offsets): two meta datasets over the same ids that take their lengths from
        different children or fields never share a lengths or sort-index cache file."""
        return ["meta", self.control, [[n, self._fp(n)] for n in self.names], self._kept is not None,
                self.length_from, self.datasets[self.length_from].cache_key()]

    def bfloat16_fields(self) -> frozenset[str]:
        """Output names (after ``fields`` renaming) of the bfloat16 fields taken from the children."""
        out: set[str] = set()
        for name, mapping in self.field_map.items():
            bf16 = self.datasets[name].bfloat16_fields()
            out.update(dst for src, dst in mapping.items() if src in bf16)
        return frozenset(out)

    def control_rows(self, indices: Any) -> IntArray:
        """Control-store rows of meta indices (int64)."""
        idx = as_index_array(indices, self.num_seqs)
        return idx if self._kept is None else np.asarray(self._kept[idx], dtype=np.int64)

    def rows(self, name: str, indices: Any) -> IntArray:
        """Rows of child ``name``'s store for meta indices (int64; vectorised through the row map)."""
        r = self.control_rows(indices)
        return r if name == self.control else np.asarray(self._rows[name][r], dtype=np.int64)

    def lengths(self) -> LengthsView:
        """The ``length_from`` child's lengths through the meta index: ``lengths[rows[kept[i]]]``."""
        view = self.datasets[self.length_from].lengths()
        if self.length_from != self.control:
            view = KeptLengths(view, self._rows[self.length_from])
        return view if self._kept is None else KeptLengths(view, self._kept)

    def get(self, i: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.names:
            row = int(self.rows(name, np.array([i]))[0])
            rec = self.datasets[name].store[row]
            for src, dst in self.field_map[name].items():
                out[dst] = rec[src]
        return out

    def prefetch(self, indices: Any) -> None:
        idx = as_index_array(indices, self.num_seqs)
        for name in self.names:
            mapping = self.field_map[name]
            if mapping:
                self.datasets[name].store.prefetch(self.rows(name, idx), fields=list(mapping))

    def get_batch(self, indices: Any, *, pad: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        idx = as_index_array(indices, self.num_seqs)
        for name in self.names:
            mapping = self.field_map[name]
            if not mapping:
                continue
            batch = self.datasets[name].store.get_batch(self.rows(name, idx), fields=list(mapping), pad=pad)
            for src, dst in mapping.items():
                out[dst] = batch[src]
        return out

    def __repr__(self) -> str:
        return f"MetaDataset({self.names}, control={self.control!r}, n={self.num_seqs}, missing={self.missing!r})"
