"""Writing stores (the module path the code and docs use): the writer (store/write/writer.py), its
commit targets and ``create``/``append_to``/``open_or_create`` (store/write/api.py)."""

from ..format.manifest import IDS
from .write.api import append_to, create, existing_manifest, open_or_create
from .write.disk import INDEX_DIR, LOCK_FILE, MERGE_CHUNK, MERGE_FANIN, merge_sorted_runs, store_lock
from .write.writer import Writer

__all__ = ["IDS", "INDEX_DIR", "LOCK_FILE", "MERGE_CHUNK", "MERGE_FANIN", "Writer", "append_to", "create",
           "existing_manifest", "merge_sorted_runs", "open_or_create", "store_lock"]
