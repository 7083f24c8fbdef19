"""What the object-storage fixtures (moto's S3, Azurite, fake-gcs-server and the GCS XML server) share:
fresh bucket names, uploading a local store with its manifest last, listing by a plain key prefix,
stopping an emulator's process."""

from __future__ import annotations

import itertools
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_names = itertools.count()


def fresh_name(prefix: str) -> str:
    """A bucket or container name not used before in this process (3-63 lower-case letters, digits,
    hyphens: what S3, GCS and Azure all accept)."""
    return f"{prefix}-{next(_names)}-{uuid.uuid4().hex[:12]}".lower()[:63]


def files_manifest_last(root: Path) -> Iterator[tuple[str, Path]]:
    """``(relative path, path)`` of every file under ``root``, sorted, a top-level ``manifest.json`` last
    (a reader never sees a manifest whose files are not there yet)."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*") if p.is_file())
    files.sort(key=lambda rp: rp[0] == "manifest.json")  # stable: manifest.json last
    yield from files


def upload_tree(put: Callable[[str, bytes], Any], local: str | os.PathLike[str], prefix: str) -> str:
    """``put(key, data)`` every file under ``local`` as ``prefix/<relative path>``, manifest last; returns
    ``prefix`` without slashes at its ends."""
    prefix = prefix.strip("/")
    for rel, path in files_manifest_last(Path(local)):
        put(f"{prefix}/{rel}" if prefix else rel, path.read_bytes())
    return prefix


def keys_under(store: Any, prefix: str) -> dict[str, int]:
    """``{key: size}`` of the objects of obstore store ``store`` whose key starts with ``prefix`` (a plain
    string prefix, as in S3's ListObjectsV2; obstore's own ``prefix`` matches whole path segments only)."""
    import obstore

    folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
    out: dict[str, int] = {}
    for page in obstore.list(store, prefix=folder or None):
        for meta in page:
            if meta["path"].startswith(prefix):
                out[meta["path"]] = int(meta["size"])
    return out


def stop_child(proc: subprocess.Popen[Any]) -> None:
    """Terminate ``proc``, kill it if it has not exited after 10 s, and reap it."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
