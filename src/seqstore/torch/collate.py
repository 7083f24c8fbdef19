"""Collation: stack fixed fields, pad ragged fields, add lengths (and masks on request).

``collate_padded(samples)`` turns a list of records (dicts of tensors or arrays) into one dict of
tensors: a fixed field -> (B, *shape); a ragged field ``name`` -> ``name`` zero-padded (or
``pad_value``) to (B, T, *inner) with T the longest record of the batch, ``name + "_lengths"`` int64
(B,), and with ``masks=True`` ``name + "_mask"`` bool (B, T), True on real rows. The result is a
dict of CPU tensors, so ``DataLoader(pin_memory=True)`` pins it.

A batch gathered by :meth:`seqstore.torch.SeqDataset.__getitems__` arrives gathered in one vectorised
read; collation then pads each ragged field with one masked copy and adds lengths and masks (no
per-record copy).
"""

from __future__ import annotations

import functools
import numbers
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate
from torch.utils.data._utils.collate import default_collate_fn_map

from ..errors import SeqstoreError
from ..schema import field_list
from ._convert import to_tensor

__all__ = [
    "collate_padded", "collate_gathered", "PaddedCollate", "GatheredRecords", "GatheredRecord", "LENGTHS_SUFFIX",
    "MASK_SUFFIX", "lengths_mask", "pad_rows",
]

LENGTHS_SUFFIX = "_lengths"
MASK_SUFFIX = "_mask"


class GatheredRecords(list[dict[str, torch.Tensor]]):
    """A list of records that also carries the whole batch, gathered at once.

    ``values``: field -> tensor, a fixed field (B, ...), a ragged field its records' rows end to end
    (sum of T, ...); ``lengths``: ragged field -> int64 (B,). The records are views into ``values``.
    ``padded``: field -> (B, ...) with the ragged fields zero-padded to (B, T, ...), made on first use
    (one masked copy a field). Any collate function sees a plain list of records; :func:`collate_padded`
    uses ``padded`` directly while the records are as gathered (:meth:`intact`), else the records.
    """

    values: dict[str, torch.Tensor]
    lengths: dict[str, torch.Tensor]
    views: dict[str, Sequence[torch.Tensor]]  # field -> each record's view, as the records were made
    size: int  # records as made

    @functools.cached_property
    def padded(self) -> dict[str, torch.Tensor]:  # (a cached_property: it can also be set)
        return {k: pad_rows(v, self.lengths[k]) if k in self.lengths else v for k, v in self.values.items()}

    def intact(self) -> bool:
        """Whether these are still the records as gathered (none dropped, added, replaced or reordered, each
        with the views it was made with), so that the gathered batch is theirs: a collate function of the
        user's own may have changed them. Identity tests in C loops, O(records x fields). A list made
        without ``views`` (by hand) is taken as it is."""
        fields = self.__dict__.get("views")
        if fields is None:
            return True
        if len(self) != self.size or not all(map(len(fields).__eq__, map(len, self))):
            return False
        try:
            return all(all(map(operator.is_, map(operator.itemgetter(name), self), views))
                       for name, views in fields.items())
        except KeyError:  # a field taken out of a record and another put in
            return False


def pad_rows(values: torch.Tensor, lengths: torch.Tensor, pad_value: float = 0) -> torch.Tensor:
    """Records' rows end to end (``values``: (sum of ``lengths``, ...)) -> (B, T, ...) padded with
    ``pad_value``, T the longest record. One masked copy: O(B x T x inner)."""
    longest = int(lengths.max()) if len(lengths) else 0
    out = values.new_full((len(lengths), longest, *values.shape[1:]), pad_value)
    if values.shape[0]:
        signed = _SIGNED.get(values.dtype)  # (torch has no masked copy of uint16/32/64: the same bits signed)
        target, rows = (out.view(signed), values.view(signed)) if signed is not None else (out, values)
        target[lengths_mask(lengths, longest)] = rows
    return out


#: the signed dtype of each unsigned one torch's masked copy refuses (they exist from torch 2.3 on)
_SIGNED = {getattr(torch, f"uint{b}"): getattr(torch, f"int{b}") for b in (16, 32, 64) if hasattr(torch, f"uint{b}")}


class GatheredRecord(dict[str, torch.Tensor]):
    """One record of :class:`GatheredRecords` (a dict). torch's default collate, which would stack
    records of different lengths (and, in a DataLoader worker, fails with "Trying to resize storage
    that is not resizable"), refuses a batch of these with ragged fields, naming :func:`collate_padded`;
    without ragged fields it returns the gathered batch (what stacking would give).

    ``ragged``: where set (a record of :class:`~seqstore.torch.IterableSeqDataset` or ``SeqDataset[i]``), its
    dataset's ragged fields, which :func:`collate_padded` pads (with lengths) even when a batch's records
    happen to share a length."""

    ragged: tuple[str, ...] | None = None


def _known_ragged(record: Any) -> set[str] | None:
    """The ragged fields a record knows it has (:attr:`GatheredRecord.ragged`, those it still holds), else None."""
    names = getattr(record, "ragged", None) if isinstance(record, GatheredRecord) else None
    return None if names is None else set(names).intersection(record)


def _default_collate(batch: Sequence[Mapping[str, Any]], *, collate_fn_map: Any = None) -> dict[str, Any]:
    gathered = batch if isinstance(batch, GatheredRecords) and batch.intact() else None
    ragged = sorted(gathered.lengths) if gathered is not None else [
        k for k, v in batch[0].items() if isinstance(v, torch.Tensor) and v.dim() and
        any(not isinstance(r[k], torch.Tensor) or r[k].shape != v.shape for r in batch)
    ]
    if ragged:
        raise SeqstoreError(
            f"torch's default collate cannot batch the ragged field(s) {ragged} (records of different lengths); "
            "pass collate_fn=seqstore.torch.collate_padded (or dataset.collate()) to the DataLoader: it pads them "
            "and adds <field>_lengths"
        )
    if gathered is not None:
        return dict(gathered.padded)
    return {k: default_collate([r[k] for r in batch]) for k in batch[0]}


# default_collate dispatches on the element's type through this table (torch >= 1.13; seqstore needs 2.1)
default_collate_fn_map[GatheredRecord] = _default_collate


def lengths_mask(lengths: torch.Tensor, t: int) -> torch.Tensor:
    """Bool mask (B, t): ``mask[b, i] = i < lengths[b]``."""
    return torch.arange(t, dtype=lengths.dtype, device=lengths.device)[None, :] < lengths[:, None]


def _put_lengths(out: dict[str, torch.Tensor], name: str, values: torch.Tensor, lengths: torch.Tensor,
                 masks: bool, fields: Iterable[str]) -> None:
    for key in (name + LENGTHS_SUFFIX, *((name + MASK_SUFFIX,) if masks else ())):
        if key in out or key in fields:
            raise KeyError(f"collate: output key {key!r} for ragged field {name!r} clashes with a field of that name")
    out[name] = values
    out[name + LENGTHS_SUFFIX] = lengths
    if masks:
        out[name + MASK_SUFFIX] = lengths_mask(lengths, values.shape[1])


def _check_pad_value(value: Any) -> None:
    """A ValueError unless ``value`` is a number (a 0-d tensor too) to pad ragged fields with."""
    if not isinstance(value, numbers.Number) and not (isinstance(value, torch.Tensor) and value.dim() == 0):
        raise ValueError(f"collate_padded: pad_value must be a number, got {value!r}")


def _check_fits(value: Any, dtype: torch.dtype, name: str) -> None:
    """A ValueError where ``pad_value`` ``value`` is not a value of ``dtype`` (ragged field ``name``): an
    integer field would hold it cut or wrapped (-100 in uint16 is 65436, 0.5 in int32 is 0)."""
    if dtype.is_floating_point or dtype.is_complex:
        return
    low, high = (0, 1) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
    v = value.item() if isinstance(value, torch.Tensor) else value
    whole = not isinstance(v, complex) and (not isinstance(v, float) or v.is_integer())
    if not (whole and low <= v <= high):
        what = "0 or 1" if dtype == torch.bool else f"an integer in [{low}, {high}]"
        raise ValueError(f"collate_padded: pad_value {value!r} is not a value of ragged field {name!r} ({dtype}): "
                         f"expected {what}")


def collate_gathered(padded: dict[str, torch.Tensor], lengths: dict[str, torch.Tensor], *,
                     ragged: Iterable[str] | None = None, masks: bool = False) -> dict[str, torch.Tensor]:
    """The batch :func:`collate_padded` returns for a batch gathered already padded: ``padded``
    (field -> (B, ...)) and ``lengths`` (ragged field -> int64 (B,)), as :class:`GatheredRecords`
    carries them. O(fields) plus the masks."""
    out: dict[str, torch.Tensor] = {}
    names = set(lengths) if ragged is None else set(field_list(ragged) or ())
    if missing := names - set(padded):
        raise KeyError(f"collate_padded: ragged field(s) {sorted(missing)} not in the records")
    for name, value in padded.items():
        if name in names and name in lengths:
            _put_lengths(out, name, value, lengths[name], masks, padded)
        elif name in names:
            raise ValueError(f"collate_padded: field {name!r} is not ragged in this dataset")
        else:
            if name in lengths and len(lengths[name]) and bool((lengths[name] != lengths[name][0]).any()):
                shapes = sorted({(n, *value.shape[2:]) for n in lengths[name].tolist()})
                raise ValueError(f"collate_padded: field {name!r} has records of shapes {shapes}")
            out[name] = value
    return out


def collate_padded(samples: Sequence[Mapping[str, Any]], *, ragged: Iterable[str] | None = None, masks: bool = False,
                   pad_value: float = 0) -> dict[str, torch.Tensor]:
    """Collate records into a dict of tensors (see the module docstring for the layout).

    ``ragged``: the fields to pad (default: from a :class:`GatheredRecords` batch, else every field
    whose records differ in their first dimension and those the records name (:attr:`GatheredRecord.ragged`)
    -- name them to get lengths for equal-length batches too; a string is one field's name; a named field the
    records lack is a KeyError). Records must share inner shapes and dtypes per field
    (else ValueError naming the field).
    Time and memory O(batch elements).
    """
    _check_pad_value(pad_value)
    if not samples:
        raise ValueError("collate_padded: empty batch")
    if isinstance(samples, GatheredRecords) and pad_value == 0 and samples.intact():
        return collate_gathered(samples.padded, samples.lengths, ragged=ragged, masks=masks)
    first = samples[0]
    wanted = None if ragged is None else set(field_list(ragged) or ())
    known = _known_ragged(first) if ragged is None else None  # (besides those whose shapes differ)
    out = {}
    for name in first:
        try:
            ts = [to_tensor(s[name], name=name) for s in samples]
        except KeyError:
            raise KeyError(f"collate_padded: some records lack field {name!r}") from None
        shapes = {tuple(t.shape) for t in ts}
        is_ragged = (name in wanted) if wanted is not None else len(shapes) > 1 or (
            known is not None and name in known and all(t.dim() for t in ts))
        if not is_ragged:
            if len(shapes) > 1:
                raise ValueError(f"collate_padded: field {name!r} has records of shapes {sorted(shapes)}")
            out[name] = torch.stack(ts)
            continue
        if any(t.dim() == 0 for t in ts):
            raise ValueError(f"collate_padded: field {name!r} is scalar and cannot be padded")
        inner = {tuple(t.shape[1:]) for t in ts}
        dtypes = {t.dtype for t in ts}
        if len(inner) > 1 or len(dtypes) > 1:
            raise ValueError(f"collate_padded: ragged field {name!r} mixes inner shapes {sorted(inner)} / "
                             f"dtypes {dtypes}")
        _check_fits(pad_value, ts[0].dtype, name)
        lengths = torch.tensor([t.shape[0] for t in ts], dtype=torch.int64)
        tmax = int(lengths.max())
        values = torch.full((len(ts), tmax, *ts[0].shape[1:]), pad_value, dtype=ts[0].dtype)
        for b, t in enumerate(ts):
            values[b, : t.shape[0]] = t
        _put_lengths(out, name, values, lengths, masks, first)
    if wanted is not None and (missing := wanted - set(first)):
        raise KeyError(f"collate_padded: ragged field(s) {sorted(missing)} not in the records")
    return out


class PaddedCollate:
    """A picklable :func:`collate_padded` with fixed options, for ``DataLoader(collate_fn=...)``."""

    def __init__(self, ragged: Iterable[str] | None = None, *, masks: bool = False, pad_value: float = 0) -> None:
        _check_pad_value(pad_value)
        self.ragged = None if ragged is None else tuple(field_list(ragged) or ())
        self.masks = masks
        self.pad_value = pad_value

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        return collate_padded(samples, ragged=self.ragged, masks=self.masks, pad_value=self.pad_value)

    def __repr__(self) -> str:
        return f"PaddedCollate(ragged={self.ragged}, masks={self.masks}, pad_value={self.pad_value})"
