"""The RETURNN HDF layout as the importer reads it: :func:`inspect_hdf` checks a file and describes its
streams (:class:`HdfFileInfo`, :class:`HdfStream`); :func:`read_dataset` reads a slice of one of its
datasets, naming the file and dataset when HDF5 fails. The layout is the one RETURNN's
``SimpleHDFWriter`` writes and ``HDFDataset`` reads (see :mod:`seqstore.interop.returnn`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SchemaError
from ..schema import Field
from ._common import SourceFormatError

__all__ = ["inspect_hdf", "HdfFileInfo", "HdfStream", "read_dataset", "decode_tag", "h5py_module", "VALIDATE_BLOCK",
           "recorded_labels", "stream_dims"]

VALIDATE_BLOCK = 1 << 20  # sequences of seqLengths read at once while validating


def h5py_module() -> Any:
    """The ``h5py`` module; ImportError naming the extra to install."""
    try:
        import h5py
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("RETURNN HDF import/export needs h5py: pip install 'seqstore[hdf5]'") from exc
    return h5py


@dataclasses.dataclass(frozen=True)
class HdfStream:
    """One stream of a RETURNN HDF file: ``inputs`` or ``targets/data/<key>``.

    ``key`` is RETURNN's data key (``"data"`` for inputs), ``dataset`` the HDF path, ``column`` its
    column in ``seqLengths``, ``dtype``/``inner`` the row dtype and shape (``()`` for sparse/1-d),
    ``rows`` the first-axis size, ``dim``/``ndim`` RETURNN's ``num_outputs`` entry.
    """

    key: str
    dataset: str
    column: int
    dtype: str
    inner: tuple[int, ...]
    rows: int
    dim: int
    ndim: int

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.inner, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def sparse(self) -> bool:
        return self.ndim <= 1 and np.dtype(self.dtype).kind in "iu"


@dataclasses.dataclass(frozen=True)
class HdfFileInfo:
    """What :func:`inspect_hdf` found in one file: sequence count, streams, labels. O(streams + labels)."""

    path: str
    num_seqs: int
    streams: tuple[HdfStream, ...]
    lengths_2d: bool
    labels: dict[str, list[str]]

    @property
    def total_bytes(self) -> int:
        """Bytes of all stream rows (what the import reads, tags not counted)."""
        return sum(s.rows * s.row_bytes for s in self.streams)


def stream_dims(store: Any, name: str, f: Field) -> tuple[int | None, int, bool]:
    """(dim, ndim, sparse) of the field ``name`` (``f``) of ``store`` for RETURNN: as its
    ``metadata["returnn"]["streams"]`` records them (SchemaError naming the store and the field unless
    whole numbers >= 0), else from ``f``'s shape (dim None: a sparse stream's, to be measured)."""
    meta = store.metadata.get("returnn", {})
    streams = meta.get("streams", {}) if isinstance(meta, dict) else None
    given = streams.get(name) if isinstance(streams, dict) else None
    inner = f.inner_shape
    ndim = 1 + len(inner)
    sparse = ndim == 1 and np.dtype(f.storage_dtype).kind in "iu" and f.dtype != "bfloat16"
    if isinstance(given, dict) and "dim" in given:
        dim, nd = given["dim"], given.get("ndim", ndim)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (dim, nd)):
            raise SchemaError(f"{store.url}: metadata['returnn']['streams'][{name!r}] has dim {dim!r} and ndim "
                              f"{nd!r}; RETURNN's num_outputs need whole numbers >= 0")
        return dim, nd, bool(given.get("sparse", sparse))
    if sparse:
        return None, ndim, True
    return (inner[-1] if inner else 1), ndim, False


def recorded_labels(url: str, meta: Mapping[str, Any], fields: Any) -> dict[str, list[str]]:
    """The labels of the ``fields`` as the store ``url`` records them in ``metadata["returnn"]["labels"]``
    (``meta``: ``metadata["returnn"]``; nothing when it has none); SchemaError naming the store and the
    field unless each is a list of strings."""
    labels = meta.get("labels", {})
    if not isinstance(labels, Mapping):
        return {}
    out: dict[str, list[str]] = {}
    for k, v in labels.items():
        if k not in fields:
            continue
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise SchemaError(f"{url}: metadata['returnn']['labels'][{k!r}] is {v!r}; expected a list of strings "
                              "(the stream's label names)")
        out[k] = list(v)
    return out


def decode_tag(t: Any) -> str:
    """A tag as RETURNN decodes it: bytes -> utf-8, cut at the first NUL."""
    s = t.decode("utf-8", "surrogateescape") if isinstance(t, bytes) else str(t)
    return s.split("\0", 1)[0]


def read_dataset(ds: Any, sl: Any, path: str, name: str) -> Any:
    """``ds[sl]``, turning HDF5 read failures into a SourceFormatError naming file and dataset."""
    try:
        return ds[sl]
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise SourceFormatError(path, name, f"cannot read {sl!r}: {exc}") from exc


def _dataset(fin: Any, name: str, path: str) -> Any:
    """The HDF dataset ``name`` of ``fin``; SourceFormatError naming it when it is a group (or a link to
    nothing), which the importer cannot read as one."""
    obj = fin.get(name)
    if not isinstance(obj, h5py_module().Dataset):
        raise SourceFormatError(path, name, f"is a {type(obj).__name__}, expected an HDF dataset")
    return obj


def _labels(fin: Any, name: str, path: str) -> list[str] | None:
    if name not in fin:
        return None
    raw = read_dataset(_dataset(fin, name, path), (), path, name)
    labels = [decode_tag(x) for x in np.asarray(raw).reshape(-1).tolist()]
    return None if labels in ([], ["dummy-label"]) else labels


def _counts(v: Any) -> bool:
    """Whether the array ``v`` holds numbers that are whole and >= 0 (RETURNN's dims)."""
    if v.dtype.kind in "iu":
        return bool(np.all(v >= 0))
    return v.dtype.kind == "f" and bool(np.all(np.isfinite(v) & (v >= 0) & (v == np.floor(v))))


def _patt_size(fin: Any, path: str) -> int:
    """The file attribute ``inputPattSize`` (the dim of sparse inputs; 1 when absent)."""
    v = np.asarray(fin.attrs.get("inputPattSize", 1))
    if v.shape != () or not _counts(v):
        raise SourceFormatError(path, "inputs", "file attribute 'inputPattSize' (the dim of the sparse inputs) "
                                f"should be a whole number >= 0, got {v.tolist()!r}")
    return int(v)


def _size_attr(fin: Any, key: str, path: str) -> tuple[int, int] | None:
    if "targets/size" not in fin or key not in fin["targets/size"].attrs:
        return None
    v = np.asarray(fin["targets/size"].attrs[key])
    if v.shape not in ((), (2,)) or not _counts(v):
        raise SourceFormatError(path, "targets/size", f"attribute {key!r} should be [dim, ndim] (whole numbers "
                                f">= 0), got {v.tolist()!r}")
    if v.ndim == 0:
        return int(v), len(fin[f"targets/data/{key}"].shape)
    return int(v[0]), int(v[1])


def inspect_hdf(path: str | os.PathLike[str], *, check_lengths: bool = True) -> HdfFileInfo:
    """Check that ``path`` is a well-formed RETURNN HDF file and describe it.

    Reads attributes, dataset shapes and labels, and (``check_lengths``) walks ``seqLengths`` in
    blocks of 2**20 sequences to check that every column is non-negative and sums to the first-axis
    size of its stream. O(block) memory; reads 4-8 bytes per sequence and stream.

    Raises :class:`SourceFormatError` (a :class:`seqstore.FormatError`) naming the file and dataset
    for a missing dataset, a ``seqLengths`` shape that does not fit the streams, lengths that disagree
    with data sizes, or a file that is not HDF5; :class:`seqstore.SchemaError` for string-valued
    streams, which have no numeric field to go to.
    """
    h5py = h5py_module()
    p = str(path)
    try:
        fin = h5py.File(p, "r")
    except (OSError, ValueError) as exc:
        raise SourceFormatError(p, None, f"cannot open as an HDF5 file: {exc}") from exc
    with fin:
        for need in ("seqLengths", "seqTags"):
            if need not in fin:
                raise SourceFormatError(p, need, "missing (a RETURNN HDF file has seqLengths, seqTags, inputs and/or "
                                        "targets/data/<key>)")
        has_inputs = "inputs" in fin
        has_targets = "targets" in fin
        keys: list[str] = []
        if has_targets:
            if not isinstance(fin["targets"], h5py.Group):
                raise SourceFormatError(p, "targets", "is a dataset; a RETURNN HDF file's 'targets' is a group")
            if "targets/data" not in fin:
                raise SourceFormatError(p, "targets/data", "missing although the file has a 'targets' group")
            if not isinstance(fin["targets/data"], h5py.Group):
                raise SourceFormatError(p, "targets/data", "is a dataset; expected a group of one dataset per key")
            size_keys = set(fin["targets/size"].attrs.keys()) if "targets/size" in fin else set()
            keys = sorted(set(fin["targets/data"].keys()) | size_keys)
            for k in keys:
                if k not in fin["targets/data"]:
                    raise SourceFormatError(p, f"targets/data/{k}", "missing (the key is listed in targets/size)")
                _dataset(fin, f"targets/data/{k}", p)
        if not has_inputs and not keys:
            raise SourceFormatError(p, "inputs", "missing, and there are no targets/data/<key> streams either")
        if has_inputs and "data" in keys:
            raise SourceFormatError(p, "targets/data/data", "key 'data' is taken by 'inputs'")

        sl = _dataset(fin, "seqLengths", p)
        lengths_2d = sl.ndim == 2
        tags = _dataset(fin, "seqTags", p)
        if sl.ndim not in (1, 2) or sl.dtype.kind not in "iu":
            raise SourceFormatError(p, "seqLengths", f"expected integer (num_seqs, C), got {sl.dtype} {sl.shape}")
        n = int(sl.shape[0])
        ncols = int(has_inputs) + (len(keys) if has_targets else 1)
        if sl.ndim == 2 and sl.shape[1] != ncols:
            what = (["inputs"] if has_inputs else []) + (keys if has_targets else ["(unused 'classes')"])
            raise SourceFormatError(p, "seqLengths", f"has {sl.shape[1]} columns, expected {ncols} (one per stream: "
                                    f"{', '.join(what)})")
        if tags.shape != (n,):
            raise SourceFormatError(p, "seqTags", f"shape {tags.shape} does not match seqLengths' {n} sequences")

        streams: list[HdfStream] = []
        names = (["inputs"] if has_inputs else []) + [f"targets/data/{k}" for k in keys]
        for col, name in enumerate(names):
            ds = _dataset(fin, name, p)
            if ds.dtype.kind in "OSUV" or h5py.check_string_dtype(ds.dtype) is not None:
                raise SchemaError(f"{p}, dataset {name!r}: holds {ds.dtype} values; seqstore fields are numeric")
            if ds.ndim < 1:
                raise SourceFormatError(p, name, f"expected at least one axis (rows), got shape {ds.shape}")
            inner = tuple(int(s) for s in ds.shape[1:])
            if name == "inputs":
                key = "data"
                dim, ndim = (_patt_size(fin, p), 1) if ds.ndim == 1 else (int(ds.shape[1]), ds.ndim)
            else:
                key = name.rsplit("/", 1)[1]
                given = _size_attr(fin, key, p)
                dim, ndim = given if given else ((1 if ds.ndim == 1 else int(ds.shape[-1])), ds.ndim)
            column = col if sl.ndim == 2 else 0
            streams.append(HdfStream(key, name, column, str(ds.dtype), inner, int(ds.shape[0]), dim, ndim))

        if check_lengths:
            sums = np.zeros(ncols if sl.ndim == 2 else 1, dtype=np.int64)
            most = max(s.rows for s in streams)  # (a length above it could make the sums wrap around)
            for a in range(0, n, VALIDATE_BLOCK):
                rows = slice(a, min(a + VALIDATE_BLOCK, n))
                block = np.asarray(read_dataset(sl, rows, p, "seqLengths"), dtype=np.int64)
                block = block.reshape(len(block), -1)
                if block.size and block.min() < 0:
                    r, c = np.argwhere(block < 0)[0]
                    raise SourceFormatError(p, "seqLengths", f"negative length {block[r, c]} at sequence {a + r}")
                if block.size and block.max() > most:
                    r, c = np.argwhere(block > most)[0]
                    raise SourceFormatError(p, "seqLengths", f"length {block[r, c]} at sequence {a + r} is more than "
                                            f"the {most} rows of the data")
                sums += block.sum(axis=0)
            for s in streams:
                if int(sums[s.column]) != s.rows:
                    raise SourceFormatError(p, s.dataset, f"has {s.rows} rows but seqLengths column {s.column} sums to "
                                            f"{int(sums[s.column])}: lengths and data disagree")

        labels: dict[str, list[str]] = {}
        for k, name in ([("data", "labels")] if has_inputs else []) + [(k, f"targets/labels/{k}") for k in keys]:
            if got := _labels(fin, name, p):
                labels[k] = got
    return HdfFileInfo(p, n, tuple(streams), lengths_2d, labels)
