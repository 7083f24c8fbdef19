"""Reading Lhotse cut manifests (JSONL, plain or gzip) for the import (interop/lhotse.py): the lazy
``CutSet`` check, counting lines with byte offsets that a worker seeks to, and parsing a run of lines into
cuts, ``MonoCut`` lines as :class:`LeanCut` (no Lhotse cut objects) when no audio is read."""

from __future__ import annotations

import contextlib
import gzip
import os
import threading
import zlib
from collections import deque
from collections.abc import Iterator
from itertools import islice
from typing import IO, Any, cast

import numpy as np

from ._common import SourceFormatError

__all__ = [
    "open_cuts", "count_cuts", "scan_manifest", "manifest_cuts", "forget_streams", "LeanCut", "lean_cut", "MARK_LINES",
]

#: A plain ``.jsonl`` manifest's byte offset is noted every this many lines when its lines are counted,
#: so that a worker of a parallel import seeks to its run (a gzip manifest is read from its start).
MARK_LINES = 1024


def open_cuts(path: str | os.PathLike[str], *, empty_ok: bool = False) -> Any:
    """A lazy ``CutSet`` over the JSONL manifest ``path`` (``.jsonl``, ``.jsonl.gz``): nothing but the
    first line is read here. FileNotFoundError for a missing file; SourceFormatError for a file that is
    not JSONL, is empty (None with ``empty_ok``), or holds another kind of manifest (recordings,
    supervisions, features)."""
    from lhotse import CutSet, load_manifest_lazy

    p = os.fspath(path)
    if not os.path.exists(p):
        raise FileNotFoundError(f"{p}: no such Lhotse manifest (expected a cuts JSONL file such as cuts.jsonl.gz)")
    if os.path.isdir(p):
        raise IsADirectoryError(f"{p}: is a directory; expected a Lhotse cuts manifest file (cuts.jsonl.gz)")
    if ".jsonl" not in os.path.basename(p):
        raise SourceFormatError(p, None, "expected a JSONL manifest (.jsonl or .jsonl.gz), which is read lazily; "
                                "convert another one with lhotse.load_manifest(p).to_file('cuts.jsonl.gz')")
    try:
        cuts = load_manifest_lazy(p)
    except (ValueError, KeyError, TypeError, OSError, EOFError) as exc:
        raise SourceFormatError(p, None, f"not a readable Lhotse manifest: {type(exc).__name__}: {exc}") from exc
    if cuts is None:
        if empty_ok:
            return None
        raise SourceFormatError(p, None, "holds no cuts (empty manifest)")
    if not isinstance(cuts, CutSet):
        raise SourceFormatError(p, None, f"holds a {type(cuts).__name__}, not cuts; make cuts first, e.g. "
                                "CutSet.from_manifests(recordings=..., supervisions=...)")
    return cuts


#: The gzip stream of the last run of lines this process read, kept for a next run that starts at or
#: after its end (a worker of a parallel import takes runs in order): (path, file identity, next line,
#: stream). At most one; :func:`forget_streams` closes it.
_LEFT: list[tuple[str, tuple[int, int, int], int, IO[bytes]]] = []
_LEFT_LOCK = threading.Lock()


def _take_left() -> tuple[str, tuple[int, int, int], int, IO[bytes]] | None:
    with _LEFT_LOCK:
        return _LEFT.pop() if _LEFT else None


def forget_streams() -> None:
    """Close the gzip stream kept for a next run (at the end of an import)."""
    while (left := _take_left()) is not None:
        left[3].close()


def _identity(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _stream_at(path: str, start: int, marks: np.ndarray[Any, Any] | None) -> tuple[IO[bytes], int]:
    """A stream of the manifest ``path`` and how many lines to read past to reach line ``start``: the
    kept gzip stream where it has not passed ``start`` (see :data:`_LEFT`), else the file from the
    nearest noted offset (a plain file) or from its start (gzip)."""
    left = _take_left()
    if left is not None:
        kept_path, ident, line, f = left
        if kept_path == path and line <= start and ident == _identity(path):
            return f, start - line
        f.close()
    f = open_manifest(path)
    if marks is not None and len(marks):
        m = min(start // MARK_LINES, len(marks) - 1)
        f.seek(int(marks[m]))
        return f, start - m * MARK_LINES
    return f, start


def open_manifest(path: str) -> IO[bytes]:
    """The bytes of a JSONL manifest, decompressed when its name ends in ``.gz`` (as Lhotse decides)."""
    return cast(IO[bytes], gzip.open(path, "rb")) if path.endswith(".gz") else open(path, "rb")


def count_cuts(path: str | os.PathLike[str]) -> int:
    """The number of lines (one cut each) of the JSONL manifest ``path``, counted without parsing them."""
    return scan_manifest(os.fspath(path))[0]


def scan_manifest(path: str) -> tuple[int, np.ndarray[Any, Any] | None]:
    """The number of lines of the manifest ``path`` and, for a plain (not gzip) file, the byte offsets
    of lines 0, :data:`MARK_LINES`, 2 x :data:`MARK_LINES`, ... (None for gzip, which cannot be entered
    in the middle): O(lines / MARK_LINES) memory, one pass without parsing."""
    n, last = 0, b"\n"
    plain = not path.endswith(".gz")
    marks: list[np.ndarray[Any, Any]] = [np.zeros(1, np.int64)]
    pos = 0
    with open_manifest(path) as f, _reading(path):
        while block := f.read(1 << 20):
            if plain:  # line L starts after newline L - 1; keep the lines that are multiples of MARK_LINES
                ends = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
                marks.append(pos + ends[(-n - 1) % MARK_LINES :: MARK_LINES] + 1)
                n += len(ends)
                pos += len(block)
            else:
                n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n"), np.concatenate(marks) if plain else None


@contextlib.contextmanager
def _reading(path: str) -> Iterator[None]:
    """Reads of the manifest ``path``: a damaged or cut-short file (gzip: EOFError, BadGzipFile,
    zlib.error) is a SourceFormatError naming it."""
    try:
        yield
    except (EOFError, OSError, zlib.error) as exc:
        raise SourceFormatError(path, None, f"cannot read the manifest: {exc}") from exc


def _lines(f: IO[bytes], path: str) -> Iterator[bytes]:
    """The lines of the manifest stream ``f`` (left open: a gzip stream may be kept for a next run)."""
    with _reading(path):
        yield from iter(f.readline, b"")


class LeanCut:
    """What the import reads of a ``MonoCut`` line without audio: its id, start, duration, supervision
    texts and ``lhotse.Features``, without Lhotse's cut and supervision objects (building those took
    0.3 s of the 1.7 s Lhotse spends reading 20,000 cuts with their features). The features are loaded by
    Lhotse's own ``Features.load`` (its storage readers and trimming to the cut's span), then made
    ``num_frames`` long as ``MonoCut.load_features`` does (a frame dropped or repeated at the end)."""

    __slots__ = ("id", "start", "duration", "features", "texts", "num_frames")

    def __init__(self, cut_id: str, start: float, duration: float, features: Any, texts: list[str],
                 num_frames: int | None) -> None:
        self.id, self.start, self.duration, self.features = cut_id, start, duration, features
        self.texts, self.num_frames = texts, num_frames

    @property
    def has_features(self) -> bool:
        return self.features is not None

    @property
    def num_features(self) -> Any:
        """As the manifest has it (a ``MonoCut``'s ``num_features`` is not converted either)."""
        return self.features.num_features

    @property
    def frame_shift(self) -> float | None:
        return None if self.features is None else float(self.features.frame_shift)

    def load_features(self) -> np.ndarray[Any, Any] | None:
        if self.features is None:
            return None
        arr = self.features.load(start=self.start, duration=self.duration)
        n = self.num_frames
        assert n is not None
        if arr.shape[0] - n == 1:
            arr = arr[:n]
        elif arr.shape[0] - n == -1:
            arr = np.concatenate((arr, arr[-1:]), axis=0)
        return np.asarray(arr)


#: The keys of a ``MonoCut`` line (its dataclass fields and ``type``); a line with others is parsed by Lhotse.
MONO_KEYS = frozenset(("type", "id", "start", "duration", "channel", "supervisions", "features", "recording",
                       "custom"))


def lean_cut(data: dict[str, Any], features_type: Any, frames: Any) -> LeanCut | None:
    """``data`` (a decoded manifest line) as a :class:`LeanCut`, or None (untouched) when it is not a
    plain ``MonoCut`` line; ``features_type`` is ``lhotse.Features``, ``frames`` Lhotse's
    ``compute_num_frames`` (as ``MonoCut.num_frames``)."""
    if data.get("type") != "MonoCut" or not data.keys() <= MONO_KEYS or not isinstance(data.get("id"), str):
        return None
    fd = data.get("features")
    texts = [t for s in data.get("supervisions") or () if (t := s.get("text")) is not None]
    duration = data["duration"]
    if fd is None:
        return LeanCut(data["id"], data["start"], duration, None, texts, None)
    feats = features_type.from_dict(fd)
    n = int(frames(duration=duration, frame_shift=feats.frame_shift, sampling_rate=feats.sampling_rate))
    return LeanCut(data["id"], data["start"], duration, feats, texts, n)


def manifest_cuts(path: str, start: int, stop: int | None, marks: np.ndarray[Any, Any] | None = None, *,
                   lean: bool = False) -> Iterator[Any]:
    """The cuts on lines ``[start, stop)`` (``stop`` None: to the end) of the manifest ``path``, parsed
    as Lhotse parses a lazy manifest's lines (``lean``: ``MonoCut`` lines as :class:`LeanCut`, for an
    import without audio). The lines before ``start`` are read past without being parsed, from the
    nearest of the line offsets ``marks`` (:func:`scan_manifest`) when given. A line that is not a cut
    is a :class:`SourceFormatError` naming the manifest and the line. A gzip manifest's stream is kept
    after a run read to its end, so that a next run at or after it goes on from there instead of
    decompressing the lines before it again (:data:`_LEFT`)."""
    from lhotse import Features
    from lhotse.cut import Cut
    from lhotse.serialization import decode_json_line, deserialize_item
    from lhotse.utils import compute_num_frames

    f, skip = _stream_at(path, start, marks)
    kept = False
    try:
        with _reading(path):
            deque(islice(f, skip), maxlen=0)
        for number, line in enumerate(islice(_lines(f, path), None if stop is None else stop - start), start + 1):
            try:
                data = decode_json_line(line)
                item = lean_cut(data, Features, compute_num_frames) if lean else None
                if item is None:
                    item = deserialize_item(data)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise SourceFormatError(path, None, f"line {number}: not a Lhotse cut ({type(exc).__name__}: "
                                        f"{exc})") from exc
            if not isinstance(item, (Cut, LeanCut)):
                raise SourceFormatError(path, None, f"line {number}: holds a {type(item).__name__}, not a cut")
            yield item
        if stop is not None and marks is None and path.endswith(".gz"):  # read whole: a next run may go on
            forget_streams()
            with _LEFT_LOCK:
                _LEFT.append((path, _identity(path), stop, f))
            kept = True
    finally:
        if not kept:
            f.close()
