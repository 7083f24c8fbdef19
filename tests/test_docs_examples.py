"""Every ```python block of README.md and docs/*.md runs, so a renamed argument or a changed return type
breaks the build instead of the docs.

Conventions for the docs (this docstring is their reference):

- The ``python`` blocks of one file run in order, in one namespace, in a fresh temporary directory
  that is the working directory (like a notebook): a block may use what an earlier block of the same
  file defined, and relative paths such as ``"corpus.seqstore"`` land in that directory.
- ``<!-- docs-test: setup ... -->`` on the lines right before a block (one line or several): hidden
  code run first, for what a reader has anyway, typically a small generated store at the path the
  example names. It may call ``make_corpus(path, n=300, dim=8, seed=0)``: a store with ragged
  ``features`` (float16, (None, dim)) and ``labels`` (int32), a scalar ``speaker`` and ids ``utt-<i>``.
  ``s3_corpus(url)`` puts such a store at ``s3://bucket/prefix`` of a moto S3 server on loopback (started
  once per test run) and points the ``AWS_*`` environment variables and ``SEQSTORE_CACHE_DIR`` at it
  and at the test's directory, so an example reads a real S3 API by the URL it shows.
- ``<!-- docs-test: skip gpu -->`` / ``<!-- docs-test: skip logix -->`` right before a block: it needs
  a CUDA device / a LogIX source tree (``LOGIX_SRC``); it runs when that is there, else it is
  skipped. No other reason is accepted, and any other ``docs-test:`` directive is an error.
- A block that raises fails the test; the traceback names the file and its line in the file.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SKIP_REASONS = ("gpu", "logix")
_FENCE = re.compile(r"^(\s*)(```+)\s*([\w+-]*)")
_DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(\w+)\s*(.*?)\s*-->", re.S)


@dataclasses.dataclass
class Block:
    path: Path
    line: int  # 1-based line of the first code line
    code: str
    setup: str = ""
    skip: str | None = None

    @property
    def where(self) -> str:
        path = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{path}:{self.line}"


def _directives(lines: list[str], fence: int) -> list[tuple[str, str]]:
    """The ``<!-- docs-test: ... -->`` comments that end on the lines right before line ``fence``."""
    found: list[tuple[str, str]] = []
    end = fence
    while end > 0 and lines[end - 1].rstrip().endswith("-->"):
        start = end - 1
        while start >= 0 and "<!--" not in lines[start]:
            start -= 1
        if start < 0:
            break
        m = _DIRECTIVE.fullmatch("\n".join(lines[start:end]).strip())
        if m is None:
            break
        found.insert(0, (m.group(1), m.group(2)))
        end = start
    return found


def python_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    k = 0
    while k < len(lines):
        m = _FENCE.match(lines[k])
        if not m:
            k += 1
            continue
        indent, ticks, lang = m.groups()
        end = k + 1
        while end < len(lines) and not lines[end].strip().startswith(ticks):
            end += 1
        if lang in ("python", "py"):
            code = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[k + 1 : end])
            block = Block(path, k + 2, code)
            for kind, arg in _directives(lines, k):
                if kind == "setup":
                    block.setup += arg + "\n"
                elif kind == "skip" and arg.split()[:1] and arg.split()[0] in SKIP_REASONS:
                    block.skip = arg.split()[0]
                else:
                    raise AssertionError(f"{path}:{k + 1}: unknown docs-test directive {kind!r} {arg!r}")
            blocks.append(block)
        k = end + 1
    return blocks


def _available(reason: str) -> bool:
    if reason == "gpu":
        if importlib.util.find_spec("torch") is None:
            return False
        import torch

        return bool(torch.cuda.is_available())
    return bool(os.environ.get("LOGIX_SRC"))


def make_corpus(path: str | os.PathLike[str], n: int = 300, dim: int = 8, seed: int = 0) -> seqstore.Store:
    """A small speech-like store for the examples (see the module docstring)."""
    rng = np.random.default_rng(seed)
    schema = {
        "features": seqstore.Field("float16", (None, dim)),
        "labels": seqstore.Field("int32", (None,)),
        "speaker": seqstore.Field("int32"),
    }
    with seqstore.create(path, schema) as w:
        for i in range(n):
            t = int(rng.integers(5, 60))
            w.append({"features": rng.standard_normal((t, dim)), "labels": rng.integers(0, 30, t // 4 + 1),
                      "speaker": i % 7}, id=f"utt-{i}")
    return seqstore.open(path)


_MOTO: Any = None


def s3_corpus(url: str, n: int = 300, dim: int = 8, seed: int = 0) -> str:
    """A make_corpus store uploaded to ``url`` (``s3://bucket/prefix``) of a moto server (see the module
    docstring); returns ``url``."""
    global _MOTO
    from support.s3 import MotoS3

    if _MOTO is None:
        _MOTO = MotoS3().start()
    bucket, _, prefix = url[len("s3://") :].partition("/")
    try:
        _MOTO.boto3().create_bucket(Bucket=bucket)
    except Exception as exc:  # noqa: BLE001 - already there from an earlier example
        if "BucketAlreadyOwnedByYou" not in repr(exc):
            raise
    local = Path(f"_s3_corpus-{bucket}-{prefix.replace('/', '_')}")
    make_corpus(local, n=n, dim=dim, seed=seed)
    _MOTO.upload_dir(local, bucket, prefix)
    os.environ.update(_MOTO.env())
    os.environ["AWS_ALLOW_HTTP"] = "true"
    os.environ["SEQSTORE_CACHE_DIR"] = str(Path("_seqstore_cache").resolve())
    return url


def _run(block: Block, namespace: dict[str, Any], code: str, what: str) -> None:
    # padded with newlines so that a traceback's line numbers are the file's
    source = "\n" * (block.line - 1) + code
    try:
        exec(compile(source, str(block.path), "exec"), namespace)
    except Exception as exc:
        raise AssertionError(f"{what} of the python block at {block.where} raised {type(exc).__name__}: {exc}") from exc


FILES = [p for p in DOCS if python_blocks(p)]


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(REPO)) for p in FILES])
def test_docs_python_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                request: pytest.FixtureRequest) -> None:
    monkeypatch.chdir(tmp_path)
    if any("SparkSession" in b.code for b in python_blocks(path)):
        # the example's SparkSession.builder...getOrCreate() gets the run's session (tests/conftest.py),
        # which tests/test_spark.py uses too: one Spark context and one set of Python workers per run.
        # Started here, in this directory, as the example would start it: its relative paths are resolved
        # by Spark's processes, in the directory they started in
        request.getfixturevalue("spark_session")
    environ = dict(os.environ)  # s3_corpus sets AWS_* and SEQSTORE_CACHE_DIR: restored below
    try:
        _run_file(path)
    finally:
        os.environ.clear()
        os.environ.update(environ)


def _run_file(path: Path) -> None:
    namespace: dict[str, Any] = {"__name__": "__docs__", "make_corpus": make_corpus, "s3_corpus": s3_corpus}
    ran = 0
    for block in python_blocks(path):
        if block.skip is not None and not _available(block.skip):
            continue
        if block.setup:
            _run(block, namespace, block.setup, "the setup")
        _run(block, namespace, block.code, "the code")
        ran += 1
    assert ran or all(b.skip for b in python_blocks(path))


def test_docs_every_python_block_is_covered() -> None:
    """README.md and every docs/*.md are scanned; blocks are only skipped for a GPU or LogIX."""
    blocks = [b for p in DOCS for b in python_blocks(p)]
    assert REPO / "README.md" in FILES and len(blocks) >= 10
    for b in blocks:
        assert b.code.strip(), f"{b.where}: empty python block"
        assert b.skip in (None, *SKIP_REASONS), b.where
    # a python block spelled otherwise (```Python, ```python3) would escape this test
    for p in DOCS:
        for n, line in enumerate(p.read_text().splitlines(), 1):
            m = _FENCE.match(line)
            if m and m.group(3) and m.group(3).lower().startswith("py"):
                assert m.group(3) in ("python", "py"), f"{p}:{n}: write ```python"


def test_docs_directives_are_parsed(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text(
        "text\n<!-- docs-test: setup x = 1\ny = 2 -->\n```python\nprint(x + y)\n```\n"
        "<!-- docs-test: skip gpu -->\n```python\nimport torch\n```\n```bash\nls\n```\n"
    )
    a, b = python_blocks(doc)
    assert (a.line, a.code, a.setup, a.skip) == (5, "print(x + y)", "x = 1\ny = 2\n", None)
    assert (b.line, b.skip, b.setup) == (9, "gpu", "")
    doc.write_text("<!-- docs-test: skip flaky -->\n```python\npass\n```\n")
    with pytest.raises(AssertionError, match="unknown docs-test directive"):
        python_blocks(doc)
    # a raising block fails, naming the file and line
    doc.write_text("```python\nx = 1\nraise ValueError('boom')\n```\n")
    with pytest.raises(AssertionError, match=r"d.md:2 raised ValueError: boom") as err:
        _run(python_blocks(doc)[0], {}, python_blocks(doc)[0].code, "the code")
    assert err.value.__cause__ is not None and err.value.__cause__.__traceback__ is not None
