"""Where a store's bytes live, as the reader sees it: the :class:`ByteSource` interface.

A reader needs little from where its store is kept: the store's root (``manifest.json`` and the shard
table) loaded at open and on refresh, each committed shard file mapped as an array, byte ranges of those
mappings made resident before (or while) they are read, a residency probe, and a name for messages and
for reopening in another process. Where sources differ in how reads should be planned, the source says
so in its :class:`ReadPolicy`. Sources: :class:`~seqstore.io.local_source.LocalSource` (a directory) and
:class:`~seqstore.io.remote_source.RemoteSource` (object storage through the node cache);
:func:`seqstore.io.sources.open_source` picks one. A new kind of source (e.g. in memory) is one subclass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..format.manifest import FileInfo, Manifest
from ..format.shard_table import ShardTable
from .advice import REQUEST_BYTES, any_cold

__all__ = ["ByteSource", "ReadPolicy", "READAHEAD_MODES"]

#: the reader's ``readahead`` modes (see :func:`seqstore.open`)
READAHEAD_MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class ReadPolicy:
    """How a reader plans its reads on one source, for one ``readahead`` mode.

    ``ahead``: batch reads and ``prefetch`` ask for their bytes before gathering (scans follow the
    ``readahead`` mode alone). ``probe``: sample residency first and skip the requests when the sample is
    in memory. ``lazy``: mapped bytes read as zeros until made resident, so every access must
    :meth:`ByteSource.ensure` its ranges first. ``setup``: first touching a shard costs requests
    (:meth:`ByteSource.prepare_shards`), so a batch prepares all its new shards at once. ``depth``: batches
    ``iter_batches`` keeps in flight by default; ``deepest``: how many while the source has few requests
    pending (:meth:`ByteSource.deeper`). ``staged``: a batch's ragged value rows are asked for a few
    batches after its offsets, not only when it is next. ``together``: ``iter_batches`` (default depth)
    asks for the reads of this many consecutive batches at once, as their union's runs
    (:meth:`ByteSource.request_runs`; 0: each batch on its own). ``stream``: it fetches those runs into
    memory instead (:meth:`ByteSource.fetch_into`; a read-once store).
    """

    ahead: bool
    probe: bool
    lazy: bool = False
    setup: bool = False
    depth: int = 2
    deepest: int = 0
    staged: bool = False
    together: int = 0
    stream: bool = False


class ByteSource(ABC):
    """The bytes of one store (see the module docstring). ``root`` is a local directory holding the
    store's ``manifest.json`` and shard table (the store itself, or a local copy of them), valid
    after :meth:`load`."""

    #: Whether the bytes come from object storage (``Store.is_remote``).
    is_remote: ClassVar[bool] = False
    #: ``any_cold(addresses, sample=n)``: whether any of up to ``n`` sampled addresses inside this
    #: source's mappings is on a page that is not resident (a plain function: no call layer is added)
    any_cold: Callable[..., bool] = staticmethod(any_cold)
    #: ``searchsorted(sorted_array, queries, side)`` over an array this source mapped
    searchsorted: Callable[..., np.ndarray[Any, Any]] = staticmethod(np.searchsorted)  # type: ignore[assignment]

    root: Path

    @property
    @abstractmethod
    def url(self) -> str:
        """Where the store is, for messages and ``Store.url``: its URL, or its path."""

    @abstractmethod
    def load(self) -> Manifest:
        """Read the store's root (manifest and shard table), at open and again on refresh; sets ``root``."""

    @abstractmethod
    def map_npy(
        self, path: Path, info: FileInfo | None, dtype: np.dtype[Any], shape: tuple[int, ...], *,
        sequential: bool = False,
    ) -> np.ndarray[Any, Any]:
        """Map the committed ``.npy`` file at ``path`` (under ``root``) read-only, after checking its size
        against ``info`` (when given) and its header against ``dtype`` and ``shape``; a
        :class:`~seqstore.CorruptionError` names the file. ``sequential``: the caller reads it in order."""

    @abstractmethod
    def policy(self, readahead: str) -> ReadPolicy:
        """How to plan reads on this source in ``readahead`` mode (one of :data:`READAHEAD_MODES`)."""

    @abstractmethod
    def reopen(self) -> tuple[Any, dict[str, Any]]:
        """What opening this source again in another process takes: ``(path, options)`` for
        ``Store(path, **options)`` (a pickled Store reopens its source this way)."""

    @abstractmethod
    def request(self, starts: Any, ends: Any, *, most: int) -> None:
        """Start making byte ranges ``[starts[i], ends[i])`` (absolute addresses in this source's
        mappings) resident, in requests of at most ``most`` bytes; return at once."""

    def request_runs(self, starts: Any, ends: Any, *, most: int, must: int) -> tuple[Any, Any]:
        """Start reading the union of several accesses' ranges (see ``ReadPolicy.together``) as it lies:
        exactly their pages, in runs, where :meth:`request` may round a dense access up to larger units.
        The first ``must`` ranges are asked for; later ones (the last access's) may be left out where
        they lie apart from the rest (the few rows of the next window's blocks that a window's last batch
        takes): they are returned (``starts``, ``ends``), to be given again, first, with the next union."""
        self.request(starts, ends, most=most)
        return np.zeros(0, np.int64), np.zeros(0, np.int64)

    @abstractmethod
    def request_span(self, start: int, stop: int, *, most: int) -> None:
        """:meth:`request` of one range (a scan's next stretch)."""

    def fetch_into(self, starts: Any, ends: Any, alloc: Any) -> Any:
        """Start fetching byte ranges ``[starts, ends)`` (addresses in this source's mappings) into a
        buffer from ``alloc(nbytes)``, bypassing any cache; a
        :class:`~seqstore.io.remote_stream.Part`. Only a source whose policy has ``stream`` is asked."""
        raise NotImplementedError(f"{self.url}: this source does not fetch into memory (a read-once epoch is "
                                  "for remote stores)")

    def segments(self, parts: list[Any]) -> tuple[Any, Any, Any]:
        """The segment table (starts, ends, buffer addresses; by start) of parts :meth:`fetch_into` fetched:
        this process's parts, or ``(part.export(), address of its buffer here)`` of another process's."""
        raise NotImplementedError(f"{self.url}: this source does not fetch into memory")

    @property
    def stream_budget(self) -> int:
        """Bytes :meth:`fetch_into` may hold ahead of the reader (a source that fetches into memory)."""
        return 0

    def ensure(self, starts: Any, ends: Any) -> None:
        """Return once byte ranges ``[starts[i], ends[i])`` are resident (only a ``lazy`` source needs this)."""
        return None  # default: bytes in files that a page fault reads need nothing here

    def ensure_array(self, arr: np.ndarray[Any, Any]) -> None:
        """:meth:`ensure` of every byte a view of a mapping spans."""
        return None  # default: bytes in files that a page fault reads need nothing here

    def deeper(self) -> bool:
        """Whether few enough requests are pending that ``iter_batches`` may keep more batches in flight
        than its default depth (up to the policy's ``deepest``)."""
        return False

    def request_bytes(self, path: Path) -> int:
        """Bytes per read-ahead request on the device that holds ``path``."""
        return REQUEST_BYTES

    def prepare_shards(self, manifest: Manifest, table: ShardTable, shards: Iterable[int]) -> None:
        """Make shards ``shards`` (positions in ``table``) ready to map, all at once (a ``setup`` source)."""
        return None  # default: bytes in files that a page fault reads need nothing here

    def prepare_ids(self, name: str, crc: int | None) -> None:
        """Before shard ``name``'s id files are first mapped (maybe long after its other files): make them
        ready, checking that the shard is still the one of descriptor CRC-32 ``crc`` (version 3; None: not
        known) where this touches the store (a remote source). Nothing for a local source."""
        return None

    def shard_display(self, name: str) -> str:
        """How messages name shard ``name``."""
        return str(self.root / name)

    def display(self, text: str) -> str:
        """``text`` (a message) with paths under ``root`` written as this source names them."""
        return text

    def fetch_descriptors(self, manifest: Manifest) -> None:
        """Make every shard's descriptor readable under ``root`` in one go (``info`` and ``verify`` read
        them all; a local store has them already)."""
        return None  # default: bytes in files that a page fault reads need nothing here

    def materialize(self, keys: Sequence[str]) -> None:
        """Make the whole files ``keys`` (relative to the store) readable as local files under ``root``
        (``verify`` reads them as files; a local store has them already)."""
        return None  # default: bytes in files that a page fault reads need nothing here

    def refetch(self, keys: Sequence[str], spans: Mapping[str, tuple[Any, Any]] | None = None) -> bool:
        """Drop this node's copies of the files ``keys`` that :meth:`materialize` made and fetch them again
        (``verify``, finding a copy damaged, checks the store's own bytes); False where the files are the
        store's own (a local store: nothing to fetch again). ``spans``: for the files it names, the byte
        ranges ``(starts, ends)`` known damaged (records that failed their checksums): only those are
        fetched again."""
        return False

    def derived_dir(self) -> Path | None:
        """Where files derived from the store (lengths, row maps) go by default, or None: next to the
        store (the caller's default)."""
        return None

    @property
    def fork_safe(self) -> bool:
        """Whether a process forked from this one now could read this source."""
        return True

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

