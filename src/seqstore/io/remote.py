"""A store on object storage laid out as a local directory: the mirror of its manifest and shard
table, and its data files mapped from the node cache (:class:`RemoteRoot`).

- :meth:`RemoteRoot.load` fetches ``manifest.json`` and the committed rows of the shard table (at most
  2 round trips, nothing per shard) into a small local directory of the cache (a *mirror*, one per
  store URL and manifest version), so the reader opens it with the code it uses for local stores.
- :meth:`RemoteRoot.prepare_shards`, when shards are first touched: one wave of requests fetches their
  descriptors and the first and last page of each of their files (``.npy`` headers, last offsets, each
  object's size and ETag). Data files become cache entries keyed by URL and ETag.
- :meth:`RemoteRoot.map_npy` maps a data file's cache entry in place of the object and tells the store's
  :class:`~seqstore.io.remote_fetch.Fetcher` (:attr:`RemoteRoot.fetcher`), which brings the pages an
  access needs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import weakref
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptionError, FormatError, RemoteNotFound, StaleStoreError
from ..format.descriptor import DESCRIPTOR
from ..format.manifest import IDS_FILES, MANIFEST, Manifest
from ..format.npy import parse_header
from ..format.shard_table import TABLE, TABLE_HEADER_BYTES, row_dtype
from .advice import page_runs
from .local_source import npy_array
from .mapping import MADV_RANDOM, MADV_SEQUENTIAL, PAGE, address, map_fd
from .nodecache import NodeCache, run_pages
from .object_common import Answer, Request
from .object_links import reset_in_child
from .objects import ObjectClient, ObjectMeta, redact
from .options import StoreOptions
from .remote_fetch import MOST, DirectWaves, Fetcher, Region, Ticket

__all__ = ["RemoteRoot"]

_HEAD = 4096  # bytes fetched from the start and the end of every file when a shard is prepared
_META = "_remote.json"
_RUNS = "_index"  # the directory of merged id-index runs (format section 6)
_ROUNDS = 8  # times a whole-object fetch waits for pages other processes claim before it gives up


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


class RemoteRoot:
    """A store at ``url`` (see the module docstring), opened with ``options``: its client, node cache
    and fetch path (:attr:`fetcher`) are made from them."""

    def __init__(self, url: str, options: StoreOptions) -> None:
        self.url = url.rstrip("/")
        self.options = options
        self.client = ObjectClient(self.url, options.storage_options(), options.filesystem)
        self.cache = NodeCache.get(options.cache_dir, options.cache_bytes)
        direct = DirectWaves(self.client) if options.direct_reads else None  # small waves: the direct reader
        self.fetcher = Fetcher(self.client, self.cache, direct=direct)
        self.fetcher.on_changed = self._forget
        self.mirror: Path | None = None
        self._mirrors: list[Path] = []  # earlier manifest versions' mirrors (shards mapped before a refresh)
        self._metas: dict[str, ObjectMeta] = {}
        self._meta_lock = threading.Lock()
        reset_in_child(self, "_meta_lock")  # (a thread of a process forked meanwhile may hold it)
        self._unpin: weakref.finalize[Any, Any] | None = None  # of the mirror pinned, when dropped or refreshed
        #: a version-1/2 store (no descriptor CRCs): ``check(manifest bytes now, shard names)`` raises unless the
        #: store's manifest now lists those shards as the one read did (see prepare_shards); None: version 3
        self.manifest_check: Callable[[bytes, Sequence[str]], None] | None = None
        #: ``check(manifest bytes now, keys)`` raises CorruptionError unless the merged id-index runs whose files
        #: ``keys`` are, learned after the manifest changed, are the ones of the shards the read manifest lists
        self.run_check: Callable[[bytes, Sequence[str]], None] | None = None
        self._manifest_tag = ""  # the version tag of the manifest read ("": none known, nothing compared)

    def __repr__(self) -> str:
        return f"RemoteRoot({self.url!r}, storage_options={redact(self.options.storage_options())!r})"

    def digest(self) -> str:
        """A short name of this store's URL (its directory in the node cache)."""
        return _digest(self.url)

    def display(self, path: Path | str) -> str:
        """The URL of a mirror path (for messages)."""
        text = os.fspath(path)
        m = os.fspath(self.mirror) if self.mirror is not None else None
        return self.url + text[len(m) :] if m and text.startswith(m) else text

    # ---------------------------------------------------------------------------------- manifest

    def load(self) -> Path:
        """Fetch the manifest and the shard table into a mirror directory; return its path."""
        try:
            raw, meta = self.client.get(MANIFEST)
        except RemoteNotFound:
            raise FormatError(f"{self.url}: no seqstore store here ({MANIFEST} does not exist)") from None
        data = bytes(raw)
        # a store uploaded again puts its manifest again (a later Last-Modified, though the same bytes and
        # ETag): a new mirror, so the sizes and ETags the node saved of the objects before are not pinned
        version = _digest(meta.etag, str(len(data)), str(zlib.crc32(data)), f"{meta.mtime:.6f}")
        mirror = self.cache.root / "stores" / self.digest() / version
        if not (mirror / MANIFEST).exists():
            self._build_mirror(mirror, data)
        else:
            self._repair_mirror(mirror, data)
        with contextlib.suppress(OSError):
            os.utime(mirror)
        pin = self.cache.pin(mirror)  # never evicted (by any process on the node) while this store may read it
        if self.mirror is not None and self.mirror != mirror:
            self._mirrors.append(self.mirror)  # (its paths name the shards mapped before; nothing is read there)
        if self._unpin is not None:
            self._unpin()  # else every refresh of a growing store keeps one more past the budget
        self._unpin = weakref.finalize(self, NodeCache.unpin, pin)
        self.mirror = mirror
        self._metas = {}
        self._manifest_tag = meta.etag
        return mirror

    def _table(self, manifest_bytes: bytes) -> tuple[str, int]:
        """The shard table's name and the bytes of it that manifest ``manifest_bytes`` commits (0: none)."""
        try:
            obj = json.loads(manifest_bytes)
            m = Manifest._from_json(obj, int(obj["version"]))
            if m.table is not None and m.table.rows > 0:  # (the immutable _shards/<name>.tbl of a remote writer)
                return m.table.file, TABLE_HEADER_BYTES + m.table.rows * row_dtype(len(m.ragged)).itemsize
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            pass  # the reader reports the malformed manifest, naming it
        return TABLE, 0

    def _get_table(self, table: str, need: int) -> bytes:
        try:
            got = self.client.get_ranges([(table, 0, need, None)])
        except RemoteNotFound:
            raise CorruptionError(f"{self.url}/{table}: shard table is missing (the manifest lists rows)") from None
        return bytes(got[0][0])

    def _repair_mirror(self, mirror: Path, manifest_bytes: bytes) -> None:
        """Write again the copies of the manifest and the shard table in ``mirror`` that are not what they
        must be (left empty or cut short, e.g. by a power cut: written without fsync), not blaming the
        store for them. Other processes may read the mirror: each is replaced whole, with the same bytes."""
        table, need = self._table(manifest_bytes)
        try:
            same = (mirror / MANIFEST).read_bytes() == manifest_bytes
            whole = not need or (mirror / table).stat().st_size == need
        except OSError:  # evicted meanwhile (the caller makes it again), or the table's copy is missing
            same, whole = (mirror / MANIFEST).exists(), False
        if same and whole:
            return
        got = None if whole else self._get_table(table, need)
        with self.cache.locked():  # (an eviction, which takes this lock, does not take it meanwhile)
            if not (mirror / MANIFEST).exists():
                return
            if not same:
                self._write(mirror / MANIFEST, manifest_bytes, reserve=False)
            if got is not None:
                self._write(mirror / table, got, reserve=False)

    def _build_mirror(self, mirror: Path, manifest_bytes: bytes) -> None:
        tmp = mirror.with_name(f"{mirror.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        with self.cache.building(tmp):  # (deleted by the next eviction if this process is killed here)
            table, need = self._table(manifest_bytes)
            got = self._get_table(table, need) if need else b""
            try:
                (tmp / MANIFEST).write_bytes(manifest_bytes)
                if need:
                    (tmp / table).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / table).write_bytes(got)
            except OSError as exc:
                raise self._disk_error(exc, mirror / MANIFEST) from None
            self.cache.reserve(_pages(len(manifest_bytes)) + _pages(need))
            try:
                os.rename(tmp, mirror)
            except OSError:  # another process built it first (or left it incomplete: fill it in)
                if not (mirror / MANIFEST).exists():
                    mirror.mkdir(parents=True, exist_ok=True)
                    for f in tmp.iterdir():
                        os.replace(f, mirror / f.name)

    # ------------------------------------------------------------------------------------ shards

    def prepare_shards(self, shards: Sequence[tuple[str, Sequence[str], int | None]],
                       sizes: Mapping[str, Mapping[str, int]] | None = None) -> None:
        """Make the descriptors and the file heads of shards ``(name, files, descriptor CRC-32 or None)``
        local, all in one wave of requests: the descriptor (version 3: where a CRC is given; it is written
        into the mirror only if its CRC matches), and per file its first 4 KiB (the ``.npy`` header; the
        answer also carries the object's size and ETag) and, for offsets, its last 4 KiB (the last offset,
        checked at mapping). Nothing is requested for what this node's cache already holds. Where objects'
        versions are learned here and :attr:`manifest_check` is set (version 1/2), the wave asks for a byte of
        the manifest too: a manifest changed since it was read (a commit, or the store replaced) is read
        again and checked, before anything of the objects is kept. The sizes the answers give of objects
        learned are checked, before a cache entry of that size is made, against ``sizes`` (shard -> file
        -> bytes: a version-1/2 manifest's) or the shard's descriptor (version 3)."""
        assert self.mirror is not None
        # (request, what, (shard, file) whose meta it learns, or None where the meta is known)
        todo: list[tuple[Request, str, tuple[str, str] | None]] = []
        crcs: dict[str, int] = {}
        for name, files, descriptor in shards:
            if descriptor is not None:
                crcs[f"{name}/{DESCRIPTOR}"] = descriptor
            known = self._known(name)
            # where its objects are learned now (maybe of a store replaced since it was opened), the store's
            # own descriptor is fetched and checked, whatever the node's copy: as mapping the shard first did
            learn = any(rel not in known for rel in files)
            if descriptor and (learn or not _intact(self.mirror / name / DESCRIPTOR, descriptor)):
                todo.append(((f"{name}/{DESCRIPTOR}", 0, -1, None), "descriptor", None))
            for rel in files:
                key = f"{name}/{rel}"
                m = known.get(rel)
                if m is not None:
                    with self._meta_lock:
                        self._metas[key] = m
                    obj = self.cache.object(self.client.key_url(key), m.etag, m.size)
                    if not obj.present(0, min(m.size, _HEAD)):
                        todo.append(((key, 0, min(m.size, _HEAD), m.etag or None), "head", None))
                    if rel.endswith(".offsets.npy") and not obj.present(max(0, m.size - 8), m.size):
                        a = max(0, m.size - _HEAD) // PAGE * PAGE
                        todo.append(((key, a, m.size, m.etag or None), "tail", None))
                    continue
                todo.append(((key, 0, _HEAD, None), "head", (name, rel)))
                if rel.endswith(".offsets.npy"):
                    todo.append(((key, -_HEAD, -1, None), "tail", (name, rel)))
        if not todo:
            return
        learned = sorted({shard[0] for _, _, shard in todo if shard is not None})
        runs = [req[0] for req, _, shard in todo if shard is not None and shard[0] == _RUNS]  # (a run: no descriptor)
        if (self.manifest_check is not None and learned or self.run_check is not None and runs) and self._manifest_tag:
            todo.append(((MANIFEST, 0, 1, None), "manifest", None))
        try:
            got = self._get_ranges([req for req, _, _ in todo])
        except RemoteNotFound as exc:
            raise CorruptionError(f"{exc.url}: object is missing (the shard table lists it)") from None
        fresh: dict[str, dict[str, list[Any]]] = {}
        filled = 0
        for ((key, _, _, _), what, _), (data, m) in zip(todo, got):
            if what == "manifest" and m is not None and m.etag != self._manifest_tag:
                self._check_manifest(learned, runs)
            if what == "descriptor" and zlib.crc32(data) != crcs[key]:
                raise CorruptionError(
                    f"{self.client.key_url(key)}: CRC-32 {zlib.crc32(data):#010x} of the descriptor differs from "
                    f"the shard table's {crcs[key]:#010x}: the store was replaced since it was opened (reopen it) "
                    "or the object is damaged"
                )
        self._check_sizes(todo, got, sizes or {})  # (before an entry of the size an answer gives is made)
        for ((key, start, _, _), what, shard), (data, meta) in zip(todo, got):
            if what == "descriptor":
                self._write(self.mirror / key, bytes(data))
                continue
            if what == "manifest":
                continue
            assert meta is not None
            have = self._metas.get(key)
            if have is not None and have.etag != meta.etag:  # (e.g. a shard mapped again after the change)
                url = self.client.key_url(key)
                raise StaleStoreError(f"{url}: the object changed while the store was open (ETag {meta.etag}, "
                                      f"expected {have.etag}, as read before); reopen the store", url=url, attempts=1)
            obj = self.cache.object(self.client.key_url(key), meta.etag, meta.size)
            start = start if start >= 0 else max(0, meta.size - len(data))
            # (pages the entry holds already, e.g. fetched by another process opening the store at once: counted)
            filled += int(np.count_nonzero(obj.bits[start // PAGE : -(-(start + len(data)) // PAGE)] == 0)) * PAGE
            obj.fill(start, data)
            if shard is not None:  # (saved under the shard name given: _known looks it up so)
                with self._meta_lock:
                    self._metas[key] = ObjectMeta(key, meta.size, meta.etag)
                fresh.setdefault(shard[0], {})[shard[1]] = [meta.size, meta.etag]
        self.cache.reserve(filled)
        with self._meta_lock:  # (as _forget: a merge must not write back what it drops)
            for name, saved in fresh.items():
                merged = {rel: [m.size, m.etag] for rel, m in self._known(name).items()}
                merged.update(saved)
                self._write(self.mirror / name / _META, json.dumps(merged).encode())

    def _check_sizes(self, todo: list[tuple[Request, str, tuple[str, str] | None]], got: list[Answer],
                     sizes: Mapping[str, Mapping[str, int]]) -> None:
        """Raise CorruptionError where an answer gives an object learned in this wave a size other than the
        store's index lists (``sizes``, else the shard's descriptor as fetched in this wave or kept in the
        mirror; a file listed nowhere, or a descriptor that does not parse, is left to the reader)."""
        assert self.mirror is not None
        wave = {req[0]: data for (req, what, _), (data, _m) in zip(todo, got) if what == "descriptor"}
        listed: dict[str, Mapping[str, int]] = dict(sizes)
        for (_req, _what, shard), (_data, meta) in zip(todo, got):
            if shard is None or meta is None:
                continue
            name, rel = shard
            if name not in listed:
                key = f"{name}/{DESCRIPTOR}"
                try:
                    raw = wave[key] if key in wave else (self.mirror / key).read_bytes()
                    listed[name] = {str(k): int(v["bytes"]) for k, v in json.loads(bytes(raw))["files"].items()}
                except (OSError, ValueError, KeyError, TypeError, AttributeError):
                    listed[name] = {}
            want = listed[name].get(rel)
            if want is not None and meta.size != want:
                raise CorruptionError(f"{self.client.key_url(f'{name}/{rel}')}: object has {meta.size} bytes, the "
                                      f"store's index says {want} (truncated or replaced?)")

    def _check_manifest(self, names: Sequence[str], runs: Sequence[str] = ()) -> None:
        """The manifest changed since it was read: read it again and let :attr:`manifest_check` raise unless
        it lists shards ``names`` as before (a commit that appended), and :attr:`run_check` unless the merged
        id-index runs of files ``runs`` are those of the shards read; then its new version is the one known."""
        raw, meta = self.client.get(MANIFEST)
        if self.manifest_check is not None:
            self.manifest_check(bytes(raw), names)
        if runs and self.run_check is not None:
            self.run_check(bytes(raw), runs)
        self._manifest_tag = meta.etag

    def _write(self, path: Path, data: bytes, *, reserve: bool = True) -> None:
        """Write a mirror file atomically (making its directory), its disk space counted in the cache's
        budget (``reserve`` False: not counted again, for a copy written again in place of one counted)."""
        if reserve:  # (a copy written again in place of one counted: only what it grows by)
            try:
                had = _pages(path.stat().st_size)
            except OSError:
                had = 0
            self.cache.reserve(_pages(len(data)) - had)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:  # e.g. a full disk: no part-written copy left, and say which (the node cache's)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise self._disk_error(exc, path) from None

    def _disk_error(self, exc: OSError, path: Path) -> OSError:
        """``exc``, met writing mirror file ``path``, as an error naming the store and the node cache."""
        return OSError(exc.errno, f"{exc.strerror}: cannot write the node cache's copy of {self.display(path)} "
                       f"(store {self.url}); free space under {self.cache.root} or lower cache_bytes", str(path))

    def _known(self, name: str) -> dict[str, ObjectMeta]:
        """Sizes and ETags of shard ``name``'s objects this node has seen (``_remote.json`` in the mirror)."""
        assert self.mirror is not None
        try:
            saved = json.loads((self.mirror / name / _META).read_text())
            return {rel: ObjectMeta(f"{name}/{rel}", int(v[0]), str(v[1])) for rel, v in saved.items()}
        except (ValueError, TypeError, KeyError, IndexError, OSError, AttributeError):  # none yet, or unreadable
            return {}

    def _get_ranges(self, reqs: list[Request]) -> list[Answer]:
        """The client's ``get_ranges``; where an object has changed, its saved meta is forgotten first."""
        try:
            return self.client.get_ranges(reqs)
        except StaleStoreError:
            self._forget([key for key, _, _, etag in reqs if etag])
            raise

    def _forget(self, keys: Sequence[str]) -> None:
        """Drop the sizes and ETags of objects ``keys``, which a read found changed, from the mirror's
        ``_remote.json``: the next open of the store learns them anew and reads the objects as they now are
        (new cache entries: an entry's name holds the ETag), while this one, whose mappings hold the old
        ones, goes on raising StaleStoreError for them."""
        if self.mirror is None:
            return
        drop: dict[str, list[str]] = {}
        for key in keys:
            parts = key.split("/")
            for i in range(1, len(parts)):  # the shard's name may hold a '/' (a merged id index's run)
                drop.setdefault("/".join(parts[:i]), []).append("/".join(parts[i:]))
        with self._meta_lock:
            for name, rels in drop.items():
                known = self._known(name)
                if any(rel in known for rel in rels):
                    saved = {rel: [m.size, m.etag] for rel, m in known.items() if rel not in rels}
                    with contextlib.suppress(OSError):  # (not written: the next open asks If-Match, fails again)
                        self._write(self.mirror / name / _META, json.dumps(saved).encode())

    def _meta(self, key: str) -> ObjectMeta:
        m = self._metas.get(key)
        if m is None:
            name, _, rel = key.rpartition("/")
            # a shard's id files come together, on its first id lookup, and a merged id index run's two files
            stem = rel.removesuffix(".hash.npy").removesuffix(".rows.npy")
            run = [f"{stem}.hash.npy", f"{stem}.rows.npy"] if name == _RUNS and stem != rel else [rel]
            self.prepare_shards([(name, IDS_FILES if rel in IDS_FILES else run, None)])
            m = self._metas.get(key)
            if m is None:
                raise CorruptionError(f"{self.client.key_url(key)}: object is missing")
        return m

    def map_npy(
        self, path: Path, info: Any, dtype: np.dtype[Any], shape: tuple[int, ...], *, sequential: bool = False
    ) -> np.ndarray[Any, Any]:
        """The remote counterpart of the reader's ``map_npy``: map the cache entry of the object
        behind mirror path ``path`` after the same checks (size, header)."""
        assert self.mirror is not None
        key = self._key(path)
        url = self.client.key_url(key)
        meta = self._meta(key)
        size = meta.size
        if info is not None and size != info.bytes:
            raise CorruptionError(
                f"{url}: object has {size} bytes, manifest says {info.bytes} (truncated or replaced?)"
            )
        obj = self.cache.object(url, meta.etag, size)
        head_len = min(size, _HEAD)

        def checked() -> np.ndarray[Any, Any]:
            header = parse_header(os.pread(obj.fd, head_len, 0), url)
            if header.data_offset > head_len:  # a header longer than a page
                got = self._get_ranges([(key, 0, header.data_offset, meta.etag or None)])
                header = parse_header(bytes(got[0][0]), url)
            return npy_array(url, size, header, dtype, shape, mapped)

        def mapped() -> np.ndarray[Any, Any]:
            raw = map_fd(obj.fd, size, advice=MADV_SEQUENTIAL if sequential else MADV_RANDOM, name=url)
            base = address(raw)
            self.fetcher.add(Region(base, base + size, obj, key, meta.etag), raw.base if raw.base is not None else raw)
            return raw

        if obj.present(0, head_len):
            with contextlib.suppress(CorruptionError):  # maybe only the node cache's copy is damaged: fetched anew
                return checked()
        got = self._get_ranges([(key, 0, head_len, meta.etag or None)])
        self.cache.reserve(int(np.count_nonzero(obj.bits[: -(-head_len // PAGE)] == 0)) * PAGE)  # (new pages only)
        obj.fill(0, got[0][0])  # (over the node's copy, for every process on the node)
        return checked()

    def fetch_descriptors(self, names: Sequence[str], crcs: Sequence[int]) -> None:
        """Fetch the descriptors of shards ``names`` whose copy in the mirror is missing or does not have
        its CRC-32 ``crcs``, all in one wave (for ``info`` and ``verify``, which read every shard's descriptor)."""
        assert self.mirror is not None
        todo = [n for n, crc in zip(names, crcs) if not _intact(self.mirror / n / DESCRIPTOR, crc)]
        for lo in range(0, len(todo), 4096):
            part = todo[lo : lo + 4096]
            got = self.client.get_ranges([(f"{n}/{DESCRIPTOR}", 0, -1, None) for n in part], missing_ok=True)
            for n, (data, meta) in zip(part, got):
                if meta is not None:  # (missing: the reader reports it, naming the descriptor)
                    self._write(self.mirror / n / DESCRIPTOR, bytes(data))

    def materialize(self, keys: Sequence[str]) -> None:
        """Fetch the whole objects ``keys`` into the cache and link them into the mirror under their
        names, so that code reading local files (``verify``) reads them. Missing objects stay missing."""
        assert self.mirror is not None
        for key in keys:
            try:
                meta = self._meta(key)
            except CorruptionError:
                continue
            if _pages(meta.size) > self.cache.budget:  # (its own pages would be evicted as it is written)
                raise ValueError(
                    f"{self.client.key_url(key)}: {meta.size} bytes, more than the node cache's budget "
                    f"({self.cache.budget} bytes, {self.cache.root}) holds whole; raise cache_bytes (or "
                    "SEQSTORE_CACHE_BYTES) to read it as a whole file"
                )
            obj = self.cache.object(self.client.key_url(key), meta.etag, meta.size)
            whole = np.array([0], np.int64), np.array([max(meta.size, 1)], np.int64)
            self._fill(key, meta.etag, obj, *obj.missing(*whole))  # (bounded: ``verify`` never hangs)
            link = self.mirror / key
            link.parent.mkdir(parents=True, exist_ok=True)
            tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}-{threading.get_ident()}")  # (of this thread)
            tmp.unlink(missing_ok=True)
            os.symlink(obj.data_path, tmp)
            os.replace(tmp, link)

    def refetch(self, keys: Sequence[str], spans: Mapping[str, tuple[Any, Any]] | None = None) -> None:
        """Mark the pages of the node cache's entries of objects ``keys`` absent and fetch them again:
        their bytes are fetched anew, over a copy found damaged (for every process on the node), and
        :meth:`materialize` links them. A copy this process still maps that is no longer the entry (evicted
        since, or made anew by another process) is fetched again too: a read retried after this reads
        through the mapping it has. An object larger than half the cache's budget is not made whole (it
        would not fit): only the pages each copy held are fetched again, the rest as reads need them.
        ``spans``: for the objects it names, the byte ranges ``(starts, ends)`` known damaged (the records
        that failed their checksums): only their pages are fetched again, nothing is linked.
        Pages another process of the node claims are left to it: it is fetching them now (they are waited
        for), or fetched them within its claim's time (they are as fresh as this fetch would make them), so
        two processes refetching one object at once fetch it once."""
        for key in keys:
            meta = self._meta(key)
            entry = self.cache.object(self.client.key_url(key), meta.etag, meta.size)
            copies = {id(entry): entry}
            copies.update((id(r.obj), r.obj) for r in self.fetcher.regions() if r.key == key and r.etag == meta.etag)
            part = None if spans is None else spans.get(key)
            if part is not None:
                part = page_runs(np.minimum(part[0], meta.size), np.minimum(part[1], meta.size))
                part = part[0], np.minimum(part[1], meta.size)  # (the last page of the object ends where it does)
            fits = part is None and _pages(meta.size) <= self.cache.budget // 2
            whole = np.array([0], np.int64), np.array([meta.size], np.int64)
            for obj in copies.values():
                runs = part if part is not None else whole if fits else obj.held()
                pages = run_pages(*runs)
                drop = pages[self.fetcher.take(obj, pages)]  # (claimed by this process until they arrive)
                if obj is entry:  # its pages are counted in the cache's budget: not counted twice by the fetch
                    self.cache.release(int(np.count_nonzero(obj.bits[drop])) * PAGE)
                obj.bits[drop] = 0
                self._fill(key, meta.etag, obj, *obj.missing(*runs))
            if fits:
                self.materialize([key])

    def _fill(self, key: str, etag: str, obj: Any, starts: np.ndarray[Any, Any], ends: np.ndarray[Any, Any]) -> None:
        """Fetch the page-aligned byte runs ``[starts[i], ends[i])`` of object ``key`` into its cache entry
        ``obj``, in waves that each fit the cache's budget (one wave where it is large), waiting for each;
        pages another process of the node claims are waited for, and fetched here where they do not arrive
        (bounded: no hang)."""
        step = max(PAGE, min(MOST, self.cache.budget // 4) // PAGE * PAGE)
        most = max(step, self.cache.budget // 4)  # bytes a wave asks for at most
        url = self.client.key_url(key)
        for _ in range(_ROUNDS):  # (a round asks again for what other processes claimed and did not bring)
            runs = [(a, min(a + step, e)) for s0, e in zip(starts.tolist(), ends.tolist()) for a in range(s0, e, step)]
            waits, lo = [], 0
            while lo < len(runs):
                hi, total = lo + 1, runs[lo][1] - runs[lo][0]
                while hi < len(runs) and total + runs[hi][1] - runs[hi][0] <= most:
                    total += runs[hi][1] - runs[hi][0]
                    hi += 1
                wave, wait = self.fetcher.send(obj, key, etag, runs[lo:hi])
                if wave is not None:
                    self.client.answer(wave, url, hi - lo)
                if wait is not None:
                    waits.append(wait)
                lo = hi
            if not waits:
                return
            Ticket(waits, self.client.patience(), True, url).wait()  # (the others' waves: each bounded so)
            starts, ends = obj.missing(starts, ends)  # (another process's claim ran out, or its fetch failed)
            if not len(starts):
                return
        raise CorruptionError(f"{url}: bytes at {int(starts[0])} did not arrive in the cache (other processes of "
                              f"the node claimed them {_ROUNDS} times and did not bring them)")

    def _key(self, path: Path) -> str:
        """The object key of mirror path ``path`` (of this manifest version's mirror or an earlier one:
        a Store that refreshed keeps the shards it had mapped)."""
        for mirror in (self.mirror, *self._mirrors):
            if mirror is not None and path.is_relative_to(mirror):
                return path.relative_to(mirror).as_posix()
        raise ValueError(f"{path} is not in a mirror of {self.url}")


def _intact(path: Path, crc: int | None) -> bool:
    """Whether the node's copy ``path`` of a descriptor exists and, where its CRC-32 ``crc`` is known,
    has it (a copy left damaged, e.g. empty after a power cut, is fetched again, not blamed on the store)."""
    if crc is None:
        return path.exists()
    try:
        return zlib.crc32(path.read_bytes()) == crc
    except OSError:
        return False


def _pages(n: int) -> int:
    """``n`` rounded up to whole pages (what a file of ``n`` bytes takes on disk)."""
    return -(-n // PAGE) * PAGE
