"""The ``qjm`` command against real nodes: format, status, tail, dump, journalnode errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import qjm
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import txn_data, wait_for_every_node


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qjm", *args], capture_output=True, text=True, timeout=120)


def test_format_status_tail_dump(cluster: MiniJournalCluster) -> None:
    r = run("format", cluster.uri)
    assert r.returncode == 0, r.stderr
    assert run("format", cluster.uri).returncode == 1  # already formatted: refused without --force
    w = qjm.open_writer(cluster.uri)
    for i in range(1, 21):
        w.append(txn_data(i))
    w.roll()
    w.append(b"last")
    w.sync()
    wait_for_every_node(w)  # sync returns at a majority; the status below lists all three nodes
    st = run("status", cluster.uri, "--json")
    assert st.returncode == 0, st.stderr
    out = json.loads(st.stdout)
    assert out["state"] == "in-sync" and out["exit_code"] == 0
    rows = out["nodes"]
    assert [r["writer_epoch"] for r in rows] == [w.epoch] * 3
    assert all(r["highest_written_txid"] == 21 for r in rows)
    table = run("status", cluster.uri)
    assert table.returncode == 0 and "promised" in table.stdout and cluster.addresses[0] in table.stdout
    tail = run("tail", cluster.uri)
    lines = tail.stdout.splitlines()
    assert lines[0] == f"1\t{txn_data(1).decode()}" and lines[-1] == "21\tlast"
    w.close()
    seg = os.path.join(cluster.journal_dir(0), f"edits_{1:019d}-{20:019d}")
    d = run("dump", seg, "--records")
    assert d.returncode == 0 and "txids 1-20" in d.stdout and "tail clean" in d.stdout
    with open(seg, "ab") as f:
        f.write(b"garbage")
    assert run("dump", seg).returncode == 2  # a torn tail is reported


def test_status_reports_a_down_node(cluster: MiniJournalCluster) -> None:
    qjm.open_writer(cluster.uri, create=True).close()
    cluster.stop(1)
    st = run("status", cluster.uri)
    assert st.returncode == 1, st.stdout + st.stderr  # degraded: a quorum is left
    assert st.stdout.splitlines()[2].split()[1] == "unreachable"
    assert "out of sync" not in st.stdout


def test_journalnode_refuses_a_locked_directory(cluster: MiniJournalCluster) -> None:
    """A second node on a data directory in use refuses to start, says why, and prints no
    traceback and no READY; the first node keeps serving."""
    qjm.open_writer(cluster.uri, create=True).close()
    r = run("journalnode", "--data-dir", cluster.node_dir(0), "--rpc-port", "0", "--data-port", "0", "--ready-line")
    assert r.returncode == 1, r
    assert "READY" not in r.stdout
    assert "in use by another JournalNode" in r.stderr and "Traceback" not in r.stderr, r.stderr
    w = qjm.open_writer(cluster.uri)
    w.append(b"still served")
    w.sync()
    w.close()


def test_bad_uri_is_a_clear_error() -> None:
    r = run("status", "qjournal://localhost:1/../etc")
    assert r.returncode == 3 and "bad journal id" in r.stderr  # 3: the check could not run


def test_journalnode_takes_no_fault_option(tmp_path: object) -> None:
    """Fault injection reaches a node through the test harness (qjm.testing.node) only."""
    r = run("journalnode", "--data-dir", str(tmp_path), "--fault", "before_append=exit")
    assert r.returncode == 2 and "unrecognized arguments: --fault" in r.stderr
