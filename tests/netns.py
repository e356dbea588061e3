"""Network namespaces for partition tests: a database host and worker hosts joined by veths.

    with Network() as net:
        db = net.namespace("db")
        w1 = net.namespace("w1")
        link = net.link(db, w1)             # db side 10.231.77.1, w1 side 10.231.77.2
        pg = net.postgres(db, link)         # a throwaway cluster listening on both sides
        subprocess.Popen(w1.exec_args("python", ...), env={**env, **pg.env(link.db_address)})
        link.cut()                          # packets dropped silently, both ways
        link.restore()

Linux only, as root, with iproute2. The private /24 of SUBNET only ever exists inside the
namespaces made here (each veth pair lives entirely in them), so nothing outside can be
reached or disturbed, and concurrent runs do not collide (their namespaces differ).
Everything is removed on exit, however the block ends: the processes left in the
namespaces, the cluster, the namespaces and with them the veths.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parent.parent
SUBNET = "10.231.77"  # a private /24: .1 is the database host, .2 onwards the worker hosts


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if not Path("/proc/self/ns/net").exists():
        return "not Linux (no /proc/self/ns/net)"
    if os.geteuid() != 0:
        return "not root: `ip netns add` and veth pairs need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"js-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {shlex.join(args)} failed: {done.stderr.strip()}")
    return done


@dataclass
class Namespace:
    name: str

    def exec_args(self, *command: str) -> list[str]:
        """`command` run inside this namespace (`ip netns exec` execs it: same pid)."""
        return ["ip", "netns", "exec", self.name, *command]

    def pids(self) -> list[int]:
        return [int(pid) for pid in _ip("netns", "pids", self.name, check=False).stdout.split()]


@dataclass
class Link:
    """A veth pair: one end in the database host, the other in a worker host."""

    db: Namespace
    host: Namespace
    db_device: str
    db_address: str
    host_address: str

    def cut(self) -> None:
        """Partition: the database side goes down, so the host's packets are dropped.

        Nothing is refused or reset: the host's TCP connections stay open and its writes
        wait in retransmission, as across a real network partition (no netem, tc
        classifiers or iptables needed).
        """
        _ip("-n", self.db.name, "link", "set", "dev", self.db_device, "down")

    def restore(self) -> None:
        _ip("-n", self.db.name, "link", "set", "dev", self.db_device, "up")


@dataclass
class Postgres:
    """A throwaway cluster started by scripts/pg inside a namespace."""

    variables: dict[str, str]

    @property
    def directory(self) -> str:
        return self.variables["JOBSTATE_PG_DIR"]

    def env(self, host: str) -> dict[str, str]:
        """PG* variables for a client that reaches the server at `host`.

        `host` may be the cluster's directory: its Unix socket, reachable from any
        namespace (sockets in the file system are not namespaced).
        """
        return {
            "PGHOST": host,
            "PGPORT": self.variables["PGPORT"],
            "PGUSER": self.variables["PGUSER"],
            "PGDATABASE": self.variables["PGDATABASE"],
        }


@dataclass
class Network:
    """Namespaces, veth pairs and clusters made for one test; all removed on exit."""

    tag: str = field(default_factory=lambda: str(os.getpid()))
    namespaces: list[Namespace] = field(default_factory=list)
    clusters: list[Postgres] = field(default_factory=list)
    _hosts: itertools.count[int] = field(default_factory=lambda: itertools.count(2))

    def __enter__(self) -> Network:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def namespace(self, role: str) -> Namespace:
        ns = Namespace(f"js-{role}-{self.tag}")
        _ip("netns", "add", ns.name)
        self.namespaces.append(ns)
        _ip("-n", ns.name, "link", "set", "dev", "lo", "up")
        return ns

    def link(self, db: Namespace, host: Namespace) -> Link:
        n = next(self._hosts)
        # Made inside the database host, so the names never appear in the root namespace.
        db_device, host_device = f"jsdb{n}", f"jshost{n}"
        _ip("-n", db.name, "link", "add", db_device, "type", "veth", "peer", "name", host_device)
        _ip("-n", db.name, "link", "set", "dev", host_device, "netns", host.name)
        link = Link(db, host, db_device, f"{SUBNET}.1", f"{SUBNET}.{n}")
        for ns, device, local, peer in [
            (db, db_device, link.db_address, link.host_address),
            (host, host_device, link.host_address, link.db_address),
        ]:
            # Point to point: the route to the peer belongs to the address, so it comes back
            # when a cut link comes up again; the database host can take several links.
            _ip("-n", ns.name, "addr", "add", local, "peer", f"{peer}/32", "dev", device)
            _ip("-n", ns.name, "link", "set", "dev", device, "up")
        # Permanent neighbours: across the cut, packets go out and are dropped, instead of
        # address resolution failing and new connections being told "no route to host".
        for ns, device, peer_ns, peer_device, peer in [
            (db, db_device, host, host_device, link.host_address),
            (host, host_device, db, db_device, link.db_address),
        ]:
            [info] = json.loads(_ip("-n", peer_ns.name, "-j", "link", "show", peer_device).stdout)
            _ip("-n", ns.name, "neigh", "replace", peer, "lladdr", info["address"], "dev", device,
                "nud", "permanent")  # fmt: skip
        return link

    def postgres(self, db: Namespace, link: Link) -> Postgres:
        """Start a throwaway cluster in `db` on 127.0.0.1 and on the link's address."""
        env = {
            **os.environ,
            "JOBSTATE_PG_EXTRA_LISTEN": link.db_address,
            "JOBSTATE_PG_EXTRA_HBA": f"{SUBNET}.0/24",
        }
        for name in ("JOBSTATE_PG_DIR", "JOBSTATE_PG_CTL", "JOBSTATE_PG_LOG"):
            env.pop(name, None)  # not the cluster of the shell that runs the tests
        done = subprocess.run(
            db.exec_args(str(ROOT / "scripts" / "pg"), "start"),
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        variables = {}
        for line in done.stdout.splitlines():
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").partition("=")
                variables[name] = shlex.split(value)[0] if value else ""
        if "JOBSTATE_PG_DIR" in variables:
            self.clusters.append(Postgres(variables))  # stopped on exit, even half-started
        if done.returncode != 0:
            raise RuntimeError(f"scripts/pg start failed in {db.name}:\n{done.stderr}")
        return self.clusters[-1]

    def close(self) -> None:
        """Kill what runs in the namespaces, stop the clusters, delete the namespaces."""
        for ns in self.namespaces:
            for pid in ns.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for cluster in self.clusters:
            subprocess.run(
                [str(ROOT / "scripts" / "pg"), "stop", cluster.directory],
                capture_output=True,
                timeout=60,
                check=False,
            )
        self.clusters.clear()
        deadline = time.monotonic() + 10
        for ns in self.namespaces:
            while ns.pids() and time.monotonic() < deadline:
                time.sleep(0.05)  # killed processes keep their namespace until they are gone
            _ip("netns", "delete", ns.name, check=False)
        self.namespaces.clear()
