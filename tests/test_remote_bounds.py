"""Bounds on what a remote store's server can make the reader do: a root object (the manifest) larger than
any real one is refused, naming its URL, size and the limit, before its body is read.
"""

from __future__ import annotations

import gc
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_remote_direct_answers import RawServer

import seqstore as ss
from seqstore.errors import RemoteError
from seqstore.io.object_common import WHOLE_OBJECT_MOST

pytestmark = pytest.mark.timeout(60)


def test_a_manifest_past_the_limit_is_refused_unread(tmp_path: Path) -> None:
    from support.http import StaticServer

    site = tmp_path / "site" / "big.seqstore"
    site.mkdir(parents=True)
    with open(site / "manifest.json", "wb") as f:  # sparse: no disk and no memory here, nor in the server
        f.truncate(WHOLE_OBJECT_MOST + 1)
    with StaticServer(tmp_path / "site") as srv:
        url = f"{srv.url}/big.seqstore"
        with pytest.raises(RemoteError) as exc:
            ss.open(url, storage_options={"allow_http": "true", "max_retries": 0}, cache_dir=tmp_path / "cache")
    text = str(exc.value)
    assert f"{url}/manifest.json" in text and str(WHOLE_OBJECT_MOST + 1) in text and str(WHOLE_OBJECT_MOST) in text
    assert exc.value.url == f"{url}/manifest.json"


def test_a_descriptor_past_the_limit_is_refused_unread(tmp_path: Path) -> None:
    """A shard's descriptor is read whole (a range to the object's end): an answer of gigabytes was read
    into memory before its CRC told it from the shard table's. It is refused as the manifest is."""
    from support.http import StaticServer

    site = tmp_path / "site" / "s.seqstore"
    with ss.create(site, {"a": ss.Field("int32", ())}, max_shard_records=2) as w:
        w.append_batch({"a": np.arange(4, dtype=np.int32)})
    with open(site / "shard-000000" / "_shard.json", "r+b") as f:  # sparse, as above
        f.truncate(WHOLE_OBJECT_MOST + 1)
    with StaticServer(tmp_path / "site") as srv:
        url = f"{srv.url}/s.seqstore"
        store = ss.open(url, storage_options={"allow_http": "true", "max_retries": 0}, cache_dir=tmp_path / "cache")
        assert int(store[3]["a"]) == 3
        with pytest.raises(RemoteError) as exc:
            store[0]
    assert exc.value.url == f"{url}/shard-000000/_shard.json" and str(WHOLE_OBJECT_MOST) in str(exc.value)
    del store, exc
    gc.collect()  # (the store's finalizers run here, not inside a later import's parse: CPython 3.11 fails that)


def test_the_presigned_urls_kept_stay_bounded(moto_s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct reader's presigned URL of every object read was kept for the process's life (about 1 KiB
    each, with a session token more): an epoch over a store of 10^6 objects held a GiB of them. The
    URLs kept are bounded; one dropped is signed again when next read."""
    from seqstore.io import object_obstore
    from seqstore.io.objects import ObjectClient

    monkeypatch.setattr(object_obstore, "SIGNED_MOST", 8, raising=False)
    client = ObjectClient("s3://b/x.seqstore", moto_s3.storage_options())
    urls = [client.direct(f"shard-{i:06d}/a.npy", None) for i in range(40)]
    assert all(u is not None for u in urls)
    backend: Any = client.backend
    assert len(backend._signed) <= 8 and len(backend._signed_keys) <= 16
    assert client.resign(urls[-1][0]) is not None  # (urls[-1]: a URL kept, signed anew on a refusal)
    again = client.direct("shard-000000/a.npy", None)
    assert again is not None and "shard-000000/a.npy" in again[0]


BODY = bytes(range(64))


def _marked_gzip(conn: socket.socket, a: int, b: int) -> bool:
    """The bytes of ``BODY`` asked for (a range: 206, the whole object: 200), marked ``Content-Encoding: gzip``
    as a compressing proxy would; the connection then closes."""
    whole = b < 0
    a, b = (0, len(BODY)) if whole else (a, b)
    status = "200 OK" if whole else "206 Partial Content"
    extra = "" if whole else f"Content-Range: bytes {a}-{b - 1}/{len(BODY)}\r\n"
    conn.sendall(f"HTTP/1.1 {status}\r\n{extra}Content-Length: {b - a}\r\nContent-Encoding: gzip\r\n"
                 f"ETag: \"e\"\r\nConnection: close\r\n\r\n".encode() + BODY[a:b])
    return False


def test_an_encoded_answer_through_obstore_is_refused() -> None:
    """obstore's reads (the manifest, ranges, small ranges' fast path) took a compressed answer's bytes as
    the object's, and asked for no particular encoding. They ask for ``identity`` and refuse another,
    naming the URL and the encoding."""
    from seqstore.io.objects import ObjectClient

    server = RawServer(_marked_gzip)
    try:
        client = ObjectClient(f"{server.url}/b", {"allow_http": "true", "max_retries": 0, "timeout": 2,
                                                  "direct_reads": False})
        calls = {"get": lambda: client.get("k"), "range": lambda: client.get_ranges([("k", 0, 8, None)]),
                 "fast": lambda: client.answer(client.submit([("k", 0, 8, None)], with_meta=False), client.url)}
        for what, call in calls.items():
            with pytest.raises(RemoteError) as exc:
                call()
            assert f"{server.url}/b/k" in str(exc.value) and "gzip" in str(exc.value), (what, str(exc.value))
        assert server.heads and all("\r\naccept-encoding: identity\r\n" in h.lower() for h in server.heads)
    finally:
        server.close()
