"""The remote bench's S3 server for object reads: nginx, with the latency added inside nginx.

nginx serves a directory as path-style S3 objects (GET and HEAD with ranges, ``ETag``, ``sendfile``)
and costs about 40 us of CPU per small request: the readers measured against it, not the server.
``echo_sleep`` of the echo module (Debian: ``nginx-light`` and ``libnginx-mod-http-echo``) holds every
request for the latency before the file is served (no proxy process in the data path). What nginx
cannot answer (ListObjectsV2, which Lance uses for its ``_versions/``; PUT, POST, DELETE) it hands to
the bench's Python S3 server (``bench/_remote_server.py``) with ``proxy_pass``.

Requests are counted from nginx's access log (one line per request: the time it ended, the seconds
it took, status, body bytes, method): :func:`stats` gives the same counts as the Python latency
proxy's ``/_proxy/stats`` (requests, round trips, body bytes) since the last reset. The control
string of a server is ``nginx:<access log path>``.

``python -m bench._remote_nginx --install`` installs the packages with apt where apt is present and
this runs as root (``apt-get update`` once, then ``apt-get install -y``), and prints why not otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._remote_proxy import round_trips

PACKAGES = ("nginx-light", "libnginx-mod-http-echo")
MODULE = Path("/usr/lib/nginx/modules/ngx_http_echo_module.so")
PREFIX = "nginx:"


def missing() -> str | None:
    """Why nginx with the echo module cannot run here, or None when it can."""
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        return "nginx is not installed"
    if not MODULE.exists():
        return f"nginx's echo module is not installed ({MODULE})"
    return None


def install() -> str | None:
    """Install nginx and its echo module with apt where possible; None when they are there, else why not."""
    why = missing()
    if why is None:
        return None
    if shutil.which("apt-get") is None:
        return f"{why} and apt-get is not available here (install {' '.join(PACKAGES)} by hand)"
    if os.geteuid() != 0:
        return f"{why} and installing needs root (apt-get install {' '.join(PACKAGES)})"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", *PACKAGES]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            return f"{why}; `{' '.join(cmd)}` failed: {proc.stderr.strip()[-500:]}"
    # the package starts the system's nginx on port 80; this bench runs its own instance
    subprocess.run(["nginx", "-s", "stop"], capture_output=True)
    return missing()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CONFIG = """\
load_module {module};
daemon on;
master_process on;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    client_max_body_size 0;
    log_format timing '$msec $request_time $status $body_bytes_sent $request_method';
    access_log {dir}/access.log timing;
    server {{
        listen 127.0.0.1:{port};
        root {dir}/root;
        location / {{
            error_page 418 = @python;
            if ($args ~ "list-type") {{ return 418; }}
            if ($request_method !~ ^(GET|HEAD)$) {{ return 418; }}
            echo_sleep {latency};
            echo_exec @file;
        }}
        location @file {{ }}
        location @python {{
            proxy_pass {upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_request_buffering off;
            proxy_buffering off;
        }}
    }}
}}
"""


class NginxServer:
    """nginx serving ``root`` (a bucket's directory) as bucket ``bucket`` with ``latency`` seconds added
    to every object read, other requests proxied to ``upstream`` (the Python S3 server):
    ``with NginxServer(...) as s: s.endpoint, s.control, s.pids()``."""

    def __init__(self, root: Path, bucket: str, upstream: str, latency: float) -> None:
        self.root, self.bucket, self.upstream, self.latency = Path(root), bucket, upstream, latency
        self.dir: Path | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def control(self) -> str:
        assert self.dir is not None
        return PREFIX + str(self.dir / "access.log")

    def start(self) -> NginxServer:
        why = missing()
        if why:
            raise RuntimeError(why)
        self.dir = Path(tempfile.mkdtemp(prefix="seqstore-nginx-"))
        self.dir.chmod(0o755)  # nginx's workers run as an unprivileged user when started by root
        (self.dir / "root").mkdir()
        (self.dir / "root" / self.bucket).symlink_to(self.root.resolve())
        self.port = _free_port()
        conf = self.dir / "nginx.conf"
        conf.write_text(
            CONFIG.format(
                module=MODULE, dir=self.dir, port=self.port, latency=self.latency, upstream=self.upstream.rstrip("/")
            )
        )
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        proc = subprocess.run([nginx, "-c", str(conf), "-p", str(self.dir)], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"nginx did not start: {proc.stderr.strip()[-1000:]}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError(f"nginx did not listen on port {self.port} within 10 s")
        return self

    def master(self) -> int | None:
        assert self.dir is not None
        try:
            return int((self.dir / "nginx.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def pids(self) -> list[int]:
        """The master's and its workers' process ids (what the server spends, for the peers' CPU)."""
        pid = self.master()
        if pid is None:
            return []
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            kids = []
        return [pid, *map(int, kids)]

    def stop(self) -> None:
        if self.dir is None:
            return
        pid = self.master()
        if pid is not None:
            try:
                os.kill(pid, 15)  # nginx's fast shutdown
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.05)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self) -> NginxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stats(control: str, reset: bool = False) -> dict[str, Any]:
    """Requests, round trips and response body bytes nginx logged since the last reset (and, with
    ``reset``, count anew from now on); ``control``: ``nginx:<access log>``."""
    log = Path(control.removeprefix(PREFIX))
    mark = log.with_name("access.mark")
    start = int(mark.read_text()) if mark.exists() else 0
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read()
    if reset:
        mark.write_text(str(start + len(text)))
    spans, body = [], 0
    for line in text.decode().splitlines():
        parts = line.split()
        if len(parts) < 5:
            continue
        end, took = float(parts[0]), float(parts[1])
        spans.append((end - took, end))
        body += int(parts[3])
    return {"requests": len(spans), "round_trips": round_trips(spans), "body_bytes": body}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--install", action="store_true", help="install nginx and its echo module (apt, as root)")
    args = p.parse_args()
    if args.install:
        why = install()
        if why:
            print(f"skipped: nginx for bench/remote.py: {why} (bench/remote.py falls back to --server python)")
        else:
            print("nginx with the echo module: present")
    sys.exit(0)


if __name__ == "__main__":
    main()
