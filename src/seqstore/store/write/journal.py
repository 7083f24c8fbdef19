"""Committing a distributed write's parts to a local store through a journal (docs/format.md, section 7.1).

:func:`commit_local_parts` (the caller holds the store's lock) writes ``_parts/.commit.json`` (where
every part shard goes, the table state the commit ends in) before it renames the part shards to
``shard-NNNNNN`` and writes their table rows; then it saves the manifest, the commit point. Whoever
takes the lock next and finds a journal (:func:`recover_batch_commit`) finishes the commit when the
manifest shows it (:func:`roll_forward`) or undoes it, so a crash at any step leaves all of the parts
committed or all of them pending.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CorruptionError
from ...format.descriptor import DESCRIPTOR
from ...format.manifest import COMMIT_JOURNAL, MANIFEST, PARTS_DIR, WORK_DIR, Manifest, fsync_dir
from ...format.shard_table import (
    TABLE,
    TABLE_HEADER_BYTES,
    TableState,
    encode_row,
    encode_table_header,
    row_dtype,
    shard_dir_name,
)
from ...schema import Schema
from ..directio import write_file
from .disk import append_row, maybe_merge_index, next_shard_number, remove_if_dead, write_json
from .target import COMMITTED_FILE, OWNER, PART_FILE, STAGED, Part, PartShard, check_part

__all__ = [
    "JOURNAL", "OLD_TABLE", "check_local_parts", "commit_local_parts", "discard_job", "recover_batch_commit",
    "remove_dead_temporaries", "roll_forward", "unlink_superseded",
]

log = logging.getLogger(__name__)


def unlink_superseded(root: Path, superseded: list[Path]) -> None:
    """Delete index-run files a commit's merge replaced (after the manifest that no longer lists them)."""
    for path in superseded:  # a crash before this leaves orphans, which the next writer deletes
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:  # committed already: leave it to the next writer's clean-up
            log.warning("%s: could not delete superseded index file %s (%r)", root, path, exc)


#: The journal of a multi-shard commit in progress (``_parts/.commit.json``).
JOURNAL = COMMIT_JOURNAL
#: During an overwrite commit: a hard link to the replaced shard table (``_parts/.old.tbl``).
OLD_TABLE = ".old.tbl"


def recover_batch_commit(root: Path) -> bool:
    """Finish or undo a multi-shard commit that died part way, as its journal (``_parts/``) says: the
    manifest's generation and table state say whether its commit point was reached. Caller holds the
    lock. O(1) when there is no journal (one ``stat``); returns whether there was one."""
    if not (root / PARTS_DIR / JOURNAL).exists():
        return False
    journal = json.loads((root / PARTS_DIR / JOURNAL).read_bytes())
    obj = json.loads((root / MANIFEST).read_bytes())  # not Manifest.load: the table may be the new one
    generation = obj.get("generation")
    if generation == journal["generation"] and obj.get("shard_table") == journal["table"]:
        log.warning("%s: finishing a commit of parts interrupted after its commit point", root)
        roll_forward(root, journal)
    elif generation == journal["base_generation"]:
        log.warning("%s: undoing a commit of parts interrupted before its commit point", root)
        _roll_back(root, journal)
    else:
        raise CorruptionError(
            f"{root / PARTS_DIR / JOURNAL}: commit journal of generation {journal['generation']} (from "
            f"{journal['base_generation']}) but manifest.json is at generation {generation}"
        )
    return True


def remove_dead_temporaries(root: Path) -> None:
    """Delete the temporary files ``_parts/.<name>.tmp-<pid>`` of the journal and of the staged schema
    that a driver which died before renaming them left (they are written under the store's lock, which
    the caller holds: none is a live one's). One listing of ``_parts/``: O(jobs)."""
    for tmp in (root / PARTS_DIR).glob(".*.tmp-*"):
        tmp.unlink(missing_ok=True)


def check_local_parts(root: Path, plist: list[Part], schema: Schema) -> list[tuple[Path, PartShard]]:
    """The parts' shard directories, once :func:`~seqstore.store.write.target.check_part` passed for each."""
    entries: list[tuple[Path, PartShard]] = []
    for p in plist:
        task_dir = root / PARTS_DIR / p.job / p.task
        done = task_dir / COMMITTED_FILE
        descs = [(str(task_dir / sh.dir / DESCRIPTOR), _read_or_none(task_dir / sh.dir / DESCRIPTOR))
                 for sh in p.shards]
        check_part(f"{task_dir} (part {p.task!r} of job {p.job!r})", p, schema,
                   done.read_bytes() if done.exists() else None, (task_dir / PART_FILE).exists(), None, descs)
        entries += [(task_dir / sh.dir, sh) for sh in p.shards]
    return entries


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def commit_local_parts(
    root: Path,
    manifest: Manifest,
    staged: dict[str, Any] | None,
    schema: Schema,
    plist: list[Part],
    entries: list[tuple[Path, PartShard]],
    overwrite: bool,
) -> int:
    assert manifest.table is not None
    old_state = manifest.table
    old_table = manifest.shard_table()
    ragged = tuple(n for n, f in schema.items() if f.ragged)
    first_number = next_shard_number(manifest)
    generation = manifest.generation + 1
    # an overwrite writes a new table file whose id (the new generation: unique within the store) the new
    # manifest names, so a reader pairing a manifest with the other file notices (format/shard_table.py)
    state = TableState(0, 0, 0, generation) if overwrite else old_state
    base_rows = state.rows
    start = state.records
    rows = bytearray()
    moves: list[tuple[str, str]] = []  # (part shard's directory, its name in the store)
    starts: list[int] = []
    for k, (src, sh) in enumerate(entries):
        number = first_number + k
        row = encode_row(number, start, sh.records, sh.has_ids, [sh.rows[r] for r in ragged], sh.desc_crc)
        rows += row
        state = state.after(row, sh.records)
        moves.append((src.relative_to(root).as_posix(), shard_dir_name(number)))
        starts.append(start)
        start += sh.records
    parts_dir = root / PARTS_DIR
    journal = {
        "mode": "overwrite" if overwrite else "append",
        "base_generation": manifest.generation,
        "generation": generation,
        "table": state.to_json(),
        "moves": moves,
        "tasks": [[p.job, p.task] for p in plist],
        "old_rows": old_state.rows if overwrite else 0,
        "first_number": first_number,
        "staged": staged is not None,
    }
    parts_dir.mkdir(exist_ok=True)  # (no part ever staged here: a commit of none)
    # where the temporary manifest (and an overwrite's new table) is written, and a dead one's swept
    (root / WORK_DIR).mkdir(exist_ok=True)  # (a store written only by commit_parts has none yet)
    write_json(parts_dir / JOURNAL, journal)
    for src_rel, dst in moves:
        target = root / dst
        if target.exists():  # left by a committer that died: never listed in the table
            shutil.rmtree(target)
        os.rename(root / src_rel, target)
    fsync_dir(root)
    new_table: Path | None = None
    if overwrite:
        if (root / TABLE).exists():
            (parts_dir / OLD_TABLE).unlink(missing_ok=True)
            os.link(root / TABLE, parts_dir / OLD_TABLE)
            fsync_dir(parts_dir)
        new_table = root / WORK_DIR / f".{TABLE}.tmp-{os.getpid()}"
        write_file(new_table, encode_table_header(len(ragged), state.id) + bytes(rows))
        manifest.index_runs = []
        manifest.schema = schema
        if staged is not None:
            manifest.id_lookup = str(staged["id_lookup"])
            if staged.get("metadata") is not None:
                manifest.metadata = dict(staged["metadata"])
    elif rows:
        append_row(root, base_rows, bytes(rows), len(ragged), state.id)
    superseded: list[Path] = []
    if entries and entries[0][1].has_ids:
        tag = f"-g{generation}" if overwrite else ""

        def locate(k: int) -> tuple[str, int]:
            if k >= base_rows:
                return moves[k - base_rows][1], starts[k - base_rows]
            return shard_dir_name(int(old_table.data["number"][k])), int(old_table.starts[k])

        for count in range(base_rows + 1, base_rows + len(entries) + 1):  # as one commit per shard would
            superseded += maybe_merge_index(root, manifest, count, locate, tag)
    if new_table is not None:  # last, so that readers meet a new table without its manifest only briefly
        os.replace(new_table, root / TABLE)
        fsync_dir(root)
    manifest.table = state
    manifest.generation = generation
    manifest.save(root)  # the commit point
    unlink_superseded(root, superseded)
    try:
        roll_forward(root, journal)
    except Exception as exc:  # noqa: BLE001 - committed all the same: an error would say it was not
        log.warning("%s: committed (manifest generation %d), but could not finish marking the parts committed "
                    "(%r); the next commit, writer or discard_parts of the store finishes it", root, generation, exc)
    return sum(sh.records for _, sh in entries)


def roll_forward(root: Path, journal: Mapping[str, Any]) -> None:
    """After the commit point: mark the parts committed, delete what an overwrite replaced, drop the
    journal. Idempotent (a crash part way is finished by the next holder of the lock)."""
    parts_dir = root / PARTS_DIR
    for job, task in journal["tasks"]:
        task_dir = parts_dir / job / task
        if task_dir.is_dir():
            write_json(task_dir / COMMITTED_FILE, {"generation": journal["generation"]})
            (task_dir / PART_FILE).unlink(missing_ok=True)
            (task_dir / OWNER).unlink(missing_ok=True)
    if journal["mode"] == "overwrite":
        old = parts_dir / OLD_TABLE
        if old.exists() and journal["old_rows"]:
            with open(old, "rb") as f:
                ragged = struct.unpack_from("<I", f.read(TABLE_HEADER_BYTES), 16)[0]
            numbers = np.fromfile(old, dtype=row_dtype(ragged), count=int(journal["old_rows"]),
                                  offset=TABLE_HEADER_BYTES)["number"]
            for number in numbers.tolist():
                if number < int(journal["first_number"]):
                    shutil.rmtree(root / shard_dir_name(int(number)), ignore_errors=True)
        old.unlink(missing_ok=True)
        if journal.get("staged"):
            (parts_dir / STAGED).unlink(missing_ok=True)
    (parts_dir / JOURNAL).unlink(missing_ok=True)
    fsync_dir(parts_dir)


def _roll_back(root: Path, journal: Mapping[str, Any]) -> None:
    """Before the commit point: put the shards back into their parts (and an overwrite's old table)."""
    parts_dir = root / PARTS_DIR
    old = parts_dir / OLD_TABLE
    if journal["mode"] == "overwrite" and old.exists():
        os.replace(old, root / TABLE)
    for tmp in (root / WORK_DIR).glob(f".{TABLE}.tmp-*"):  # an overwrite's new table, not yet in place
        tmp.unlink(missing_ok=True)
    for src_rel, dst in reversed(journal["moves"]):
        src, target = root / src_rel, root / dst
        if target.is_dir() and not src.exists() and src.parent.is_dir():
            os.rename(target, src)
    fsync_dir(root)
    (parts_dir / JOURNAL).unlink(missing_ok=True)
    fsync_dir(parts_dir)


def discard_job(job_dir: Path) -> bool:
    """Delete a job's parts directory, but not the tasks whose PartWriter is alive (warned about);
    returns whether it is gone."""
    while True:  # (again where a task started after the scan: its directory is never removed whole)
        if not job_dir.is_dir():
            return True
        live = []
        for entry in os.scandir(job_dir):
            if not entry.is_dir(follow_symlinks=False):
                Path(entry.path).unlink(missing_ok=True)
            elif not remove_if_dead(Path(entry.path)):
                live.append(entry.name)
        if live:
            log.warning("%s: left %d task(s) with a live PartWriter: %s", job_dir, len(live), sorted(live)[:5])
            return False
        try:
            job_dir.rmdir()
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            continue
        return True
