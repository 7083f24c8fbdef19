"""``seqstore.copy``: copy a store between local directories and object storage, shard by shard in
parallel, resumable, checksummed on arrival (docs/remote.md, "Copying stores", says what is copied,
checked and skipped).

The source is walked through what it commits (manifest, table rows, descriptors), never listed. Order
of writes: each shard's files, each checked against its CRC-32 before it is completed (a streamed
upload is not completed, a local file not renamed into place), then its descriptor last, so a
descriptor at the destination means the files beside it were checked (a resumed copy skips that
shard after a size check). Then the index runs, the table rows, and ``manifest.json`` last, written
conditionally (``If-Match`` on the ETag read at the start, create-only when there was none; locally
under the store's lock: a copy adding shards to a local store stages them in its directory of ``_tmp/``
and takes the lock only to check the manifest and move them in, so that store's writers go on meanwhile;
one creating or replacing a store holds the lock throughout): a reader sees the old store or none,
never a partial one, and a commit made meanwhile is never silently replaced.
A destination store is updated in place only when it is a prefix of the source (its readers keep
working); anything else needs ``overwrite=True``, which first deletes the destination's manifest and,
before the new one is written (while no writer can open a store there), the replaced store's files
that the new store does not use.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import json
import os
import sys
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..errors import ConflictError, CorruptionError, FormatError, RemoteNotFound, SeqstoreError
from ..format.checksums import CHECKS
from ..format.descriptor import DESCRIPTOR, parse_descriptor
from ..format.manifest import MANIFEST, FileInfo, Manifest, ShardInfo
from ..format.npy import NpyHeader, parse_header
from ..format.shard_table import TABLE
from ..schema import Schema
from .describe import human_bytes
from .write.api import open_target
from .write.state import LocalObjects, StoreState, manifest_bytes, read_state

__all__ = ["CHUNK", "CopyResult", "copy"]

#: Bytes per streamed chunk (and the largest file written with a single request).
CHUNK = 8 << 20
_WINDOW = 3  # chunk requests in flight per file being read from object storage


@dataclass(frozen=True)
class CopyResult:
    """What :func:`copy` did: ``shards`` in the store, ``copied`` by this call, ``skipped`` because they
    were complete at the destination already (a resumed or repeated copy); ``files`` and ``bytes``
    transferred (data files, descriptors, index runs, table and manifest)."""

    src: str
    dst: str
    shards: int
    copied: int
    skipped: int
    files: int
    bytes: int


class _DataCrc:
    """CRC-32 of a ``.npy`` file's data bytes (everything after its header), fed the file in order;
    :meth:`finish` checks it and the size against what the store records. The header (not under the
    CRC) must describe the data that follows it and, where ``layout`` gives them, the dtype and shape
    the store says the file holds."""

    def __init__(self, where: str, size: int, crc: int | None,
                 layout: tuple[np.dtype[Any], tuple[int, ...]] | None = None) -> None:
        self.where, self.size, self.want, self.layout = where, size, crc, layout
        self.head = bytearray()
        self.offset: int | None = None
        self.crc = self.seen = 0

    def update(self, chunk: bytes | memoryview) -> None:
        self.seen += len(chunk)
        if self.seen > self.size:
            raise CorruptionError(f"{self.where}: more than the {self.size} bytes the store records")
        if self.offset is not None:
            if self.want is not None:
                self.crc = zlib.crc32(chunk, self.crc)
            return
        self.head += chunk
        off = _data_offset(self.head, self.where)
        if off is not None and len(self.head) >= off:
            self._check_header(parse_header(bytes(self.head[:off]), self.where))
            self.crc = zlib.crc32(memoryview(self.head)[off:])
            self.offset = off
            self.head = bytearray()

    def _check_header(self, h: NpyHeader) -> None:
        if self.layout is not None and (h.dtype, h.shape) != self.layout:
            dtype, shape = self.layout
            raise CorruptionError(f"{self.where}: header says dtype {h.dtype.str} shape {h.shape}, the store records "
                                  f"dtype {dtype.str} shape {shape}; nothing was written for this file")
        if h.data_offset + h.data_bytes != self.size:
            raise CorruptionError(f"{self.where}: header describes {h.data_offset + h.data_bytes} bytes, the store "
                                  f"records {self.size}; nothing was written for this file")

    def finish(self) -> None:
        if self.seen != self.size:
            raise CorruptionError(f"{self.where}: {self.seen} bytes, the store records {self.size} (truncated?)")
        if self.offset is None:
            raise CorruptionError(f"{self.where}: truncated .npy header")
        if self.want is not None and self.crc != self.want:
            raise CorruptionError(
                f"{self.where}: CRC-32 {self.crc:#010x} of the data differs from the store's {self.want:#010x} "
                "(damaged in storage or in transit); nothing was written for this file"
            )


def _layout(schema: Schema, info: ShardInfo) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]]:
    """The dtype and shape of each field's (and packed group's) files in a shard of ``info.records`` records."""
    n, out = info.records, {}
    for name, f in schema.storage_units():
        out[f"{name}.npy"] = (f.storage_dtype, (info.rows[name] if f.ragged else n, *f.inner_shape))
        if f.ragged:
            out[f"{name}.offsets.npy"] = (np.dtype("<i8"), (n + 1,))
    return out


def _data_offset(head: bytes | bytearray, where: str) -> int | None:
    """Where the data of a ``.npy`` file starts, from its first bytes (None: not enough of them yet)."""
    if len(head) < 12:
        return None
    if bytes(head[:6]) != b"\x93NUMPY":
        raise CorruptionError(f"{where}: not a .npy file (bad magic)")
    if head[6] == 1:
        return 10 + int.from_bytes(head[8:10], "little")
    if head[6] in (2, 3):
        return 12 + int.from_bytes(head[8:12], "little")
    raise CorruptionError(f"{where}: unsupported .npy format version {head[6]}")


def _read_chunks(objs: Any, key: str, size: int) -> Iterator[bytes | memoryview]:
    """The bytes of ``key`` in order, in chunks of at most CHUNK; checks the object's size is ``size``."""
    if isinstance(objs, LocalObjects) or size == 0:
        actual = objs.head(key).size
        if actual != size:
            raise CorruptionError(f"{objs.key_url(key)}: {actual} bytes, the store records {size}")
        if isinstance(objs, LocalObjects):
            yield from objs.read_chunks(key, CHUNK)
        return
    data, meta = objs.get_ranges([(key, 0, min(CHUNK, size), None)])[0]
    if meta is not None and meta.size != size:
        raise CorruptionError(f"{objs.key_url(key)}: {meta.size} bytes, the store records {size}")
    etag = meta.etag if meta is not None and meta.etag else None
    yield data
    pending: collections.deque[Any] = collections.deque()
    pos = len(data)
    try:
        while pos < size or pending:
            while pos < size and len(pending) < _WINDOW:
                end = min(pos + CHUNK, size)
                pending.append(objs.submit([(key, pos, end, etag)]))  # conditional: the same object
                pos = end
            answers = objs.answer(pending.popleft(), objs.key_url(key))  # bounded: a stuck thread is an error
            yield answers[0][0]
    finally:
        for f in pending:
            f.cancel()


class _Copier:
    def __init__(self, src: Any, dst: Any, state: StoreState, bar: Any) -> None:
        self.src, self.dst, self.s, self.bar = src, dst, state, bar
        self.lock = threading.Lock()
        self.files = self.bytes = self.copied = self.skipped = 0

    def _count(self, files: int, nbytes: int) -> None:
        with self.lock:
            self.files += files
            self.bytes += nbytes
        if self.bar is not None:
            self.bar.set_postfix_str(f"{human_bytes(self.bytes)}", refresh=False)

    def copy_file(self, key: str, size: int, crc: int | None,
                  layout: tuple[np.dtype[Any], tuple[int, ...]] | None = None) -> None:
        where = self.src.key_url(key)

        def chunks() -> Iterator[bytes]:
            acc = _DataCrc(where, size, crc, layout)
            for c in _read_chunks(self.src, key, size):
                acc.update(c)
                yield bytes(c)
            acc.finish()  # raises before the upload is completed / the file renamed into place

        if size <= CHUNK:
            self.dst.put(key, b"".join(chunks()))
        else:
            self.dst.put_stream(key, chunks)
        self._count(1, size)

    def _sizes_match(self, name: str, files: Mapping[str, FileInfo]) -> bool:
        sizes = {m.key: m.size for m in self.dst.list(f"{name}/")}
        return all(sizes.get(f"{name}/{rel}") == fi.bytes for rel, fi in files.items())

    def shard(self, k: int) -> None:
        s = self.s
        name = s.name(k)
        dkey = f"{name}/{DESCRIPTOR}"
        if s.v3:
            row = s.row(k)
            try:
                desc = bytes(self.src.get(dkey)[0])
            except RemoteNotFound:
                raise CorruptionError(f"{self.src.key_url(dkey)}: shard descriptor is missing (the shard table "
                                      f"lists {name})") from None
            info = parse_descriptor(desc, self.src.key_url(dkey), name, row, s.expected_files(row.has_ids))
            try:
                complete = bytes(self.dst.get(dkey)[0]) == desc
            except RemoteNotFound:
                complete = False
            complete = complete and self._sizes_match(name, info.files)
        else:
            info = s.manifest.shards[k]
            complete = self._complete_v12(name, info.files)
        if not complete:
            layout = _layout(s.manifest.schema, info)
            for rel, fi in sorted(info.files.items()):
                self.copy_file(f"{name}/{rel}", fi.bytes, fi.crc32, layout.get(rel))
            if s.v3:
                self.dst.put(dkey, desc)  # last: the shard is complete at the destination
                self._count(1, len(desc))
        with self.lock:
            self.skipped += complete
            self.copied += not complete
        if self.bar is not None:
            self.bar.update(1)

    def _complete_v12(self, name: str, files: Mapping[str, FileInfo]) -> bool:
        if not self._sizes_match(name, files):
            return False
        for rel, fi in files.items():  # no descriptor marks the shard complete: check what is there
            key = f"{name}/{rel}"
            acc = _DataCrc(self.dst.key_url(key), fi.bytes, fi.crc32)
            try:
                for c in _read_chunks(self.dst, key, fi.bytes):
                    acc.update(c)
                acc.finish()
            except (CorruptionError, RemoteNotFound):
                return False
        return True


def _is_prefix(d: StoreState, s: StoreState) -> bool:
    """Whether the store ``d`` is an earlier state of ``s``: same schema and layout, and its committed
    shards are exactly the first ones of ``s`` (so copying ``s`` over it leaves every object a reader
    of ``d`` uses as it is, bar a shard table that only grows)."""
    dm, sm = d.manifest, s.manifest
    if dm.schema != sm.schema or dm.id_lookup != sm.id_lookup or d.v3 != s.v3 or d.num_shards > s.num_shards:
        return False
    if s.v3:
        if d.num_shards and d.header != s.header:
            return False
        return d.rows.tobytes() == s.rows[: d.num_shards].tobytes()
    return list(dm.shards) == list(sm.shards[: d.num_shards])


def copy(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    src_options: Mapping[str, Any] | None = None,
    dst_options: Mapping[str, Any] | None = None,
    workers: int = 8,
    progress: bool = False,
    overwrite: bool = False,
) -> CopyResult:
    """Copy the store at ``src`` to ``dst``: local path to URL, URL to local path, URL to URL (or path
    to path). See the module documentation for what is checked and in which order things are written.

    ``src_options`` / ``dst_options``: each end's ``storage_options`` (as :func:`seqstore.open` takes
    them). ``workers``: shards copied at once. ``progress``: a progress bar (tqdm, on stderr).
    ``overwrite``: replace a destination store that is not an earlier state of the source (without it
    such a destination is an error). Rerunning a copy that was interrupted, or copying again after the
    source grew, transfers only the shards the destination lacks. Returns a :class:`CopyResult`.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    src_text, dst_text = os.fspath(src), os.fspath(dst)
    s_objs = open_target(src, src_options, writing=False, what="source").objects()  # LocalObjects or ObjectClient
    d_objs = open_target(dst, dst_options, writing=False, what="destination").objects()
    local = isinstance(s_objs, LocalObjects), isinstance(d_objs, LocalObjects)
    v12 = False  # a failed copy adding shards to a version-1/2 store removes what it staged (no writer would)
    try:
        same = s_objs.root.resolve() == d_objs.root.resolve() if all(local) else s_objs.url == d_objs.url
        if same and all(local) == any(local):  # (both local, or both remote)
            raise ValueError(f"{src_text}: source and destination are the same store")
        if all(local) and d_objs.root.resolve().is_relative_to(s_objs.root.resolve()):
            raise ValueError(f"{dst_text}: the destination is inside the source store {src_text}")
        if local[1]:
            _check_local_destination(d_objs.root)
        try:
            s = read_state(s_objs)
        except OSError as exc:
            raise _unreadable(s_objs, exc) from exc
        if s is None:
            raise FormatError(f"{src_text}: no seqstore store here ({MANIFEST} does not exist)")
        # a local store the copy adds shards to: its writers go on meanwhile; else they wait for the copy
        staged = _stages(d_objs, s) if local[1] else None
        v12 = staged is not None and not s.v3
        with d_objs.locked() if local[1] and staged is None else contextlib.nullcontext():
            result = _copy(s_objs, d_objs, s, src_text, dst_text, workers, progress, overwrite, staged=staged)
        v12 = False
        return result
    finally:
        for objs in (s_objs, d_objs):
            if isinstance(objs, LocalObjects):
                objs.close(keep_staged=not v12)


def _unreadable(objs: Any, exc: OSError) -> FormatError:
    """A local manifest that cannot be read (a directory, a store path that is a file): the FormatError
    :func:`seqstore.open` raises, naming it."""
    return FormatError(f"{objs.key_url(MANIFEST)}: cannot read ({exc.strerror or exc})")


def _stages(d_objs: LocalObjects, s: StoreState) -> str | None:
    """Where the local destination holds an earlier state of the source ``s``, the ETag of its manifest: then
    the copy stages the shards and index runs it adds (:meth:`LocalObjects.stage`) and takes the store's lock
    only to commit them, if the manifest is still that one. None: the copy holds the lock throughout."""
    try:
        d = read_state(d_objs)
    except (OSError, SeqstoreError):
        return None  # (reported under the lock)
    if d is None or not _is_prefix(d, s):
        return None
    old = {r.name for r in d.manifest.index_runs}
    d_objs.stage([*(s.name(k) for k in range(d.num_shards, s.num_shards)),
                  *(r.name for r in s.manifest.index_runs if r.name not in old)])
    return d.etag


def _check_local_destination(root: Path) -> None:
    """A local destination is a store, an interrupted copy's files, or nothing: never another directory."""
    if not root.exists() or (root / MANIFEST).exists():
        return
    if not root.is_dir():
        raise SeqstoreError(f"{root}: exists and is not a directory")
    ours = (TABLE, "_shards", "_index", "_tmp", "_parts", ".lock")  # (and versions 1/2: workspaces, manifests)
    other = [e for e in os.listdir(root) if not (e.startswith(("shard-", "_tmp-", f".{MANIFEST}.tmp-")) or e in ours)]
    if other:
        raise SeqstoreError(
            f"{root}: refusing to copy into a non-empty directory that is not a store (it holds {sorted(other)[:5]})"
        )


def _copy(s_objs: Any, d_objs: Any, s: StoreState, src_text: str, dst_text: str, workers: int, progress: bool,
          overwrite: bool, *, staged: str | None = None) -> CopyResult:
    try:
        d: StoreState | None = read_state(d_objs)
        d_error: Exception | None = None
    except (CorruptionError, FormatError) as exc:
        d, d_error = None, exc
    except OSError as exc:  # (not a store that overwrite could replace either)
        raise _unreadable(d_objs, exc) from exc
    mode: str | dict[str, Any] = "create"
    old_runs: list[str] = []
    replaced: StoreState | None = None  # the store the copy replaces: its files go once the copy is committed
    if staged is not None and (d is None or d.etag != staged):  # (a writer committed since _stages read it)
        raise _changed(dst_text)
    if d is not None and _is_prefix(d, s):
        mode = {"e_tag": d.etag}
        old_runs = [r.name for r in d.manifest.index_runs]
    elif d is not None or d_error is not None:
        why = str(d_error) if d_error is not None else "not an earlier state of the source"
        if not overwrite:
            raise SeqstoreError(
                f"{dst_text}: already holds a different store ({why}); pass overwrite=True to replace it"
            )
        d_objs.delete(MANIFEST)  # readers see no store from here until the new manifest is written
        replaced = d
    if not d_objs.conditional_writes() and isinstance(mode, dict):
        mode = "overwrite"

    bar = tqdm(total=s.num_shards, unit="shard", desc="copy", file=sys.stderr) if progress else None
    copier = _Copier(s_objs, d_objs, s, bar)
    try:
        _run_shards(copier, s.num_shards, workers)
        manifest_raw = _copy_runs(copier, s, set(old_runs))
        if s.v3 and s.num_shards:
            key = TABLE if isinstance(d_objs, LocalObjects) else s.table_key
            table = s.header + s.rows.tobytes()
            if key != s.table_key:  # a local store appends to _shards.tbl in place: name it
                obj = json.loads(manifest_raw)
                obj["shard_table"]["file"] = key
                manifest_raw = json.dumps(obj, separators=(",", ":")).encode()
        else:
            key, table = "", b""
        kept = {r.name for r in Manifest.parse(manifest_raw, d_objs.key_url(MANIFEST)).index_runs}
        if replaced is not None:  # before the new manifest: no writer can have opened the new store yet
            _remove_leftovers(d_objs, replaced, s, key, kept, workers)
        replaced_runs = [f"{name}{suffix}" for name in old_runs if name not in kept
                         for suffix in (".hash.npy", ".rows.npy")]
        try:
            if isinstance(d_objs, LocalObjects):  # the table is replaced in place: under the lock, checked
                d_objs.commit([(key, table)] if key else [], manifest_raw, mode, replaced_runs)
                replaced_runs = []  # (deleted under the lock: a writer's merge may make a run of that name next)
            else:  # a remote table object is never appended to: replacing it keeps the prefix readers use
                if key:
                    d_objs.put(key, table)
                d_objs.put(MANIFEST, manifest_raw, mode=mode)
        except ConflictError as exc:
            if not (exc.attempts > 1 and manifest_bytes(d_objs) == manifest_raw):  # (else our own write, retried)
                raise _changed(dst_text) from None
        copier._count(2 if key else 1, len(table) + len(manifest_raw))
        for run_key in replaced_runs:  # runs the new manifest replaced (a reader falls back to the shard indexes)
            with contextlib.suppress(OSError, SeqstoreError):
                d_objs.delete(run_key)
    finally:
        if bar is not None:
            bar.close()
    return CopyResult(src_text, dst_text, s.num_shards, copier.copied, copier.skipped, copier.files, copier.bytes)


def _changed(dst_text: str) -> SeqstoreError:
    return SeqstoreError(f"{dst_text}: its manifest changed while the copy ran (another writer or copy committed); "
                         "the store was not replaced: run the copy again (a store that is no longer an earlier "
                         "state of the source needs overwrite=True)")


def _shard_files(st: StoreState, k: int) -> set[str]:
    """The files (relative to its directory) that shard ``k`` of the store ``st`` may have."""
    if st.v3:
        return {*st.expected_files(bool(int(st.rows["flags"][k]) & 1)), CHECKS, DESCRIPTOR}
    return set(st.manifest.shards[k].files)


def _remove_leftovers(objs: Any, old: StoreState, new: StoreState, table: str, runs: set[str], workers: int) -> None:
    """Delete what the store ``old`` had at ``objs`` that the store ``new``, copied over it and about to be
    committed (its shard table ``table``, "" for none, and index runs ``runs``), does not use: the shards it does
    not have (a larger store replaced by a smaller one), the files of a shard it has that it does not
    (fields of another schema, ids), the old index runs and shard table. Locally, the directories left
    empty go too. Best effort: what cannot be deleted stays (no file the new store uses is touched).
    O(old shards) deletes, ``workers`` at once, and O(new shards) memory."""
    at = {new.name(k): k for k in range(new.num_shards)}
    keys: list[str] = []
    for k in range(old.num_shards):
        name = old.name(k)
        j = at.get(name)
        keys.extend(f"{name}/{rel}" for rel in sorted(_shard_files(old, k) - (set() if j is None else
                                                                                 _shard_files(new, j))))
    keys.extend(f"{r.name}{suffix}" for r in old.manifest.index_runs if r.name not in runs
                for suffix in (".hash.npy", ".rows.npy"))
    if old.v3 and old.num_shards and old.table_key != table:
        keys.append(old.table_key)

    def delete(key: str) -> None:
        with contextlib.suppress(OSError, SeqstoreError):
            objs.delete(key)

    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="seqstore-copy") as pool:
        list(pool.map(delete, keys))
    if isinstance(objs, LocalObjects):  # directories emptied (a shard's, a nested field's, _index/)
        dirs = {p for key in keys for p in Path(key).parents if p != Path(".")}
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(objs.root / d)


def _run_shards(copier: _Copier, count: int, workers: int) -> None:
    """Copy shards ``0 .. count-1`` with ``workers`` threads, at most ``2 * workers`` submitted at once.

    The pool is driven from a thread of its own; this thread waits for it by polling a flag, with no lock
    involved: Ctrl-C (KeyboardInterrupt here) must not land inside lock handling (an interrupted
    ``concurrent.futures.wait`` can leave a future's lock held; an interrupted ``Thread.join`` on Python
    3.11 marks a running thread as ended). The interrupt stops the scheduling, the queued shards are
    dropped, the ones being copied finish, and then it is raised."""
    if count == 0:
        return
    stop = threading.Event()
    outcome: list[BaseException | None] = []

    def drive() -> None:
        try:
            _schedule_shards(copier, count, workers, stop)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
            outcome.append(exc)

    threading.Thread(target=drive, name="seqstore-copy-driver", daemon=True).start()
    try:
        while not outcome:
            time.sleep(0.02)
    except BaseException:
        stop.set()
        while not outcome:  # the shards in flight finish (a few seconds at most); a second Ctrl-C waits too
            try:
                time.sleep(0.02)
            except KeyboardInterrupt:
                pass
        raise
    if outcome[0] is not None:
        raise outcome[0]


def _schedule_shards(copier: _Copier, count: int, workers: int, stop: threading.Event) -> None:
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="seqstore-copy") as pool:
        pending: set[concurrent.futures.Future[None]] = set()
        failed: BaseException | None = None
        k = 0
        while (k < count or pending) and failed is None and not stop.is_set():
            while k < count and len(pending) < 2 * workers:
                pending.add(pool.submit(copier.shard, k))
                k += 1
            done, pending = concurrent.futures.wait(pending, timeout=0.2,
                                                    return_when=concurrent.futures.FIRST_COMPLETED)
            failed = next((f.exception() for f in done if f.exception() is not None), None)
        if stop.is_set():  # interrupted: the shards being copied finish, the queued ones are dropped
            for f in pending:
                f.cancel()
            return
        if failed is not None:  # (else every shard was copied: nothing is pending)
            raise failed


def _copy_runs(copier: _Copier, s: StoreState, present: set[str]) -> bytes:
    """Copy the merged id-index runs the manifest lists, skipping those of ``present`` (the runs an
    earlier state of the source at the destination lists) already there with the same size: a run's
    name fixes the shards it covers, so there the same name and size is the same run. Any other file
    of that name (a replaced store's run, an interrupted copy's) may hold other ids: it is sent again.
    A run whose files vanished from the source (merged into a bigger run by a writer since the manifest
    was read) is left out of the copy's manifest: runs are an accelerator, the shards' own indexes are
    authoritative. Returns the manifest bytes to write."""
    dropped = []
    for run in s.manifest.index_runs:
        for suffix in (".hash.npy", ".rows.npy"):
            key = f"{run.name}{suffix}"
            try:
                size = copier.src.head(key).size
            except RemoteNotFound:
                dropped.append(run.name)
                break
            with contextlib.suppress(RemoteNotFound):
                if run.name in present and copier.dst.head(key).size == size:
                    continue
            copier.copy_file(key, size, None)
    if not dropped:
        return s.raw
    obj = json.loads(s.raw)
    obj["index_runs"] = [r for r in obj.get("index_runs", []) if r.get("name") not in dropped]
    return json.dumps(obj, separators=(",", ":")).encode()
