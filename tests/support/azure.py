"""Azurite, Microsoft's Azure Blob Storage emulator, on loopback for the ``az://`` tests.

:class:`Azurite` starts ``azurite-blob`` (the npm package ``azurite``; ``make test`` installs it under
``.venv/node``) as a child process on 127.0.0.1 at a free port, objects in memory. It speaks the Blob
service's REST API with Shared Key authentication, ETags and conditional requests, and refuses what
the service refuses (suffix ranges, for one), which moto's S3 does not exercise.

Everything here talks to the emulator with obstore or with a Shared Key request signed here (creating
a container, which obstore has no call for), never with seqstore. The account is the emulator's fixed
development account (:data:`ACCOUNT`, :data:`KEY`: public, documented by Microsoft).
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import os
import re
import shutil
import subprocess
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any

from support.emulators import fresh_name, keys_under, stop_child, upload_tree

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_API_VERSION = "2021-08-06"
_REPO = Path(__file__).resolve().parents[2]


def azurite_command() -> str | None:
    """The ``azurite-blob`` executable: ``$AZURITE_BLOB``, the one ``make test`` installs under
    ``.venv/node``, or one on ``PATH``; None where there is none."""
    for cand in (os.environ.get("AZURITE_BLOB"), str(_REPO / ".venv/node/node_modules/.bin/azurite-blob")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return shutil.which("azurite-blob")


class Azurite:
    """One emulator process. ``with Azurite() as az:`` or :meth:`start` / :meth:`stop`."""

    def __init__(self, command: str | None = None) -> None:
        self.command = command or azurite_command()
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._output: list[str] = []

    def start(self, timeout: float = 60.0) -> Azurite:
        if self.command is None:
            raise RuntimeError("azurite-blob is not installed (make test installs it under .venv/node)")
        self._workdir = tempfile.TemporaryDirectory(prefix="azurite-")
        self.proc = subprocess.Popen(
            [self.command, "--blobHost", "127.0.0.1", "--blobPort", "0", "--inMemoryPersistence",
             "--disableTelemetry", "--skipApiVersionCheck", "--silent"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=self._workdir.name,
        )
        found = threading.Event()

        def read() -> None:  # keeps draining the pipe after the port is known
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self._output.append(line)
                m = re.search(r"listens on http://127\.0\.0\.1:(\d+)", line)
                if m and not found.is_set():
                    self.port = int(m.group(1))
                    found.set()
            found.set()

        threading.Thread(target=read, name="azurite-output", daemon=True).start()
        if not found.wait(timeout) or not self.port:
            out = "".join(self._output)
            code = self.proc.poll() if self.proc is not None else None
            self.stop()
            why = f"exited with status {code}" if code is not None else f"did not listen within {timeout:.0f} s"
            raise RuntimeError(f"{self.command} {why}: {out[-2000:]}")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_child(self.proc)
            self.proc = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> Azurite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """The service's base URL, ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    # ---------------------------------------------------------------------------------- options

    def storage_options(self, endpoint: str | None = None, **extra: Any) -> dict[str, Any]:
        """obstore Azure options for this emulator (or for ``endpoint``, e.g. a proxy in front of it), as
        ``seqstore.open("az://container/...", storage_options=...)`` takes them."""
        opts: dict[str, Any] = {
            "account_name": ACCOUNT,
            "account_key": KEY,
            "endpoint": f"{endpoint or self.endpoint}/{ACCOUNT}",  # the emulator's path-style URLs
            "allow_http": "true",
        }
        opts.update(extra)
        return opts

    def obstore(self, container: str) -> Any:
        from obstore.store import AzureStore

        return AzureStore(container_name=container, account_name=ACCOUNT, account_key=KEY,
                          endpoint=f"{self.endpoint}/{ACCOUNT}", client_options={"allow_http": True})

    # -------------------------------------------------------------------------------- containers

    def new_container(self, prefix: str = "t") -> str:
        """Create a container with a fresh name (3-63 lower-case letters, digits, hyphens)."""
        name = fresh_name(prefix)
        self._signed("PUT", f"/{name}", {"restype": "container"})
        return name

    def _signed(self, method: str, path: str, query: dict[str, str]) -> int:
        """One Shared Key request without a body (the string to sign as the Blob service defines it)."""
        headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": _API_VERSION}
        canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
        canonical_resource = f"/{ACCOUNT}/{ACCOUNT}{path}" + "".join(f"\n{k}:{v}" for k, v in sorted(query.items()))
        # verb, then 11 standard headers (all empty here, Content-Length of 0 included), then ours
        to_sign = method + "\n" * 12 + canonical_headers + canonical_resource
        digest = hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()
        headers["Authorization"] = f"SharedKey {ACCOUNT}:{base64.b64encode(digest).decode()}"
        headers["Content-Length"] = "0"
        url = f"{self.endpoint}/{ACCOUNT}{path}?" + "&".join(f"{k}={v}" for k, v in query.items())
        with urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers), timeout=30) as r:
            return int(r.status)

    # ----------------------------------------------------------------------------------- objects

    def keys(self, container: str, prefix: str = "") -> dict[str, int]:
        """``{key: size}`` of the blobs whose name starts with ``prefix``."""
        return keys_under(self.obstore(container), prefix)

    def get(self, container: str, key: str) -> bytes:
        import obstore

        return bytes(obstore.get(self.obstore(container), key).bytes())

    def delete(self, container: str, *keys: str) -> None:
        import obstore

        obstore.delete(self.obstore(container), list(keys))

    def upload_dir(self, local: str | os.PathLike[str], container: str, prefix: str) -> str:
        """Upload every file under ``local`` to ``az://container/prefix/<relative path>``, the top-level
        ``manifest.json`` last, and return that URL."""
        import obstore

        store = self.obstore(container)
        return f"az://{container}/{upload_tree(lambda key, data: obstore.put(store, key, data), local, prefix)}"
