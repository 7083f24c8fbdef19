"""The ``seqstore`` command line: ``info``, ``verify``, ``demo``, ``copy``, ``convert`` and ``export``.

Progress bars (tqdm, on stderr) are shown for work that reads or writes the whole store.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from . import __version__
from ._sysinfo import rss_bytes
from .errors import CorruptionError, SeqstoreError
from .format.manifest import MANIFEST
from .format.shard_table import TABLE
from .interop.commands import Interrupted, SuggestingParser, cli_message, key_values, positive_int
from .interop.commands import add_subcommands as add_interop_subcommands
from .io.local_source import local_path
from .io.object_common import check_not_chained
from .io.objects import is_remote
from .io.sources import open_source
from .store import open_store
from .store.copy import copy
from .store.describe import describe_groups, dtype_name, human_bytes
from .store.verify import total_bytes, verify

__all__ = ["EXIT_STATUSES", "console_main", "main"]

#: every exit status of the command, and what it means (``seqstore --help`` and docs/interop.md list them)
EXIT_STATUSES = {
    0: "done (verify: no problem found)",
    1: "verify found problems (listed on stderr), or an OSError that is not about the paths given, e.g. a full "
       "disk or an I/O error (one line naming the output)",
    2: "a usage error, or an error that seqstore names in one line (seqstore: error: ...), e.g. a missing, "
       "existing or wrong path, bad input, a damaged store, a storage failure after its retries, or a "
       "conversion worker process that was killed (out of memory, a signal)",
    130: "interrupted by Ctrl-C or SIGTERM (one line says what stays written, if anything)",
    141: "the reader of the output stopped early, e.g. seqstore info piped into head (nothing more is printed)",
}


#: the longest record whose length ``info`` counts exactly in one pass (one int64 counter per length)
_MAX_TALLY = 1 << 22


def _length_stats(store: Any, field: str, progress: bool) -> list[str]:
    """Min/mean/max and an integer-binned text histogram (at most 10 bins) of a ragged field's lengths.

    One pass over the offsets, counting each length (memory O(chunk + longest record), at most
    ``_MAX_TALLY`` counters); only where a record is longer than that does a second pass bin the lengths
    once their range is known. One bar, counting records to ``len(store)`` per pass.
    """
    lengths = store.lengths(field)
    n = len(lengths)
    if n == 0:
        return ["    (no records)"]
    lo, hi, total = np.iinfo(np.int64).max, 0, 0
    tally: np.ndarray[Any, Any] | None = np.zeros(0, dtype=np.int64)  # tally[k]: records of length k
    # the bar stays, at 100%, once done (cleared on close, its last state was rarely drawn: updates are
    # drawn at most every 0.1 s, so a fast pass vanished at 0%)
    bar = tqdm(total=n, desc=f"lengths of {field}", unit="rec", unit_scale=True, disable=not progress)
    for chunk in lengths.iter_chunks():
        lo, hi, total = min(lo, int(chunk.min())), max(hi, int(chunk.max())), total + int(chunk.sum())
        if tally is not None and hi < _MAX_TALLY:
            part = np.bincount(chunk, minlength=len(tally))
            part[: len(tally)] += tally
            tally = part
        else:
            tally = None
        bar.update(len(chunk))
    width = -(-(hi + 1 - lo) // 10)  # integer bins [lo + k*width, lo + (k+1)*width), at most 10 of them
    nbins = -(-(hi + 1 - lo) // width)
    edges = lo + width * np.arange(nbins + 1, dtype=np.int64)
    if tally is not None:
        counts = np.add.reduceat(tally[lo : hi + 1], np.arange(0, hi + 1 - lo, width))
    else:  # a record longer than _MAX_TALLY: bin the lengths in a second pass
        bar.total += n
        bar.refresh()
        counts = np.zeros(nbins, dtype=np.int64)
        for chunk in lengths.iter_chunks():
            counts += np.bincount((chunk - lo) // width, minlength=nbins)
            bar.update(len(chunk))
    bar.close()
    lines = [f"    rows per record: min {lo}, mean {total / n:.1f}, max {hi}; total {total}"]
    top = int(counts.max())
    for k in range(len(counts)):
        bar_len = int(round(40 * counts[k] / top)) if top else 0
        lines.append(f"    [{edges[k]:>9d}, {edges[k + 1]:>9d}) {'#' * bar_len:<40} {counts[k]}")
    return lines


def _manifest_line(root: Path) -> str:
    """Size of what an open reads: ``manifest.json``, plus the binary shard table a version-3 store
    maps (its committed rows) when there is one."""
    size = (root / MANIFEST).stat().st_size
    line = f"{human_bytes(size)} ({size}) {MANIFEST}"
    if (root / TABLE).is_file():
        tsize = (root / TABLE).stat().st_size
        line += f", shard table {human_bytes(tsize)} ({tsize}, mapped)"
    return line


def cmd_info(args: argparse.Namespace) -> int:
    gc.collect()
    private0 = rss_bytes()[0]
    t0 = time.perf_counter()
    store = open_store(args.path, storage_options=storage_options(args))
    open_s = time.perf_counter() - t0
    private_growth = rss_bytes()[0] - private0
    m = store.manifest
    store.source.fetch_descriptors(m)  # a remote store: every shard's descriptor, in one wave
    print(f"store     {store.url}")
    print(f"records   {len(store)}")
    print(f"shards    {store.num_shards}")
    print(f"bytes     {human_bytes(total_bytes(m))} ({total_bytes(m)})")
    print(f"ids       {'yes' if store.has_ids else 'no'}")
    print(f"format    version {m.version}" + (f", id lookup {m.id_lookup}" if m.version >= 2 else ""))
    print(f"manifest  {_manifest_line(Path(store.root))}")
    print(f"open      {open_s * 1e3:.2f} ms, private memory {private_growth / 2**20:+.2f} MiB "
          "(seqstore.open measured in this process)")
    if m.metadata:
        print(f"metadata  {m.metadata}")
    print("fields")
    width = max(len(n) for n in store.schema)
    for name, f in store.schema.items():
        dims = ", ".join("*" if s is None else str(s) for s in f.shape)
        shape = f"({dims}{',' if len(f.shape) == 1 else ''})"
        print(f"  {name:<{width}}  {dtype_name(f.dtype):<9} {shape:<16} {'ragged' if f.ragged else 'fixed'}")
    for line in describe_groups(store.schema):
        print(line)
    for name, f in store.schema.items():
        if f.ragged and not args.no_lengths:
            print(f"lengths of {name}")
            for line in _length_stats(store, name, progress=not args.quiet):
                print(line)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    opts = storage_options(args)
    # a path that is no store at all (missing, not a store, a bucket that does not exist) is an error as in
    # ``info`` (exit 2, the same words); a damaged manifest is one of the problems verify reports (exit 1)
    source = open_source(args.path, opts)
    try:
        manifest = source.load()
    except CorruptionError:
        manifest = None
    size = 0 if source.is_remote or manifest is None else total_bytes(manifest)
    # verify() reports every byte of every listed file (header and data), so the bar ends at ``size``
    with tqdm(total=size, unit="B", unit_scale=True, desc="verify", disable=args.quiet or size == 0,
              file=sys.stderr) as bar:
        problems = verify(args.path, progress=bar.update, storage_options=opts)
    if problems:
        for p in problems:
            print(f"ERROR: {p}", file=sys.stderr)
        print(f"{args.path}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"{args.path}: OK")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    try:
        run_demo(out=args.out, records=args.records, dim=args.dim, seed=args.seed, keep=args.keep)
    except KeyboardInterrupt:  # an interrupted write removes the corpus; once written (or reused) it stays
        corpus = local_path(args.out) / "corpus.seqstore"  # (a file:// URL as its path, as run_demo takes it)
        if (corpus / MANIFEST).is_file():
            raise Interrupted(f"the corpus stays in {corpus}") from None
        raise
    return 0


def cmd_copy(args: argparse.Namespace) -> int:
    # a local destination this copy creates is removed again when it is interrupted (main() says nothing
    # was written); an existing or remote one keeps the shards copied so far, which a rerun does not copy again
    local_dst = None if is_remote(args.dst) else local_path(args.dst)  # (a file:// URL: its path)
    new_dst = None if local_dst is None or local_dst.exists() else local_dst
    options: dict[str, dict[str, Any] | None] = {}
    for end in ("src", "dst"):  # (the library's message would name neither option)
        options[end] = key_values(getattr(args, f"{end}_option"), f"--{end}-option", empty_value=True)
        if options[end] and not is_remote(getattr(args, end)):
            raise SeqstoreError(f"{getattr(args, end)}: --{end}-option options are for URLs of object storage, "
                                "not local paths")
    try:
        r = copy(args.src, args.dst, src_options=options["src"], dst_options=options["dst"], workers=args.workers,
                 progress=not args.quiet, overwrite=args.overwrite)
        print(f"{args.dst}: {r.shards} shard(s): {r.copied} copied, {r.skipped} already there; "
              f"{human_bytes(r.bytes)} in {r.files} file(s)")
    except ValueError as exc:
        print(f"seqstore: error: {cli_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # also one that came after the copy finished
        if new_dst is None:  # (an existing or remote destination keeps the shards copied so far)
            raise Interrupted(f"what was copied so far stays in {args.dst} (a rerun copies the rest)") from None
        shutil.rmtree(new_dst, ignore_errors=True)
        raise
    return 0


def storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """``-o KEY=VALUE`` options as a dict (None when there are none); refused for a local ``args.path``, which
    would ignore them (as ``copy`` and ``convert`` refuse them)."""
    opts = key_values(getattr(args, "storage_option", []) or [], "--storage-option", empty_value=True)
    path = getattr(args, "path", None)
    if opts and path is not None and not is_remote(path):
        raise SeqstoreError(f"{path}: -o options are for URLs of object storage, not local paths")
    return opts


def build_parser() -> argparse.ArgumentParser:
    p = SuggestingParser(  # a misspelled option or choice: the close match is suggested
        prog="seqstore", description="Inspect and check seqstore stores (info, verify), copy them between disk and "
        "object storage (copy), build them from other formats and write them back out (convert, export), and try it "
        "all on a generated corpus (demo).",
        epilog="exit status: " + "; ".join(f"{status}: {meaning}" for status, meaning in EXIT_STATUSES.items()))
    p.add_argument("--version", action="version", version=f"seqstore {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    for name, about, func in (("info", "schema, records, shards, bytes and length statistics", cmd_info),
                              ("verify", "recompute checksums and check offsets and id indexes", cmd_verify)):
        cmd = sub.add_parser(name, help=about)
        cmd.add_argument("path", help="a store directory or URL (s3://, gs://, az://, https://, ...)")
        cmd.add_argument("-o", "--storage-option", action="append", default=[], metavar="KEY=VALUE",
                         help="an option for a remote store's client, e.g. endpoint=http://127.0.0.1:9000 (repeatable; "
                         "credentials are better left to the environment)")
        if name == "info":
            cmd.add_argument("--no-lengths", action="store_true",
                             help="skip the length statistics (a pass over offsets)")
        cmd.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
        cmd.set_defaults(func=func)

    demo = sub.add_parser("demo", help="generate a speech-like corpus, write it, open it and read it")
    demo.add_argument("--records", type=positive_int, default=1_000_000,
                      help="number of sequences (default 1,000,000)")
    demo.add_argument("--dim", type=positive_int, default=16, help="feature dimension (default 16)")
    demo.add_argument("--out", default="demo-out", help="output directory (default ./demo-out)")
    demo.add_argument("--seed", type=int, default=0,
                      help="random seed of the generated corpus and of the read patterns (default 0)")
    demo.add_argument("--keep", action="store_true", help="reuse the corpus in --out if it is already there "
                      "(one of these --records and --dim; another is written anew)")
    demo.set_defaults(func=cmd_demo)

    cp = sub.add_parser("copy", help="copy a store between local disk and object storage (resumable, checked)")
    cp.add_argument("src", help="the store to copy: a directory or URL (s3://, gs://, az://, ...)")
    cp.add_argument("dst", help="where to copy it: a directory or URL")
    cp.add_argument("--workers", type=positive_int, default=8, metavar="N", help="shards copied at once (default 8)")
    for end in ("src", "dst"):
        cp.add_argument(f"--{end}-option", action="append", default=[], metavar="KEY=VALUE",
                        help=f"a client option of the {end} URL, e.g. endpoint=http://127.0.0.1:9000 (repeatable)")
    cp.add_argument("--overwrite", action="store_true", help="replace a destination that holds another store")
    cp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    cp.set_defaults(func=cmd_copy)

    add_interop_subcommands(sub)  # convert, export
    return p


INTERRUPTED = "seqstore: interrupted; nothing was written"

#: an optional package's top-level module -> the extra of pyproject.toml that installs it
_EXTRAS = {"h5py": "hdf5", "pyarrow": "arrow", "datasets": "hf", "obstore": "remote", "fsspec": "remote",
           "lhotse": "lhotse", "webdataset": "webdataset", "megatron": "megatron", "torch": "torch", "ray": "ray",
           "pyspark": "spark", "grain": "grain"}


def _missing_package(exc: ImportError, args: argparse.Namespace | None) -> str:
    """One line for an ImportError: its own message where it already says what to install, else the
    package (``exc.name``) and, for an optional one, the ``pip install 'seqstore[EXTRA]'`` that installs it."""
    msg = cli_message(exc)
    if "pip install" in msg:
        return msg
    who = f"seqstore {args.command}" if args is not None else "seqstore"
    package = (exc.name or "").partition(".")[0]
    if not package:
        return f"{who}: a package it needs could not be imported ({msg})"
    state = "is not installed" if isinstance(exc, ModuleNotFoundError) else "could not be imported"
    extra = _EXTRAS.get(package)
    hint = f": pip install 'seqstore[{extra}]'" if extra else ""
    return f"{who} needs the {package} package, which {state} ({msg}){hint}"


#: a path that is not what the command expected (a file where a directory goes, ...): the user's mistake
_PATH_ERRORS = (FileExistsError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


@contextlib.contextmanager
def _interrupts(exiting: bool) -> Iterator[None]:
    """Ctrl-C and SIGTERM stop the command with KeyboardInterrupt, once: the signals that follow (a
    terminal's Ctrl-C reaches the process twice under ``timeout``, a user presses it again) are ignored
    while the command removes what it started, so that nothing is left half-deleted. ``exiting`` (the
    console command, whose process ends next): after an interrupt they stay ignored until the process
    has exited; otherwise the caller's handlers are given back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        if not seen:
            seen.append(signum)
            raise KeyboardInterrupt

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():  # interrupted, and the process on its way out: late signals are
            signal.signal(s, signal.SIG_IGN if seen and exiting else handler)  # ignored until it is gone


def _output(args: argparse.Namespace | None) -> str | None:
    """What the command writes (convert's OUT, export's OUT, copy's DST, demo's --out); None for the others."""
    if args is None or args.command not in ("convert", "export", "copy", "demo"):
        return None
    return str(args.paths[-1] if args.command == "convert" else args.dst if args.command == "copy" else args.out)


def _check_paths(args: argparse.Namespace) -> None:
    """Refuse a chained URL among the paths and URLs given (taken as a local path, it was written as one)."""
    for name in ("path", "src", "dst", "store", "out", "paths"):
        value = getattr(args, name, None)
        for given in value if isinstance(value, list) else [value]:
            check_not_chained(given)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default ``sys.argv[1:]``) and return its exit status. SIGINT's and
    SIGTERM's handlers are the caller's again when it returns, also after an interrupt."""
    return _main(argv, exiting=False)


def console_main() -> int:
    """The ``seqstore`` console command (and ``python -m seqstore.cli``): :func:`main`, except that after
    an interrupt a late Ctrl-C or SIGTERM stays ignored until the process, which exits next, is gone."""
    return _main(None, exiting=True)


def _main(argv: Sequence[str] | None, exiting: bool) -> int:
    args: argparse.Namespace | None = None
    try:
        with _interrupts(exiting):
            args = build_parser().parse_args(argv)
            _check_paths(args)
            status = int(args.func(args))
            sys.stdout.flush()  # a reader that stopped early (seqstore info | head) is seen here, not at exit
            return status
    except BrokenPipeError:  # stop quietly, as cat does; nothing more is written to the closed pipe
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, sys.stdout.fileno())
            finally:
                os.close(devnull)
        return 141
    except (SeqstoreError, *_PATH_ERRORS) as exc:
        print(f"seqstore: error: {cli_message(exc)}", file=sys.stderr)
        return 2
    except ImportError as exc:  # an optional package that is not installed (lhotse, h5py, pyarrow, ...)
        print(f"seqstore: error: {_missing_package(exc, args)}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a file too large, an I/O error: not the user's mistake (exit 1)
        out = _output(args)
        where = f"{out}: " if out is not None and exc.filename is None else ""
        print(f"seqstore: error: {where}{cli_message(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # every command cleans up on its way out (temporary directories, workers)
        print(f"seqstore: interrupted; {exc}" if isinstance(exc, Interrupted) else INTERRUPTED, file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(console_main())
