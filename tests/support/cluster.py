"""A small cluster on one machine: hosts in network namespaces, joined by a switch, for multi-node tests.

:class:`Cluster` makes a *switch* namespace holding a bridge, a *storage* host and ``nodes`` node hosts,
each host a namespace of its own with one veth pair to the bridge: the host side is ``eth0`` with the
address ``10.77.0.1`` (storage) or ``10.77.0.10 + i`` (node i), the switch side is the host's port. A
host's processes reach the others only over that link, so :meth:`Cluster.cut` (the switch port down: the
host's packets vanish, as when a cable or a switch fails; connections stall and new ones time out) and
:meth:`Cluster.restore` cut and restore a host for real (``cut(host, "host")`` takes the host's own
interface down instead: then every connection attempt fails at once). :meth:`Cluster.spawn` starts a
process on a host (``ip netns exec``), :meth:`Cluster.kill_host` SIGKILLs every process in a host's namespace (its
forkserver and DataLoader workers included), :meth:`Cluster.close` kills everything and deletes every
namespace (the veths and the bridge go with them). Every name carries a tag unique to the cluster, and
:func:`leftovers` lists what any cluster left behind (namespaces, interfaces, processes), for the test
that checks nothing was.

Needs root and ``ip netns`` (iproute2); :func:`unavailable` says in one line why not, for a skip. The
file system is shared by all hosts (one machine): each node gets its own cache directory, which is what
a node's local disk holds. Nothing here imports seqstore.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

PREFIX = "ssc"  # every namespace and interface name a cluster makes starts with this
SUBNET = "10.77.0"
STORAGE_IP = f"{SUBNET}.1"
REPO = Path(__file__).resolve().parents[2]


def unavailable() -> str | None:
    """Why this machine cannot build a cluster (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "building network namespaces needs root (CI runs as root)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        return f"ip netns is unavailable: {r.stderr.strip()[:200]}"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def _netns_names() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _ns_pids(ns: str) -> list[int]:
    r = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split() if p.strip().isdigit()]


def leftovers(prefix: str = PREFIX) -> list[str]:
    """What clusters left behind: namespaces and root-namespace interfaces whose name starts with
    ``prefix``, and the processes still in such namespaces."""
    found = []
    for ns in _netns_names():
        if ns.startswith(prefix):
            found.append(f"namespace {ns} (processes {_ns_pids(ns)})")
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":", 2)[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(prefix):
            found.append(f"interface {name}")
    return found


class Cluster:
    """See the module documentation. ``with Cluster(nodes=2) as c:`` or :meth:`start` / :meth:`close`."""

    def __init__(self, nodes: int = 2, workdir: str | os.PathLike[str] | None = None) -> None:
        self.tag = secrets.token_hex(2)  # 4 hex digits: names stay within the 15 characters of an interface
        self.switch = f"{PREFIX}{self.tag}sw"
        self.storage = f"{PREFIX}{self.tag}st"
        self.nodes = [f"{PREFIX}{self.tag}n{i}" for i in range(nodes)]
        self.hosts = [self.storage, *self.nodes]
        self.ips = {self.storage: STORAGE_IP, **{n: f"{SUBNET}.{10 + i}" for i, n in enumerate(self.nodes)}}
        self._ports = {h: f"{PREFIX}{self.tag}p{i}" for i, h in enumerate(self.hosts)}
        self.workdir = Path(workdir) if workdir is not None else None
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._made: list[str] = []

    # ------------------------------------------------------------------------------- life cycle

    def start(self) -> Cluster:
        try:
            for ns in (self.switch, *self.hosts):
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for h in self.hosts:
                port, tmp = self._ports[h], f"{PREFIX}{self.tag}h"
                # made in the switch namespace, so nothing is ever created in the root namespace
                _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", tmp)
                _ip("-n", self.switch, "link", "set", tmp, "netns", h)
                _ip("-n", h, "link", "set", tmp, "name", "eth0")
                _ip("-n", h, "addr", "add", f"{self.ips[h]}/24", "dev", "eth0")
                _ip("-n", h, "link", "set", "eth0", "up")
                _ip("-n", self.switch, "link", "set", port, "master", "br0")
                _ip("-n", self.switch, "link", "set", port, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process on every host, then delete the namespaces (and with them the links)."""
        for h in reversed(self._made):
            self.kill_host(h)
        for _, p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for h in reversed(self._made):
            _ip("netns", "del", h, check=False)
        self._made.clear()

    # ---------------------------------------------------------------------------------- hosts

    def spawn(self, host: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              log: str | os.PathLike[str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``host``, in a session of its own; its stdout and stderr go to ``log`` (a
        file), else are discarded. The cluster kills it at :meth:`close` at the latest."""
        full = dict(os.environ)
        full.update(env or {})
        full["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO / "tests"),
                                             *filter(None, [os.environ.get("PYTHONPATH")])])
        out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            p = subprocess.Popen(["ip", "netns", "exec", host, *argv], env=full, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            if log is not None:
                out.close()  # type: ignore[union-attr]
        self.procs.append((host, p))
        return p

    def python(self, host: str, *args: str, env: Mapping[str, str] | None = None,
               log: str | os.PathLike[str] | None = None) -> subprocess.Popen[bytes]:
        """Start this interpreter with ``args`` on ``host`` (see :meth:`spawn`)."""
        return self.spawn(host, [sys.executable, *args], env=env, log=log)

    def run(self, host: str, argv: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` and wait for it (at most ``timeout`` seconds)."""
        return subprocess.run(["ip", "netns", "exec", host, *argv], capture_output=True, text=True, timeout=timeout)

    def kill_host(self, host: str) -> list[int]:
        """SIGKILL every process in ``host``'s namespace (as when the machine dies); returns their pids."""
        killed = []
        for _ in range(5):  # processes forking while they are being killed: look again
            pids = _ns_pids(host)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for h, p in self.procs:
            if h == host:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        return killed

    def pids(self, host: str) -> list[int]:
        """The processes in ``host``'s namespace."""
        return _ns_pids(host)

    # ---------------------------------------------------------------------------------- links

    def cut(self, host: str, side: str = "switch") -> None:
        """Cut ``host`` off the network. ``side="switch"``: its switch port goes down, its packets vanish
        (connections stall until their timeout, connects time out). ``side="host"``: its own ``eth0`` goes
        down, as when the host loses its link: the route goes with it, and every connection attempt fails
        at once (network unreachable) while established ones stall."""
        if side == "host":
            _ip("-n", host, "link", "set", "eth0", "down")
        else:
            _ip("-n", self.switch, "link", "set", self._ports[host], "down")

    def restore(self, host: str, side: str = "switch") -> None:
        """Undo :meth:`cut` (the host's address route comes back with its link)."""
        if side == "host":
            _ip("-n", host, "link", "set", "eth0", "up")
        else:
            _ip("-n", self.switch, "link", "set", self._ports[host], "up")

    def wait_reachable(self, host: str, ip: str, port: int, timeout: float = 20.0) -> None:
        """Wait until a TCP connection from ``host`` to ``ip:port`` succeeds (at most ``timeout`` s)."""
        code = (f"import socket,time\nend=time.monotonic()+{timeout}\n"
                "while True:\n"
                f"    try:\n        socket.create_connection(({ip!r}, {port}), 1).close(); break\n"
                "    except OSError:\n"
                "        if time.monotonic() > end: raise\n"
                "        time.sleep(0.1)\n")
        r = self.run(host, [sys.executable, "-c", code], timeout=timeout + 10)
        if r.returncode != 0:
            raise TimeoutError(f"{host}: {ip}:{port} not reachable within {timeout} s: {r.stderr[-500:]}")
