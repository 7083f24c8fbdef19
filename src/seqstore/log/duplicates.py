"""What a :class:`~seqstore.log.Logger` knows of the ids it logged: :class:`LoggedIds`.

An id is "logged" when the store's lookup view has it (committed by any rank and seen) or when it is
in one of this logger's buffers that are not yet visible to that view (in flight). ``LoggedIds`` keeps
the in-flight ids (a count per id: the same id may be in flight twice under ``keep_last``), the buffers
handed to the background writer with their ids, and the last commit the view was refreshed for, and
decides per batch which records to write under the logger's ``on_duplicate`` policy (see
:mod:`seqstore.log.logger`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SchemaError
from ..format.manifest import MANIFEST
from ..store.reader import Store

if TYPE_CHECKING:
    from ._buffers import Buffer

__all__ = ["DUPLICATE_POLICIES", "DuplicateIdError", "LoggedIds"]

DUPLICATE_POLICIES = ("keep_first", "keep_last", "error")


class DuplicateIdError(SchemaError):
    """``on_duplicate="error"`` and a logged id was logged before."""


class LoggedIds:
    """The in-flight ids of one logger and its ``on_duplicate`` decision per batch."""

    def __init__(self, path: Path | str, policy: str) -> None:
        if policy not in DUPLICATE_POLICIES:
            raise ValueError(f"Logger {path}: on_duplicate must be one of {DUPLICATE_POLICIES}, got {policy!r}")
        self.path = path
        self.policy = policy
        self.inflight: dict[str, int] = {}  # id -> copies in buffers not yet visible to the view
        self.commit_asked = -1  # seq of the buffer an early commit was asked for, -1: none pending
        self._pending: list[tuple[int, list[str]]] = []  # (buffer seq, its ids), handed off, not yet visible
        self._seen_seq = -1
        self._manifest_sig: tuple[int, int, int] | None = None

    @property
    def lookup(self) -> str:
        """The store's ``id_lookup`` under this policy: ``index(id)`` gives the last record under keep_last."""
        return "last" if self.policy == "keep_last" else "first"

    def check_lookup(self, have: str) -> None:
        """:class:`SchemaError` when an existing store's ``id_lookup`` is not :attr:`lookup`."""
        if have != self.lookup:
            made_by = "on_duplicate='keep_last'" if have == "last" else "on_duplicate 'keep_first' or 'error'"
            raise SchemaError(
                f"{self.path}: this log was written with {made_by} (index(id) returns the {have} record of an "
                f"id), a Logger with on_duplicate={self.policy!r} cannot add to it; open it with {made_by} or "
                "log into a new store")

    def __len__(self) -> int:
        return len(self.inflight)

    def add(self, buf: Buffer) -> None:
        """The ids of ``buf``'s rows that are not in flight yet (from ``buf.added`` to ``buf.n``) went into
        it; ids past ``buf.n`` (an interrupted copy) are dropped. An interrupt (Ctrl-C) anywhere leaves the
        rest to the next call: each id's count and ``buf.added`` change with no call between them."""
        del buf.ids[buf.n :]
        ids, inflight = buf.ids, self.inflight
        for k in range(buf.added, buf.n):
            i = ids[k]
            c = inflight.get(i, 0) + 1
            inflight[i] = c; buf.added = k + 1  # noqa: E702 - one step: no interrupt between them

    def handed_off(self, seq: int, ids: list[str]) -> None:
        """The buffer ``seq`` holding ``ids`` went to the background writer (a repeated call for the
        same buffer, after an interrupted handoff, changes nothing)."""
        if not (self._pending and self._pending[-1][0] == seq):
            self._pending.append((seq, ids))

    def see_commits(self, view: Store, committed_seq: int) -> None:
        """Make ``view`` include what was committed up to buffer ``committed_seq`` (and what other ranks
        committed); drop those ids from the in-flight ones."""
        sig = None  # a remote store: other ranks' shards are seen at this rank's next commit
        try:  # every commit (any rank) renames a new manifest into place: a new inode
            if isinstance(self.path, Path):
                st = os.stat(self.path / MANIFEST)
                sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            sig = None
        if committed_seq > self._seen_seq or sig != self._manifest_sig:
            view.refresh()
            self._manifest_sig = sig
        if committed_seq > self._seen_seq:
            if 0 <= self.commit_asked <= committed_seq:
                self.commit_asked = -1
            while self._pending and self._pending[0][0] <= committed_seq:
                for i in self._pending.pop(0)[1]:
                    c = self.inflight.get(i, 0) - 1  # 0: an interrupt kept add() from counting it
                    if c > 0:
                        self.inflight[i] = c
                    else:
                        self.inflight.pop(i, None)
            self._seen_seq = committed_seq

    def check(self, view: Store, ids: list[str]) -> tuple[np.ndarray[Any, Any] | None, dict[str, int], int]:
        """Positions of the batch to write (None: all), the stats delta and the number skipped, per
        the policy; :class:`DuplicateIdError` under ``"error"``."""
        seen: set[str] = set()
        dup = np.zeros(len(ids), dtype=np.bool_)
        repeated = np.zeros(len(ids), dtype=np.bool_)  # an earlier position of this batch has the id
        for k, i in enumerate(ids):
            if i in seen:
                dup[k] = repeated[k] = True
            elif i in self.inflight:
                dup[k] = True
            seen.add(i)
        rest = np.flatnonzero(~dup)
        if len(rest) and len(view):
            if not view.manifest.has_ids:
                raise SchemaError(f"log(): {self.path}: its records have no ids; a Logger logs an id with every "
                                  "record (log into a new store)")
            found = view.index_many([ids[k] for k in rest], missing=-1)
            dup[rest[found >= 0]] = True
        ndup = int(dup.sum())
        if ndup == 0:
            return None, {}, 0
        if self.policy == "error":
            raise DuplicateIdError(self._message(ids, dup, repeated))
        if self.policy == "keep_last":
            return None, {"duplicates_superseded": ndup}, 0
        return np.flatnonzero(~dup), {"duplicates_skipped": ndup}, ndup

    def _message(self, ids: list[str], dup: np.ndarray[Any, Any], repeated: np.ndarray[Any, Any]) -> str:
        """What ``on_duplicate="error"`` says: ids logged before (committed or in flight) and ids
        repeated inside the batch, each named (the first 10 of each kind)."""
        logged = list(dict.fromkeys(ids[k] for k in np.flatnonzero(dup & ~repeated)))
        known = set(logged)
        again = list(dict.fromkeys(ids[k] for k in np.flatnonzero(repeated) if ids[k] not in known))
        parts = []
        if logged:
            parts.append(f"{len(logged)} id(s) already logged to {self.path}: {logged[:10]}")
        if again:
            parts.append(f"{len(again)} id(s) repeated inside this batch: {again[:10]}")
        return f"log(): {'; '.join(parts)}; nothing of this batch was logged (on_duplicate='error')"
