"""The ``seqstore convert`` and ``seqstore export`` subcommands.

``cli.py`` registers them with :func:`add_subcommands`::

    from .interop.commands import add_subcommands as add_interop_subcommands
    add_interop_subcommands(sub)          # sub = parser.add_subparsers(...)

Sources and targets are registries (:data:`SOURCES`, :data:`TARGETS`): a new format is one
:func:`register_source` call (made before ``add_subcommands`` runs) with a name, a help line, an
optional function adding its own options, and a function ``run(args, progress) -> Store``. The
options of every source live on the one ``convert`` parser, grouped per source.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from ..errors import SeqstoreError
from ._common import Progress, announce_total

__all__ = [
    "SOURCES",
    "TARGETS",
    "Converter",
    "Progress",
    "ProgressBar",
    "cli_message",
    "register_source",
    "register_target",
    "add_subcommands",
    "convert_main",
    "export_main",
]


@dataclasses.dataclass(frozen=True)
class Converter:
    """One ``--from`` source or ``--to`` target.

    ``run(args, progress)`` does the work (``progress(n)`` advances the bar by ``n`` of ``unit``;
    ``progress.add_total(n)``, called once the inputs are validated, sizes it) and returns what it made
    (a Store or a path); ``add_arguments(group)`` adds the format's own options; ``total(args)`` is an
    up-front total for a converter that does not call ``add_total`` (None: unknown).
    """

    help: str
    run: Callable[[argparse.Namespace, Progress], Any]
    add_arguments: Callable[[Any], None] | None = None
    total: Callable[[argparse.Namespace], int | None] | None = None
    unit: str = "B"


#: ``seqstore convert --from NAME``: name -> converter.
SOURCES: dict[str, Converter] = {}
#: ``seqstore export --to NAME``: name -> converter.
TARGETS: dict[str, Converter] = {}


def register_source(name: str, converter: Converter) -> None:
    """Add (or replace) a ``convert --from`` source. Call before :func:`add_subcommands`."""
    SOURCES[name] = converter


def register_target(name: str, converter: Converter) -> None:
    """Add (or replace) an ``export --to`` target. Call before :func:`add_subcommands`."""
    TARGETS[name] = converter


# -------------------------------------------------------------------------------------- helpers


def _parse_map(items: list[str] | None, what: str) -> dict[str, str] | None:
    if not items:
        return None
    out: dict[str, str] = {}
    for item in items:
        src, sep, dst = item.partition("=")
        if not sep or not src or not dst:
            raise SeqstoreError(f"{what} {item!r}: expected NAME=FIELD")
        out[src] = dst
    return out


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def _storage_options(args: argparse.Namespace) -> dict[str, str] | None:
    """``-o KEY=VALUE`` options of the output URL's client (None when there are none)."""
    out: dict[str, str] = {}
    for item in getattr(args, "storage_option", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SeqstoreError(f"--storage-option {item!r}: expected KEY=VALUE")
        out[key] = value
    return out or None


def _add_storage_option(parser: Any, what: str) -> None:
    """``-o KEY=VALUE`` (read by :func:`_storage_options`) for ``what`` is at a URL."""
    parser.add_argument("-o", "--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help=f"{what}: an option of its client, e.g. endpoint=http://127.0.0.1:9000 "
                        "(repeatable; credentials are better left to the environment)")


def _sources_and_out(args: argparse.Namespace) -> tuple[list[str], str]:
    paths = list(args.paths)
    if len(paths) < 2:
        raise SeqstoreError("convert: give one or more sources and then the output store path")
    return paths[:-1], paths[-1]


# ---------------------------------------------------------------------------------- returnn-hdf


def _hdf_run(args: argparse.Namespace, progress: Progress) -> Any:
    from .returnn import import_hdf

    srcs, out = _sources_and_out(args)
    return import_hdf(
        srcs, out, rename=_parse_map(args.rename, "--rename"), chunk_bytes=args.chunk_mb << 20,
        shard_bytes=args.shard_mb << 20, overwrite=args.overwrite, progress=progress, workers=args.workers,
        storage_options=_storage_options(args),
    )


def _hdf_args(group: Any) -> None:
    group.add_argument("--rename", action="append", metavar="STREAM=FIELD",
                       help="returnn-hdf: store stream STREAM ('inputs' or a target key) as field FIELD (repeatable)")


# -------------------------------------------------------------------------------- parquet/arrow


def _arrow_run(fmt: str) -> Callable[[argparse.Namespace, Progress], Any]:
    def run(args: argparse.Namespace, progress: Progress) -> Any:
        from .arrow import import_arrow, import_parquet

        srcs, out = _sources_and_out(args)
        fn = import_parquet if fmt == "parquet" else import_arrow
        return fn(
            srcs, out, columns=_parse_map(args.map, "--map"), id_column=args.id_column,
            chunk_bytes=args.chunk_mb << 20, shard_bytes=args.shard_mb << 20, overwrite=args.overwrite,
            progress=progress, workers=args.workers, storage_options=_storage_options(args),
        )

    return run


def _arrow_args(group: Any) -> None:
    group.add_argument("--map", action="append", metavar="COLUMN=FIELD",
                       help="parquet/arrow/hf: import COLUMN as field FIELD (repeatable; default: every column)")
    group.add_argument("--id-column", metavar="COLUMN", help="parquet/arrow/hf: string column whose values become ids")


# ------------------------------------------------------------------------------- export targets


def _hdf_export(args: argparse.Namespace, progress: Progress) -> Any:
    from .returnn import export_hdf

    inputs: str | None = args.inputs
    if inputs is not None and inputs.lower() == "none":
        inputs = None
    fields: Any = None
    if args.field:
        fields = {}
        for item in args.field:
            name, sep, key = item.partition("=")
            fields[name] = key if sep else name
    return export_hdf(args.store, args.out, inputs=inputs, fields=fields, chunk_bytes=args.chunk_mb << 20,
                      overwrite=args.overwrite, progress=progress)


def _hdf_export_args(group: Any) -> None:
    group.add_argument("--inputs", default="auto",
                       help="returnn-hdf: field written as 'inputs' (default: the imported one, else 'data'; "
                       "'none': targets only)")
    group.add_argument("--field", action="append", metavar="FIELD[=KEY]",
                       help="returnn-hdf: write FIELD as targets/data/KEY (repeatable; default: all other fields)")


register_source("returnn-hdf", Converter("RETURNN HDF files (SimpleHDFWriter / HDFDataset layout)", _hdf_run,
                                         _hdf_args))
register_source("parquet", Converter("Parquet files or directories", _arrow_run("parquet"), _arrow_args, unit="rec"))
register_source("arrow", Converter("Arrow IPC files or directories (incl. HF datasets save_to_disk)",
                                   _arrow_run("arrow"), _arrow_args, unit="rec"))
def _logix_run(args: argparse.Namespace, progress: Progress) -> Any:
    from ..log.logix import import_logix
    from ..store import open_store

    srcs, out = _sources_and_out(args)
    if len(srcs) != 1:
        raise SeqstoreError("convert --from logix: give one LogIX log directory, then the output store")
    if not os.path.exists(srcs[0]):
        raise FileNotFoundError(f"{srcs[0]}: no such file or directory (expected a LogIX log directory)")
    import_logix(srcs[0], out, overwrite=args.overwrite, batch_records=args.batch_records,
                 progress=_RunningTotal(progress))
    return open_store(out)


class _RunningTotal:
    """Turns import_logix's running totals into increments for a bar; passes ``add_total`` on."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._done = 0

    def __call__(self, records: int) -> None:
        self._progress(records - self._done)
        self._done = records

    def add_total(self, n: int) -> None:
        announce_total(self._progress, n)


def _logix_args(group: Any) -> None:
    group.add_argument("--batch-records", type=int, default=4096,
                       help="logix: records read and written per step (bounds memory; default 4096)")


register_source("logix", Converter("LogIX / AnaLog per-example log directory (log_rank_R_chunk_C.mmap + "
                                   "_metadata.json)", _logix_run, _logix_args, unit="rec"))
register_target("returnn-hdf", Converter("one RETURNN HDF file for HDFDataset", _hdf_export, _hdf_export_args))


# --------------------------------------------------------------------------- megatron / webdataset


def _megatron_run(args: argparse.Namespace, progress: Progress) -> Any:
    from .megatron import import_megatron

    srcs, out = _sources_and_out(args)
    return import_megatron(srcs, out, field=args.tokens_field, chunk_bytes=args.chunk_mb << 20,
                           shard_bytes=args.shard_mb << 20, overwrite=args.overwrite, progress=progress,
                           workers=args.workers, storage_options=_storage_options(args))


def _megatron_args(group: Any) -> None:
    group.add_argument("--tokens-field", default="tokens", metavar="FIELD",
                       help="megatron: the field of the tokens (default 'tokens')")


def _wds_run(args: argparse.Namespace, progress: Progress) -> Any:
    from .webdataset import import_webdataset

    srcs, out = _sources_and_out(args)
    source_options: dict[str, str] = {}
    for item in args.source_option or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SeqstoreError(f"--source-option {item!r}: expected KEY=VALUE")
        source_options[key] = value
    return import_webdataset(srcs, out, fields=_parse_map(args.ext, "--ext"), strict=not args.skip_unknown,
                             chunk_bytes=args.chunk_mb << 20, shard_bytes=args.shard_mb << 20,
                             overwrite=args.overwrite, progress=progress, workers=args.workers,
                             storage_options=_storage_options(args), source_options=source_options or None)


def _wds_args(group: Any) -> None:
    group.add_argument("--ext", action="append", metavar="EXT=FIELD",
                       help="webdataset: import members KEY.EXT as field FIELD (repeatable; default: every "
                       "extension of the first sample, under its own name)")
    group.add_argument("--skip-unknown", action="store_true",
                       help="webdataset: skip members whose extension has no field (default: an error)")
    group.add_argument("--source-option", action="append", default=[], metavar="KEY=VALUE",
                       help="webdataset: an option of the client that reads shard URLs, e.g. allow_http=true")


# ------------------------------------------------------------------------------- hugging face


def _hf_run(args: argparse.Namespace, progress: Progress) -> Any:
    from .hf import import_hf

    srcs, out = _sources_and_out(args)
    if len(srcs) != 1:
        raise SeqstoreError("convert --from hf: give one datasets save_to_disk directory, then the output store")
    return import_hf(srcs[0], out, split=args.split, columns=_parse_map(args.map, "--map"), id_column=args.id_column,
                     batch_size=args.batch_size, chunk_bytes=args.chunk_mb << 20, shard_bytes=args.shard_mb << 20,
                     overwrite=args.overwrite, progress=progress, workers=args.workers,
                     storage_options=_storage_options(args))


def _hf_args(group: Any) -> None:
    group.add_argument("--split", metavar="NAME", help="hf: the split to import from a DatasetDict directory")
    group.add_argument("--batch-size", type=_positive_int, metavar="ROWS",
                       help="hf: rows read per step (default: about --chunk-mb of rows)")


def _megatron_export(args: argparse.Namespace, progress: Progress) -> Any:
    from .megatron import export_megatron

    documents: str | None = args.documents
    if documents is not None and documents.lower() == "none":
        documents = None
    return export_megatron(args.store, args.out, field=args.tokens, dtype=args.dtype, documents=documents,
                           chunk_bytes=args.chunk_mb << 20, overwrite=args.overwrite, progress=progress)


def _megatron_export_args(group: Any) -> None:
    group.add_argument("--tokens", metavar="FIELD", help="megatron: the ragged field to write (default: the only one)")
    group.add_argument("--dtype", help="megatron: token dtype in the files (default: the field's)")
    group.add_argument("--documents", default="auto", metavar="FIELD",
                       help="megatron: integer field whose changes start documents (default: the imported one; "
                       "'none': one document per record)")


def _wds_export(args: argparse.Namespace, progress: Progress) -> Any:
    from .webdataset import export_webdataset

    exts = _parse_map(args.ext, "--ext")
    return export_webdataset(args.store, args.out, fields=exts, keys=args.keys, shard_records=args.shard_records,
                             shard_bytes=args.shard_mb << 20, overwrite=args.overwrite, progress=progress)


def _wds_export_args(group: Any) -> None:
    group.add_argument("--ext", action="append", metavar="FIELD=EXT",
                       help="webdataset: write FIELD as members KEY.EXT (repeatable; default: every field)")
    group.add_argument("--keys", choices=("auto", "ids", "index"), default="auto",
                       help="webdataset: sample keys from the record ids or record numbers (default: ids if any)")
    group.add_argument("--shard-records", type=_positive_int, default=10_000, metavar="N",
                       help="webdataset: records per tar shard at most (default 10000)")
    group.add_argument("--shard-mb", type=_positive_int, default=1024, metavar="MB",
                       help="webdataset: a shard ends after the record that passes this size (default 1024)")


def _hf_export(args: argparse.Namespace, progress: Progress) -> Any:
    from .hf_export import export_hf

    fields = [f for item in args.hf_field or [] for f in item.split(",") if f] or None
    id_column = None if args.hf_id_column.lower() == "none" else args.hf_id_column
    return export_hf(args.store, args.out, fields=fields, id_column=id_column, overwrite=args.overwrite,
                     progress=progress)


def _hf_export_args(group: Any) -> None:
    group.add_argument("--fields", dest="hf_field", action="append", metavar="A,B",
                       help="hf: the fields to write as columns (repeatable; default: every field)")
    group.add_argument("--id-column", dest="hf_id_column", default="id", metavar="NAME",
                       help="hf: the column of the record ids, when the store has ids (default 'id'; 'none': no ids)")


register_source("megatron", Converter("Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx)", _megatron_run,
                                      _megatron_args, unit="rec"))
register_source("webdataset", Converter("WebDataset tar shards (files, directories, {000..009} ranges, URLs)",
                                        _wds_run, _wds_args))
register_source("hf", Converter("Hugging Face datasets save_to_disk directory (a Dataset, or --split of a "
                                  "DatasetDict); --map/--id-column as for arrow", _hf_run, _hf_args, unit="rec"))
register_target("megatron", Converter("PREFIX.bin + PREFIX.idx for Megatron-Core's IndexedDataset",
                                      _megatron_export, _megatron_export_args))
register_target("webdataset", Converter("a directory of WebDataset tar shards", _wds_export, _wds_export_args,
                                        unit="rec"))
register_target("hf", Converter("a Hugging Face datasets save_to_disk directory (datasets.load_from_disk)",
                                _hf_export, _hf_export_args, unit="rec"))


# ------------------------------------------------------------------------------------------ lhotse


def _lhotse_run(args: argparse.Namespace, progress: Progress) -> Any:
    from .lhotse import import_lhotse

    srcs, out = _sources_and_out(args)
    return import_lhotse(srcs, out, features=args.features, features_dtype=args.features_dtype, audio=args.audio,
                         audio_dtype=args.audio_dtype, channels=args.channels, text_separator=args.text_separator,
                         chunk_bytes=args.chunk_mb << 20, shard_bytes=args.shard_mb << 20, overwrite=args.overwrite,
                         progress=progress, workers=args.workers, storage_options=_storage_options(args))


def _lhotse_args(group: Any) -> None:
    group.add_argument("--features", action="store_true",
                       help="lhotse: store cut.load_features() as field 'features' (every cut needs features)")
    group.add_argument("--features-dtype", choices=("float32", "float16"), default="float32",
                       help="lhotse: dtype of 'features' (default float32, as Lhotse loads them)")
    group.add_argument("--audio", action="store_true",
                       help="lhotse: store cut.load_audio() as mono field 'audio' (every cut needs a recording)")
    group.add_argument("--audio-dtype", choices=("float32", "int16"), default="float32",
                       help="lhotse: dtype of 'audio' (int16: samples x 32768, rounded; default float32)")
    group.add_argument("--channels", choices=("error", "first", "mix"), default="error",
                       help="lhotse: a cut of several channels is refused (default), its first channel, or their mean")
    group.add_argument("--text-separator", default=" ", metavar="SEP",
                       help="lhotse: joins the texts of a cut's supervisions in field 'text' (default one space)")


register_source("lhotse", Converter("Lhotse cut manifests (cuts.jsonl.gz, read lazily)", _lhotse_run, _lhotse_args,
                                    unit="cut"))


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


#: Python spellings in library messages -> the command line's options (errors of the commands speak CLI).
CLI_WORDS = {
    "pass overwrite=True": "pass --overwrite",
    "columns={column: field}": "--map COLUMN=FIELD",
    "rename={stream: field}": "--rename STREAM=FIELD",
    "fields={field: key}": "--field FIELD=KEY",
    "features=True": "--features",
    "audio=True": "--audio",
    "channels='first' or channels='mix'": "--channels first or --channels mix",
    "split=NAME": "--split NAME",
}


def cli_message(exc: BaseException) -> str:
    """The message of an error raised by the library, with its Python option names in CLI spelling."""
    msg = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    for py, cli in CLI_WORDS.items():
        msg = msg.replace(py, cli)
    return msg


def _user_error(exc: OSError | KeyError) -> int:
    print(f"seqstore: error: {cli_message(exc)}", file=sys.stderr)
    return 2


def convert_main(args: argparse.Namespace) -> int:
    """``seqstore convert --from FORMAT SOURCE... OUT``: build a new store from files of another format.
    Returns the exit status (0; 2 for missing/existing paths; SeqstoreError propagates to cli.main)."""
    conv = SOURCES[args.source]
    try:
        store = _with_bar(conv, args, f"convert {args.source}")
    except (FileNotFoundError, FileExistsError, IsADirectoryError, KeyError) as exc:
        return _user_error(exc)
    if not args.quiet:
        n = len(store) if hasattr(store, "__len__") else "?"
        shards = getattr(store, "num_shards", "?")
        print(f"{_sources_and_out(args)[1]}: {n} records, {shards} shard(s)")
    return 0


def export_main(args: argparse.Namespace) -> int:
    """``seqstore export --to FORMAT STORE OUT``: write a store in another format. Returns the exit status."""
    conv = TARGETS[args.target]
    try:
        opts = _storage_options(args)
        if opts is not None:  # a store at a URL that needs options of its client: opened here, handed over
            from ..store import open_store

            args.store = open_store(args.store, storage_options=opts)
        out = _with_bar(conv, args, f"export {args.target}")
    except (FileNotFoundError, FileExistsError, IsADirectoryError, KeyError) as exc:
        return _user_error(exc)
    if not args.quiet:
        print(f"wrote {out}")
    return 0


def add_subcommands(subparsers: Any) -> None:
    """Register ``convert`` and ``export`` on an ``argparse`` subparsers object (``set_defaults(func=...)``
    points at :func:`convert_main` / :func:`export_main`, as ``cli.main`` expects)."""
    conv = subparsers.add_parser(
        "convert", help="build a store from other formats (" + ", ".join(SOURCES) + ")",
        usage="%(prog)s --from FORMAT [options] SOURCE [SOURCE ...] OUT",
        description="Stream files of another format into a new store (all files are checked first; a failed "
        "conversion leaves no store behind).",
    )
    conv.add_argument("--from", dest="source", required=True, choices=list(SOURCES), help="source format")
    conv.add_argument("paths", nargs="+", metavar="SOURCE... OUT", help="source files/directories, then the new store")
    conv.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    conv.add_argument("--chunk-mb", type=int, default=64, help="MiB of rows read per step (default 64)")
    conv.add_argument("--shard-mb", type=int, default=1024, help="MiB per store shard (default 1024)")
    conv.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _add_storage_option(conv, "returnn-hdf/parquet/arrow into a URL (s3://, gs://, az://)")
    conv.add_argument("--workers", type=_positive_int, default=os.cpu_count() or 1, metavar="N",
                      help="worker processes (default: the number of cores, "
                      f"{os.cpu_count() or 1} here); the records keep the input order whatever N; inputs "
                      "too small to split (and hf streams) are converted in one process")
    shared: dict[Callable[[Any], None], list[str]] = {}  # options of several sources: one group naming them all
    for name, c in SOURCES.items():
        if c.add_arguments is not None:
            shared.setdefault(c.add_arguments, []).append(name)
    for add_arguments, names in shared.items():
        add_arguments(conv.add_argument_group(", ".join(f"--from {n}" for n in names)))
    conv.set_defaults(func=convert_main)

    exp = subparsers.add_parser("export", help="write a store in another format (" + ", ".join(TARGETS) + ")")
    exp.add_argument("--to", dest="target", required=True, choices=list(TARGETS), help="target format")
    exp.add_argument("store", help="the store to export")
    exp.add_argument("out", help="output file")
    exp.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    exp.add_argument("--chunk-mb", type=int, default=64, help="MiB of rows written per step (default 64)")
    exp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _add_storage_option(exp, "a STORE at a URL (s3://, gs://, az://, https://)")
    for name, c in TARGETS.items():
        if c.add_arguments is not None:
            c.add_arguments(exp.add_argument_group(f"--to {name}"))
    exp.set_defaults(func=export_main)
