"""Hosts for multi-host tests: Linux network namespaces joined by veth pairs on a bridge, and
``qjm journalnode`` processes started in them.

Each host is a namespace with one interface (``eth0``) and its own IPv4 and IPv6 address; the
bridge lives in a namespace of its own, so nothing is added to the machine's own network and
every address exists only inside namespaces this module created. ``NamespaceNet.close`` deletes
them all (deleting a namespace deletes its end of each veth pair, and with it the pair).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qjm.testing.processes import NotReady, read_ready_line, stop_process

READY_TIMEOUT = 60.0
# Unique-local (RFC 4193) and RFC 1918 prefixes, only ever configured inside the namespaces.
V4_PREFIX = "10.213.77."
V6_PREFIX = "fd51:6a4d:7e57::"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def namespaces_unavailable() -> str | None:
    """Why namespaces cannot be made here (no ``ip``, not permitted), or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"qjmprobe{uuid.uuid4().hex[:6]}"
    r = _ip("netns", "add", probe)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip() or r.returncode}"
    _ip("netns", "del", probe)
    return None


@dataclass(frozen=True, slots=True)
class Host:
    ns: str
    v4: str
    v6: str

    def address(self, family: str) -> str:
        return self.v6 if family == "ipv6" else self.v4

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns]


class NamespaceNet:
    """``n`` hosts on one bridge; raises RuntimeError naming the failed ``ip`` command."""

    def __init__(self, n: int) -> None:
        tag = uuid.uuid4().hex[:5]
        self.bridge_ns = f"qjm{tag}br"
        self.hosts: list[Host] = []
        self._made: list[str] = []
        try:
            self._add_ns(self.bridge_ns)
            self._run("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
            self._run("-n", self.bridge_ns, "link", "set", "br0", "up")
            for i in range(n):
                host = Host(f"qjm{tag}h{i}", f"{V4_PREFIX}{i + 1}", f"{V6_PREFIX}{i + 1}")
                self._add_ns(host.ns)
                peer = f"veth{i}"
                self._run("-n", host.ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer,
                          "netns", self.bridge_ns)  # fmt: skip
                self._run("-n", self.bridge_ns, "link", "set", peer, "master", "br0")
                self._run("-n", self.bridge_ns, "link", "set", peer, "up")
                self._run("-n", host.ns, "addr", "add", f"{host.v4}/24", "dev", "eth0")
                self._run("-n", host.ns, "-6", "addr", "add", f"{host.v6}/64", "dev", "eth0", "nodad")
                self._run("-n", host.ns, "link", "set", "eth0", "up")
                self._run("-n", host.ns, "link", "set", "lo", "up")
                self.hosts.append(host)
        except BaseException:
            self.close()
            raise

    def _add_ns(self, name: str) -> None:
        self._run("netns", "add", name)
        self._made.append(name)

    @staticmethod
    def _run(*args: str) -> None:
        r = _ip(*args)
        if r.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def close(self) -> None:
        for name in reversed(self._made):
            _ip("netns", "del", name)
        self._made.clear()

    def leftovers(self) -> list[str]:
        """Namespaces of this net still present (empty after ``close``)."""
        listed = _ip("netns", "list").stdout
        names = {line.split()[0] for line in listed.splitlines() if line.strip()}
        return sorted(names & ({self.bridge_ns} | {h.ns for h in self.hosts}))

    def __enter__(self) -> NamespaceNet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NodeProcess:
    """``qjm journalnode --ready-line`` as a subprocess (behind ``prefix``, such as ``ip netns
    exec NS``); ``ready`` holds the bind and advertised addresses of its READY line."""

    def __init__(
        self, args: Sequence[str], *, log: Path, prefix: Sequence[str] = (), env: dict[str, str] | None = None
    ) -> None:
        self.log = log
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "qjm", "journalnode", "--ready-line", *args],
                stdout=subprocess.PIPE,
                stderr=f,
                env=env,
            )
        try:
            self.ready = self._await_ready()
        except BaseException:
            self.stop()
            raise

    def _await_ready(self) -> dict[str, str]:
        try:
            line = read_ready_line(self.proc, READY_TIMEOUT)
        except NotReady as e:
            raise RuntimeError(f"node {e}; log: {self.log.read_text()}") from None
        words = line.decode().split()
        if not words or words[0] != "READY":
            raise RuntimeError(f"node said {line!r} instead of READY")
        # READY rpc=<bind> data=<bind> advertised rpc=<advertised> data=<advertised>
        return {
            "rpc_bind": words[1].split("=", 1)[1],
            "data_bind": words[2].split("=", 1)[1],
            "rpc": words[4].split("=", 1)[1],
            "data": words[5].split("=", 1)[1],
        }

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc, 20)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
