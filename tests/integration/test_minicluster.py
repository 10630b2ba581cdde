"""The test cluster itself: a port taken by another process between probe and bind costs a retry,
not a failed test (CI saw exactly that once)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import qjm
from qjm.testing import minicluster
from qjm.testing.minicluster import MiniJournalCluster


@pytest.mark.parametrize("in_process", [False, True])
def test_a_port_taken_before_the_first_start_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_process: bool
) -> None:
    thief = socket.socket()
    thief.bind(("127.0.0.1", 0))
    thief.listen()
    taken = thief.getsockname()[1]
    real = minicluster.free_port
    handed = iter([taken])
    monkeypatch.setattr(minicluster, "free_port", lambda host="127.0.0.1": next(handed, None) or real(host))
    try:
        with MiniJournalCluster(1, str(tmp_path), in_process=in_process) as c:
            assert c.nodes[0].rpc_port != taken
            w = qjm.open_writer(c.uri, create=True)
            w.append(b"x")
            assert w.sync() == 1
            w.close()
    finally:
        thief.close()


def test_free_port_never_hands_out_a_port_twice() -> None:
    ports = [minicluster.free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
