"""A new store built aside and put at its place whole, for a writer that reads back what it committed
while it builds (the LogIX import's duplicate check, a similarity scan's scores): a local ``out`` is
built in a hidden sibling and renamed into place; a URL is built in a local temporary directory and
copied there once complete (:func:`~seqstore.store.copy.copy`: its manifest last). Either way a
failure leaves ``out`` as it was."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..io.local_source import local_path
from ..io.objects import is_remote
from .copy import copy
from .write.api import existing_manifest
from .write.outputs import OutputExistsError, check_output, replaced

__all__ = ["built_aside"]


@contextlib.contextmanager
def built_aside(out: str | os.PathLike[str], overwrite: bool, prefix: str,
                storage_options: Mapping[str, Any] | None = None) -> Iterator[Path]:
    """Where to build the new store ``out``, put at ``out`` when the block ends and deleted if it raises,
    so a failure leaves ``out`` as it was. A local ``out`` (a path or a ``file://`` URL): a hidden
    sibling, renamed into place; a URL of object storage (``storage_options``: its client's options):
    a local temporary directory (named ``prefix...``, room for the whole store needed there), copied
    to the URL. An existing store at ``out`` is refused at once (:class:`OutputExistsError`) unless
    ``overwrite``."""
    if not is_remote(out):
        root = local_path(out)
        check_output(root, overwrite)
        with replaced(root) as tmp:
            yield tmp
        return
    if not overwrite and existing_manifest(out, storage_options) is not None:
        raise OutputExistsError(os.fspath(out))
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp) / "store"
        copy(Path(tmp) / "store", out, dst_options=storage_options, overwrite=overwrite)
