"""Distributed writes (the module path the engines and docs use): see store/write/parts.py."""

from .write.parts import (
    PARTS_DIR,
    Part,
    PartShard,
    PartWriter,
    clean_parts,
    commit_parts,
    discard_parts,
    pending_jobs,
    prepare_store,
    remove_if_empty,
    unstage,
)

__all__ = ["PARTS_DIR", "Part", "PartShard", "PartWriter", "clean_parts", "commit_parts", "discard_parts",
           "pending_jobs", "prepare_store", "remove_if_empty", "unstage"]
