"""Lhotse cut manifests into a store.

**Import** (:func:`import_lhotse`): one record per cut of a Lhotse ``CutSet`` (an object, or JSONL
manifests such as ``cuts.jsonl.gz`` opened lazily with ``lhotse.load_manifest_lazy``), in the
manifest's order, the cut id as the record id. Fields:

==================  =====================================  =====================================================
field               schema                                 value
==================  =====================================  =====================================================
``duration``        float64 scalar                         ``cut.duration`` (seconds)
``num_frames``      int64 scalar                           ``cut.num_frames``; -1 for a cut without features.
                                                           Written when the first cut has features.
``text``            uint8 ragged (None,)                   the UTF-8 texts of ``cut.supervisions`` (in the
                                                           cut's order; supervisions without text skipped)
                                                           joined by ``text_separator`` (default one space)
``features``        float32/float16 ragged (None, dims)    ``cut.load_features()`` (only with ``features=True``)
``audio``           float32/int16 ragged (None,)           ``cut.load_audio()`` made mono (``channels``)
``sampling_rate``   int32 scalar                           ``cut.sampling_rate`` (with ``audio``)
==================  =====================================  =====================================================

Features and audio are read through Lhotse's own storage readers (``load_features`` / ``load_audio``,
so every storage type Lhotse reads works); without audio, a manifest's ``MonoCut`` lines skip Lhotse's
cut objects (:class:`~._lhotse_manifest.LeanCut`). Cuts are streamed and appended in blocks of at most
``chunk_bytes`` of features and audio (or :data:`CHUNK_RECORDS` cuts), so memory does not grow with the
manifest. The store is written by the importer driver (interop/driver.py), all or nothing. More, with
the command line and workers: docs/interop.md, "Lhotse cut manifests".
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from typing import Any, Unpack

import numpy as np

from ..errors import SchemaError
from ..schema import Field, Schema
from ..store import Store, Writer
from ..store.directio import aligned_empty
from . import driver
from ._common import Progress, SourceFormatError, file_url_path, runs_across
from ._lhotse_manifest import MARK_LINES, LeanCut, forget_streams, manifest_cuts, open_cuts, scan_manifest

__all__ = ["import_lhotse", "open_cuts", "LhotseCutError", "MissingFeaturesError", "MissingRecordingError",
           "METADATA_KEY", "CHUNK_RECORDS", "FEATURE_DTYPES", "AUDIO_DTYPES", "CHANNEL_MODES", "MIN_UNIT_CUTS",
           "PARALLEL_MIN_CUTS", "MARK_LINES"]

#: Key of the import information in the store's metadata.
METADATA_KEY = "lhotse"
#: Cuts per appended block at most (bounds the per-block lists of small cuts).
CHUNK_RECORDS = 1 << 14
FEATURE_DTYPES = ("float32", "float16")
AUDIO_DTYPES = ("float32", "int16")
CHANNEL_MODES = ("error", "first", "mix")
#: Cuts per unit of work of a parallel import at least (about half a second of work each).
MIN_UNIT_CUTS = 2_500
#: Manifests of fewer cuts in all are imported in one process whatever ``workers`` is: a worker takes
#: 1.3-1.7 s to start (it imports Lhotse and torch), which fewer cuts do not pay back on two cores
#: (docs/benchmarks.md, "Lhotse cut manifests import").
PARALLEL_MIN_CUTS = 50_000
#: Modules a parallel import's worker processes start with (imported once, in the forkserver).
PRELOAD = ("seqstore.interop.lhotse", "lhotse")
#: How a CutSet object (not a file) is named in errors.
OBJECT_NAME = "<CutSet>"


class LhotseCutError(SourceFormatError):
    """A cut of a Lhotse manifest cannot be imported as asked; ``path`` is the manifest (``<CutSet>``
    for an object), ``cut_id`` the cut."""

    def __init__(self, path: str, cut_id: str, message: str) -> None:
        super().__init__(path, None, message)
        self.args = (f"{path}, cut {cut_id!r}: {message}",)
        self.cut_id = cut_id
        self._cut_message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.cut_id, self._cut_message))


class MissingFeaturesError(LhotseCutError):
    """``features=True``, but a cut has no features in the manifest."""


class MissingRecordingError(LhotseCutError):
    """``audio=True``, but a cut has no recording in the manifest."""


# ------------------------------------------------------------------------------------------ input


def _sources(cuts: Any, lean: bool) -> list[tuple[str, Any]]:
    """(name for errors, iterable of cuts) for each source; manifest files are checked and opened lazily
    (``lean``: as :func:`manifest_cuts`)."""
    if isinstance(cuts, (str, os.PathLike)):
        return [_manifest_source(cuts, lean)]
    from lhotse import CutSet

    if isinstance(cuts, CutSet):
        return [(OBJECT_NAME, cuts)]
    if isinstance(cuts, Sequence) and cuts and all(isinstance(c, (str, os.PathLike)) for c in cuts):
        return [_manifest_source(c, lean) for c in cuts]
    raise TypeError(f"import_lhotse: expected a CutSet, a manifest path or a list of paths, got {type(cuts).__name__}")


def _manifest_source(path: str | os.PathLike[str], lean: bool) -> tuple[str, Iterator[Any]]:
    """A manifest file checked (:func:`open_cuts`) and its cuts, parsed line by line as Lhotse parses
    them, so that a line that is not a cut is an error naming the manifest and the line. An empty
    manifest has no cuts (skipped; :func:`_first_cut` names the manifests when all are empty)."""
    p = os.fspath(file_url_path(path))
    open_cuts(p, empty_ok=True)
    return p, manifest_cuts(p, 0, None, lean=lean)


# ------------------------------------------------------------------------------------------ plan


def _loaded(cut: Any, where: str, what: str, load: Callable[[], Any]) -> np.ndarray[Any, Any]:
    """``load()`` as an array; Lhotse's failure to read a cut's file (a missing or damaged recording or
    feature file) as a LhotseCutError naming the manifest and the cut."""
    try:
        return np.asarray(load())
    except Exception as exc:  # Lhotse's readers raise their own kinds (AudioLoadingError, OSError, ...)
        raise LhotseCutError(where, cut.id, f"cannot load its {what}: {type(exc).__name__}: {exc}") from exc


class _Plan:
    """What is read from each cut and how it is stored; checks each cut against the first."""

    def __init__(self, first: Any, where: str, *, features: bool, features_dtype: str, audio: bool,
                 audio_dtype: str, channels: str, text_separator: str, audio_by_default: bool = False) -> None:
        self.features, self.audio, self.audio_by_default = features, audio, audio_by_default
        self.features_dtype, self.audio_dtype = np.dtype(features_dtype), np.dtype(audio_dtype)
        self.channels, self.sep = channels, text_separator
        self.frames = features or bool(first.has_features)
        self.dims: int | None = None
        if features:
            self.check_features(first, where)
            dims = first.num_features
            whole = isinstance(dims, (int, np.integer)) or (isinstance(dims, float) and dims.is_integer())
            if isinstance(dims, bool) or not whole:
                raise LhotseCutError(where, first.id, f"its features' num_features should be a whole number, got "
                                     f"{dims!r}")
            self.dims = int(dims)
        if audio:
            self.check_recording(first, where)

    def schema(self) -> Schema:
        spec: dict[str, Field] = {"duration": Field("float64")}
        if self.frames:
            spec["num_frames"] = Field("int64")
        spec["text"] = Field("uint8", (None,))
        if self.features:
            assert self.dims is not None
            spec["features"] = Field(str(self.features_dtype), (None, self.dims))
        if self.audio:
            spec["audio"] = Field(str(self.audio_dtype), (None,))
            spec["sampling_rate"] = Field("int32")
        return Schema(spec)

    def check_features(self, cut: Any, where: str) -> None:
        if not cut.has_features:
            raise MissingFeaturesError(where, cut.id, "has no features, but features=True was asked for; compute "
                                       "them first (cuts.compute_and_store_features(...)) or import without features")

    def check_recording(self, cut: Any, where: str) -> None:
        if not cut.has_recording:
            raise MissingRecordingError(where, cut.id, "has no recording, but audio=True was asked for; attach "
                                        "recordings to the cuts or import without audio")

    def text(self, cut: Any) -> bytes:
        texts = cut.texts if isinstance(cut, LeanCut) else [s.text for s in cut.supervisions if s.text is not None]
        return self.sep.join(texts).encode("utf-8")

    def load_features(self, cut: Any, where: str) -> np.ndarray[Any, Any]:
        self.check_features(cut, where)
        arr = _loaded(cut, where, "features", cut.load_features)
        if arr.ndim != 2 or arr.shape[1] != self.dims:
            raise LhotseCutError(where, cut.id, f"features of shape {list(arr.shape)} do not fit field 'features' "
                                 f"(frames, {self.dims}) from the first cut")
        if arr.dtype.kind != "f":
            raise LhotseCutError(where, cut.id, f"features are {arr.dtype}, expected floating point")
        return arr.astype(self.features_dtype, copy=False)

    def load_audio(self, cut: Any, where: str) -> np.ndarray[Any, Any]:
        self.check_recording(cut, where)
        arr = _loaded(cut, where, "audio", cut.load_audio)
        if arr.ndim == 1:
            mono = arr
        elif arr.ndim == 2 and (arr.shape[0] == 1 or self.channels == "first"):
            mono = arr[0]
        elif arr.ndim == 2 and self.channels == "mix":
            mono = arr.mean(axis=0, dtype=np.float64).astype(np.float32)
        else:
            raise LhotseCutError(where, cut.id, f"audio has {arr.shape[0] if arr.ndim == 2 else arr.shape} channels, "
                                 "expected one; pass channels='first' or channels='mix' to make it mono" + (
                                     " (or audio=False to import without audio, which cuts with recordings and "
                                     "no features keep by default)" if self.audio_by_default else ""))
        if self.audio_dtype == np.int16:
            return np.clip(np.rint(mono.astype(np.float64) * 32768.0), -32768, 32767).astype(np.int16)
        return mono.astype(np.float32, copy=False)


class _Room:
    """Page-aligned buffers, one per field (features, audio), that each cut's array is copied into as
    soon as it is loaded, reused from block to block (the writer is done with a batch's arrays when
    ``append_batch`` returns). Copying each array while it is fresh in the cache, rather than joining a
    block of arrays at the end, saves a pass over memory and keeps the heap from growing and shrinking
    by a block each time. Buffers start a quarter above ``chunk_bytes`` and grow by half when needed."""

    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self.buffers: dict[str, np.ndarray[Any, Any]] = {}

    def put(self, name: str, at: int, arr: np.ndarray[Any, Any]) -> None:
        """Copy ``arr`` (rows of the field's inner shape and dtype) into field ``name``'s buffer at row ``at``."""
        n = len(arr)
        buf = self.buffers.get(name)
        if buf is None or buf.shape[0] < at + n or buf.dtype != arr.dtype:
            row = max(arr.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64)), 1)
            rows = max(at + n, (self.chunk_bytes + self.chunk_bytes // 4) // row + 1)
            if buf is not None and buf.dtype == arr.dtype:
                rows = max(rows, buf.shape[0] + buf.shape[0] // 2)
            grown = aligned_empty((rows, *arr.shape[1:]), arr.dtype)
            if buf is not None and at:
                grown[:at] = buf[:at]
            self.buffers[name] = buf = grown
        buf[at : at + n] = arr

    def view(self, name: str, rows: int, inner: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
        """The first ``rows`` rows of field ``name``'s buffer (an empty array when nothing was put)."""
        buf = self.buffers.get(name)
        if buf is None:
            return np.empty((0, *inner), dtype)
        return buf[:rows]


class _Block:
    """The columns of the cuts read since the last append; features and audio are in ``room``."""

    def __init__(self, room: _Room) -> None:
        self.room = room
        self.ids: list[str] = []
        self.durations: list[float] = []
        self.frames: list[int] = []
        self.texts: list[bytes] = []
        self.lens: dict[str, list[int]] = {"features": [], "audio": []}  # each cut's rows, per field in room
        self.rows = {"features": 0, "audio": 0}
        self.rates: list[int] = []
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, name: str, arr: np.ndarray[Any, Any]) -> None:
        """A cut's array of field ``name`` (features or audio), copied into the room after the others."""
        self.room.put(name, self.rows[name], arr)
        self.rows[name] += len(arr)
        self.lens[name].append(len(arr))
        self.nbytes += arr.nbytes

    def _ragged(self, name: str, inner: tuple[int, ...], dtype: Any) -> tuple[Any, Any]:
        return self.room.view(name, self.rows[name], inner, dtype), np.asarray(self.lens[name], dtype=np.int64)

    def append_to(self, writer: Writer, plan: _Plan) -> None:
        """Append the block's cuts to ``writer``."""
        n = len(self.ids)
        batch: dict[str, Any] = {"duration": np.asarray(self.durations, dtype=np.float64)}
        if plan.frames:
            batch["num_frames"] = np.asarray(self.frames, dtype=np.int64)
        lens = np.fromiter((len(t) for t in self.texts), dtype=np.int64, count=n)
        batch["text"] = (np.frombuffer(b"".join(self.texts), dtype=np.uint8), lens)
        if plan.features:
            assert plan.dims is not None
            batch["features"] = self._ragged("features", (plan.dims,), plan.features_dtype)
        if plan.audio:
            batch["audio"] = self._ragged("audio", (), plan.audio_dtype)
            batch["sampling_rate"] = np.asarray(self.rates, dtype=np.int32)
        writer.append_batch(batch, ids=self.ids)


def _write(writer: Writer, sources: Iterable[tuple[str, Iterable[Any]]], plan: _Plan, chunk_bytes: int,
           progress: Progress | None) -> None:
    """Stream every cut of ``sources`` into ``writer`` in blocks of about ``chunk_bytes``."""
    room = _Room(chunk_bytes)
    block = _Block(room)

    def flush() -> None:
        nonlocal block
        if len(block):
            block.append_to(writer, plan)
            if progress is not None:
                progress(len(block))
            block = _Block(room)

    for where, cuts in sources:
        for cut in cuts:
            if not isinstance(getattr(cut, "id", None), str):
                raise SourceFormatError(where, None, f"expected Lhotse cuts, got {type(cut).__name__}")
            try:
                duration, text = float(cut.duration), plan.text(cut)
            except (TypeError, ValueError) as exc:  # e.g. a duration of "abc" or None, a text of 5
                raise LhotseCutError(where, cut.id, f"cannot read its duration and texts: {exc}") from exc
            block.ids.append(cut.id)
            block.durations.append(duration)
            block.texts.append(text)
            block.nbytes += len(text) + 16
            if plan.frames:
                block.frames.append(int(cut.num_frames) if cut.has_features else -1)
            if plan.features:
                block.add("features", plan.load_features(cut, where))
            if plan.audio:
                block.add("audio", plan.load_audio(cut, where))
                block.rates.append(int(cut.sampling_rate))
            if block.nbytes >= chunk_bytes or len(block) >= CHUNK_RECORDS:
                flush()
    flush()


def _first_cut(sources: list[tuple[str, Any]]) -> tuple[str, Any, list[tuple[str, Iterable[Any]]]]:
    """The first cut (and its source's name) and the sources again as iterables that start with it
    (each source is iterated once)."""
    for k, (where, cs) in enumerate(sources):
        it: Iterator[Any] = iter(cs)
        cut = next(it, None)
        if cut is not None:
            return where, cut, [(where, chain([cut], it)), *sources[k + 1 :]]
    raise SourceFormatError(sources[0][0] if len(sources) == 1 else ", ".join(w for w, _ in sources), None,
                            "holds no cuts")


# ------------------------------------------------------------------------------------------ workers


def _units(counts: Sequence[int], workers: int) -> list[list[tuple[int, int, int]]]:
    """The manifests' lines, in order, cut into runs of about ``total / (8 x workers)`` cuts (at least
    :data:`MIN_UNIT_CUTS`; one run for fewer than :data:`PARALLEL_MIN_CUTS`), each a list of (manifest,
    first line, end line) and one part of a parallel import; small runs keep the processes equally busy
    to the end. Consecutive small manifests share a run; a short tail joins the run before it."""
    total = sum(counts)
    if total < max(PARALLEL_MIN_CUTS, 2 * MIN_UNIT_CUTS):
        return [[(k, 0, n) for k, n in enumerate(counts) if n]]
    budget = max(MIN_UNIT_CUTS, -(-total // (8 * workers)))
    units = runs_across(counts, budget)
    if len(units) > 1 and sum(b - a for _, a, b in units[-1]) < budget // 2:
        units[-2].extend(units.pop())
    return units


@dataclasses.dataclass(frozen=True)
class _StreamJob:
    """Cuts streamed in this process: ``write`` takes the sources as (name, iterable of cuts) pairs."""

    plan: _Plan
    chunk_bytes: int

    def write(self, writer: Writer, streams: Iterable[tuple[str, Iterable[Any]]], progress: Progress | None) -> None:
        _write(writer, streams, self.plan, self.chunk_bytes, progress)


@dataclasses.dataclass(frozen=True)
class _CutsJob:
    """What a worker of a parallel import needs (picklable): the manifests, the plan, the block size."""

    plan: _Plan
    chunk_bytes: int
    manifests: list[str]
    marks: list[np.ndarray[Any, Any] | None]  # each manifest's line offsets (:func:`scan_manifest`)

    def describe(self, segments: Sequence[tuple[int, int, int]]) -> str:
        return ", ".join(f"{self.manifests[k]} cuts {a}..{b - 1}" for k, a, b in segments)

    def write(self, writer: Writer, segments: Sequence[tuple[int, int, int]], progress: Progress | None) -> None:
        """Append the cuts of ``segments`` ((manifest, first line, end line), in order)."""
        runs = [(self.manifests[k], manifest_cuts(self.manifests[k], a, b, self.marks[k], lean=not self.plan.audio))
                for k, a, b in segments]
        _write(writer, runs, self.plan, self.chunk_bytes, progress)


def import_lhotse(
    cuts: Any,
    out: str | os.PathLike[str],
    *,
    features: bool = False,
    features_dtype: str = "float32",
    audio: bool | None = None,
    audio_dtype: str = "float32",
    channels: str = "error",
    text_separator: str = " ",
    direct_io: bool = True,
    **options: Unpack[driver.ImportOptions],
) -> Store:
    """Import Lhotse cuts into one new store at ``out``, and open it (the fields are in the module docs).

    ``cuts``: a ``lhotse.CutSet`` (lazy or not), a cuts manifest path (``cuts.jsonl.gz``, opened lazily)
    or a list of such paths (their cuts in order). ``features=True`` stores ``cut.load_features()`` as
    ``features`` (``features_dtype`` float32, or float16: the float32 arrays cast). ``audio=True`` stores
    ``cut.load_audio()`` as mono ``audio`` plus ``sampling_rate``; ``audio=None`` (the default) does so
    when the first cut has a recording and no features and ``features`` is false, ``audio=False`` never.
    ``audio_dtype``: float32 (Lhotse's samples as they are) or int16 (``round(x * 32768)`` clipped: the
    samples of a 16-bit PCM file exactly). ``channels``, for a cut of several channels (a ``MultiCut``):
    ``"error"`` refuses it, ``"first"`` keeps its first channel, ``"mix"`` their mean (in float64, then
    cast). Supervision texts are joined by ``text_separator``.

    The manifests are checked to exist and the first cut is read before anything is written; a cut
    that lacks features or a recording asked for is a :class:`MissingFeaturesError` /
    :class:`MissingRecordingError` naming the manifest and the cut, and leaves no store behind (all or
    nothing). Memory O(``chunk_bytes``) whatever the number of cuts. ``progress`` gets cuts (told the
    total, when it has ``add_total``, for manifests, counted by one pass over their lines, and for an
    eager CutSet). ``store.metadata["lhotse"]`` records the manifests and the choices made.

    ``workers > 1`` imports manifest files in that many processes, this one included: their lines are
    cut into runs of about ``cuts / (8 x workers)`` (at least :data:`MIN_UNIT_CUTS`), each written as
    one part, by forkserver processes from the first run on and by this process from the last run
    backwards (so it works while they start); the records are the same, in the same order, whatever
    ``workers`` is. Manifests of fewer than :data:`PARALLEL_MIN_CUTS` cuts in all, and a ``CutSet``
    object (it could only be handed to a worker by pickling every cut), are imported in this process.

    ``direct_io`` (default True): features and audio are written with ``O_DIRECT`` in page-aligned runs
    (:class:`~seqstore.store.Writer`), not through the page cache, whose copies cost more CPU than
    reading the features; a filesystem without ``O_DIRECT`` writes buffered. The other keywords, and an
    ``out`` at a URL: :class:`~seqstore.interop.driver.Options`.
    """
    opts = driver.options("import_lhotse", out, options, cuts)
    for name, value, allowed in (("features_dtype", features_dtype, FEATURE_DTYPES),
                                 ("audio_dtype", audio_dtype, AUDIO_DTYPES), ("channels", channels, CHANNEL_MODES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    sources = _sources(cuts, lean=audio is False)
    where, first, streams = _first_cut(sources)
    by_default = audio is None
    if audio is None:  # audio unless the cuts have features (or features are asked for) or no recordings
        audio = not features and bool(getattr(first, "has_recording", False)) and not first.has_features
        if not audio:  # read without Lhotse's cut objects, as with audio=False
            sources = _sources(cuts, lean=True)
            where, first, streams = _first_cut(sources)
    plan = _Plan(first, where, features=features, features_dtype=features_dtype, audio=audio,
                 audio_dtype=audio_dtype, channels=channels, text_separator=text_separator,
                 audio_by_default=by_default)
    try:
        schema = plan.schema()
    except SchemaError as exc:
        raise SourceFormatError(where, None, f"cut {first.id!r}: {exc}") from exc
    paths = [w for w, _ in sources if w != OBJECT_NAME]
    meta = {
        "manifests": [os.path.basename(p) for p in paths] or None,
        "text_separator": text_separator,
        "num_frames": "cut.num_frames, -1 without features" if plan.frames else None,
        "features": {"dtype": features_dtype, "dims": plan.dims,
                     "frame_shift": getattr(first, "frame_shift", None)} if features else None,
        "audio": {"dtype": audio_dtype, "channels": channels,
                  "int16_scale": 32768 if audio_dtype == "int16" else None} if audio else None,
    }
    scans = functools.cache(lambda: [scan_manifest(p) for p in paths])  # one pass over the lines, when needed

    def units(workers: int) -> list[tuple[_CutsJob, list[tuple[int, int, int]]]]:
        job = _CutsJob(plan, opts.chunk_bytes, paths, [m for _, m in scans()])
        return [(job, u) for u in _units([n for n, _ in scans()], workers)]

    eager = not any(getattr(cs, "is_lazy", True) for _, cs in sources)  # a CutSet that knows its length unread
    total = (lambda: sum(n for n, _ in scans())) if paths else sum(len(cs) for _, cs in sources) if eager else None
    conv = driver.Conversion(schema, {METADATA_KEY: meta}, _StreamJob(plan, opts.chunk_bytes), streams, total,
                             units if paths else None, url_as_parts=False, preload=PRELOAD, in_driver=True,
                             after_parallel=forget_streams)  # a gzip stream this process kept after one of its runs
    return driver.write(conv, out, opts, direct_io=direct_io)
