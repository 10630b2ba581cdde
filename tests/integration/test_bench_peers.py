"""The peers of ``qjm bench --peers`` started for real: ZooKeeper, etcd and NATS JetStream, three servers each.

Each cluster is started from the Debian packages through the harness, records go in and come back out
through the harness's own client code, and nothing may be left running afterwards, also when the body
of the ``with`` fails. A missing package fails (never skips): the benchmark needs them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qjm.bench import peers

pytestmark = pytest.mark.integration

BATCH = {"zookeeper": peers.ZK_MULTI, "etcd": peers.ETCD_TXN_OPS, "nats": 1}  # records per request


def _processes_using(path: str) -> list[int]:
    """Pids of every process whose command line mentions ``path`` (the cluster's config or data dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue  # exited meanwhile
        if path in cmdline:
            found.append(int(entry))
    return found


def _require(name: str) -> None:
    missing = peers.missing_binaries(name)
    assert not missing, f"{name}: {', '.join(missing)} not installed; {peers.INSTALL_HINT}"


@pytest.mark.parametrize("name", peers.PEERS)
def test_peer_cluster_commits_reads_back_and_leaves_nothing(name: str, tmp_path: Path) -> None:
    _require(name)
    base = str(tmp_path / name)
    values = [os.urandom(1024), b"r" * 100, b"qjm"]
    with peers.running(name, base) as (cluster, client):
        pids = cluster.pids
        assert len(pids) == 3
        assert sorted(_processes_using(base)) == sorted(pids)  # each server is its own process
        assert cluster.version[0].isdigit(), cluster.version
        keys = [client.put(v) for v in values]
        assert len(set(keys)) == len(values)
        assert [client.get(k) for k in keys] == values
        acked, elapsed = client.pipelined(os.urandom(1024), 0.2)
        assert acked > 0 and elapsed > 0
        acked, elapsed = client.batched(os.urandom(1024), 0.2)  # its best batching client
        assert acked > 0 and elapsed > 0
        assert acked % BATCH[name] == 0, (acked, BATCH[name])  # whole multis and txns, nothing half-counted
        assert client.get(keys[0]) == values[0]  # still there after the pipelined phase
    assert _processes_using(base) == []


def test_servers_are_killed_when_the_body_fails(tmp_path: Path) -> None:
    _require("nats")
    base = str(tmp_path / "failing")
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="the benchmark broke"), peers.running("nats", base) as (cluster, _):
        pids = cluster.pids
        raise RuntimeError("the benchmark broke")
    assert len(pids) == 3
    assert _processes_using(base) == []


def test_a_retried_start_watches_only_its_own_servers(tmp_path: Path) -> None:
    """A cluster whose first start failed (a port taken meanwhile) is started again with the same
    ``Servers``: only the new processes and their logs are checked."""
    servers = peers.Servers("retry")
    servers.spawn(["true"], str(tmp_path), str(tmp_path / "first.log"))
    servers.stop()
    servers.spawn(["sleep", "60"], str(tmp_path), str(tmp_path / "second.log"))
    try:
        servers.check_alive()  # the exited first process is no longer its concern
        assert servers.logs == [str(tmp_path / "second.log")]
    finally:
        servers.stop()
