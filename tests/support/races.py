"""Two remote writers racing for one commit, with the loser decided: the test of conditional commits
on every object store (S3, Azure, GCS)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote


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
