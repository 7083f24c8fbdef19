"""The ``seqstore convert`` and ``seqstore export`` subcommands, built from one table of formats.

``cli.py`` registers them with :func:`add_subcommands`::

    from .interop.commands import add_subcommands as add_interop_subcommands
    add_interop_subcommands(sub)          # sub = parser.add_subparsers(...)

:data:`SOURCES` (``convert --from NAME``) and :data:`TARGETS` (``export --to NAME``) map each format's
name to a :class:`Converter`. Everything the help says about the formats is generated from these tables:
the ``--from``/``--to`` lists, the option groups (an option shared by several formats is one group, its
help prefixed with their names), which formats ``-o`` applies to, and what ``OUT`` is for each target. A
new format is one :func:`register_source`/:func:`register_target` call made before ``add_subcommands``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..errors import SeqstoreError
from ..io.local_source import local_path
from ..io.objects import is_remote
from ..store import open_store
from ._common import Progress, announce_total, check_apart, check_sources_apart, file_url_path, remove_path
from .cli_words import cli_message

__all__ = ["SOURCES", "TARGETS", "Converter", "Interrupted", "Option", "Progress", "ProgressBar", "SuggestingParser",
           "cli_message", "key_values", "register_source", "register_target", "add_subcommands", "convert_main",
           "export_main", "positive_int"]


@dataclasses.dataclass(frozen=True, eq=False)
class Option:
    """One command-line option of one or more formats: ``argparse`` flags and keywords (``help`` without
    the formats' names, which the parser puts in front)."""

    flags: tuple[str, ...]
    kwargs: Mapping[str, Any]

    @classmethod
    def of(cls, *flags: str, **kwargs: Any) -> Option:
        return cls(flags, kwargs)


@dataclasses.dataclass(frozen=True)
class Converter:
    """One ``--from`` source or ``--to`` target.

    ``run(args, progress)`` does the work (``progress(n)`` advances the bar by ``n`` of ``unit``;
    ``progress.add_total(n)``, called once the inputs are validated, sizes it) and returns what it made
    (a Store or a path); ``add_arguments(group)`` adds options by hand (prefer ``options``, whose help the
    parser generates); ``total(args)`` is an up-front total for a converter that does not call
    ``add_total`` (None: unknown). ``url``: a source writes its new store to a URL of object storage
    (``-o`` applies). ``out``: what a target's OUT is (a file, a directory, a prefix). ``chunked``: whether
    ``--chunk-mb`` applies (``-o`` and ``--chunk-mb`` are refused where they do not).
    """

    help: str
    run: Callable[[argparse.Namespace, Progress], Any]
    add_arguments: Callable[[Any], None] | None = None
    total: Callable[[argparse.Namespace], int | None] | None = None
    unit: str = "B"
    options: tuple[Option, ...] = ()
    url: bool = False
    out: str = "a file"
    chunked: bool = True


def register_source(name: str, converter: Converter) -> None:
    """Add (or replace) a ``convert --from`` source. Call before :func:`add_subcommands`."""
    SOURCES[name] = converter


def register_target(name: str, converter: Converter) -> None:
    """Add (or replace) an ``export --to`` target. Call before :func:`add_subcommands`."""
    TARGETS[name] = converter


# -------------------------------------------------------------------------------------- helpers


def key_values(items: list[str] | None, what: str, *, empty_value: bool = False, bare: bool = False
                ) -> dict[str, str] | None:
    """``NAME=VALUE`` items as a dict (None for none); SeqstoreError naming ``what`` for a malformed one or a
    repeated name. ``empty_value``: ``KEY=`` is allowed (options of a client); ``bare``: ``NAME`` maps to itself."""
    out: dict[str, str] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        value = value if eq or not bare else key
        if key in out or not key or not (eq or bare) or not (value or empty_value):
            expected = "each name once" if key in out else "KEY=VALUE" if empty_value else "NAME=FIELD"
            raise SeqstoreError(f"{what} {item!r}: expected {expected}")
        out[key] = value
    return out or None


def positive_int(text: str) -> int:  # an option's positive integer (argparse's usage error otherwise)
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def _storage_options(args: argparse.Namespace) -> dict[str, str] | None:  # -o KEY=VALUE (None: none)
    return key_values(getattr(args, "storage_option", None), "--storage-option", empty_value=True)


def _sources_and_out(args: argparse.Namespace) -> tuple[list[str], str]:
    paths = list(args.paths)
    if len(paths) < 2:
        raise SeqstoreError("convert: give one or more sources and then the output store path")
    return paths[:-1], paths[-1]


def _one_source(args: argparse.Namespace, what: str) -> tuple[str, str]:
    srcs, out = _sources_and_out(args)
    if len(srcs) != 1:
        raise SeqstoreError(f"convert --from {args.source}: give one {what}, then the output store")
    return srcs[0], out


def _check_options(args: argparse.Namespace, command: str) -> None:
    """Refuse an option the chosen format would ignore (a usage error): ``--chunk-mb``, or another format's
    own option given a value other than its default; give ``--chunk-mb`` its default, 64."""
    flag, table, name = ("--from", SOURCES, args.source) if command == "convert" else ("--to", TARGETS, args.target)
    for opt, users, used in [("--chunk-mb", [n for n, c in table.items() if c.chunked], args.chunk_mb is not None)] + [
            (opt, users, getattr(args, dest) != was) for dest, (opt, users, was) in args.format_options.items()]:
        if used and name not in users:
            raise SeqstoreError(f"{command} {flag} {name}: {opt} does not apply (it is for {flag} {', '.join(users)})")
    args.chunk_mb = 64 if args.chunk_mb is None else args.chunk_mb
    if command == "convert" and not table[name].url and _storage_options(args):
        users = ", ".join(n for n, c in table.items() if c.url)
        raise SeqstoreError(f"convert --from {name}: -o does not apply (a local store; -o is for --from {users})")


def _common(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:  # what every importer takes
    return dict(chunk_bytes=args.chunk_mb << 20, shard_bytes=args.shard_mb << 20, overwrite=args.overwrite,
                progress=progress, workers=args.workers or os.cpu_count() or 1, storage_options=_storage_options(args))


def _none(value: str | None) -> str | None:  # an option's value, ``none`` (any case) read as None
    return None if value is not None and value.lower() == "none" else value


# ------------------------------------------------------------------------------------- sources


def _hdf_run(args: argparse.Namespace, progress: Progress) -> Any:
    from .returnn import import_hdf

    return import_hdf(*_sources_and_out(args), rename=key_values(args.rename, "--rename"),
                      **_common(args, progress))


def _arrow_run(fmt: str) -> Callable[[argparse.Namespace, Progress], Any]:
    def run(args: argparse.Namespace, progress: Progress) -> Any:
        from .arrow import import_arrow, import_parquet

        return (import_parquet if fmt == "parquet" else import_arrow)(*_sources_and_out(args), columns=key_values(
            args.map, "--map"), id_column=args.id_column, **_common(args, progress))

    return run


def _hf_run(args: argparse.Namespace, progress: Progress) -> Any:
    from .hf import import_hf

    return import_hf(*_one_source(args, "datasets save_to_disk directory"), split=args.split,
                     columns=key_values(args.map, "--map"), id_column=args.id_column, batch_size=args.batch_size,
                     **_common(args, progress))


def _megatron_run(args: argparse.Namespace, progress: Progress) -> Any:
    from .megatron import import_megatron

    return import_megatron(*_sources_and_out(args), field=args.tokens_field, **_common(args, progress))


def _wds_run(args: argparse.Namespace, progress: Progress) -> Any:
    from .webdataset import import_webdataset

    return import_webdataset(*_sources_and_out(args), fields=key_values(args.ext, "--ext"),
                             strict=not args.skip_unknown,
                             source_options=key_values(args.source_option, "--source-option", empty_value=True),
                             **_common(args, progress))


def _lhotse_run(args: argparse.Namespace, progress: Progress) -> Any:
    from .lhotse import import_lhotse

    return import_lhotse(*_sources_and_out(args), features=args.features, features_dtype=args.features_dtype,
                         audio=args.audio, audio_dtype=args.audio_dtype, channels=args.channels,
                         text_separator=args.text_separator, **_common(args, progress))


def _logix_run(args: argparse.Namespace, progress: Progress) -> Any:
    from ..log.logix import import_logix

    src, out = _one_source(args, "LogIX log directory")
    src = file_url_path(src)
    if args.workers is not None:
        raise SeqstoreError("convert --from logix: --workers does not apply (a LogIX log is imported in one process)")
    if not os.path.exists(src):
        raise FileNotFoundError(f"{src}: no such file or directory (expected a LogIX log directory)")
    import_logix(src, out, overwrite=args.overwrite, batch_records=args.batch_records,
                 shard_bytes=args.shard_mb << 20, progress=_RunningTotal(progress))
    return open_store(out)


@dataclasses.dataclass(eq=False)
class _RunningTotal:
    """Turns import_logix's running totals into increments for a bar; passes ``add_total`` on."""

    _progress: Progress
    _done: int = 0

    def __call__(self, records: int) -> None:
        self._progress(records - self._done)
        self._done = records

    def add_total(self, n: int) -> None:
        announce_total(self._progress, n)


# ------------------------------------------------------------------------------------- targets


def _hdf_export(args: argparse.Namespace, progress: Progress) -> Any:
    from .returnn import export_hdf

    return export_hdf(args.store, args.out, inputs=_none(args.inputs), fields=key_values(args.field, "--field",
                      bare=True), chunk_bytes=args.chunk_mb << 20, overwrite=args.overwrite, progress=progress)


def _megatron_export(args: argparse.Namespace, progress: Progress) -> Any:
    from .megatron import export_megatron

    return export_megatron(args.store, args.out, field=args.tokens, dtype=args.dtype, documents=_none(args.documents),
                           chunk_bytes=args.chunk_mb << 20, overwrite=args.overwrite, progress=progress)


def _wds_export(args: argparse.Namespace, progress: Progress) -> Any:
    from .webdataset import export_webdataset

    return export_webdataset(args.store, args.out, fields=key_values(args.ext, "--ext"), keys=args.keys,
                             shard_records=args.shard_records, shard_bytes=args.shard_mb << 20,
                             overwrite=args.overwrite, progress=progress)


def _hf_export(args: argparse.Namespace, progress: Progress) -> Any:
    from .hf_export import export_hf

    fields = [f for item in args.hf_field or [] for f in item.split(",") if f] or None
    return export_hf(args.store, args.out, fields=fields, id_column=_none(args.hf_id_column), overwrite=args.overwrite,
                     progress=progress)


# ------------------------------------------------------------------------------------- the table

MAP = Option.of("--map", action="append", metavar="COLUMN=FIELD",
                help="import COLUMN as field FIELD (repeatable; default: every column)")
ID_COLUMN = Option.of("--id-column", metavar="COLUMN",
                      help="a string or integer column whose values become the record ids")

#: ``seqstore convert --from NAME``: name -> converter (the order of the help).
SOURCES: dict[str, Converter] = {
    "returnn-hdf": Converter("RETURNN HDF files (SimpleHDFWriter / HDFDataset layout)", _hdf_run, url=True, options=(
        Option.of("--rename", action="append", metavar="STREAM=FIELD",
                  help="store stream STREAM ('inputs' or a target key) as field FIELD (repeatable)"),)),
    "hf": Converter("Hugging Face datasets save_to_disk directory (a Dataset, or --split of a DatasetDict)", _hf_run,
                    unit="rec", url=True, options=(MAP, ID_COLUMN,
        Option.of("--split", metavar="NAME", help="the split to import from a DatasetDict directory"),
        Option.of("--batch-size", type=positive_int, metavar="ROWS",
                  help="rows read per step (default: about --chunk-mb of rows)"))),
    "parquet": Converter("Parquet files or directories", _arrow_run("parquet"), unit="rec", url=True,
                         options=(MAP, ID_COLUMN)),
    "arrow": Converter("Arrow IPC files or directories (incl. HF datasets save_to_disk)",
                       _arrow_run("arrow"), unit="rec", url=True,
                       options=(MAP, ID_COLUMN)),
    "logix": Converter("LogIX / AnaLog per-example log directory (log_rank_R_chunk_C.mmap + _metadata.json)",
                       _logix_run, unit="rec", chunked=False, options=(
        Option.of("--batch-records", type=positive_int, default=4096,
                  help="records read and written per step (bounds memory; default 4096)"),)),
    "megatron": Converter("Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx)", _megatron_run, unit="rec",
                          url=True, options=(
        Option.of("--tokens-field", default="tokens", metavar="FIELD", help="the field of the tokens (default "
                  "'tokens')"),)),
    "webdataset": Converter("WebDataset tar shards (files, directories, {000..009} ranges, URLs)", _wds_run,
                            url=True, options=(
        Option.of("--ext", action="append", metavar="EXT=FIELD", help="import members KEY.EXT as field FIELD "
                  "(repeatable; default: every extension of the first sample, under its own name)"),
        Option.of("--skip-unknown", action="store_true",
                  help="skip members whose extension has no field (default: an error)"),
        Option.of("--source-option", action="append", default=[], metavar="KEY=VALUE",
                  help="an option of the client that reads shard URLs, e.g. allow_http=true"))),
    "lhotse": Converter("Lhotse cut manifests (cuts.jsonl.gz, read lazily)", _lhotse_run, unit="cut", url=True,
                        options=(
        Option.of("--features", action="store_true",
                  help="store cut.load_features() as field 'features' (every cut needs features)"),
        Option.of("--features-dtype", choices=("float32", "float16"), default="float32",
                  help="dtype of 'features' (default float32, as Lhotse loads them)"),
        Option.of("--audio", action=argparse.BooleanOptionalAction, default=None,
                  help="store cut.load_audio() as mono field 'audio' and 'sampling_rate' (every cut needs a "
                  "recording); default: when the first cut has a recording and no features and --features is "
                  "not given"),
        Option.of("--audio-dtype", choices=("float32", "int16"), default="float32",
                  help="dtype of 'audio' (int16: samples x 32768, rounded; default float32)"),
        Option.of("--channels", choices=("error", "first", "mix"), default="error",
                  help="a cut of several channels is refused (default), its first channel, or their mean"),
        Option.of("--text-separator", default=" ", metavar="SEP",
                  help="joins the texts of a cut's supervisions in field 'text' (default one space)"))),
}

#: ``seqstore export --to NAME``: name -> converter (the order of the help).
TARGETS: dict[str, Converter] = {
    "returnn-hdf": Converter("one RETURNN HDF file for HDFDataset", _hdf_export, options=(
        Option.of("--inputs", default="auto", help="field written as 'inputs' (default: the imported one, else "
                  "'data'; 'none': targets only)"),
        Option.of("--field", action="append", metavar="FIELD[=KEY]",
                  help="write FIELD as targets/data/KEY (repeatable; default: all other fields)"))),
    "megatron": Converter("PREFIX.bin + PREFIX.idx for Megatron-Core's IndexedDataset", _megatron_export,
                          out="a prefix (PREFIX.bin + PREFIX.idx)", options=(
        Option.of("--tokens", metavar="FIELD", help="the ragged field to write (default: the only one)"),
        Option.of("--dtype", help="token dtype in the files (default: the field's)"),
        Option.of("--documents", default="auto", metavar="FIELD", help="integer field whose changes start "
                  "documents (default: the imported one; 'none': one document per record)"))),
    "webdataset": Converter("a directory of WebDataset tar shards", _wds_export, unit="rec", out="a directory",
                            chunked=False, options=(
        Option.of("--ext", action="append", metavar="FIELD=EXT",
                  help="write FIELD as members KEY.EXT (repeatable; default: every field)"),
        Option.of("--keys", choices=("auto", "ids", "index"), default="auto",
                  help="sample keys from the record ids or record numbers (default: ids if any)"),
        Option.of("--shard-records", type=positive_int, default=10_000, metavar="N",
                  help="records per tar shard at most (default 10000)"),
        Option.of("--shard-mb", type=positive_int, default=1024, metavar="MB",
                  help="a shard ends after the record that passes this size (default 1024)"))),
    "hf": Converter("a Hugging Face datasets save_to_disk directory (datasets.load_from_disk)", _hf_export,
                    unit="rec", out="a directory", chunked=False, options=(
        Option.of("--fields", dest="hf_field", action="append", metavar="A,B",
                  help="the fields to write as columns (repeatable; default: every field)"),
        Option.of("--id-column", dest="hf_id_column", default="id", metavar="NAME",
                  help="the column of the record ids, when the store has ids (default 'id'; 'none': no ids)"))),
}


# ------------------------------------------------------------------------------------- commands


class ProgressBar:
    """The progress callback the commands hand to a converter: a tqdm bar on stderr, drawn only when
    the work starts (the converter's first ``add_total`` or step, which come after its inputs and
    output path are validated), so a command that fails on bad input draws no bar.

    ``add_total(n)`` grows the total (in the converter's unit), ``bar(n)`` advances it; on success
    the steps add up to the total. ``total`` is a fixed total for converters that announce none.
    """

    def __init__(self, desc: str, unit: str, *, disable: bool = False, total: int | None = None) -> None:
        self.desc, self.unit, self.disable = desc, unit, disable
        self._total = total
        self._bar: Any = None

    def _open(self) -> Any:
        if self._bar is None:
            self._bar = tqdm(total=self._total, desc=self.desc, unit=self.unit, unit_scale=True,
                             disable=self.disable, file=sys.stderr)
        return self._bar

    def add_total(self, n: int) -> None:
        bar = self._open()
        bar.total = (bar.total or 0) + n
        bar.refresh()

    def __call__(self, n: int) -> None:
        self._open().update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _with_bar(conv: Converter, args: argparse.Namespace, desc: str) -> Any:
    total = None if args.quiet or conv.total is None else conv.total(args)
    bar = ProgressBar(desc, conv.unit, disable=args.quiet, total=total)
    try:
        return conv.run(args, bar)
    finally:
        bar.close()


_USER_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError, KeyError)


def _user_error(exc: OSError | KeyError) -> int:
    print(f"seqstore: error: {cli_message(exc)}", file=sys.stderr)
    return 2


class Interrupted(KeyboardInterrupt):
    """An interrupt after which something written stays: its message says what (instead of "nothing was written")."""


def _identity(path: Path) -> tuple[int, int] | None:  # which file or directory is at ``path`` (None: nothing)
    try:
        st = os.lstat(path)
    except OSError:  # (missing, or a file where a directory above it goes: the command names that)
        return None
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def _undone_on_interrupt(out: str, *, pair: bool = False) -> Iterator[None]:
    """On an interrupt (Ctrl-C, SIGTERM), even one after the output was installed, remove the local outputs
    that did not exist before: ``out``, and for Megatron (``pair``) ``PREFIX.bin`` / ``PREFIX.idx`` (``out``
    less a trailing ``.bin`` / ``.idx``), so that nothing is left, as ``cli.main`` then says. An output that
    existed and was replaced (``--overwrite``) before the interrupt stays, and :class:`Interrupted` says so.
    A ``file://`` URL is its path (as the commands write it)."""
    path = "" if is_remote(out) else os.fspath(local_path(out))
    prefix = path[:-4] if pair and path.endswith((".bin", ".idx")) else path
    paths = [Path(path), *(Path(prefix + s) for s in (".bin", ".idx") if pair)] if path else []
    before = {q: _identity(q) for q in paths}
    try:
        yield
    except KeyboardInterrupt:
        for q, was in before.items():
            if was is None:
                remove_path(q)
        if any(was is not None and _identity(q) != was for q, was in before.items()):
            raise Interrupted(f"{out} holds the new output (it replaced what was there)") from None
        raise


def convert_main(args: argparse.Namespace) -> int:
    """``seqstore convert --from FORMAT SOURCE... OUT``: build a new store from files of another format.
    Returns the exit status (0; 2 for missing/existing paths; SeqstoreError propagates to cli.main)."""
    conv = SOURCES[args.source]
    srcs, out = _sources_and_out(args)
    _check_options(args, "convert")
    check_sources_apart(srcs, out, "convert")  # (every format: --from logix too)
    with _undone_on_interrupt(out):
        try:
            store = _with_bar(conv, args, f"convert {args.source}")
        except _USER_ERRORS as exc:
            return _user_error(exc)
        if not args.quiet:
            n = len(store) if hasattr(store, "__len__") else "?"
            shards = getattr(store, "num_shards", "?")
            print(f"{out}: {n} records, {shards} shard(s)")
    return 0


def export_main(args: argparse.Namespace) -> int:
    """``seqstore export --to FORMAT STORE OUT``: write a store in another format. Returns the exit status."""
    conv = TARGETS[args.target]
    _check_options(args, "export")
    check_apart(args.store, [args.out], "export")  # (before the interrupt's clean-up could remove OUT)
    with _undone_on_interrupt(os.fspath(args.out), pair=args.target == "megatron"):
        try:
            opts = _storage_options(args)
            if opts is not None:  # a store at a URL that needs options of its client: opened here, handed over
                if not is_remote(args.store):  # (a local store would ignore them, as info and verify refuse them)
                    raise SeqstoreError(f"{args.store}: -o options are for URLs of object storage, not local paths")
                args.store = open_store(args.store, storage_options=opts)
            out = _with_bar(conv, args, f"export {args.target}")
        except _USER_ERRORS as exc:
            return _user_error(exc)
        if not args.quiet:
            print(f"wrote {out}")
    return 0


# ------------------------------------------------------------------------------------- parsers


class SuggestingParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors suggest the closest spelling: for an unrecognized option, the
    option of the chosen subcommand it most resembles; for an invalid choice, the closest choice."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def _options(self) -> list[str]:  # this parser's option strings and the named subcommand's
        found = [s for a in self._actions for s in a.option_strings]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for word in getattr(self, "_argv", []):
                    if word in action.choices:
                        found += [s for a in action.choices[word]._actions for s in a.option_strings]
                        break
        return found

    def error(self, message: str) -> Any:
        hints = []
        if message.startswith("unrecognized arguments:"):
            options = self._options()
            for word in message.split(":", 1)[1].split():
                if word.startswith("-") and (close := difflib.get_close_matches(word.split("=")[0], options, 1)):
                    hints.append(f"{word}: did you mean {close[0]}?")
        elif (bad := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)) is not None:
            choices = re.findall(r"'([^']*)'", bad.group(2))
            if close := difflib.get_close_matches(bad.group(1), choices, 1):
                hints.append(f"did you mean {close[0]!r}?")
        super().error("; ".join([message, *hints]))


def _add_options(parser: Any, table: Mapping[str, Converter], flag: str) -> None:
    """The formats' own options, one group per set of formats that share them, help prefixed with their
    names (an option object listed by several formats is added once)."""
    users: dict[Option, list[str]] = {}
    for name, conv in table.items():
        for option in conv.options:
            users.setdefault(option, []).append(name)
    groups: dict[tuple[str, ...], Any] = {}
    parser.set_defaults(format_options={})  # dest -> (option, its formats, its default), for _check_options
    for option, names in users.items():
        key = tuple(names)
        groups[key] = groups.get(key) or parser.add_argument_group(", ".join(f"{flag} {n}" for n in names))
        kwargs = {**option.kwargs, "help": f"{'/'.join(names)}: {option.kwargs.get('help', '')}"}
        action = groups[key].add_argument(*option.flags, **kwargs)
        parser.get_default("format_options")[action.dest] = (max(option.flags, key=len), names, action.default)
    for name, conv in table.items():
        if conv.add_arguments is not None:
            conv.add_arguments(parser.add_argument_group(f"{flag} {name}"))


def _client_option(parser: Any, what: str) -> None:
    parser.add_argument("-o", "--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help=f"{what}: an option of its client, e.g. endpoint=http://127.0.0.1:9000 "
                        "(repeatable; credentials are better left to the environment)")


def _unchunked(flag: str, table: Mapping[str, Converter]) -> str:
    names = [n for n, c in table.items() if not c.chunked]
    return f"; not for {flag} {', '.join(names)}" if names else ""


def add_subcommands(subparsers: Any) -> None:
    """Register ``convert`` and ``export`` on an ``argparse`` subparsers object (``set_defaults(func=...)``
    points at :func:`convert_main` / :func:`export_main`, as ``cli.main`` expects)."""
    conv = subparsers.add_parser(
        "convert", help="build a store from other formats (" + ", ".join(SOURCES) + ")",
        usage="%(prog)s --from FORMAT [options] SOURCE [SOURCE ...] OUT", description="Stream files of another "
        "format into a new store (all files are checked first; a failed conversion leaves no store behind).")
    conv.add_argument("--from", dest="source", required=True, choices=list(SOURCES), help="source format")
    conv.add_argument("paths", nargs="+", metavar="SOURCE... OUT", help="source files/directories, then the new store")
    conv.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    conv.add_argument("--chunk-mb", type=positive_int, metavar="CHUNK_MB", help="MiB of rows read per step "
                      f"(default 64{_unchunked('--from', SOURCES)})")
    conv.add_argument("--shard-mb", type=positive_int, default=1024, help="MiB per store shard (default 1024)")
    conv.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    urls = ", ".join(n for n, c in SOURCES.items() if c.url)
    _client_option(conv, f"an OUT at a URL (s3://, gs://, az://) for --from {urls}")
    conv.add_argument("--workers", type=positive_int, metavar="N", help="worker processes (default: the number of "
                      f"cores, {os.cpu_count() or 1} here); the records keep the input order whatever N; inputs "
                      "too small to split (and hf streams) are converted in one process; not for --from logix")
    _add_options(conv, SOURCES, "--from")
    conv.set_defaults(func=convert_main)

    exp = subparsers.add_parser("export", help="write a store in another format (" + ", ".join(TARGETS) + ")")
    exp.add_argument("--to", dest="target", required=True, choices=list(TARGETS), help="target format")
    exp.add_argument("store", help="the store to export")
    outs: dict[str, list[str]] = {}
    for name, c in TARGETS.items():
        outs.setdefault(c.out, []).append(name)
    exp.add_argument("out", help="the output: " + "; ".join(f"{what} for --to {'/'.join(names)}"
                                                           for what, names in outs.items()))
    exp.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    exp.add_argument("--chunk-mb", type=positive_int, metavar="CHUNK_MB", help="MiB of rows written per step "
                     f"(default 64{_unchunked('--to', TARGETS)})")
    exp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _client_option(exp, "a STORE at a URL (s3://, gs://, az://, https://)")
    _add_options(exp, TARGETS, "--to")
    exp.set_defaults(func=export_main)
