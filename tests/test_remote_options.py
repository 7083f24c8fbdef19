"""One options value for a remote store (seqstore.io.options.StoreOptions) and one fetch path per store.

Options are parsed and checked once, travel with the store (a pickled store reopens with them), and
every entry point that takes a store's URL (``seqstore.open``, ``StoreDataset``, ``SeqDataset``,
``IterableSeqDataset``) takes the same ``storage_options``. Each store fetches through its own
``Fetcher``, which knows only that store's mappings.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.s3 import MotoS3

pytest.importorskip("obstore")

import seqstore as ss  # noqa: E402
from seqstore.errors import ConfigError  # noqa: E402
from seqstore.io import StoreOptions  # noqa: E402

pytestmark = pytest.mark.timeout(300)
N, DIM = 600, 16


@pytest.fixture(scope="module")
def values() -> np.ndarray[Any, Any]:
    return np.random.default_rng(3).standard_normal((N, DIM)).astype(np.float32)


@pytest.fixture(scope="module")
def remote(moto_s3: MotoS3, tmp_path_factory: pytest.TempPathFactory, values: np.ndarray[Any, Any]) -> Iterator[str]:
    local = tmp_path_factory.mktemp("options") / "main.seqstore"
    with ss.create(local, {"v": ss.Field("float32", (DIM,))}, max_shard_records=200) as w:
        w.append_batch({"v": values})
    bucket = moto_s3.new_bucket("options")
    yield moto_s3.upload_dir(local, bucket, "o/main.seqstore")
    moto_s3.delete_bucket(bucket)


def test_options_are_parsed_once_into_typed_fields() -> None:
    opts = StoreOptions.of("s3://b/x", {"max_requests": "16", "timeout": "2.5", "read_once": "yes",
                                        "direct_reads": "false", "region": "eu-west-1"}, cache_bytes="2G")
    assert (opts.max_requests, opts.timeout, opts.read_once, opts.direct_reads) == (16, 2.5, True, False)
    assert opts.backend == {"region": "eu-west-1"}  # the back end's own keys, passed through
    assert opts.cache_bytes == "2G"
    assert StoreOptions.of("s3://b/x", opts) is opts  # parsed already: taken as it is
    assert StoreOptions.of("s3://b/x", opts, cache_dir="/tmp/c").cache_dir == "/tmp/c"
    assert StoreOptions.of("s3://b/x", opts.storage_options(), cache_bytes="2G") == opts
    with pytest.raises(ConfigError, match=r"s3://b/x: storage option max_requests='many'"):
        StoreOptions.of("s3://b/x", {"max_requests": "many"})
    with pytest.raises(TypeError, match="cache_size"):
        StoreOptions.of("s3://b/x", None, cache_size=1)


def test_a_secret_never_shows_in_the_options_repr() -> None:
    opts = StoreOptions.of("s3://b/x", {"secret_access_key": "TOPSECRET", "region": "r"})
    assert "TOPSECRET" not in repr(opts) and "region" in repr(opts)


def test_the_store_carries_its_options_and_reopens_with_them(moto_s3: MotoS3, remote: str, tmp_path: Path,
                                                              values: np.ndarray[Any, Any]) -> None:
    store = ss.open(remote, storage_options=moto_s3.storage_options(max_requests=8), cache_dir=tmp_path / "c")
    opts = store.source.options
    assert isinstance(opts, StoreOptions)
    assert opts.max_requests == 8 and opts.cache_dir == str(tmp_path / "c")
    again = pickle.loads(pickle.dumps(store))
    assert again.source.options == opts
    np.testing.assert_array_equal(again.get_batch([1, 599, 250])["v"], values[[1, 599, 250]])


def test_datasets_take_the_same_storage_options(moto_s3: MotoS3, remote: str, tmp_path: Path,
                                                values: np.ndarray[Any, Any]) -> None:
    pytest.importorskip("torch")
    from seqstore.data import StoreDataset
    from seqstore.torch import IterableSeqDataset, SeqDataset

    opts = StoreOptions.of(remote, moto_s3.storage_options(max_requests=4), cache_dir=tmp_path / "c")
    ds = StoreDataset(remote, storage_options=opts)
    assert ds.store.source.options is opts
    np.testing.assert_array_equal(ds.get_batch(np.array([3, 400]))["v"], values[[3, 400]])
    sds = SeqDataset(remote, storage_options=moto_s3.storage_options(), with_index=True)
    assert sds[7]["v"].numpy().tolist() == values[7].tolist()
    it = IterableSeqDataset(remote, batch=50, storage_options=opts)
    assert sum(len(b["v"]) for b in it) == N
    with pytest.raises(ValueError, match="storage_options are for a store given by path or URL"):
        StoreDataset(ds.store, storage_options=opts)


def test_each_store_fetches_through_its_own_fetcher(moto_s3: MotoS3, remote: str, tmp_path: Path,
                                                    values: np.ndarray[Any, Any]) -> None:
    """Two stores over the same objects and node cache: each fetcher knows its own mappings only, and an
    address of the other store's mappings is not its business (nothing is looked up process-wide)."""
    a = ss.open(remote, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "c")
    b = ss.open(remote, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "c")
    np.testing.assert_array_equal(a.get_batch([0, 590])["v"], values[[0, 590]])
    assert a.source.fetcher is not b.source.fetcher
    mine = a.source.fetcher.regions()
    assert {r.key for r in mine} == {"shard-000000/v.npy", "shard-000002/v.npy"}
    assert b.source.fetcher.regions() == []
    ticket = b.source.fetcher.fetch(np.array([mine[0].base]), np.array([mine[0].end]))
    assert ticket.futures == []  # not b's mapping: nothing asked
    np.testing.assert_array_equal(b.get_batch([590, 0])["v"], values[[590, 0]])
    assert {r.key for r in b.source.fetcher.regions()} == {"shard-000000/v.npy", "shard-000002/v.npy"}


@pytest.mark.parametrize("text", ["inf", "1e400", "nan", "-2G"])
def test_a_cache_budget_that_is_no_byte_count_is_named(text: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``SEQSTORE_CACHE_BYTES=inf`` (or ``cache_bytes="inf"``) raised a bare OverflowError naming neither."""
    from seqstore.io.nodecache import NodeCache, default_cache_bytes

    monkeypatch.setenv("SEQSTORE_CACHE_BYTES", text)
    with pytest.raises(ValueError, match="SEQSTORE_CACHE_BYTES"):
        default_cache_bytes()
    with pytest.raises(ValueError, match="cache_bytes"):
        NodeCache(tmp_path / "cache", text)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), [1 << 30], True])
def test_a_cache_budget_of_the_wrong_type_is_named(value: Any, tmp_path: Path) -> None:
    """``cache_bytes=float("nan")`` (or a list) raised int()'s bare ValueError / OverflowError / TypeError."""
    from seqstore.io.nodecache import NodeCache

    with pytest.raises(ValueError, match="cache_bytes: expected a byte count"):
        NodeCache.get(tmp_path / "cache", value)


@pytest.mark.parametrize(("storage_options", "remote", "named"), [
    ("anon=true", {}, "storage_options"), (5, {}, "storage_options"), ({}, {"cache_dir": 5}, "cache_dir"),
])
def test_options_of_the_wrong_type_are_named(storage_options: Any, remote: dict[str, Any], named: str) -> None:
    """``storage_options="anon=true"`` raised dict()'s bare "dictionary update sequence element #0 has length 1"
    (an int: "'int' object is not iterable"; ``cache_dir=5``: os.fspath's TypeError), naming no option."""
    with pytest.raises(ConfigError, match=f"s3://b/x: {named}"):
        StoreOptions.of("s3://b/x", storage_options, **remote)


@pytest.mark.parametrize("key", [3, None, b"timeout"])
def test_an_option_name_that_is_not_a_string_is_named(key: Any, tmp_path: Path) -> None:
    """``storage_options={3: 1}`` (a name that is not a str) raised a bare AttributeError ("'int' object has
    no attribute 'lower'") from the endpoint's look-up: a ConfigError names the URL and the key."""
    with pytest.raises(ConfigError, match=f"s3://b/x: storage option {key!r}: option names are strings"):
        ss.open("s3://b/x", storage_options={key: 1}, cache_dir=tmp_path / "c")


@pytest.mark.parametrize("url", ["s3://b/x", "memory://b/x"])
def test_a_filesystem_that_is_not_an_fsspec_one_is_named(url: str, tmp_path: Path) -> None:
    """``filesystem=`` something that is not an fsspec filesystem (an s3fs-less stand-in, a path) raised a
    bare AttributeError (``type object 'object' has no attribute 'find'``) at the first read: a
    ConfigError names the URL and what was expected when the store is opened."""
    for fs in (object(), str(tmp_path)):
        with pytest.raises(ConfigError, match=f"{url}: filesystem: expected an fsspec filesystem"):
            ss.open(url, filesystem=fs, cache_dir=tmp_path / "c")


def test_the_open_docstring_gives_the_cache_default_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``seqstore.open``'s docstring gave the node cache's default as ``~/.cache/seqstore``, but where
    ``$XDG_CACHE_HOME`` is set the cache goes under it (as docs/remote.md says)."""
    from seqstore.io.nodecache import default_cache_dir

    monkeypatch.delenv("SEQSTORE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "seqstore"
    assert "$XDG_CACHE_HOME/seqstore" in " ".join((ss.open.__doc__ or "").split())


def test_verify_reads_is_one_of_the_storage_options(moto_s3: MotoS3, remote: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``verify_reads`` is a storage option of ``seqstore.open``, but the table of seqstore's options lacked
    it: ``seqstore verify URL -o verify_reads=true`` (or a StoreOptions made with it) passed it to the
    client, which refused it as "unknown storage option 'verify_reads'", and the valid keys that message
    (and one for a misspelling) listed did not name it."""
    from seqstore.cli import main
    from seqstore.io.object_errors import unknown_key

    opts = StoreOptions.of(remote, {"verify_reads": "true", "region": "r"})
    assert opts.backend == {"region": "r"} and opts.verify_reads is True
    with pytest.raises(ConfigError, match="verify_reads='maybe'"):
        StoreOptions.of(remote, {"verify_reads": "maybe"})
    assert "did you mean 'verify_reads'?" in str(unknown_key(remote, "S3", "verify_redas"))
    parsed = StoreOptions.of(remote, {**moto_s3.storage_options(), "verify_reads": "true"}, cache_dir=tmp_path / "c")
    store = ss.open(remote, storage_options=parsed)
    assert store._verify_reads and store.get_batch([5])["v"].shape == (1, DIM)
    monkeypatch.setenv("SEQSTORE_CACHE_DIR", str(tmp_path / "c"))
    flags = [a for k, v in moto_s3.storage_options().items() for a in ("-o", f"{k}={v}")]
    assert main(["verify", remote, "-q", *flags, "-o", "verify_reads=true"]) == 0, capsys.readouterr().err


def test_a_local_store_checks_its_storage_options(tmp_path: Path) -> None:
    """``seqstore.open(path, storage_options=...)`` of a local store ignored the options unread: a
    misspelled key (``verify_read``) or a value out of range passed silently, where a URL refuses both.
    Both are ConfigErrors naming the store and the key now; the keys of seqstore and of the clients that
    do not apply to a local store are still ignored (the same options can serve a local and a remote
    store), and ``verify_reads`` applies."""
    path = tmp_path / "s.seqstore"
    with ss.create(path, {"v": ss.Field("float32", (2,))}) as w:
        w.append({"v": np.ones(2, np.float32)})
    for bad, named in (({"verify_read": "true"}, "unknown storage option 'verify_read'.*did you mean 'verify_reads'"),
                       ({"max_requests": "0"}, "storage option max_requests='0'"),
                       ({"verify_reads": "maybe"}, "verify_reads='maybe'")):
        with pytest.raises(ConfigError, match=f"{path}: .*{named}"):
            ss.open(path, storage_options=bad)
    ignored = {"region": "r", "AWS_ENDPOINT": "http://x", "azure_storage_account_name": "a", "max_requests": "4",
               "allow_http": "true", "timeout": "5"}
    assert len(ss.open(path, storage_options=ignored)) == 1
    assert ss.open(path, storage_options={"verify_reads": "true"})._verify_reads


def test_threads_first_reading_at_once_share_one_request_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads' first reads through one client each made a thread pool of the fsspec back end (and a
    direct reader of its own): ``max_requests`` requests in flight per pool, so twice as many at once, and
    the pool made first left running, unreachable."""
    import concurrent.futures
    import threading
    import time

    pytest.importorskip("fsspec")
    from seqstore.io import object_direct
    from seqstore.io.objects import ObjectClient

    made: list[Any] = []

    class SlowPool(concurrent.futures.ThreadPoolExecutor):  # widens the window between the check and the set
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(self)
            time.sleep(0.05)
            super().__init__(*args, **kwargs)

    real_init = object_direct.DirectReader.__init__

    def slow_init(self: Any, client: Any) -> None:
        made.append(self)
        time.sleep(0.05)
        real_init(self, client)

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", SlowPool)
    monkeypatch.setattr(object_direct.DirectReader, "__init__", slow_init)
    client = ObjectClient("memory://pools/s.seqstore")
    client.backend.fs.pipe("/pools/s.seqstore/x", b"abc")
    for first in (lambda: client.backend.submit([("x", 0, 3, None)], None).result(), lambda: client.direct_reader):
        made.clear()
        gate = threading.Barrier(4)
        got: list[Any] = []

        def run(first: Any = first, gate: Any = gate, got: list[Any] = got) -> None:
            gate.wait()
            got.append(first())

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 4 and len(made) == 1, made
    client.backend.fs.rm("/pools", recursive=True)
