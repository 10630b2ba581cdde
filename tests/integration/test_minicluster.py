"""The test cluster itself: a port taken by another process between probe and bind costs a retry,
not a failed test, and a port handed out stays out of other processes' reach while its claimant
lives."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import qjm
from qjm.testing import minicluster, ports
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
    handed = [ports.free_port() for _ in range(300)]
    assert len(set(handed)) == len(handed)


def test_free_port_skips_ports_another_live_process_claimed_and_takes_over_a_dead_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node down for a restart binds nothing, so only the claim keeps a second pytest worker from
    handing its port to a cluster of its own."""
    claim = "import sys; from qjm.testing.ports import free_port; print(*(free_port() for _ in range(3)), flush=True)"
    killed = subprocess.Popen(
        [sys.executable, "-c", claim + "; sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    exited = subprocess.run([sys.executable, "-c", claim], stdout=subprocess.PIPE, check=True)
    assert killed.stdout is not None
    theirs = [int(p) for p in killed.stdout.readline().split()]
    released = [int(p) for p in exited.stdout.split()]
    assert len(theirs) == 3 and len(released) == 3
    real = random.Random()
    offered: list[int] = []

    def offer(*first: int) -> None:
        order = list(first)

        def randrange(lo: int, hi: int) -> int:
            offered.append(order.pop(0) if order else real.randrange(lo, hi))
            return offered[-1]

        monkeypatch.setattr(ports, "random", SimpleNamespace(Random=lambda: SimpleNamespace(randrange=randrange)))

    try:
        offer(*theirs)
        mine = ports.free_port()
        assert mine not in theirs and offered[:3] == theirs  # each was offered and refused
    finally:
        killed.send_signal(signal.SIGKILL)  # no exit handler: its claims stay behind, a dead process's
        killed.wait()
    offer(theirs[0], released[0])
    assert ports.free_port() == theirs[0]
    assert ports.free_port() == released[0]
    assert all(not os.path.exists(os.path.join(ports.CLAIMS_DIR, str(p))) for p in released[1:])
