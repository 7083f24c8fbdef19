"""A server that lies (issue 42, item 5): every reader path against every bad answer.

The reader paths: obstore's waves (``direct_reads=false``), the direct reader's node-cache waves (the
default), and read-once runs through either (``read_once=true``). The bad answers are those of
tests/support/hostile.py (:data:`~support.hostile.MODES`), given to the range requests of one value file
after the store was opened, and a TLS certificate for another name. Each case ends in a seqstore error
or the right bytes, never wrong bytes and never a hang (each test's timeout is its limit: the options
keep the client's timeouts at a second), and no message shows a presigned URL's signature or a secret.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.hostile import MODES, HostileServer, self_signed
from support.stores import same_batch

import seqstore as ss
from seqstore.errors import RemoteError, SeqstoreError, StaleStoreError

pytestmark = pytest.mark.timeout(20)
BUCKET = "hostile"
SECRET = "hostile-secret-9d2b"
#: the client's limits: a second a request, two attempts (the streak's budget a second); every page its own
#: request (no gaps bridged), so that a batch's wave is large enough for the direct reader
LIMITS = {"timeout": 1, "connect_timeout": 1, "retry_timeout": 1, "max_retries": 1, "coalesce_gap": 0}
PATHS = {
    "obstore": {"direct_reads": "false"},
    "direct": {},
    "once-direct": {"read_once": "true"},
    "once-obstore": {"read_once": "true", "direct_reads": "false"},
}
#: records 1 MiB apart: each its own request (the direct reader takes waves of 32 or more)
BATCHES = [np.arange(7, 40000, 1024), np.array([39997, 11])]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    path = root / "main.seqstore"
    rng = np.random.default_rng(42)
    with ss.create(path, {"v": ss.Field("float32", (256,)), "r": ss.Field("uint8", (None,))}) as w:
        for _ in range(8):
            w.append_batch({"v": rng.standard_normal((5000, 256)).astype(np.float32),
                            "r": [rng.integers(0, 255, size=int(k), dtype=np.uint8) for k in rng.integers(0, 9, 5000)]})
    return root


@pytest.fixture(scope="module")
def servers(local: Path) -> Iterator[HostileServer]:
    with HostileServer(local, BUCKET, host="127.0.0.2", flip=True) as other, HostileServer(local, BUCKET) as server:
        server.other = other.url
        yield server


def _options(server: HostileServer, path: str, **limits: Any) -> dict[str, Any]:
    return {"endpoint": server.url, "allow_http": "true", "region": "us-east-1", "access_key_id": "hostile-key",
            "secret_access_key": SECRET, **LIMITS, **limits, **PATHS[path]}


def _message(exc: BaseException) -> str:
    """What a user could see of ``exc``: its message and its chain of causes."""
    return "".join(traceback.format_exception(exc))


def _clean(text: str) -> None:
    for word in ("Signature", "X-Amz-Credential", SECRET):
        assert word not in text, f"{word!r} in the message: {text}"


def _read(store: ss.Store, path: str) -> list[dict[str, Any]]:
    if path.startswith("once"):
        return list(store.iter_batches(BATCHES))
    return [store.get_batch(b) for b in BATCHES]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", list(PATHS))
def test_a_bad_answer_is_a_named_error_or_the_right_bytes(servers: HostileServer, local: Path, tmp_path: Path,
                                                          path: str, mode: str) -> None:
    want = [ss.open(local / "main.seqstore").get_batch(b) for b in BATCHES]
    store = ss.open(f"s3://{BUCKET}/main.seqstore", storage_options=_options(servers, path), cache_dir=tmp_path)
    store.get_batch([0])  # the shard prepared (its files' heads and tails, the offsets): what follows reads values
    servers.arm(mode, match="/v.npy")
    try:
        got = _read(store, path)
    except SeqstoreError as exc:
        assert isinstance(exc, RemoteError) or "v.npy" in str(exc), _message(exc)
        _clean(_message(exc))
    else:
        for g, w in zip(got, want):
            same_batch(g, w, f"{path}, {mode}")
    finally:
        servers.arm(None)
    assert servers.hits > 0  # the bad answers were given


@pytest.fixture(scope="module")
def tls_server(local: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HostileServer, str]]:
    pair = self_signed(tmp_path_factory.mktemp("tls"), "another-host.invalid")
    if pair is None:
        pytest.skip("the cryptography package is not installed (it makes the test certificate)")
    with HostileServer(local, BUCKET, tls=pair) as server:
        yield server, pair[0]


@pytest.mark.parametrize("direct", [True, False])
def test_a_certificate_for_another_name_is_refused(tls_server: tuple[HostileServer, str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch, direct: bool) -> None:
    """The certificate is trusted (its file is the CA bundle) but names another host: refused, not retried
    for long, named."""
    from seqstore.io.objects import ObjectClient

    server, cert = tls_server
    monkeypatch.setenv("SSL_CERT_FILE", cert)
    monkeypatch.setenv("AWS_CA_BUNDLE", cert)
    client = ObjectClient(f"{server.url}/{BUCKET}/main.seqstore", LIMITS)
    with pytest.raises(RemoteError) as exc:
        if direct:
            url, _ = client.direct("manifest.json", None)
            client.direct_reader.submit([(url, 0, 10, None, memoryview(bytearray(10)))]).result(timeout=15)
        else:
            client.get("manifest.json")
    text = _message(exc.value)
    assert "certificate" in text.lower(), text
    _clean(text)


@pytest.mark.parametrize("path", list(PATHS))
def test_an_object_replaced_behind_a_server_that_ignores_if_match_is_stale(local: Path, tmp_path: Path,
                                                                            path: str) -> None:
    """The value file is replaced (same size, other bytes) after the store was opened, on a server that
    answers ranges of the new version whatever If-Match says: every path refuses the answer by its ETag
    (StaleStoreError) instead of returning the new version's bytes."""
    import shutil

    root = tmp_path / "site"
    shutil.copytree(local, root)
    with HostileServer(root, BUCKET) as server:  # (what is tested is no timeout: room for a loaded machine)
        store = ss.open(f"s3://{BUCKET}/main.seqstore", cache_dir=tmp_path / "cache",
                        storage_options=_options(server, path, timeout=30, retry_timeout=30, max_retries=4))
        store.get_batch([0])
        for file in (root / "main.seqstore").rglob("v.npy"):
            data = file.read_bytes()
            file.write_bytes(data[:128] + bytes(len(data) - 128))
        server._files.clear()  # serve the new bytes
        rows = np.arange(3, 40000, 1024)  # a row every MiB: pages not fetched before
        with pytest.raises(StaleStoreError, match="another version") as exc:
            list(store.iter_batches([rows])) if path.startswith("once") else store.get_batch(rows)
        _clean(_message(exc.value))
