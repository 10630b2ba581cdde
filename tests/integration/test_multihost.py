"""Three JournalNodes on three hosts and the writer on a fourth: Linux network namespaces joined
by veth pairs on a bridge (qjm.testing.netns), over IPv4 and over IPv6.

The nodes bind in the three ways an operator would: a wildcard with nothing advertised (the writer
dials the host it reached the control plane at), a wildcard with an advertised host, and the
host's own address. The writer's host writes, one node is killed, ``qjm status`` run there names it
unreachable (exit 1), a new writer takes over on the two left and everything is read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from qjm.testing.netns import NamespaceNet, NodeProcess, namespaces_unavailable

WHY_NOT = namespaces_unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"network namespaces unavailable: {WHY_NOT}")

KEEP_ENV = ("QJM_NO_EXTENSIONS", "QJM_REQUIRE_NATIVE", "QJM_IO_URING")
WRITER = textwrap.dedent(
    """
    import sys
    import qjm

    uri, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    w = qjm.open_writer(uri, create=True)
    for i in range(first, first + count):
        w.append(b"rec-%d" % i)
    w.sync()
    w.close()
    print(" ".join(str(txid) + ":" + rec.decode() for txid, rec in qjm.open_reader(uri)))
    """
)


@pytest.fixture
def net() -> Iterator[NamespaceNet]:
    n = NamespaceNet(4)
    try:
        yield n
    finally:
        n.close()
        assert n.leftovers() == [], "namespaces left behind"


def _run_in(net: NamespaceNet, host: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*net.hosts[host].exec_prefix(), sys.executable, *args], capture_output=True, text=True, timeout=180
    )


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_three_hosts_and_a_writer_on_a_fourth(net: NamespaceNet, tmp_path: Path, family: str) -> None:
    wildcard = "::" if family == "ipv6" else "0.0.0.0"
    addr = [h.address(family) for h in net.hosts]
    binds = [  # plaintext beyond loopback needs --insecure (test_security covers TLS)
        ["--bind", wildcard, "--insecure"],  # advertises its ports only: the writer supplies the host
        ["--bind", wildcard, "--advertise", addr[1], "--insecure"],
        ["--bind", addr[2], "--insecure"],
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("QJM_") or k in KEEP_ENV}
    nodes: list[NodeProcess] = []
    try:
        for i in range(3):
            args = ["--data-dir", str(tmp_path / f"jn{i}"), "--rpc-port", "8485", "--data-port", "8486", *binds[i]]
            nodes.append(NodeProcess(args, log=tmp_path / f"jn{i}.log", prefix=net.hosts[i].exec_prefix(), env=env))
        host = (lambda a: f"[{a}]") if family == "ipv6" else (lambda a: a)
        assert nodes[0].ready["data"] == ":8486"
        assert nodes[1].ready["data"] == f"{host(addr[1])}:8486"
        assert nodes[2].ready["data"] == f"{host(addr[2])}:8486"
        uri = "qjournal://" + ";".join(f"{host(a)}:8485" for a in addr[:3]) + "/multihost"

        script = tmp_path / "writer.py"
        script.write_text(WRITER)
        first = _run_in(net, 3, str(script), uri, "1", "100")
        assert first.returncode == 0, first.stderr
        assert first.stdout.split() == [f"{i}:rec-{i}" for i in range(1, 101)]

        ok = _run_in(net, 3, "-m", "qjm", "status", uri, "--json")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        nodes[1].kill()
        degraded = _run_in(net, 3, "-m", "qjm", "status", uri, "--json")
        assert degraded.returncode == 1, degraded.stdout + degraded.stderr
        states = [n["state"] for n in json.loads(degraded.stdout)["nodes"]]
        assert states == ["in sync", "unreachable", "in sync"]

        second = _run_in(net, 3, str(script), uri, "101", "50")  # a new writer recovers on the two left
        assert second.returncode == 0, second.stderr
        assert second.stdout.split() == [f"{i}:rec-{i}" for i in range(1, 151)]
    finally:
        for n in nodes:
            n.stop()
