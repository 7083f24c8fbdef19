"""1-D arrays held by orders (lengths, explicit orders, sort indexes) and how they pickle.

An :class:`ArrayRef` wraps a 1-D NumPy array. When the array is (a contiguous view of) a memory-mapped
file, the reference pickles as ``(path, byte offset, dtype, length)`` and reopens the mapping read-only on
unpickling: a few hundred bytes whatever N is, and every process shares the file through the page cache.
An in-memory array has no file to point to and pickles by value (O(N) bytes); pass a ``.npy`` path or a
memory-mapped array where that matters.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

__all__ = ["ArrayRef", "PathLike"]

PathLike = str | os.PathLike[str]


def _mapped_file(array: np.ndarray) -> tuple[str, int] | None:
    """``(file, byte offset of array[0])`` if ``array`` is a C-contiguous view of a np.memmap, else None."""
    if array.ndim != 1 or not array.flags.c_contiguous:
        return None
    node: Any = array
    while node is not None:
        if isinstance(node, np.memmap) and isinstance(node.base, mmap.mmap):
            filename = getattr(node, "filename", None)
            if filename is None:
                return None
            offset = int(node.offset) + (array.ctypes.data - node.ctypes.data)
            return str(filename), offset
        node = getattr(node, "base", None)
    return None


class ArrayRef:
    """A read-only 1-D integer (or float) array that pickles by file reference when memory-mapped.

    ``array`` may be any 1-D array-like: np.ndarray, np.memmap (or a contiguous slice of one), a
    ``.npy`` path (opened with ``mmap_mode="r"``), a list (converted, O(N) memory), or a lazy object
    with ``len``, ``dtype`` and a vectorised ``take(int_array)`` (kept as it is; pickled as itself).
    """

    __slots__ = ("_array", "_lazy", "_file")

    _array: np.ndarray | None
    _lazy: Any
    _file: tuple[str, int] | None

    def __init__(self, array: Any, what: str = "array") -> None:
        self._lazy = None
        if _is_lazy(array):
            # A lazy lengths object (e.g. ``Store.lengths(field)``): gathered with ``take``, never
            # materialised unless an ordering needs the whole array (``.array``).
            if array.dtype.kind not in "iuf":
                raise ValueError(f"{what} must have an integer or float dtype, got {array.dtype}")
            self._lazy = array
            self._array = self._file = None
            return
        if isinstance(array, (str, os.PathLike)):
            try:
                arr = np.load(os.fspath(array), mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise ValueError(f"{what}: cannot open {os.fspath(array)!r} as a .npy file: {exc}") from exc
        else:
            arr = np.asarray(array) if not isinstance(array, np.ndarray) else array
        if arr.ndim != 1:
            raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
        if arr.dtype.kind not in "iuf" and not (arr.size == 0 and arr.dtype.kind in "iufb"):
            raise ValueError(f"{what} must have an integer or float dtype, got {arr.dtype}")
        self._array = arr
        self._file = _mapped_file(arr)

    @property
    def array(self) -> np.ndarray:
        """The values as one NumPy array. For a lazy object this materialises it once (O(N) memory):
        only orderings that need a global sort ask for it; ``laplace`` uses :meth:`gather`."""
        if self._array is None:
            self._array = np.asarray(self._lazy)
        return self._array

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._lazy.dtype if self._lazy is not None else self._array.dtype  # type: ignore[union-attr]

    def gather(self, indices: np.ndarray) -> np.ndarray:
        """Values at ``indices`` (int array) without materialising a lazy object. O(len(indices))."""
        if self._lazy is not None and self._array is None:
            return np.asarray(self._lazy.take(indices))
        return np.asarray(self.array[indices])

    def indexable(self) -> Any:
        """Something that supports ``len``-free ``shape``/``dtype``, slicing and integer-array indexing:
        the array itself, or for a lazy object a view that gathers with ``take`` (nothing materialised)."""
        if self._lazy is not None and self._array is None:
            return _Gathering(self)
        return self.array

    @property
    def file(self) -> str | None:
        """The mapped file, or None for an in-memory array."""
        return None if self._file is None else self._file[0]

    def __len__(self) -> int:
        return len(self._lazy) if self._lazy is not None else int(self.array.shape[0])

    def __reduce__(self) -> tuple[Any, ...]:
        if self._lazy is not None:
            return (ArrayRef, (self._lazy,))
        if self._file is not None:
            path, offset = self._file
            return (_reopen, (path, offset, self.array.dtype.str, len(self)))
        return (ArrayRef, (self.array,))

    def __repr__(self) -> str:
        if self._lazy is not None:
            return f"ArrayRef(lazy {self._lazy!r})"
        where = f"file={self._file[0]!r}" if self._file is not None else "in memory"
        return f"ArrayRef({self.array.dtype}[{len(self)}], {where})"


class _Gathering:
    """Read-only array-like over a lazy :class:`ArrayRef`: ``[a:b]`` and ``[int_array]`` gather."""

    __slots__ = ("_ref", "shape", "dtype")

    def __init__(self, ref: ArrayRef) -> None:
        self._ref = ref
        self.shape = (len(ref),)
        self.dtype = ref.dtype

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            return self._ref.gather(np.arange(start, stop, step, dtype=np.int64))
        return self._ref.gather(np.asarray(key, dtype=np.int64))


def _is_lazy(obj: Any) -> bool:
    """True for array-likes that gather with ``take`` and are not NumPy arrays, lists or paths."""
    if isinstance(obj, (np.ndarray, list, tuple, range, str, os.PathLike)):
        return False
    return all(hasattr(obj, a) for a in ("take", "__len__", "dtype"))


def _reopen(path: str, offset: int, dtype: str, length: int) -> ArrayRef:
    """Unpickle an :class:`ArrayRef` by mapping ``length`` items of ``dtype`` at ``offset`` of ``path``."""
    if length == 0:
        return ArrayRef(np.empty(0, dtype=np.dtype(dtype)))
    try:
        arr = np.memmap(path, dtype=np.dtype(dtype), mode="r", offset=offset, shape=(length,))
    except ValueError as exc:  # (a file shorter than when pickled: numpy's message named neither)
        raise ValueError(f"{path}: cannot map {length} values of {dtype} at byte {offset} ({exc}); the file "
                         "changed since the order holding it was pickled") from exc
    return ArrayRef(arr)
