"""A new output built beside its place and installed whole: a hidden sibling to build it in, renamed
onto the output's path once complete (the previous output, if any, renamed aside first and deleted after),
and deleted if building fails, so the path holds the old output or the new one, never a part. The
importers, exporters and the LogIX import write through it. Each sibling's ``<sibling>.lock`` is flock'd
while it is in use: the next conversion of the path recovers from one killed (:func:`remove_dead`).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from ...errors import SeqstoreError
from ...format.manifest import MANIFEST, fsync_dir
from ..directio import O_CLOEXEC

__all__ = ["OutputExistsError", "temp_sibling", "remove_path", "remove_dead", "check_output", "install_output",
           "replaced"]

_held: dict[Path, int] = {}  # the hidden siblings this process uses -> the descriptor of their flock'd .lock


class OutputExistsError(FileExistsError):
    """The output of a conversion already exists and ``overwrite`` was not given; ``path`` names it.

    The message speaks Python (``overwrite=True``); the command line says ``--overwrite`` instead.
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__(f"{path}: already exists (pass overwrite=True to replace it)")
        self.path = str(path)


def temp_sibling(root: Path, tag: str, *, held: bool = True) -> Path:
    """``<parent>/.<name>.<tag>-<pid>-<random>``: a hidden sibling of ``root`` (same file system, so a
    rename onto ``root`` is atomic); ``held``: its ``.lock`` flock'd until :func:`remove_path` (or
    :func:`install_output`) is done with it, so that no :func:`remove_dead` takes it."""
    path = root.with_name(f".{root.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")
    if held:
        fd = os.open(_lock(path), os.O_RDWR | os.O_CREAT | O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        _held[path] = fd
    return path


def _lock(sibling: Path) -> Path:
    return sibling.with_name(sibling.name + ".lock")


def _release(sibling: Path) -> None:
    fd = _held.pop(sibling, -1)
    if fd >= 0:
        _lock(sibling).unlink(missing_ok=True)
        os.close(fd)


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    _release(path)


def remove_dead(root: Path) -> None:
    """Recover from conversions of ``root`` killed part way: delete the hidden siblings (:func:`temp_sibling`)
    whose ``.lock`` no process holds, except a previous output set aside where ``root`` is missing (killed
    between :func:`install_output`'s renames): that one is put back."""
    prefix = f".{root.name}."
    for lock in root.parent.glob(f"{glob.escape(prefix)}*.lock"):
        if "." in lock.name[len(prefix) : -len(".lock")]:  # (another output's: .<name>.<more>.<tag>-...)
            continue
        try:
            fd = os.open(lock, os.O_RDWR | O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            sibling = lock.with_name(lock.name[: -len(".lock")])
            if sibling.name.startswith(f"{prefix}old-") and not (root.exists() or root.is_symlink()):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(sibling, root)
                    fsync_dir(root.parent)
            remove_path(sibling)
            lock.unlink(missing_ok=True)
        except BlockingIOError:  # a live conversion's
            pass
        finally:
            os.close(fd)


def _not_a_store(root: Path) -> bool:
    """A file (a source named as the output by mistake), or a non-empty directory without a manifest."""
    return not root.is_dir() or (not (root / MANIFEST).exists() and any(root.iterdir()))


def check_output(root: Path, overwrite: bool, refuse: Callable[[Path], bool] = _not_a_store,
                 what: str = "what is not a store (a file, or a non-empty directory without a manifest)",
                 error: type[Exception] = SeqstoreError) -> None:
    """Refuse an existing ``root`` unless ``overwrite`` (OutputExistsError), and even then one that
    ``refuse(root)`` says may not be replaced (``error``: "refusing to overwrite ``what``"); make the
    parent directory."""
    remove_dead(root)
    if root.exists() or root.is_symlink():
        if not overwrite:
            raise OutputExistsError(root)
        if refuse(root):
            raise error(f"{root}: refusing to overwrite {what}")
    root.parent.mkdir(parents=True, exist_ok=True)


def install_output(tmp: Path, root: Path, *, replace: bool = True) -> None:
    """Move the finished store ``tmp`` to ``root``: an existing ``root`` is renamed aside, ``tmp`` renamed
    into place, then the old one deleted (put back if the second rename fails). ``replace=False``: an
    existing ``root`` is OutputExistsError instead."""
    if root.exists() or root.is_symlink():
        if not replace:
            raise OutputExistsError(root)
        old = temp_sibling(root, "old")
        os.replace(root, old)
        try:
            os.replace(tmp, root)
        except BaseException:
            os.replace(old, root)  # put the previous store back
            _release(old)
            raise
        fsync_dir(root.parent)
        remove_path(old)
    else:
        os.replace(tmp, root)
        fsync_dir(root.parent)
    _release(tmp)


@contextlib.contextmanager
def replaced(root: Path, tag: str = "tmp") -> Iterator[Path]:
    """A hidden sibling of ``root`` (:func:`temp_sibling`) to build an output in: installed at ``root``
    (:func:`install_output`) when the block ends, deleted when it raises (``root`` then as before). Only
    what was at ``root`` when the block began may be replaced: something made there meanwhile (another
    process's output) is OutputExistsError."""
    remove_dead(root)
    tmp = temp_sibling(root, tag)
    existed = root.exists() or root.is_symlink()
    try:
        yield tmp
        install_output(tmp, root, replace=existed)
    except BaseException:
        remove_path(tmp)
        raise
