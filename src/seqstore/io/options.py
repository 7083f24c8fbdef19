"""How a store is opened, parsed once: :class:`StoreOptions`.

:meth:`StoreOptions.of` turns the keyword arguments of :func:`seqstore.open` (``storage_options``,
``filesystem``, ``cache_dir``, ``cache_bytes``) or a :class:`StoreOptions` made earlier into one frozen
value, checking every option seqstore understands (a :class:`~seqstore.errors.ConfigError` names the option
and what it takes). ``storage_options`` holds the back end's own keys (obstore's or the fsspec
filesystem's, passed through as :attr:`StoreOptions.backend`) and seqstore's (:data:`SEQSTORE_OPTIONS`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import ConfigError

__all__ = ["SEQSTORE_OPTIONS", "StoreOptions", "check_options", "option_flag", "redact"]

#: seqstore's numeric options: (kind, least value, whether the least value itself is allowed)
_RANGES: dict[str, tuple[type, float, bool]] = {
    "max_requests": (int, 1, True),
    "max_inflight_bytes": (int, 1, True),
    "coalesce_gap": (int, 0, True),
    "timeout": (float, 0, False),
    "connect_timeout": (float, 0, False),
    "max_retries": (int, 0, True),
    "retry_timeout": (float, 0, True),
}
#: seqstore's boolean options (``verify_reads``: the Store's, read by :func:`seqstore.open`, not by the source)
_FLAGS = ("read_once", "direct_reads", "verify_reads")
#: storage_options keys that are seqstore's own (taken out before the back end sees the options)
SEQSTORE_OPTIONS = (*_RANGES, *_FLAGS)
_TRUE = ("1", "true", "yes")  # what the client options (allow_http, ...) have always taken as true
_FALSE = ("0", "false", "no", "")
_SECRET_WORDS = ("secret", "token", "key", "password", "credential", "sas", "signature")
#: the keyword arguments of ``seqstore.open`` that :meth:`StoreOptions.of` takes besides storage_options
REMOTE_ARGS = ("filesystem", "cache_dir", "cache_bytes")


def redact(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` with every value whose key looks secret replaced by ``"***"`` (for reprs and logs)."""
    return {k: "***" if any(w in k.lower() for w in _SECRET_WORDS) and "id" not in k.lower() else v
            for k, v in (options or {}).items()}


def option_flag(value: Any, url: str | None = None, key: str = "") -> bool:
    """A boolean storage option (``True``, ``"true"``, ``"1"``, ``"yes"``; the opposites). With ``url``, a
    value that is neither is a :class:`ConfigError` naming the store and option ``key``."""
    text = str(value).strip().lower()
    if url is not None and text not in _TRUE + _FALSE:
        raise ConfigError(f"{url}: storage option {key}={value!r}: expected true or false")
    return text in _TRUE


def check_options(url: str, options: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` naming the option and what it takes if one of seqstore's own options in
    ``options`` (``max_requests``, ``timeout``, ...) is not a value in its range. Strings are accepted
    where they spell one (``-o max_requests=16`` on the command line)."""
    for key, (kind, least, inclusive) in _RANGES.items():
        if key not in options:
            continue
        value = options[key]
        try:
            if isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer()):
                raise ValueError
            number = kind(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError, OverflowError):
            number = None
        if number is None or not math.isfinite(number) or number < least or (number == least and not inclusive):
            what = "an integer" if kind is int else "a number of seconds"
            bound = f">= {least}" if inclusive else f"> {least}"
            raise ConfigError(f"{url}: storage option {key}={value!r}: expected {what} {bound}")
    for key in _FLAGS:
        if key in options:
            option_flag(options[key], url, key)


def _fsspec_filesystem(fs: Any) -> bool:
    """Whether ``fs`` is an fsspec filesystem (True without fsspec: its back end then names the package)."""
    try:
        import fsspec
    except ImportError:
        return True
    return isinstance(fs, fsspec.AbstractFileSystem)


@dataclass(frozen=True)
class StoreOptions:
    """The options of one opened store (see the module docstring). seqstore's own keys, with their defaults
    below, are those of the table in docs/remote.md ("URLs and set-up"): request limits
    (``max_requests``, ``max_inflight_bytes``, ``coalesce_gap``), ``timeout`` and ``connect_timeout`` per
    request, retries (``retry_timeout``, ``max_retries``: None, only ``retry_timeout`` limits them), and
    the read path (``read_once``: None, where the store's data are more bytes than the node cache's budget;
    ``direct_reads``; ``verify_reads``: the Store checks each record it reads against its checksums, see
    :func:`seqstore.open`; ``seqstore verify`` and ``copy`` check every byte anyway). ``backend``: the back
    end's own options; ``filesystem``: an fsspec filesystem to read through; ``cache_dir`` / ``cache_bytes``:
    the node cache (None: ``$SEQSTORE_CACHE_DIR`` / ``$SEQSTORE_CACHE_BYTES`` or their defaults)."""

    backend: Mapping[str, Any] = field(default_factory=dict)
    filesystem: Any = None
    cache_dir: str | None = None
    cache_bytes: int | str | None = None
    max_requests: int = 64
    max_inflight_bytes: int = 256 << 20
    coalesce_gap: int = 64 << 10
    timeout: float = 30.0
    connect_timeout: float = 5.0
    retry_timeout: float = 120.0
    max_retries: int | None = None
    read_once: bool | None = None
    direct_reads: bool = True
    verify_reads: bool = False

    @classmethod
    def of(cls, url: str, storage_options: StoreOptions | Mapping[str, Any] | None = None,
           **remote: Any) -> StoreOptions:
        """The options of the store at ``url`` from ``storage_options`` (a mapping, or options parsed
        already) and the keyword arguments ``filesystem``, ``cache_dir`` and ``cache_bytes``."""
        if unknown := sorted(set(remote) - set(REMOTE_ARGS)):
            raise TypeError(f"unexpected keyword argument {unknown[0]!r} (remote stores take storage_options, "
                            f"{', '.join(REMOTE_ARGS)})")
        given = {k: v for k, v in remote.items() if v is not None}
        if not isinstance(given.get("cache_dir", ""), (str, os.PathLike)):
            raise ConfigError(f"{url}: cache_dir: expected a directory path, got {given['cache_dir']!r}")
        if "filesystem" in given and not _fsspec_filesystem(given["filesystem"]):
            raise ConfigError(f"{url}: filesystem: expected an fsspec filesystem (an fsspec.AbstractFileSystem), "
                              f"got a {type(given['filesystem']).__name__}")
        if isinstance(storage_options, StoreOptions):
            return storage_options.replace(**given) if given else storage_options
        try:
            opts = dict(storage_options or {})
        except (TypeError, ValueError):  # e.g. "anon=true": named, not dict()'s bare error
            raise ConfigError(f"{url}: storage_options: expected a mapping of option names to values, got a "
                              f"{type(storage_options).__name__} (its value not shown: it may hold a secret)") from None
        if bad := [k for k in opts if not isinstance(k, str)]:  # (back ends take str names; else a bare AttributeError)
            raise ConfigError(f"{url}: storage option {bad[0]!r}: option names are strings, got a "
                              f"{type(bad[0]).__name__}")
        check_options(url, opts)  # a seqstore error naming the option, not int()'s ValueError
        mine: dict[str, Any] = {key: opts.pop(key) for key in SEQSTORE_OPTIONS if key in opts}
        for key, v in mine.items():
            mine[key] = option_flag(v) if key in _FLAGS else _RANGES[key][0](v.strip() if isinstance(v, str) else v)
        return cls(backend=opts, **mine).replace(**given)

    def __repr__(self) -> str:  # never a credential: values whose key looks secret are shown as ***
        shown = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}
        shown.pop("backend", None)
        return f"StoreOptions({redact(self.backend)!r}, {', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def replace(self, **changes: Any) -> StoreOptions:
        """These options with ``changes``."""
        if changes.get("cache_dir") is not None:
            changes["cache_dir"] = os.fspath(changes["cache_dir"])
        return dataclasses.replace(self, **changes)

    def storage_options(self) -> dict[str, Any]:
        """The ``storage_options`` mapping these options were parsed from (the back end's keys and
        seqstore's keys that differ from their defaults)."""
        base = StoreOptions()
        changed = {k: getattr(self, k) for k in SEQSTORE_OPTIONS if getattr(self, k) != getattr(base, k)}
        return {**self.backend, **changed}
