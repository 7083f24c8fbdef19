"""Chunked similarity scans: scores of every record of a store against Q query vectors (docs/logging.md).

:func:`similarity` streams the store through :meth:`Store.iter_matrix` (zero-copy views of the mapped
files for a packed group) and computes one GEMM per chunk, ``block (r, D) @ queries.T (D, Q)``: on CPU
with numpy BLAS in float32 (16-bit blocks widened one chunk at a time, scores written straight into the
output rows); on CUDA with torch (:func:`_scan_cuda`: pinned, double-buffered uploads overlapping the
GEMM, which runs in the stored dtype). Results: all scores ``(N, Q)``, a new store of them (``out``),
the running top ``k`` per query (memory O(k x Q)) and per-field scores. Memory besides the results:
O(chunk_rows x D).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..schema import BFLOAT16, Field, bfloat16_to_float32, flatten_values
from ..store.aside import built_aside
from ..store.reader import Store, open_store
from ..store.write.outputs import OutputExistsError
from ..store.writer import create
from ._tensors import is_torch

__all__ = ["similarity", "SimilarityResult"]

_CHUNK_BYTES = 64 << 20


@dataclass
class SimilarityResult:
    """What :func:`similarity` computed.

    Attributes:
        scores: ``(N, Q)`` float32, ``scores[i, q] = <record i, query q>``; None when not kept.
        per_field: field -> ``(N, Q)`` float32 scores over that field's columns only (``per_field=True``).
        top_rows: ``(Q, min(k, rows))`` int64 record numbers of the k highest scores per query, best
            first (ties: lower record first; NaN scores rank last): fewer than k columns, not padded, when
            fewer than k records are scanned; None without ``topk``.
        top_scores: ``(Q, min(k, rows))`` float32 scores of ``top_rows``.
        out: the store the scores were written to (``out=``): one record per scanned record, field
            ``"score"`` (Q,) and, with ``per_field``, ``"by_field/<field>"`` (Q,), packed as group ``"scores"``.
        columns: each field's column range ``[a, b)`` in the scanned matrix.
        rows: records scanned; seconds: wall time of the scan.
    """

    scores: np.ndarray[Any, Any] | None
    per_field: dict[str, np.ndarray[Any, Any]] | None
    top_rows: np.ndarray[Any, Any] | None
    top_scores: np.ndarray[Any, Any] | None
    out: Store | None
    columns: dict[str, tuple[int, int]]
    rows: int
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


def _queries_matrix(store: Store, queries: Any, fields: Sequence[str] | str | None) -> np.ndarray[Any, Any]:
    """Queries as a float32 ``(Q, D)`` matrix in the column order of ``store.matrix(fields)``.

    Accepts a ``(Q, D)`` array/tensor, a single ``(D,)`` vector, or a (nested) dict field -> ``(Q, *shape)``.
    """
    columns = store.matrix_columns(fields)
    width = max(b for _, b in columns.values())
    if isinstance(queries, Mapping):
        flat = flatten_values(queries, "similarity(): queries")
        unknown = sorted(set(flat) - set(store.schema))
        if unknown:  # (a field the store has but ``fields`` leaves out is not scanned: its queries are ignored)
            raise ValueError(f"similarity(): queries name field(s) {unknown} that {store.url} lacks; its fields are "
                             f"{list(store.schema)}")
        missing = sorted(set(columns) - set(flat))
        if missing:
            raise ValueError(f"similarity(): queries lack field(s) {missing}; the scanned fields are {list(columns)}")
        qn: int | None = None
        parts = {}
        for name, (a, b) in columns.items():
            arr = _as_float32(flat[name])
            single = arr.shape == store.schema[name].shape  # one query, without the Q axis
            arr = arr.reshape(1, -1) if single else arr.reshape(arr.shape[0], -1)
            if arr.shape[1] != b - a:
                raise ValueError(
                    f"similarity(): query field {name!r} has {arr.shape[1]} values per query, expected {b - a}"
                )
            if qn is not None and arr.shape[0] != qn:
                raise ValueError(f"similarity(): query field {name!r} has {arr.shape[0]} queries, others {qn}")
            qn = arr.shape[0]
            parts[name] = arr
        assert qn is not None
        q = np.empty((qn, width), dtype=np.float32)
        for name, (a, b) in columns.items():
            q[:, a:b] = parts[name]
        return q
    given = _as_float32(queries)
    q = given[None] if given.ndim == 1 else given
    if q.ndim != 2 or q.shape[1] != width:
        raise ValueError(f"similarity(): queries must be (Q, {width}) or ({width},) for fields {list(columns)}, "
                         f"got {given.shape}")
    return np.ascontiguousarray(q)


def _row_range(st: Store, start: Any, stop: Any) -> tuple[int, int]:
    """``[start, stop)`` as ints inside the store (a stop past the end is the end); TypeError or IndexError
    naming the store and the call otherwise."""
    n = len(st)
    for name, value in (("start", start), ("stop", stop)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
            raise TypeError(f"similarity(): {st.url}: {name}={value!r} is not an int (records [start, stop) of its "
                            f"{n} records are scanned)")
    start = 0 if start is None else start
    end = n if stop is None else min(int(stop), n)
    if not 0 <= start <= end:
        raise IndexError(f"similarity(): {st.url}: start={start!r}, stop={stop!r} is no range of its {n} records "
                         "(expected 0 <= start <= stop; a stop past the end is the end)")
    return int(start), end


def _as_float32(x: Any) -> np.ndarray[Any, Any]:
    if is_torch(x):
        if x.is_complex():
            raise ValueError(f"similarity(): the queries are {str(x.dtype).removeprefix('torch.')}; scores are real "
                             "dot products (pass the real and imaginary parts as real columns)")
        x = x.detach().float().cpu().numpy()
    try:
        arr = np.asarray(x)
        if arr.dtype.kind not in "cV":  # (complex and bfloat16: below)
            return np.asarray(arr, dtype=np.float32)
    except (ValueError, TypeError) as exc:  # rows of different lengths, strings
        raise ValueError(f"similarity(): the queries are not an array of numbers ({exc})") from None
    if arr.dtype.name == BFLOAT16:
        return bfloat16_to_float32(arr)
    if arr.dtype.kind == "c":  # (a cast to float32 would drop the imaginary parts)
        raise ValueError(f"similarity(): the queries are {arr.dtype}; scores are real dot products (pass the real "
                         "and imaginary parts as real columns)")
    raise ValueError(f"similarity(): the queries are not an array of numbers (dtype {arr.dtype})")


class _TopK:
    """Running top-k per query over chunks of scores ``(r, Q)``: O(k x Q) memory."""

    def __init__(self, k: int, nq: int) -> None:
        self.k = k
        self.scores = np.empty((0, nq), dtype=np.float32)
        self.rows = np.empty((0, nq), dtype=np.int64)

    def add(self, s: np.ndarray[Any, Any], start: int) -> None:
        r = s.shape[0]
        if r > self.k:
            # the k best rows, NaN scores ranked below every number (as the merge ranks them)
            key = np.where(np.isnan(s), -np.inf, s) if np.isnan(s).any() else s
            part = np.argpartition(key, r - self.k, axis=0)[r - self.k :]
            kth = np.take_along_axis(key, part, axis=0).min(axis=0)
            # argpartition keeps any of the rows tied at the k-th score: keep the lowest
            for j in np.flatnonzero(np.count_nonzero(key >= kth, axis=0) > self.k).tolist():
                col = key[:, j]
                rows = np.flatnonzero(col > kth[j])
                tied = np.flatnonzero(col == kth[j])
                tied = tied[np.argsort(np.isnan(s[tied, j]), kind="stable")]  # a NaN (keyed -inf) after a -inf
                part[:, j] = np.concatenate([rows, tied[: self.k - len(rows)]])
            cs = np.take_along_axis(s, part, axis=0)
            cr = part.astype(np.int64) + start
        else:
            cs = np.array(s, dtype=np.float32)
            cr = np.broadcast_to(np.arange(start, start + r, dtype=np.int64)[:, None], s.shape)
        self.merge(cs, cr)

    def merge(self, cs: np.ndarray[Any, Any], cr: np.ndarray[Any, Any]) -> None:
        self.scores, self.rows = self._best(np.concatenate([self.scores, cs]), np.concatenate([self.rows, cr]))

    def _best(self, scores: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]) -> tuple[Any, Any]:
        """The ``k`` best ``scores`` per query and their ``rows``: highest score first, then lowest row."""
        order = np.lexsort((rows, -scores), axis=0)[: self.k]
        return np.take_along_axis(scores, order, axis=0), np.take_along_axis(rows, order, axis=0)

    def result(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        s, r = self._best(self.scores, self.rows)
        return np.ascontiguousarray(r.T), np.ascontiguousarray(s.T)


def similarity(store: Store | str | os.PathLike[str], queries: Any, *, fields: Sequence[str] | str | None = None,
               chunk_rows: int | None = None, device: Any = "cpu", topk: int | None = None,
               out: str | os.PathLike[str] | None = None, per_field: bool = False, keep_scores: bool | None = None,
               start: int = 0, stop: int | None = None) -> SimilarityResult:
    """Dot products of records ``[start, stop)`` of ``store`` with ``queries``, one GEMM per chunk.

    Args:
        store: a :class:`~seqstore.Store` or its path.
        queries: ``(Q, D)`` (numpy or torch) in the column order of ``store.matrix(fields)``, or a
            (nested) dict field -> ``(Q, *shape)``.
        fields: fixed fields and/or packed groups to use (None: all fixed fields, see
            :meth:`Store.matrix`); they must share one real dtype (complex fields or queries: ValueError).
        chunk_rows: rows per GEMM (default: about 64 MiB of stored data).
        device: ``"cpu"`` (numpy BLAS) or ``"cuda[:N]"`` (torch), or a ``torch.device``.
        topk: also return the ``topk`` best records per query.
        out: write the scores into a new store at this path or URL (see :class:`SimilarityResult`).
        per_field: also compute each field's own scores (module-wise); the total is their sum.
        keep_scores: keep all ``(N, Q)`` scores in RAM. Default: True unless ``topk`` or ``out`` is given.
        start, stop: the records scanned, ``0 <= start <= stop`` (a ``stop`` past the end is the end; None:
            the end); row ``i`` of the results is record ``start + i``.

    Cost: ``2 N D Q`` flops; reads each stored byte once; memory O(chunk_rows x (D + Q)) plus
    what is kept (``N x Q x 4`` bytes per kept score matrix).
    """
    st = store if isinstance(store, Store) else open_store(store)
    columns = st.matrix_columns(fields)
    if (dt := st.schema[next(iter(columns))].storage_dtype).kind == "c":
        raise ValueError(f"similarity(): {st.url}: field(s) {list(columns)} are {dt}; scores are real dot "
                         "products of real fields (log the real and imaginary parts as fields of their own)")
    q = _queries_matrix(st, queries, fields)
    nq, width = q.shape
    start, stop = _row_range(st, start, stop)
    n = stop - start
    if keep_scores is None:
        keep_scores = topk is None and out is None
    device = str(device)  # (a torch.device: its name)
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"similarity(): device={device!r}, but torch finds no CUDA device (use device='cpu')")
    elif device != "cpu":
        raise ValueError(f"similarity(): {st.url}: device must be 'cpu' or 'cuda[:N]', got {device!r}")
    if topk is not None and (not isinstance(topk, (int, np.integer)) or isinstance(topk, bool) or topk <= 0):
        raise ValueError(f"similarity(): topk must be a positive int, got {topk!r}")
    if chunk_rows is None:
        chunk_rows = max(256, _CHUNK_BYTES // max(1, width * dt.itemsize))
    integral = isinstance(chunk_rows, (int, np.integer)) and not isinstance(chunk_rows, bool)
    if not integral or chunk_rows <= 0:
        raise (ValueError if integral else TypeError)(
            f"similarity(): {st.url}: chunk_rows must be a positive int, got {chunk_rows!r}")
    scores = np.empty((n, nq), dtype=np.float32) if keep_scores else None
    per = {name: np.empty((n, nq), dtype=np.float32) for name in columns} if per_field and keep_scores else None
    top = _TopK(topk, nq) if topk is not None else None
    with ExitStack() as aside:
        writer = None
        if out is not None:
            spec: dict[str, Any] = {"score": Field("float32", (nq,))}
            if per_field:
                spec.update({f"by_field/{name}": Field("float32", (nq,)) for name in columns})
            of = st.url if st.is_remote else str(Path(st.root).resolve())  # (a remote root is the cache's mirror)
            meta = {"similarity_of": of, "queries": nq, "first_row": start, "columns": columns}
            # built aside, put at out when the scan ends: a failure leaves nothing there
            try:
                target = aside.enter_context(built_aside(out, False, "seqstore-scores-"))
            except OutputExistsError as exc:  # (its words would suggest an overwrite=True similarity lacks)
                exc.args = (f"similarity(): out={exc.path}: already exists; similarity() writes a new store of "
                            "scores (remove it or choose another path)",)
                raise
            writer = create(target, spec, packed={"scores": list(spec)}, metadata=meta)

        def consume(first: int, total: np.ndarray[Any, Any], parts: dict[str, np.ndarray[Any, Any]] | None,
                    do_top: bool) -> None:
            """Take one chunk's scores (rows first..first+r of the scan; ``parts`` per field)."""
            r = total.shape[0]
            if scores is not None and total.base is not scores:
                scores[first : first + r] = total
            if per is not None and parts is not None:
                for name, arr in parts.items():
                    if arr.base is not per[name]:
                        per[name][first : first + r] = arr
            if top is not None and do_top:
                top.add(total, start + first)
            if writer is not None:
                mats = [total] + ([parts[name] for name in columns] if parts is not None else [])
                writer.append_batch({"scores": np.concatenate(mats, axis=1) if len(mats) > 1 else total})

        scan = _Scan(st, q, fields, columns, chunk_rows, start, stop, per_field)
        t0 = time.perf_counter()
        try:
            if device == "cpu":
                _scan_cpu(scan, scores, per, consume)
            else:
                want_full = scores is not None or writer is not None
                _scan_cuda(scan, device, want_full, top, consume)
            if writer is not None:
                writer.close()
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
    out_store = open_store(out) if out is not None else None
    seconds = time.perf_counter() - t0
    top_rows, top_scores = top.result() if top is not None else (None, None)
    return SimilarityResult(scores, per, top_rows, top_scores, out_store, columns, n, seconds)


@dataclass(frozen=True)
class _Scan:
    """What a scan reads: rows ``[start, stop)`` of ``fields`` of ``st`` in chunks of ``chunk_rows``,
    against the queries ``q`` (``columns``: each field's column range; ``per_field``: scores per field too)."""

    st: Store
    q: np.ndarray[Any, Any]
    fields: Sequence[str] | str | None
    columns: dict[str, tuple[int, int]]
    chunk_rows: int
    start: int
    stop: int
    per_field: bool

    def blocks(self) -> Iterator[tuple[int, np.ndarray[Any, Any]]]:
        """``(first row, block)`` per chunk (``Store.iter_matrix``)."""
        return self.st.iter_matrix(self.fields, chunk_rows=self.chunk_rows, start=self.start, stop=self.stop)


def _scan_cpu(scan: _Scan, scores: np.ndarray[Any, Any] | None, per: dict[str, np.ndarray[Any, Any]] | None,
              consume: Any) -> None:
    st, q, columns, start, per_field = scan.st, scan.q, scan.columns, scan.start, scan.per_field
    bf16 = st.schema[next(iter(columns))].dtype == BFLOAT16
    qt = np.ascontiguousarray(q.T)  # (D, Q)
    qt_parts = {name: np.ascontiguousarray(qt[a:b]) for name, (a, b) in columns.items()}
    for first, block in scan.blocks():
        x = bfloat16_to_float32(block) if bf16 else block.astype(np.float32, copy=False)  # (float32: the block)
        rel = first - start
        r = x.shape[0]
        parts: dict[str, np.ndarray[Any, Any]] | None = None
        total = scores[rel : rel + r] if scores is not None else np.empty((r, q.shape[0]), np.float32)
        if per_field:
            parts = {}
            for name, (a, b) in columns.items():
                dst = per[name][rel : rel + r] if per is not None else np.empty((r, q.shape[0]), np.float32)
                np.matmul(x[:, a:b], qt_parts[name], out=dst)
                parts[name] = dst
            total[...] = 0
            for arr in parts.values():
                total += arr
        else:
            np.matmul(x, qt, out=total)  # BLAS sgemm; x may be a strided view of the mapped file
        consume(rel, total, parts, True)


def _cuda_buffer_dtype(stored: np.dtype[Any], bf16: bool) -> np.dtype[Any]:
    """The dtype of the CUDA scan's pinned and device buffers for a stored dtype: bfloat16's bits as int16,
    unsigned integers wider than a byte as float32 (torch < 2.3 has no uint16/32/64 tensors, later ones
    few kernels for them; integers are multiplied in float32 anyway), every other dtype as stored."""
    if bf16:
        return np.dtype(np.int16)
    dt = np.dtype(stored)
    return np.dtype(np.float32) if dt.kind == "u" and dt.itemsize > 1 else dt


def _scan_cuda(scan: _Scan, device: str, want_full: bool, top: _TopK | None, consume: Any) -> None:
    """The CUDA scan. Per chunk k (slot k % 2): wait until slot's previous upload is done, copy the
    mapped rows into the slot's pinned buffer (parallel memcpy), upload on the copy stream, GEMM on
    the compute stream, running top-k on the GPU (no host sync), and, when all scores are wanted, an
    asynchronous download into a pinned result buffer that is consumed one chunk later."""
    import torch

    st, q, columns, chunk_rows = scan.st, scan.q, scan.columns, scan.chunk_rows
    start, per_field = scan.start, scan.per_field
    dev = torch.device(device)
    f0 = st.schema[next(iter(columns))]
    bf16 = f0.dtype == BFLOAT16
    raw_dtype = torch.from_numpy(np.empty(0, dtype=_cuda_buffer_dtype(f0.storage_dtype, bf16))).dtype
    if bf16:
        compute = torch.bfloat16
    else:
        compute = raw_dtype if raw_dtype in (torch.float16, torch.float32, torch.float64) else torch.float32
    nq, width = q.shape
    ncols = nq * (1 + (len(columns) if per_field else 0))
    qt = torch.from_numpy(q).to(dev).to(compute).t().contiguous()  # (D, Q)
    qt_parts = {name: qt[a:b] for name, (a, b) in columns.items()}
    pinned = [torch.empty((chunk_rows, width), dtype=raw_dtype, pin_memory=True) for _ in range(2)]
    on_dev = [torch.empty((chunk_rows, width), dtype=raw_dtype, device=dev) for _ in range(2)]
    results = (
        [torch.empty((chunk_rows, ncols), dtype=torch.float32, pin_memory=True) for _ in range(2)] if want_full else []
    )
    copied = [torch.cuda.Event() for _ in range(2)]  # type: ignore[no-untyped-call]
    used = [torch.cuda.Event() for _ in range(2)]  # type: ignore[no-untyped-call]
    downloaded = [torch.cuda.Event() for _ in range(2)]  # type: ignore[no-untyped-call]
    copy_stream = torch.cuda.Stream(dev)  # type: ignore[no-untyped-call]
    compute_stream = torch.cuda.current_stream(dev)
    threads = max(1, min(8, os.cpu_count() or 1))
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="seqstore-sim-copy")
    names = list(columns)

    def fill(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
        """Parallel page cache -> pinned copy (numpy releases the GIL while copying)."""
        if bf16:  # bfloat16 bits: uint16 on disk, int16 in the torch buffer
            src = src.view(dst.dtype)
        r = src.shape[0]
        step = max(1, -(-r // threads))  # (unsigned integers: widened to the buffer's float32 as they are copied)
        list(pool.map(lambda a: np.copyto(dst[a : a + step], src[a : a + step], casting="unsafe"), range(0, r, step)))

    def finish(slot: int, rel: int, r: int) -> None:
        downloaded[slot].synchronize()
        res = results[slot].numpy()[:r]
        parts = {name: res[:, nq * (j + 1) : nq * (j + 2)] for j, name in enumerate(names)} if per_field else None
        consume(rel, res[:, :nq], parts, False)

    best: tuple[Any, Any] | None = None
    prev: tuple[int, int, int] | None = None
    try:
        for i, (first, block) in enumerate(scan.blocks()):
            slot = i % 2
            r = block.shape[0]
            copied[slot].synchronize()  # the pinned slot's previous upload has finished
            fill(pinned[slot].numpy()[:r], block)
            with torch.cuda.stream(copy_stream):
                copy_stream.wait_event(used[slot])  # the device slot's previous GEMM has finished
                on_dev[slot][:r].copy_(pinned[slot][:r], non_blocking=True)
                copied[slot].record(copy_stream)
            compute_stream.wait_event(copied[slot])
            x = on_dev[slot][:r]
            x = x.view(torch.bfloat16) if bf16 else x.to(compute)
            if per_field:
                parts = [(x[:, a:b] @ qt_parts[name]).float() for name, (a, b) in columns.items()]
                total = torch.stack(parts).sum(0)
            else:
                parts = []
                total = (x @ qt).float()
            if top is not None:
                best = _device_running_topk(best, total, first, top.k)
            if want_full:
                out = torch.cat([total, *parts], dim=1) if parts else total
                results[slot][:r].copy_(out, non_blocking=True)
                downloaded[slot].record(compute_stream)
            used[slot].record(compute_stream)
            if prev is not None and want_full:
                finish(*prev)  # the previous chunk's download overlapped this chunk's copy
            prev = (slot, first - start, r)
        if prev is not None and want_full:
            finish(*prev)
        torch.cuda.synchronize(dev)
        if top is not None and best is not None:
            top.merge(best[0].cpu().numpy(), best[1].cpu().numpy().astype(np.int64))
    finally:
        pool.shutdown(wait=True)


def _device_running_topk(best: tuple[Any, Any] | None, scores: Any, first: int, k: int) -> tuple[Any, Any]:
    """The GPU scan's running top-k after the chunk ``scores`` (``(r, Q)``, records ``first``..): ``(values,
    records)`` of the ``k`` best so far per query, ranked as :class:`_TopK` ranks them. The kept rows go
    before the chunk's (their records are lower, and among equal scores they are in record order), so
    :func:`_device_topk`'s ties, broken by position, are broken by record number."""
    import torch

    v, ix = _device_topk(scores, k)
    ix = ix + first
    if best is not None:
        v, sel = _device_topk(torch.cat([best[0], v]), k)
        ix = torch.gather(torch.cat([best[1], ix]), 0, sel)
    return v, ix


def _device_topk(scores: Any, k: int) -> tuple[Any, Any]:
    """The ``min(k, r)`` best of a ``(r, Q)`` tensor per query and their positions, best first, as
    :class:`_TopK` ranks them: higher score first, NaN below every number (-inf included), then the lower
    position. ``torch.topk`` takes NaN for the largest value and returns any of the rows tied at the k-th
    place, so it only finds the k-th best value here; the rows are chosen from it, with no host sync."""
    import torch

    kk = min(k, scores.shape[0])
    nan = torch.isnan(scores)
    keyed = torch.where(nan, float("-inf"), scores)
    kth = torch.topk(keyed, kk, dim=0).values[-1:]  # (1, Q)
    above, tied = keyed > kth, keyed == kth
    room = kk - above.sum(0, keepdim=True)  # rows to take among those tied at the k-th value
    numbers, nans = tied & ~nan, tied & nan  # (NaN rows tie only with -inf and rank below them)
    take = above | (numbers & (torch.cumsum(numbers, 0, dtype=torch.int32) <= room))
    take |= nans & (torch.cumsum(nans, 0, dtype=torch.int32) <= room - numbers.sum(0, keepdim=True))
    rank = torch.arange(scores.shape[0], 0, -1, dtype=torch.int32, device=scores.device)[:, None]  # lower first
    pos = torch.topk(torch.where(take, rank, 0), kk, dim=0).indices  # the kk taken, in position order
    # best first: stable sorts keep position order among equal keys (numbers before NaN, then by value)
    pos = torch.gather(pos, 0, torch.sort(torch.gather(nan, 0, pos).to(torch.uint8), dim=0, stable=True).indices)
    pos = torch.gather(pos, 0, torch.sort(torch.gather(keyed, 0, pos), dim=0, descending=True, stable=True).indices)
    return torch.gather(scores, 0, pos), pos
