"""Schemas: what every record of a store holds.

A :class:`Field` is a dtype and a shape. The first axis of the shape may be ``None`` (ragged: each
record has its own number of rows); every other axis is fixed. A :class:`Schema` is an ordered
mapping from field name to Field. Names may be nested with ``"/"`` (``"layer1/grad"``); a nested dict
of Fields is flattened into such names.

A schema may also *pack* fixed fields of one dtype into a :class:`PackedGroup`: on disk the group is one
row-major ``(n, D)`` matrix, each field a column range ``[a, b)`` of it (format version 2, see
docs/format.md). :meth:`Schema.storage_units` lists what is stored as one file per shard.

This module also owns the conversion of user values (numpy arrays, torch tensors, Python scalars and
lists) to a field's storage dtype, including ``bfloat16`` which is stored as its uint16 bits.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import SchemaError

__all__ = ["Field", "Schema", "PackedGroup", "flatten_values", "BFLOAT16", "to_storage_array", "bfloat16_to_float32",
           "float32_to_bfloat16"]

BFLOAT16 = "bfloat16"

_NAME_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_NUMERIC_KINDS = "biufc"
_MAX_BYTES = (1 << 63) - 1


def _normalise_dtype(dtype: Any) -> str:
    """Return the canonical dtype string of a field: ``"bfloat16"`` or a little-endian numpy dtype str."""
    if isinstance(dtype, str) and dtype.lower() in (BFLOAT16, "bf16"):
        return BFLOAT16
    if getattr(dtype, "name", None) == BFLOAT16 or str(dtype) in ("torch.bfloat16", "bfloat16"):
        return BFLOAT16
    if str(dtype).startswith("torch."):
        dtype = str(dtype).removeprefix("torch.")
    dt: np.dtype[Any] | None
    try:
        dt = None if dtype is None else np.dtype(dtype)  # (numpy reads None as float64)
    except (TypeError, SyntaxError):  # (numpy parses a string with a comma as Python)
        dt = None
    if dt is None or dt.kind not in _NUMERIC_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise SchemaError(f"unsupported dtype {dtype!r}: expected a numpy numeric dtype, bool or 'bfloat16'")
    return str(dt.newbyteorder("<").str if dt.itemsize > 1 else dt.str)


@dataclass(frozen=True)
class Field:
    """One column of a store.

    Args:
        dtype: a numpy numeric dtype (or its name), ``bool``, or ``"bfloat16"``.
        shape: per-record shape. ``()`` is a scalar; ``(None, 80)`` is a ragged sequence of 80-dim rows;
            ``(64, 64)`` a fixed matrix. Only the first entry may be ``None``.
    """

    dtype: str
    shape: tuple[int | None, ...] = ()

    def __init__(self, dtype: Any, shape: Any = ()) -> None:
        if isinstance(shape, (int, np.integer)) or shape is None:
            shape = (shape,)
        try:
            shape_t = tuple(shape)
        except TypeError as exc:
            raise SchemaError(f"field shape must be a tuple, got {shape!r}") from exc
        norm: list[int | None] = []
        for k, s in enumerate(shape_t):
            if s is None and k == 0:
                norm.append(None)
            elif isinstance(s, (int, np.integer)) and not isinstance(s, bool) and int(s) >= 0:
                norm.append(int(s))
            else:
                raise SchemaError(
                    f"field shape {shape_t!r}: entry {k} must be a non-negative int"
                    + (" (only the first entry may be None)" if s is None else "")
                )
        dtype = _normalise_dtype(dtype)
        size = np.dtype("<u2" if dtype == BFLOAT16 else dtype).itemsize
        for s in norm[1:] if norm and norm[0] is None else norm:
            size *= s  # type: ignore[operator]  # (Python ints: np.prod's int64 wrapped to 0 at 2**64)
        big = max((s or 0 for s in norm), default=0)
        if size > _MAX_BYTES or big > _MAX_BYTES:  # (an entry past int64 broke np.prod even where size is 0)
            unit = "row" if norm and norm[0] is None else "record"
            what = f"an entry of {big}" if big > _MAX_BYTES else f"one {unit} would hold {size} bytes"
            raise SchemaError(f"field shape {shape_t!r} of dtype {dtype}: {what}, more than 2**63 - 1")
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", tuple(norm))

    @cached_property
    def ragged(self) -> bool:
        """True when the first axis varies per record."""
        return len(self.shape) > 0 and self.shape[0] is None

    @cached_property
    def inner_shape(self) -> tuple[int, ...]:
        """Shape of one row of a ragged field, or the whole record shape of a fixed field."""
        return tuple(int(s) for s in (self.shape[1:] if self.ragged else self.shape))  # type: ignore[arg-type]

    @cached_property
    def storage_dtype(self) -> np.dtype[Any]:
        """The dtype of the bytes on disk (uint16 for bfloat16)."""
        return np.dtype("<u2") if self.dtype == BFLOAT16 else np.dtype(self.dtype)

    @cached_property
    def row_bytes(self) -> int:
        """Bytes of one row (ragged) or one record (fixed)."""
        return int(np.prod(self.inner_shape, dtype=np.int64)) * self.storage_dtype.itemsize

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, obj: Any, *, where: str = "schema") -> Field:
        if not isinstance(obj, dict) or "dtype" not in obj or "shape" not in obj:
            raise SchemaError(f"{where}: expected an object with 'dtype' and 'shape', got {obj!r}")
        if not isinstance(obj["shape"], (list, tuple)):  # (a string or dict would be split into its items)
            raise SchemaError(f"{where}: 'shape' must be a list of ints and null, got {obj['shape']!r}")
        return cls(obj["dtype"], tuple(obj["shape"]))

    def __repr__(self) -> str:
        return f"Field({self.dtype!r}, {self.shape!r})"


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise SchemaError(f"field name must be a non-empty str, got {name!r}")
    for part in name.split("/"):
        if not _NAME_PART.match(part) or part.endswith(".offsets") or part.endswith(".npy"):
            raise SchemaError(
                f"field name {name!r}: each '/'-separated part must match [A-Za-z0-9][A-Za-z0-9_.-]* "
                "and must not end in '.offsets' or '.npy'"
            )


@dataclass(frozen=True)
class PackedGroup:
    """Fixed fields stored together as one row-major ``(n, width)`` matrix file ``<name>.npy`` per shard.

    ``columns[field] = (a, b)``: the field's values of record ``i`` are ``matrix[i, a:b]`` reshaped to
    the field's shape. Column ranges tile ``[0, width)`` in ``fields`` order. All fields share ``dtype``.
    """

    name: str
    dtype: str
    fields: tuple[str, ...]
    columns: Mapping[str, tuple[int, int]]
    width: int

    @property
    def storage_dtype(self) -> np.dtype[Any]:
        """The dtype of the matrix on disk (uint16 for bfloat16)."""
        return np.dtype("<u2") if self.dtype == BFLOAT16 else np.dtype(self.dtype)

    def as_field(self) -> Field:
        """The group as a fixed field of shape ``(width,)``: what one record's row looks like."""
        return Field(self.dtype, (self.width,))

    def __hash__(self) -> int:
        return hash((self.name, self.dtype, self.fields, self.width))


def field_list(fields: str | Iterable[str] | None) -> list[str] | None:
    """``fields`` as a list of names (None stays None): a str is one field's name, not its letters.
    TypeError saying what ``fields`` takes for anything else (a number, bytes, a name that is no str)."""
    if fields is None:
        return None
    if isinstance(fields, str):
        return [fields]
    names = list(fields) if isinstance(fields, Iterable) and not isinstance(fields, (bytes, bytearray)) else None
    at = None if names is None else next((k for k, n in enumerate(names) if not isinstance(n, str)), None)
    if names is None or at is not None:
        bad = fields if names is None or at is None else names[at]
        raise TypeError(f"fields: expected a field name (str) or a list of names, got {bad!r} "
                        f"({type(bad).__name__})" + ("" if at is None else f" as name {at}"))
    return names


def flatten_values(tree: Mapping[str, Any], what: str) -> dict[str, Any]:
    """``{"a": {"b": x}}`` -> ``{"a/b": x}`` for a record or batch given as a nested dict; flat names
    with ``/`` pass through. Raises SchemaError naming ``what`` for non-str keys or a name given twice."""
    if not isinstance(tree, Mapping):
        raise SchemaError(f"{what}: expected a (nested) dict of field -> value, got {type(tree).__name__}")
    flat: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for k, v in node.items():
            if not isinstance(k, str):
                raise SchemaError(f"{what}: field names must be str, got {k!r}")
            name = f"{prefix}{k}"
            if isinstance(v, Mapping):
                walk(v, name + "/")
            elif name in flat:
                raise SchemaError(f"{what}: duplicate field name {name!r}")
            else:
                flat[name] = v

    walk(tree, "")
    return flat


class Schema(Mapping[str, Field]):
    """An ordered, immutable mapping from flat field name to :class:`Field`, plus packed groups.

    Args:
        spec: a (nested) dict of name -> :class:`Field`, or a Schema (copied, groups included).
        packed: optional ``{group name: [field names in column order]}``. Every field listed must be
            fixed (no ``None`` in its shape), belong to one group only and have the group's dtype. A
            group name is a single name part (``[A-Za-z0-9][A-Za-z0-9_.-]*``, no ``/``) that is not
            a field name. Passing ``packed`` with a Schema replaces its groups.
    """

    __slots__ = ("_fields", "_groups", "_group_of")

    def __init__(self, spec: Mapping[str, Any] | Schema, packed: Mapping[str, Sequence[str]] | None = None) -> None:
        if isinstance(spec, Schema):
            self._fields: dict[str, Field] = dict(spec._fields)
            if packed is None:
                self._groups: dict[str, PackedGroup] = dict(spec._groups)
                self._group_of: dict[str, str] = dict(spec._group_of)
                return
        else:
            fields: dict[str, Field] = flatten_values(spec, "schema") if isinstance(spec, Mapping) else {}
            if not fields:  # (not a dict, empty, or only empty groups: {"a": {}})
                raise SchemaError(f"a schema is a non-empty dict of name -> Field, got {spec!r}")
            for name, value in fields.items():
                if not isinstance(value, Field):
                    raise SchemaError(f"field {name!r}: expected a seqstore.Field or a nested dict, "
                                      f"got {type(value).__name__}")
                _check_name(name)
            names = sorted(fields)
            for a, b in zip(names, names[1:]):
                if b.startswith(a + "/"):
                    raise SchemaError(f"field {a!r} is both a field and a group (field {b!r} is inside it)")
            self._fields = fields
        self._groups = {}
        self._group_of = {}
        for gname, members in (packed or {}).items():
            self._add_group(gname, members)

    def _add_group(self, gname: str, members: Sequence[str]) -> None:
        if not isinstance(gname, str) or "/" in gname:
            raise SchemaError(f"packed group name {gname!r}: must be a str without '/'")
        _check_name(gname)
        if gname in self._fields:
            raise SchemaError(f"packed group name {gname!r} is also a field name")
        if gname in self._groups:
            raise SchemaError(f"duplicate packed group {gname!r}")
        if isinstance(members, str) or not members:
            raise SchemaError(f"packed group {gname!r}: expected a non-empty list of field names, got {members!r}")
        columns: dict[str, tuple[int, int]] = {}
        dtype: str | None = None
        pos = 0
        for name in members:
            if name not in self._fields:
                raise SchemaError(f"packed group {gname!r}: no field {name!r} in the schema")
            f = self._fields[name]
            if f.ragged:
                raise SchemaError(f"packed group {gname!r}: field {name!r} is ragged; only fixed fields can be packed")
            if name in self._group_of or name in columns:
                raise SchemaError(f"field {name!r} is in more than one packed group")
            if dtype is None:
                dtype = f.dtype
            elif f.dtype != dtype:
                raise SchemaError(
                    f"packed group {gname!r}: field {name!r} has dtype {f.dtype}, the group's dtype is {dtype} "
                    "(all fields of a group share one dtype)"
                )
            w = int(np.prod(f.inner_shape, dtype=np.int64))
            columns[name] = (pos, pos + w)
            pos += w
        assert dtype is not None
        self._groups[gname] = PackedGroup(gname, dtype, tuple(members), columns, pos)
        for name in members:
            self._group_of[name] = gname

    def __getitem__(self, name: str) -> Field:
        try:
            return self._fields[name]
        except KeyError:
            raise KeyError(f"no field {name!r} in schema; fields are {list(self._fields)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Schema)
            and self._fields == other._fields
            and {k: (g.fields, g.dtype) for k, g in self._groups.items()}
            == {k: (g.fields, g.dtype) for k, g in other._groups.items()}
        )

    def __hash__(self) -> int:
        return hash((tuple(self._fields.items()), tuple((k, g.fields) for k, g in self._groups.items())))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {v!r}" for k, v in self._fields.items())
        if not self._groups:
            return f"Schema({{{inner}}})"
        groups = ", ".join(f"{k!r}: {list(g.fields)!r}" for k, g in self._groups.items())
        return f"Schema({{{inner}}}, packed={{{groups}}})"

    # ---------------------------------------------------------------------------------- groups

    @property
    def groups(self) -> dict[str, PackedGroup]:
        """Packed groups by name (a copy; empty when nothing is packed)."""
        return dict(self._groups)

    def group_of(self, name: str) -> str | None:
        """The packed group holding field ``name``, or None when it has its own file."""
        return self._group_of.get(name)

    def storage_units(self) -> list[tuple[str, Field]]:
        """What a shard stores, one ``.npy`` file (plus offsets for ragged fields) per entry.

        Unpacked fields in schema order, each as itself, then each packed group as a fixed field of
        shape ``(width,)`` under the group's name (file ``<group>.npy`` of shape ``(n, width)``).
        """
        units = [(n, f) for n, f in self._fields.items() if n not in self._group_of]
        units += [(g.name, g.as_field()) for g in self._groups.values()]
        return units

    # ------------------------------------------------------------------------------------ json

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, f in self._fields.items():
            obj = f.to_json()
            gname = self._group_of.get(name)
            if gname is not None:
                obj["group"] = gname
                obj["columns"] = list(self._groups[gname].columns[name])
            out[name] = obj
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Schema:
        """Parse the manifest's ``schema`` object, packed groups (``group``/``columns`` keys) included.

        Checks that every group's column ranges tile ``[0, width)`` and match the fields' sizes.
        """
        if not isinstance(obj, dict) or not obj:
            raise SchemaError(f"schema: expected a non-empty object, got {obj!r}")
        fields = {name: Field.from_json(v, where=f"schema field {name!r}") for name, v in obj.items()}
        members: dict[str, list[tuple[int, int, str]]] = {}
        for name, v in obj.items():
            if "group" in v or "columns" in v:
                g, cols = v.get("group"), v.get("columns")
                if (not isinstance(g, str) or not isinstance(cols, list) or len(cols) != 2
                        or any(not isinstance(c, int) or isinstance(c, bool) for c in cols)):  # (int() took "0", 4.9)
                    raise SchemaError(f"schema field {name!r}: packed fields need \"group\" (str) and \"columns\" "
                                      f"[a, b] (integers), got {g!r} and {cols!r}")
                a, b = cols
                members.setdefault(g, []).append((a, b, name))
        packed = {g: [name for _, _, name in sorted(items)] for g, items in members.items()}
        schema = cls(fields, packed=packed)
        for g, items in members.items():
            for a, b, name in items:
                if schema._groups[g].columns[name] != (a, b):
                    raise SchemaError(
                        f"schema field {name!r}: columns [{a}, {b}) of group {g!r} do not tile the group "
                        f"(expected {list(schema._groups[g].columns[name])})"
                    )
        return schema

    def nest(self, flat: Mapping[str, Any]) -> dict[str, Any]:
        """Turn ``{"a/b": x}`` into ``{"a": {"b": x}}`` (only names present in ``flat``)."""
        out: dict[str, Any] = {}
        for name, value in flat.items():
            parts = name.split("/")
            node = out
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = value
        return out


# ---------------------------------------------------------------------------------------------- values


def schema_difference(have: Schema, want: Schema, names: tuple[str, str] = ("the store", "the schema given")) -> str:
    """How ``want`` differs from ``have``, field by field (for errors): the fields only one has, those
    whose dtype or shape differ, and packed groups that differ; ``names`` name the two sides."""
    a, b = names
    out = [f"field {k!r} only in {a}" for k in have if k not in want]
    out += [f"field {k!r} only in {b}" for k in want if k not in have]
    out += [f"field {k!r}: {have[k]!r} in {a}, {want[k]!r} in {b}" for k in have if k in want and have[k] != want[k]]
    ga, gb = ({k: g.fields for k, g in s.groups.items()} for s in (have, want))
    out += [f"packed group {k!r}: {list(ga[k]) if k in ga else None} in {a}, {list(gb[k]) if k in gb else None} in {b}"
            for k in sorted(set(ga) | set(gb)) if ga.get(k) != gb.get(k)]
    return "; ".join(out) or "no difference"


def float32_to_bfloat16(x: npt.ArrayLike) -> np.ndarray[Any, np.dtype[np.uint16]]:
    """Round float values to bfloat16 (round to nearest even; NaN stays NaN) and return the uint16 bits."""
    f = np.asarray(x, dtype=np.float32, order="C")
    bits = f.view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    out = np.asarray(rounded >> np.uint32(16)).astype(np.uint16)  # an array even for 0-d input
    nan = np.isnan(f)
    if nan.any():
        out[nan] = np.uint16(0x7FC0)
    return out


def bfloat16_to_float32(bits: npt.ArrayLike) -> np.ndarray[Any, np.dtype[np.float32]]:
    """Widen bfloat16 bits (uint16) to float32 exactly (a new array)."""
    b = np.asarray(bits)
    if b.dtype.name == BFLOAT16:
        b = b.view(np.uint16)
    return np.asarray(b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def torch_to_numpy(value: Any) -> np.ndarray[Any, Any]:
    """A torch tensor (any device) as numpy; bfloat16 as :class:`BF16Bits`."""
    t = value.detach()
    if str(t.dtype) == "torch.bfloat16":
        import torch

        return BF16Bits(t.view(torch.int16).cpu().numpy().view(np.uint16))
    return np.asarray(t.cpu().numpy())


class BF16Bits(np.ndarray[Any, np.dtype[np.uint16]]):
    """uint16 array marking that its contents are already bfloat16 bits (a torch bfloat16 tensor's values)."""

    def __new__(cls, bits: np.ndarray[Any, Any]) -> BF16Bits:
        return bits.view(cls)


def to_storage_array(field: Field, value: Any, *, what: str, item: Callable[[int], str] | None = None
                     ) -> np.ndarray[Any, Any]:
    """Convert one record's (or one stacked batch's) value to the field's storage dtype.

    Accepts numpy arrays, torch tensors (any device, bfloat16 included), Python scalars and lists.
    For a bfloat16 field, uint16 values are bfloat16 bits (as read back with ``bfloat16="bits"``);
    other numbers are rounded to bfloat16.
    Casts only within a kind or to a wider kind (``same_kind``); integer narrowing is range-checked.
    Raises :class:`SchemaError` naming ``what`` (field, record, id) otherwise; for a stacked batch,
    ``item(k)`` names its record ``k`` where a value of it does not fit. Never copies when the value
    already has the storage dtype and is contiguous.
    """
    if type(value).__module__.startswith("torch"):
        arr = torch_to_numpy(value)
    else:
        try:
            arr = value if isinstance(value, BF16Bits) else np.asarray(value)  # (asarray drops the mark)
        except Exception as exc:  # noqa: BLE001 - any conversion failure is a schema error here
            raise SchemaError(f"{what}: cannot convert {type(value).__name__} to an array ({exc})") from exc
        if arr.size == 0 and isinstance(value, (list, tuple)):  # NumPy makes [] float64: there is nothing to cast
            shape = (0, *field.inner_shape) if field.ragged and arr.shape == (0,) else arr.shape  # [] is no row
            arr = np.empty(shape, dtype=field.storage_dtype)
    if field.dtype == BFLOAT16:
        if isinstance(arr, BF16Bits) or arr.dtype.name == BFLOAT16 or arr.dtype == np.uint16:
            # uint16 is taken as bfloat16 bits: what a store opened with bfloat16="bits" returns
            return np.asarray(arr.view(np.uint16), order="C")
        if arr.dtype.kind in "fiub":
            with np.errstate(over="ignore"):  # overflow is reported below, naming the value
                bits = float32_to_bfloat16(arr)
            if arr.dtype.kind == "f" and arr.size:  # integers all fit (bfloat16 reaches 3.39e38)
                overflow = ((bits & 0x7FFF) == 0x7F80) & ~np.isinf(np.asarray(arr)).reshape(bits.shape)
                _check_overflow(overflow, np.asarray(arr), what, "bfloat16", "3.3895e+38", item)
            return bits
        raise SchemaError(f"{what}: cannot store dtype {arr.dtype} in a bfloat16 field")
    target = field.storage_dtype
    if isinstance(arr, BF16Bits):
        if target.kind not in "fc":
            raise SchemaError(f"{what}: cannot store bfloat16 values in a {target} field")
        arr = bfloat16_to_float32(arr)  # exact; float16 is then checked for overflow as any float32
    src = arr.dtype
    if src == target:
        return np.asarray(arr, order="C")
    if src.kind not in _NUMERIC_KINDS:
        raise SchemaError(f"{what}: expected numeric data for dtype {target}, got dtype {src}")
    if not np.can_cast(src, target, casting="same_kind") and not (src.kind in "biu" and target.kind in "iu"):
        raise SchemaError(f"{what}: unsafe cast from {src} to {target} (only same-kind or widening casts)")
    if target.kind in "iu" and src.kind in "iu" and arr.size:
        info = np.iinfo(target)
        lo, hi = arr.min(), arr.max()
        if lo < info.min or hi > info.max:
            at = "" if item is None else f" (the first at {_record(arr, lo if lo < info.min else hi, item)})"
            raise SchemaError(f"{what}: values [{lo}, {hi}] do not fit dtype {target}{at}")
    if target.kind in "fc" and arr.size and _largest(src) > float(np.finfo(target).max):
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.asarray(arr, dtype=target, order="C")
        overflow = np.isinf(out) & ~np.isinf(arr)  # finite values (or NaN) that became infinite
        _check_overflow(overflow, arr, what, str(target), str(np.finfo(target).max), item)
        return out
    return np.asarray(arr, dtype=target, order="C")


def _largest(dtype: np.dtype[Any]) -> float:
    """The largest finite magnitude a value of a numeric ``dtype`` can have (bool: 1)."""
    if dtype.kind in "fc":
        return float(np.finfo(dtype).max)
    if dtype.kind in "iu":
        return float(np.iinfo(dtype).max)
    return 1.0


def _record(arr: np.ndarray[Any, Any], value: Any, item: Callable[[int], str]) -> str:
    """``item`` of the record (row of the stacked batch ``arr``) that holds the first ``value``."""
    k = int(np.argmax(arr.reshape(-1) == value))
    return item(k // max(1, arr.size // max(1, arr.shape[0])) if arr.ndim else 0)


def _check_overflow(overflow: np.ndarray[Any, Any], arr: np.ndarray[Any, Any], what: str, dtype: str,
                    largest: str, item: Callable[[int], str] | None = None) -> None:
    """SchemaError naming the first value of ``arr`` that ``overflow`` marks, if any (and with ``item``,
    the batch's record that holds it)."""
    if overflow.any():
        k = int(np.argmax(overflow.reshape(-1)))
        at = f" (element {k} of the value)" if arr.size > 1 else ""
        if item is not None and arr.ndim:
            at = f" of {item(k // max(1, arr.size // max(1, arr.shape[0])))}"
        raise SchemaError(
            f"{what}: value {arr.reshape(-1)[k].item()!r}{at} overflows dtype {dtype} (largest finite {largest})"
        )
