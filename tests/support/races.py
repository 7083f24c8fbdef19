"""Remote writers for the tests of commits on every object store (S3, Azure, GCS): small records to
append, two writers racing for one commit with the loser decided, two tasks' parts staged."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote


def write_schema() -> dict[str, Any]:
    """The schema of :func:`append_rows`' records: a ragged and a fixed field."""
    import seqstore as ss

    return {"x": ss.Field("float32", (None, 2)), "spk": ss.Field("int64")}


def row_ids(first: int, n: int) -> list[str]:
    """The ids :func:`append_rows` gives records ``first`` to ``first + n - 1``."""
    return [f"r{i:05d}" for i in range(first, first + n)]


def append_rows(writer: Any, first: int, n: int) -> None:
    """Append records ``first`` to ``first + n - 1`` (``spk`` = the number, ``x`` 0-2 rows of it)."""
    import numpy as np

    cols = {"x": [np.full((i % 3, 2), first + i, np.float32) for i in range(n)],
            "spk": np.arange(first, first + n, dtype=np.int64)}
    writer.append_batch(cols, ids=row_ids(first, n))


def commit_after(first: Any, second: Any, proxy: Any) -> None:
    """Commit writer ``second`` (whose client goes through FaultProxy ``proxy``) so that its committing
    write of ``manifest.json`` reaches the service only after writer ``first`` has committed: its
    conditional write then names an old version and is refused, and ``second`` must re-read and
    retry. Both writers are closed afterwards."""
    fired: list[int] = []

    def first_commits(req: Any) -> bool:
        # unquote: obstore's GCS client escapes every byte of a key but letters and digits ("%2F" for "/")
        if req.method == "PUT" and unquote(req.path).endswith("/manifest.json") and not fired:
            fired.append(1)
            first.commit()
        return False  # then forward the request

    proxy.fail(None, where=first_commits)
    second.commit()
    first.close()
    second.close()
    assert fired, "the second writer's commit never wrote manifest.json through the proxy"


def race(url: str, options: dict[str, Any], proxy_options: dict[str, Any], proxy: Any) -> tuple[Any, Any]:
    """Writers A (``options``) and B (``proxy_options``: through ``proxy``) append to the store at ``url``,
    A records 0-11, B records 100-108; B commits after A (:func:`commit_after`). Returns (A, B), closed."""
    import seqstore as ss

    a = ss.append_to(url, storage_options=options)
    b = ss.append_to(url, storage_options=proxy_options)
    append_rows(a, 0, 12)
    append_rows(b, 100, 9)
    commit_after(a, b, proxy)
    return a, b


def stage_parts(url: str, options: dict[str, Any], staging: Any) -> list[Any]:
    """A new store at ``url`` (``prepare_store``) and two task attempts' parts staged in it, not committed:
    records 0-8 and 100-112 in shards of at most 4 (7 shards in all). Returns the parts, in that order."""
    from seqstore.store.parts import PartWriter, prepare_store

    prepare_store(url, write_schema(), mode="create", storage_options=options)
    parts = []
    for task, (first, n) in (("t0", (0, 9)), ("t1", (100, 13))):
        with PartWriter(url, job="j", task=task, storage_options=options, staging_dir=staging,
                        max_shard_records=4) as w:
            append_rows(w, first, n)
            parts.append(w.finish())
    return parts


def lose_manifest_answer(monkeypatch: Any, which: Any) -> list[str]:
    """The first ``manifest.json`` write whose mode passes ``which(mode)`` reaches the service (obstore
    back end), then its answer is lost (a transient failure, as a connection reset would give): returns
    the list that receives its ETag when that happened."""
    from seqstore.io import objects, retry

    real_put = objects.ObstoreBackend.put
    lost: list[str] = []

    def put(self: Any, key: str, data: Any, mode: Any) -> str:
        etag = real_put(self, key, data, mode)
        if key == "manifest.json" and which(mode) and not lost:
            lost.append(etag)
            raise retry.Transient("connection reset before the answer (simulated)")
        return etag

    monkeypatch.setattr(objects.ObstoreBackend, "put", put)
    return lost
