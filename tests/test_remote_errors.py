"""Storage errors a user can cause (issue 25, item 3) come out as seqstore errors in seqstore's words.

A misspelled or ill-typed storage option, a URL without a bucket, a bucket that does not exist and a
request the client refuses before sending it: each raises a :class:`~seqstore.errors.SeqstoreError`
subclass that names the option or URL, through the API and through the ``seqstore`` command, and no
obstore, botocore or Rust text (type names, ``Debug source:`` dumps) leaks into the message.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.s3 import MotoS3
from support.stores import build_store, same_batch

import seqstore as ss
from seqstore.cli import main
from seqstore.errors import BucketNotFound, ConfigError, RemoteError, RemoteNotFound, SeqstoreError
from seqstore.io.object_common import check_options, check_url

pytestmark = pytest.mark.timeout(120)

#: text that would mean an error of the storage client (or Python's int()) reached the user as it was
LEAKS = ("obstore", "Debug source", "botocore", "RetryError", "UnknownConfigurationKey", "GenericError",
         "Unrecognised", "invalid literal", "Traceback")


def _clean(text: str) -> None:
    for word in LEAKS:
        assert word not in text, f"{word!r} leaks into the message: {text}"


def _message_of(exc: BaseException) -> str:
    """The message and the chain of causes a user would see printed (``raise ... from None`` hides it)."""
    return str(exc) + "".join(traceback.format_exception_only(exc))


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("local") / "main.seqstore", seed=5)


@pytest.fixture(scope="module")
def remote(moto_s3: MotoS3, local: Path) -> Iterator[str]:
    bucket = moto_s3.new_bucket("err")
    yield moto_s3.upload_dir(local, bucket, "err/main.seqstore")
    moto_s3.delete_bucket(bucket)


@pytest.fixture(autouse=True)
def _own_cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQSTORE_CACHE_DIR", str(tmp_path / "env-cache"))


# ------------------------------------------------------------------------------------- options


def test_misspelled_option_names_it_and_lists_valid_keys(moto_s3: MotoS3, remote: str, tmp_path: Path) -> None:
    opts = moto_s3.storage_options(endpont="http://127.0.0.1:1")
    with pytest.raises(ConfigError) as info:
        ss.open(remote, storage_options=opts, cache_dir=tmp_path / "c")
    msg = _message_of(info.value)
    assert isinstance(info.value, SeqstoreError) and isinstance(info.value, ValueError)
    assert "'endpont'" in msg and "did you mean 'endpoint'" in msg and remote in msg
    assert "valid keys" in msg and "region" in msg and "max_requests" in msg and "allow_http" in msg
    _clean(msg)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [("max_requests", "abc", "an integer >= 1"), ("max_requests", 0, "an integer >= 1"),
     ("timeout", "soon", "a number of seconds > 0"), ("timeout", 0, "a number of seconds > 0"),
     ("max_retries", -1, "an integer >= 0"), ("coalesce_gap", 1.5, "an integer >= 0")],
)
def test_ill_typed_seqstore_option_names_it_and_what_was_expected(key: str, value: Any, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        ss.open("s3://some-bucket/x.seqstore", storage_options={key: value})
    msg = _message_of(info.value)
    assert f"{key}={value!r}" in msg and expected in msg and "s3://some-bucket/x.seqstore" in msg
    _clean(msg)


def test_option_values_that_spell_numbers_are_accepted() -> None:
    check_options("s3://b/x", {"max_requests": "16", "timeout": "2.5", "max_retries": 0, "coalesce_gap": "0"})


def test_http_store_refuses_a_service_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        ss.open("http://127.0.0.1:1/x.seqstore", storage_options={"allow_http": "true", "regoin": "x"},
                cache_dir=tmp_path / "c")
    msg = _message_of(info.value)
    assert "'regoin'" in msg and "http://127.0.0.1:1/x.seqstore" in msg and "valid keys" in msg
    _clean(msg)


# ----------------------------------------------------------------------------------------- URLs


@pytest.mark.parametrize("url", ["s3:///x.seqstore", "gs:///x", "az:///x", "https:///x.seqstore"])
def test_url_without_bucket_names_the_url(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_url(url)
    assert url in str(info.value)
    _clean(str(info.value))


@pytest.mark.parametrize("url", ["http://user:hunter2-pw@127.0.0.1:9/b/x.seqstore", "https://user@host.test/x"])
def test_credentials_in_an_http_url_are_refused_without_showing_them(url: str, tmp_path: Path) -> None:
    """``http://user:password@host/...``: neither obstore nor the direct reader sends them (a 401 would
    follow), and every error would show the password with the URL: a ConfigError at once that says so
    and shows the URL without the password."""
    with pytest.raises(ConfigError, match="credentials in the URL") as info:
        ss.open(url, cache_dir=tmp_path / "c")
    msg = _message_of(info.value)
    assert "hunter2-pw" not in msg and url.split("//")[1].split("@")[1] in msg, msg


@pytest.mark.parametrize("url", ["http://[::1/x.seqstore", "s3://b[x/y.seqstore", "http://host.test:99999/x.seqstore",
                                 "https://host.test:abc/x.seqstore", "s3://bucket:99999/x.seqstore"])
def test_a_url_that_does_not_parse_names_the_url(url: str, tmp_path: Path) -> None:
    """A bracket without its pair or a port that is not one: Python's and obstore's ValueError ("Invalid IPv6
    URL", "invalid port number") named neither the URL nor the option; a ConfigError names the URL."""
    with pytest.raises(ConfigError) as info:
        ss.open(url, cache_dir=tmp_path / "c")
    assert url in str(info.value), info.value
    _clean(str(info.value))


@pytest.mark.parametrize("url", ["foo://bar/x.seqstore", "MEMORY://bar/x.seqstore", "foo://u:hunter2-pw@bar/x"])
def test_a_url_of_an_unknown_scheme_names_it_and_the_schemes_seqstore_opens(
        url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``seqstore.open("foo://bar/x")`` raised fsspec's bare ``ValueError: Protocol not known: foo`` (and
    ``seqstore info`` printed a traceback): a ConfigError names the URL (not its password) and the schemes
    seqstore opens, before any request, from the API and the command line."""
    shown = url.replace("u:hunter2-pw@", "")
    for call in (lambda: ss.open(url, cache_dir=tmp_path / "c"), lambda: ss.create(url, {"x": ss.Field("int32")})):
        with pytest.raises(ConfigError, match="unknown URL scheme") as info:
            call()
        msg = _message_of(info.value)
        assert shown in msg and "hunter2-pw" not in msg and "s3://" in msg and "memory://" in msg, msg
        _clean(msg)
    assert main(["info", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error:") and shown in err and "unknown URL scheme" in err, err
    assert "hunter2-pw" not in err and len(err.splitlines()) == 1, err
    assert not list(tmp_path.iterdir())


def test_a_url_whose_fsspec_filesystem_is_not_installed_names_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheme fsspec knows but whose package is missing (``sftp://`` without paramiko) raised fsspec's
    ImportError naming neither the URL nor the scheme: it now names the URL, with fsspec's words of what to
    install."""
    from fsspec.registry import known_implementations

    monkeypatch.setitem(known_implementations, "nosuchfs",
                        {"class": "seqstore_no_such_module.FileSystem", "err": "install seqstore-no-such-module"})
    url = "nosuchfs://bucket/x.seqstore"
    with pytest.raises(ImportError, match=f"^{url}: .*install seqstore-no-such-module"):
        ss.open(url, cache_dir=tmp_path / "c")


def test_open_url_without_bucket(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        ss.open("s3:///x.seqstore", cache_dir=tmp_path / "c")
    msg = _message_of(info.value)
    assert "s3:///x.seqstore" in msg and "bucket" in msg and "one slash too many" in msg
    _clean(msg)


# -------------------------------------------------------------------------------------- buckets


def test_open_missing_bucket(moto_s3: MotoS3, tmp_path: Path) -> None:
    with pytest.raises(BucketNotFound) as info:
        ss.open("s3://no-such-bucket-25/x.seqstore", storage_options=moto_s3.storage_options(),
                cache_dir=tmp_path / "c")
    msg = _message_of(info.value)
    assert not isinstance(info.value, RemoteNotFound)  # not "a missing object"
    assert "bucket 'no-such-bucket-25' does not exist" in msg and "s3://no-such-bucket-25/x.seqstore" in msg
    assert "no seqstore store here" not in msg and "no such object" not in msg
    _clean(msg)


@pytest.mark.parametrize("command", ["info", "verify", "copy"])
def test_cli_missing_bucket(command: str, moto_s3: MotoS3, local: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in moto_s3.env().items():
        monkeypatch.setenv(k, v)
    url = "s3://no-such-bucket-25/x.seqstore"
    argv = ["copy", str(local), url, "-q"] if command == "copy" else [command, url, "-q"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error: ") and "bucket 'no-such-bucket-25' does not exist" in err
    assert "no such object" not in err and "no seqstore store here" not in err
    _clean(err)


def test_cli_misspelled_and_ill_typed_options(moto_s3: MotoS3, remote: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in moto_s3.env().items():
        monkeypatch.setenv(k, v)
    assert main(["info", remote, "-q", "-o", "endpont=x"]) == 2
    err = capsys.readouterr().err
    assert "'endpont'" in err and "valid keys" in err
    _clean(err)
    assert main(["info", remote, "-q", "-o", "max_requests=abc"]) == 2
    err = capsys.readouterr().err
    assert "max_requests='abc'" in err and "integer" in err
    _clean(err)
    assert main(["info", "s3:///x.seqstore", "-q"]) == 2
    err = capsys.readouterr().err
    assert "s3:///x.seqstore" in err and "bucket" in err
    _clean(err)


# ------------------------------------------------------------------------------ no retries for refusals


def _client_with_failing_put(moto_s3: MotoS3, bucket: str, monkeypatch: pytest.MonkeyPatch,
                             error: BaseException) -> tuple[Any, list[int]]:
    from seqstore.io.objects import ObjectClient

    client = ObjectClient(f"s3://{bucket}/refuse.seqstore", moto_s3.storage_options(max_retries=3))
    calls: list[int] = []

    def put(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise error

    backend = client.backend
    monkeypatch.setattr(backend, "obs", SimpleNamespace(put=put))
    return client, calls


def test_client_side_refusal_is_not_retried(moto_s3: MotoS3, s3_bucket: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import obstore.exceptions as oex

    refusal = oex.GenericError("Generic GCS error: Version required for conditional update\n\nDebug source:\n"
                               "Generic { store: \"GCS\", source: MissingVersion }")
    client, calls = _client_with_failing_put(moto_s3, s3_bucket, monkeypatch, refusal)
    with pytest.raises(RemoteError) as info:
        client.put("manifest.json", b"{}", mode={"e_tag": "abc"})
    assert len(calls) == 1, "a request the client refused before sending it was retried"
    assert info.value.attempts == 1
    msg = str(info.value)
    assert client.key_url("manifest.json") in msg and "Version required" in msg and "refused" in msg
    assert "Debug source" not in msg and "MissingVersion" not in msg


def test_network_failure_is_still_retried(moto_s3: MotoS3, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import obstore.exceptions as oex

    failure = oex.GenericError("Generic S3 error: Error performing PUT http://127.0.0.1:9/b/k in 1ms - "
                               "HTTP error: error sending request")
    client, calls = _client_with_failing_put(moto_s3, s3_bucket, monkeypatch, failure)
    with pytest.raises(RemoteError) as info:
        client.put("k", b"x")
    assert len(calls) > 1 and info.value.attempts == len(calls)  # retried (how often: the retry policy)


def test_a_failure_under_a_path_that_says_certificate_is_retried(moto_s3: MotoS3, s3_bucket: str,
                                                                s3_proxy: Any) -> None:
    """obstore's message names the URL (and an S3 error body the key): a 503 or a reset connection for an
    object whose path holds the word "certificate" was taken for a refused TLS certificate and raised at
    once. Both are retried, as anywhere else."""
    from seqstore.io.objects import ObjectClient

    moto_s3.put(s3_bucket, "certificates/scan.bin", b"scan" * 25)
    opts = moto_s3.storage_options(s3_proxy.url, timeout=2, connect_timeout=1, retry_timeout=5)
    client = ObjectClient(f"s3://{s3_bucket}/certificates", opts)
    s3_proxy.fail(1, status=503, path="/certificates/")
    s3_proxy.reset(1, path="/certificates/")
    data, _ = client.get("scan.bin")
    assert bytes(data) == b"scan" * 25
    s3_proxy.fail(1, status=503, path="/certificates/")
    [(got, _)] = client.get_ranges([("scan.bin", 4, 12, None)])
    assert bytes(got) == (b"scan" * 25)[4:12]


def test_a_missing_object_whose_key_says_no_such_bucket_is_a_missing_object(moto_s3: MotoS3, s3_bucket: str) -> None:
    """S3's 404 names the key (``<Key>``, and obstore's text the path): an object under ``NoSuchBucket/`` that is
    missing was reported as a bucket that does not exist."""
    from seqstore.io.objects import ObjectClient

    client = ObjectClient(f"s3://{s3_bucket}/words", moto_s3.storage_options())
    with pytest.raises(RemoteNotFound) as info:
        client.get("NoSuchBucket/x.npy")
    assert not isinstance(info.value, BucketNotFound) and "NoSuchBucket/x.npy" in str(info.value)


@pytest.mark.parametrize("key", ["Content-Range/x.npy", "a/Requested x/y.npy", "Configuration key/z.npy",
                                 "builder error/b.npy", "error following redirect/r.npy"])
def test_words_of_a_key_do_not_classify_a_failure(key: str) -> None:
    """The phrases that tell a refusal before sending (not retried) and an answer that came (the endpoint is
    reachable) are obstore's and the server's words, not the key's: a connection refused for a key holding
    one is a transient failure of an endpoint not yet reached, a 503 for it is retried."""
    from urllib.parse import quote

    import obstore.exceptions as oex

    from seqstore.io.object_errors import failure
    from seqstore.io.retry import Transient

    url = f"s3://b/store/{key}"
    sent = f"http://127.0.0.1:9/b/store/{quote(key)}"
    refused = oex.GenericError(f"Generic S3 error: Error performing GET {sent} in 1ms - HTTP error: error sending "
                               f'request\n\nDebug source:\nGeneric {{ store: "S3", path: "store/{key}" }}')
    got = failure(oex, refused, "s3://b/store", url, {})
    assert isinstance(got, Transient) and not got.answered, got
    busy = oex.GenericError(f"Generic S3 error: Error performing GET {sent} in 1ms - Server returned non-2xx status "
                            f"code: 503 Service Unavailable: <Error><Code>SlowDown</Code><Key>store/{key}</Key></Error>"
                            f"\n\nDebug source:\nGeneric {{ path: \"store/{key}\", inner: Status {{ status: 503 }} }}")
    got = failure(oex, busy, "s3://b/store", url, {})
    assert isinstance(got, Transient) and got.answered, got


def test_open_missing_azure_container(azurite: Any, tmp_path: Path) -> None:
    with pytest.raises(BucketNotFound) as info:
        ss.open("az://no-such-container-25/x.seqstore", storage_options=azurite.storage_options(),
                cache_dir=tmp_path / "c")
    msg = _message_of(info.value)
    assert "container 'no-such-container-25' does not exist" in msg and "az://no-such-container-25/x.seqstore" in msg
    _clean(msg)


_EXIT_SCRIPT = """
import sys, time
from seqstore.io.objects import ObjectClient
client = ObjectClient("s3://b/x", {"endpoint": "http://127.0.0.1:%d", "allow_http": "true", "skip_signature": "true",
                                   "virtual_hosted_style_request": "false", "connect_timeout": "2",
                                   "retry_timeout": "0.01"})
waves = []
for _ in range(12):  # waves of requests that all fail together (nothing listens on the port)
    waves.append(client.submit([("k", 0, 100, None)] * 4, lambda *a: None, with_meta=False))
    time.sleep(0.0005)
try:
    waves[0].result(timeout=60)
except Exception:
    pass
sys.exit(3)  # the other waves may still be failing on obstore's threads
"""


def test_exit_after_a_remote_error_with_requests_in_flight_keeps_its_status() -> None:
    """A process that exits right after a request failed, while its other requests are failing on obstore's
    threads, exits with its own status. Before the exit-time quiesce (object_obstore._quiesce_at_exit) such
    a thread could ask for the GIL during finalization and abort the process: SIGABRT in 8 of 20 runs here."""
    import os
    import socket
    import subprocess
    import sys

    src = Path(__file__).resolve().parents[1] / "src"
    with socket.socket() as s:  # a port that nothing listens on: every request is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    codes = []
    for _ in range(8):
        done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT % port], env={**os.environ, "PYTHONPATH": str(src)},
                              capture_output=True, text=True, timeout=120)
        codes.append(done.returncode)
    assert codes == [3] * 8, codes


# ------------------------------------------------------------------ unreachable endpoints, no credentials


def _dead_port() -> int:
    import socket

    with socket.socket() as s:  # a port that nothing listens on: every connection is refused at once
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(60)  # the default retry budget is 120 s: spending it fails here
def test_an_endpoint_that_never_answered_is_named_unreachable(tmp_path: Path) -> None:
    """A mistyped port: ``open`` + ``get_batch`` with the default options end in a RemoteError naming the
    endpoint as unreachable after a few attempts (before: the whole 120 s budget)."""
    import numpy as np

    endpoint = f"http://127.0.0.1:{_dead_port()}"
    opts = {"endpoint": endpoint, "allow_http": "true", "region": "us-east-1", "access_key_id": "k",
            "secret_access_key": "s"}
    with pytest.raises(RemoteError) as exc:
        ss.open("s3://some-bucket/x.seqstore", storage_options=opts, cache_dir=tmp_path / "c").get_batch(np.arange(2))
    msg = str(exc.value)
    assert f"the endpoint {endpoint} is unreachable" in msg and "s3://some-bucket/x.seqstore" in msg, msg
    assert 1 < exc.value.attempts < 20, exc.value.attempts
    _clean(msg.split("the last:")[0])


def test_after_an_answer_a_refused_link_gets_the_whole_budget(moto_s3: MotoS3, remote: str, local: Path,
                                                              tmp_path: Path, s3_proxy: Any) -> None:
    """The short budget is for endpoints that never answered: once the store was read, connections reset for
    longer than it (4.5 s) are ridden out within ``retry_timeout``."""
    import threading

    import numpy as np

    opts = moto_s3.storage_options(s3_proxy.url, timeout=5, connect_timeout=2, retry_timeout=30)
    store = ss.open(remote, storage_options=opts, cache_dir=tmp_path / "c")
    s3_proxy.reset(None)  # every request's connection reset, none answered
    timer = threading.Timer(4.5, s3_proxy.clear_faults)
    timer.start()
    try:
        got = store.get_batch(np.arange(len(store)), pad=True)
    finally:
        timer.cancel()
    same_batch(got, ss.open(local).get_batch(np.arange(len(store)), pad=True), "after 4.5 s of resets")


def _without_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in [k for k in os.environ if k.startswith(("AWS_", "GOOGLE_", "AZURE_"))]:
        monkeypatch.delenv(key)


def test_missing_credentials_are_named(moto_s3: MotoS3, local: Path, s3_proxy: Any, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """No keys anywhere and the instance-metadata lookup refused: a CredentialsError that says no credentials
    were found and where they come from (not "access refused (HTTP 403)": the server got no request)."""
    from seqstore.errors import CredentialsError

    _without_credentials(monkeypatch)
    bucket = moto_s3.new_bucket()
    # credentials are looked up at the metadata endpoint: here a port that refuses (as outside a cloud)
    opts = {"endpoint": s3_proxy.url, "allow_http": "true", "region": "us-east-1",
            "metadata_endpoint": f"http://127.0.0.1:{_dead_port()}"}
    url = f"s3://{bucket}/x.seqstore"
    with pytest.raises(CredentialsError) as exc:
        ss.copy(local, url, dst_options=opts)
    msg = str(exc.value)
    for word in ("no credentials found", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "access_key_id",
                 "skip_signature", url):
        assert word in msg, (word, msg)
    assert "HTTP 403" not in msg and exc.value.__cause__ is not None
    assert s3_proxy.count() == 0  # the server never heard of it
    argv = ["copy", str(local), url, "-q"] + [a for k, v in opts.items() for a in ("--dst-option", f"{k}={v}")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no credentials found" in err and "AWS_ACCESS_KEY_ID" in err and "HTTP 403" not in err, err


def test_a_pickled_client_keeps_whether_its_endpoint_answered() -> None:
    """A worker gets the client pickled: it starts with no failure streak, and an endpoint that answered in
    the parent keeps the whole budget there (a link cut as a worker starts is ridden out, not 'unreachable')."""
    import pickle

    from seqstore.io.objects import ObjectClient

    client = ObjectClient("s3://b/x.seqstore", {"endpoint": "http://127.0.0.1:9", "retry_timeout": 7})
    fresh = pickle.loads(pickle.dumps(client))
    assert not fresh.retry.reached and fresh.retry.endpoint == "http://127.0.0.1:9"
    client.retry.ok()
    client.retry.failing_since = 1.0
    worker = pickle.loads(pickle.dumps(client))
    assert worker.retry.reached and worker.retry.failing_since is None and worker.retry.retry_timeout == 7


@pytest.mark.parametrize("damage", ["manifest", "table"])
def test_a_damaged_manifest_or_shard_table_is_named_by_its_url(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                               damage: str) -> None:
    """A remote store's manifest that is not JSON, or its shard table cut short: the CorruptionError names
    the object's URL, not the path of the node cache's copy of it."""
    local = build_store(tmp_path / "a.seqstore", seed=1)
    url = moto_s3.upload_dir(local, s3_bucket, "damaged/s.seqstore")
    if damage == "manifest":
        name, data = "manifest.json", b"{not json"
    else:
        name, data = "_shards.tbl", (local / "_shards.tbl").read_bytes()[:-40]
    moto_s3.put(s3_bucket, f"damaged/s.seqstore/{name}", data)
    with pytest.raises(ss.CorruptionError) as err:
        ss.open(url, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "cache").get_batch([0])
    assert str(err.value).startswith(f"{url}/{name}: "), err.value
    assert str(tmp_path / "cache") not in str(err.value), err.value


def test_a_wait_that_gets_no_answer_and_a_cancelled_wave_name_the_store() -> None:
    """The two errors of the fetch path that no request raises (a wait past every timeout, a cancelled wave)
    name the store's URL, as every other remote error does."""
    import concurrent.futures

    from seqstore.io.remote_fetch import Ticket, _settle

    url = "s3://bucket/corpus.seqstore"
    never: concurrent.futures.Future[Any] = concurrent.futures.Future()
    with pytest.raises(RemoteError, match="^s3://bucket/corpus.seqstore: no answer") as got:
        Ticket([never], 0.05, url=url).wait()
    assert got.value.url == url
    answers: concurrent.futures.Future[Any] = concurrent.futures.Future()
    answers.cancel()
    wave: concurrent.futures.Future[Any] = concurrent.futures.Future()
    _settle(wave, answers, url)
    assert isinstance(wave.exception(), RemoteError)
    assert str(wave.exception()).startswith(url + ": the requests were cancelled")


@pytest.mark.parametrize("tail", ["#1.seqstore", "?v=1"])
def test_an_object_store_url_with_a_query_or_fragment_is_refused(tail: str, moto_s3: MotoS3, tmp_path: Path) -> None:
    """A '#' or '?' in an s3:// URL cut the key there: ``s3://b/a#1.seqstore`` and ``s3://b/a#2.seqstore``
    were one store at ``a/``. Such a URL is a ConfigError naming it, before anything is read or written."""
    bucket = moto_s3.new_bucket()
    url = f"s3://{bucket}/a{tail}"
    with pytest.raises(ConfigError) as info:
        ss.create(url, {"x": ss.Field("int32", ())}, storage_options=moto_s3.storage_options())
    assert url in str(info.value) and "'?' or '#'" in str(info.value)
    with pytest.raises(ConfigError, match="'\\?' or '#'"):
        ss.open(url, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "c")
    assert moto_s3.keys(bucket) == {}


@pytest.mark.parametrize("prefix", ["latest/meta-data", "v1/computeMetadata"])
def test_a_failure_under_a_path_that_names_a_credentials_service_is_retried(
        moto_s3: MotoS3, s3_bucket: str, s3_proxy: Any, prefix: str) -> None:
    """obstore's message names the request's URL: a 503 for an object whose path holds what a request to
    an instance-metadata service names ("/latest/meta-data/", "computeMetadata/") was taken for a failed
    lookup of credentials and raised at once as "no credentials found". It is retried, as anywhere else."""
    from seqstore.io.objects import ObjectClient

    moto_s3.put(s3_bucket, f"{prefix}/scan.bin", b"scan" * 25)
    opts = moto_s3.storage_options(s3_proxy.url, timeout=2, connect_timeout=1, retry_timeout=5)
    client = ObjectClient(f"s3://{s3_bucket}/{prefix}", opts)
    s3_proxy.fail(1, status=503, path=f"/{prefix}/")
    data, _ = client.get("scan.bin")
    assert bytes(data) == b"scan" * 25
    s3_proxy.fail(1, status=503, path=f"/{prefix}/")
    [(got, _)] = client.get_ranges([("scan.bin", 4, 12, None)])
    assert bytes(got) == (b"scan" * 25)[4:12]
