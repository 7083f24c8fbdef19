"""moto's S3 server on loopback for the remote-store tests: buckets, client options, uploads.

:class:`MotoS3` starts ``moto.server.ThreadedMotoServer`` (the real S3 HTTP API, in a thread of this
process) on 127.0.0.1 at a free port. moto copies the whole object for every range request, so tests
keep their objects small (kilobytes). Everything here talks to the server with obstore (and boto3 for
what obstore has no call for), never with seqstore: setting a test up does not use the code under test.

Credentials are the fixed test keys (:data:`KEY`, :data:`SECRET`); moto accepts any signature.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from support.emulators import files_manifest_last, fresh_name, keys_under, upload_tree

KEY = "testing"
SECRET = "testing-secret-3c1f"  # distinctive, so a test can search a pickle, repr or log for it
REGION = "us-east-1"

class MotoS3:
    """One moto S3 server. ``with MotoS3() as s3:`` or :meth:`start` / :meth:`stop`."""

    def __init__(self) -> None:
        self._server: Any = None
        self.host = "127.0.0.1"
        self.port = 0

    # ------------------------------------------------------------------------------- life cycle

    def start(self) -> MotoS3:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request on stderr
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.host, self.port = self._server.get_host_and_port()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> MotoS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """The server's base URL, ``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    # ---------------------------------------------------------------------------------- options

    def storage_options(self, endpoint: str | None = None, **extra: Any) -> dict[str, Any]:
        """obstore S3 options for this server (or for ``endpoint``, e.g. a proxy in front of it), as
        ``seqstore.open(url, storage_options=...)`` takes them; ``extra`` adds or overrides keys
        (seqstore's own, such as ``timeout`` or ``max_retries``)."""
        opts: dict[str, Any] = {
            "endpoint": endpoint or self.endpoint,
            "region": REGION,
            "access_key_id": KEY,
            "secret_access_key": SECRET,
            "allow_http": "true",
        }
        opts.update(extra)
        return opts

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """Environment variables through which obstore (and boto3) find this server and its keys, for a
        child process such as the ``seqstore`` CLI. Merge into a copy of ``os.environ``."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def boto3_kwargs(self, endpoint: str | None = None) -> dict[str, str]:
        """Keyword arguments of ``boto3.client("s3", ...)`` for this server."""
        return {
            "endpoint_url": endpoint or self.endpoint,
            "region_name": REGION,
            "aws_access_key_id": KEY,
            "aws_secret_access_key": SECRET,
        }

    def boto3(self, endpoint: str | None = None) -> Any:
        import boto3

        return boto3.client("s3", **self.boto3_kwargs(endpoint))

    def obstore(self, bucket: str, endpoint: str | None = None) -> Any:
        """An ``obstore.store.S3Store`` of ``bucket`` on this server (or through ``endpoint``)."""
        from obstore.store import S3Store

        return S3Store(
            bucket,
            endpoint=endpoint or self.endpoint,
            region=REGION,
            access_key_id=KEY,
            secret_access_key=SECRET,
            virtual_hosted_style_request=False,
            client_options={"allow_http": True},
        )

    # ----------------------------------------------------------------------------------- buckets

    def new_bucket(self, prefix: str = "t") -> str:
        """Create a bucket with a fresh name (S3 rules: 3-63 lower-case letters, digits, hyphens)."""
        name = fresh_name(prefix)
        self.boto3().create_bucket(Bucket=name)
        return name

    def delete_bucket(self, bucket: str) -> None:
        """Delete every object of ``bucket``, then the bucket."""
        self.delete_prefix(bucket, "")
        self.boto3().delete_bucket(Bucket=bucket)

    # ----------------------------------------------------------------------------------- objects

    def put(self, bucket: str, key: str, data: bytes) -> str:
        """Write one object; returns its ETag."""
        import obstore

        res = obstore.put(self.obstore(bucket), key, data)
        return str(res["e_tag"])

    def get(self, bucket: str, key: str) -> bytes:
        import obstore

        return bytes(obstore.get(self.obstore(bucket), key).bytes())

    def head(self, bucket: str, key: str) -> dict[str, Any]:
        """``{"path", "size", "e_tag", "last_modified", "version"}`` of one object."""
        import obstore

        return dict(obstore.head(self.obstore(bucket), key))

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """``{key: size}`` of the objects whose key starts with ``prefix`` (a plain string prefix, as in
        S3's ListObjectsV2; obstore's own ``prefix`` matches whole path segments only)."""
        return keys_under(self.obstore(bucket), prefix)

    def delete(self, bucket: str, *keys: str) -> None:
        """Delete these objects (absent ones are no error)."""
        import obstore

        obstore.delete(self.obstore(bucket), list(keys))

    def delete_prefix(self, bucket: str, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many."""
        import obstore

        keys = list(self.keys(bucket, prefix))
        if keys:
            obstore.delete(self.obstore(bucket), keys)
        return len(keys)

    def upload_dir(self, local: str | os.PathLike[str], bucket: str, prefix: str) -> str:
        """Upload every file under directory ``local`` to ``s3://bucket/prefix/<relative path>`` and
        return that URL (``prefix`` without a trailing slash). Files are uploaded in sorted order,
        except that a top-level ``manifest.json`` goes last (a reader never sees a manifest whose
        files are not there yet)."""
        import obstore

        store = self.obstore(bucket)
        prefix = upload_tree(lambda key, data: obstore.put(store, key, data), local, prefix)
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"

    def replace_dir(self, local: str | os.PathLike[str], bucket: str, prefix: str) -> str:
        """Make ``s3://bucket/prefix`` hold exactly the files of ``local`` (objects not in ``local``
        deleted, the others overwritten): a store replaced by another one under the same URL."""
        prefix = prefix.strip("/")
        wanted = {f"{prefix}/{rel}" if prefix else rel for rel, _ in files_manifest_last(Path(local))}
        stale = [k for k in self.keys(bucket, prefix + "/" if prefix else "") if k not in wanted]
        if stale:
            import obstore

            obstore.delete(self.obstore(bucket), stale)
        return self.upload_dir(local, bucket, prefix)

    def download_dir(self, bucket: str, prefix: str, local: str | os.PathLike[str]) -> Path:
        """Copy every object under ``prefix`` to ``local/<relative key>``; returns ``Path(local)``."""
        prefix = prefix.strip("/")
        root = Path(local)
        for key in self.keys(bucket, prefix + "/" if prefix else ""):
            rel = key[len(prefix) + 1 :] if prefix else key
            dst = root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(self.get(bucket, key))
        return root
