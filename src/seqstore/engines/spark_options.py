"""The options of the ``"seqstore"`` Spark data source: typed option values with errors naming the option,
the path, the client options of a URL (``storageOptions``, ``storage.<key>``) and the ``schema`` option.

See :class:`seqstore.engines.spark.DataSource` for the options themselves.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any

from ..errors import SchemaError
from ..io.object_common import check_not_chained
from ..io.objects import is_remote
from ..schema import Schema

__all__ = ["STORAGE_PREFIX", "READ_OPTIONS", "WRITE_OPTIONS", "schema_option"]


def opt_int(options: Mapping[str, str], key: str, default: int | None, where: str) -> int | None:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = int(str(raw))
    except ValueError:
        raise ValueError(f"{where}: option {key}={raw!r} is not an integer") from None
    if value <= 0:
        raise ValueError(f"{where}: option {key}={raw!r} must be positive")
    return value


def opt_bool(options: Mapping[str, str], key: str, where: str) -> bool:
    raw = str(options.get(key, "false")).strip().lower()
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no", ""):
        return False
    raise ValueError(f"{where}: option {key}={options.get(key)!r} must be true or false")


def opt_json(options: Mapping[str, str], key: str, where: str) -> Any:
    raw = options.get(key)
    if raw is None:
        return None
    try:
        return json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: option {key} is not JSON ({exc}): {str(raw)[:200]!r}") from None


#: prefix of the options that are single keys of the remote store's client (``storage.endpoint``)
STORAGE_PREFIX = "storage."


#: the options a write takes (``path`` is what ``.save(path)`` sets), besides ``storage.<key>``
WRITE_OPTIONS = ("path", "schema", "idColumn", "shardBytes", "maxShardRecords", "metadata", "errorIfExists",
                 "storageOptions")
#: the options a read takes (``path`` is what ``.load(path)`` sets), besides ``storage.<key>``
READ_OPTIONS = ("path", "fields", "idColumn", "partitionRecords", "batchRecords", "storageOptions")


def check_options(options: Mapping[str, str], known: tuple[str, ...], where: str) -> None:
    """Refuse options the data source does not read (Spark passes any ``.option(k, v)`` on, lower-cased,
    so a misspelled one would otherwise be ignored); the message lists the known ones."""
    by_lower = {k.lower(): k for k in known}
    unknown = sorted(str(k) for k in options
                     if str(k).lower() not in by_lower
                     and not (str(k).lower().startswith(STORAGE_PREFIX) and len(str(k)) > len(STORAGE_PREFIX)))
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key.lower().replace("_", ""), list(by_lower), n=1, cutoff=0.7)
        if close:
            hints.append(f"{key!r} -> {by_lower[close[0]]!r}")
    names = ", ".join(k for k in known if k != "path")
    raise ValueError(f"{where}: unknown option(s) {unknown}; the seqstore data source takes {names} and "
                     f"storage.<key> (Spark passes option names lower-cased)"
                     + (f"; did you mean {', '.join(hints)}?" if hints else ""))


def storage_options_of(options: Mapping[str, str], path: str, where: str) -> dict[str, Any] | None:
    """The client options of a store at a URL: the ``storageOptions`` JSON object, then every
    ``storage.<key>`` option (None when there are none); refused for a local path."""
    out: dict[str, Any] = {}
    obj = opt_json(options, "storageOptions", where)
    if obj is not None:
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: option storageOptions must be a JSON object")
        out.update(obj)
    for key, value in options.items():
        if str(key).lower().startswith(STORAGE_PREFIX) and len(key) > len(STORAGE_PREFIX):
            out[str(key)[len(STORAGE_PREFIX):]] = value
    if out and not is_remote(path):
        raise ValueError(f"{where}: storageOptions / storage.* options are for URLs of object storage, not local paths")
    return out or None


def option_path(options: Mapping[str, str]) -> str:
    path = options.get("path")
    if not path:
        raise ValueError("seqstore data source: no path; use .save(path) / .load(path)")
    check_not_chained(str(path))  # (no local path: it was written as a directory named ``simplecache::s3:``)
    return str(path)[len("file://"):] if str(path).startswith("file://") else str(path)  # (a file:// URL: its path)


def schema_option(schema: Schema | Mapping[str, Any]) -> str:
    """The value of the ``schema`` write option for seqstore fields: ``{"col": Field(...)}`` or a
    :class:`~seqstore.Schema` (packed groups included) as JSON."""
    return json.dumps((schema if isinstance(schema, Schema) else Schema(schema)).to_json())


def given_schema(options: Mapping[str, str], where: str) -> Schema | None:
    obj = opt_json(options, "schema", where)
    if obj is None:
        return None
    if isinstance(obj, dict):  # shorthand {"col": ["float16", [null, 16]]} besides {"col": {"dtype":, "shape":}}
        obj = {k: ({"dtype": v[0], "shape": v[1:] and v[1]} if isinstance(v, list) and len(v) in (1, 2) else v)
               for k, v in obj.items()}
    try:
        return Schema.from_json(obj)
    except (SchemaError, TypeError, ValueError) as exc:  # (a packed field's "columns" of the wrong kind)
        raise SchemaError(f"{where}: option schema: {exc}") from exc
