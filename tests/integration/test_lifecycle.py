"""Log lifecycle on real nodes: the writer rolls by size and by age, and purges keep what they must.

Purges come from the writer's policy (``retain_txids``) and from ``qjm purge`` (an operator beside
the writer); both leave the newest segment and the retention floor, and refusals remove nothing.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

import qjm
from qjm.client.loggers import CallHooks
from qjm.client.manager import QuorumJournalManager
from qjm.client.retention import PurgeRequest
from qjm.errors import NodeUnavailableError, PurgeRefusedError
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.util import SETTLE_TIMEOUT, eventually, read_all, txn_data


def finalized(c: MiniJournalCluster, i: int) -> list[tuple[int, int]]:
    out = []
    for name in os.listdir(c.journal_dir(i)):
        if name.startswith("edits_") and "inprogress" not in name and "." not in name:
            a, b = name[len("edits_") :].split("-")
            out.append((int(a), int(b)))
    return sorted(out)


def in_progress(c: MiniJournalCluster, i: int) -> list[int]:
    return sorted(
        int(n[len("edits_inprogress_") :])
        for n in os.listdir(c.journal_dir(i))
        if n.startswith("edits_inprogress_") and "." not in n
    )


def rolled_writer(c: MiniJournalCluster, segments: int, per: int = 50, **options: object) -> qjm.Writer:
    """A writer that has finalized ``segments`` segments of ``per`` txids each, by hand, on every
    node: a roll returns at a majority, and the tests here compare every node's files."""
    w = qjm.open_writer(c.uri, create=True, close_grace=SETTLE_TIMEOUT, **options)
    for s in range(segments):
        for t in range(s * per + 1, (s + 1) * per + 1):
            w.append(txn_data(t))
        w.roll()
    last = segments * per
    for i in range(len(c.nodes)):
        eventually(
            lambda i=i: in_progress(c, i) == [last + 1] and [e for _, e in finalized(c, i)][-1:] == [last],
            what=f"n{i} rolled to {last + 1}",
        )
    return w


def test_the_writer_rolls_by_size_without_roll_calls(icluster: MiniJournalCluster) -> None:
    """roll_bytes: many segments, none much past the size, every record read back once and in order."""
    w = qjm.open_writer(icluster.uri, create=True, batch_bytes=4096, roll_bytes=32 * 1024, roll_interval=0)
    n = 3000
    for i in range(1, n + 1):
        w.append(txn_data(i) + bytes(100))
    w.close()
    segs = finalized(icluster, 0)
    assert len(segs) >= 8, segs
    assert segs[0][0] == 1 and segs[-1][1] == n
    assert all(b + 1 == c for (_, b), (c, _) in itertools.pairwise(segs))  # a chain, no gap
    for s, e in segs[:-1]:
        size = os.path.getsize(os.path.join(icluster.journal_dir(0), f"edits_{s:019d}-{e:019d}"))
        assert size < 32 * 1024 + 4096 + 1024  # rolled at the first batch past roll_bytes
    got = read_all(icluster.uri)
    assert [t for t, _ in got] == list(range(1, n + 1))
    assert all(rec == txn_data(t) + bytes(100) for t, rec in got)


def test_the_writer_rolls_by_age_while_idle(icluster: MiniJournalCluster) -> None:
    """roll_interval: a segment whose first batch is that old is finalized with no further append."""
    w = qjm.open_writer(icluster.uri, create=True, roll_interval=0.3)
    w.append(b"one")
    w.sync()
    eventually(lambda: w.segment_txid == 2, what="the segment rolled by age")
    # The roll waited for a quorum of finalizes; node 0 may be the third, a moment later.
    eventually(lambda: finalized(icluster, 0) == [(1, 1)], what="node 0 finalized the segment")
    w.append(b"two")  # the writer goes on in the next segment
    assert w.sync() == 2
    w.close()
    assert [r for _, r in read_all(icluster.uri)] == [b"one", b"two"]


def test_rolls_by_age_under_load_keep_every_record_in_order(icluster: MiniJournalCluster) -> None:
    """Records appended across many rolls by age (while batches flow) all read back, in order."""
    w = qjm.open_writer(icluster.uri, create=True, roll_interval=0.05, roll_bytes=0)
    deadline = time.monotonic() + SETTLE_TIMEOUT
    t = 0
    while len(finalized(icluster, 0)) < 5 and time.monotonic() < deadline:
        t += 1
        w.append(txn_data(t))
        if t % 50 == 0:
            w.sync()
    w.close()
    assert len(finalized(icluster, 0)) >= 5
    got = read_all(icluster.uri)
    assert got == [(i, txn_data(i)) for i in range(1, t + 1)]


class FailStarts(CallHooks):
    """Once armed, fails start_log_segment to the named nodes before it is sent."""

    def __init__(self, nodes: set[str]) -> None:
        self.nodes = nodes
        self.armed = False

    def before(self, node: str, op: str) -> None:
        if self.armed and op == "start_log_segment" and node in self.nodes:
            raise NodeUnavailableError(f"{node}: start failed on purpose")


def test_a_start_no_quorum_took_fails_the_writer_after_its_own_roll(icluster: MiniJournalCluster) -> None:
    """The writer's own roll does not wait for the next segment's start; a start that fails on a
    majority fails the next sync, and what was committed before the roll stays."""
    hooks = FailStarts({icluster.name(0), icluster.name(1)})
    w = qjm.open_writer(icluster.uri, create=True, hooks=hooks, roll_bytes=1, roll_interval=0)
    hooks.armed = True
    w.append(b"before")  # the batch fills the segment: the writer rolls after it
    with pytest.raises(qjm.QuorumError):
        w.sync()
        w.append(b"after")
        w.sync()
    w.abort()
    assert read_all(icluster.uri) == [(1, b"before")]


def test_roll_settings_refuse_bad_values() -> None:
    with pytest.raises(qjm.QJMError):
        qjm.open_writer("qjournal://127.0.0.1:1/j", roll_bytes=-1)
    with pytest.raises(qjm.QJMError, match="min_retained_txids"):
        qjm.open_writer("qjournal://127.0.0.1:1/j", retain_txids=10, min_retained_txids=100)


def test_the_writers_retention_purges_after_each_roll(icluster: MiniJournalCluster) -> None:
    """retain_txids: after a roll, segments wholly below the newest retain_txids go on every node."""
    w = rolled_writer(icluster, 4, retain_txids=120, min_retained_txids=100)
    # committed 200: keep txids from 81 on, so segments 1-50 and... 51-100 holds 81: it stays
    w.close()
    for i in range(3):
        eventually(lambda i=i: finalized(icluster, i)[0] == (51, 100), what=f"n{i} purged")
        assert finalized(icluster, i) == [(51, 100), (101, 150), (151, 200)]
    assert [t for t, _ in read_all(icluster.uri, 51)] == list(range(51, 201))


def manager(c: MiniJournalCluster) -> QuorumJournalManager:
    return QuorumJournalManager(c.uri)


@pytest.mark.parametrize(
    ("request_", "left"),
    [
        (PurgeRequest(before_txid=101), [(101, 150), (151, 200)]),
        (PurgeRequest(before_txid=100), [(51, 100), (101, 150), (151, 200)]),
        (PurgeRequest(keep_txids=120), [(51, 100), (101, 150), (151, 200)]),
        (PurgeRequest(keep_txids=100), [(101, 150), (151, 200)]),
    ],
)
def test_admin_purge_by_txid_removes_exactly_the_segments_below(
    icluster: MiniJournalCluster, request_: PurgeRequest, left: list[tuple[int, int]]
) -> None:
    """Beside a live writer (not fenced: it goes on writing after), on every node."""
    w = rolled_writer(icluster, 4)
    with manager(icluster) as m:
        out = m.admin_purge(request_, min_retained_txids=50, now=time.time())
    assert not out.failed and len(out.purged) == 3
    for i in range(3):
        assert finalized(icluster, i) == left
        assert in_progress(icluster, i) == [201]
    w.append(b"after")  # the writer was not fenced
    assert w.sync() == 201
    w.close()


def test_admin_purge_by_age(icluster: MiniJournalCluster) -> None:
    """--older-than: segments finalized before the cutoff go, younger ones stay."""
    w = rolled_writer(icluster, 2)
    for i in range(3):  # age the first two segments by an hour
        for s, e in finalized(icluster, i):
            path = os.path.join(icluster.journal_dir(i), f"edits_{s:019d}-{e:019d}")
            past = time.time() - 3600
            os.utime(path, (past, past))
    for t in range(101, 151):
        w.append(txn_data(t))
    w.roll()
    with manager(icluster) as m:
        out = m.admin_purge(PurgeRequest(older_than=1800), min_retained_txids=10, now=time.time())
    assert out.segments == ((1, 50), (51, 100))
    for i in range(3):
        assert finalized(icluster, i) == [(101, 150)]
    w.close()


@pytest.mark.parametrize(
    ("request_", "floor"),
    [
        (PurgeRequest(before_txid=202), 0),  # into the open segment (from 201)
        (PurgeRequest(before_txid=151), 100),  # within the newest 100 committed txids
        (PurgeRequest(keep_txids=10), 100),
    ],
)
def test_admin_purge_refuses_and_removes_nothing(
    icluster: MiniJournalCluster, request_: PurgeRequest, floor: int
) -> None:
    w = rolled_writer(icluster, 4)
    before = [finalized(icluster, i) for i in range(3)]
    with manager(icluster) as m, pytest.raises(PurgeRefusedError):
        m.admin_purge(request_, min_retained_txids=floor, now=time.time())
    assert [finalized(icluster, i) for i in range(3)] == before
    assert all(in_progress(icluster, i) == [201] for i in range(3))
    w.close()


def test_a_node_refuses_a_purge_into_its_newest_segment(icluster: MiniJournalCluster) -> None:
    """The node's own guard, whatever the client planned: nothing removed, a typed error back."""
    w = rolled_writer(icluster, 2)
    before = finalized(icluster, 0)
    with manager(icluster) as m:
        state = m.loggers.loggers[0].get_journal_state().result(SETTLE_TIMEOUT)
        fut = m.loggers.loggers[0].admin_purge_logs(state.last_promised_epoch, 150)
        with pytest.raises(PurgeRefusedError):
            fut.result(SETTLE_TIMEOUT)
    assert finalized(icluster, 0) == before and in_progress(icluster, 0) == [101]
    w.close()


def test_status_and_metrics_show_purged_segments_and_bytes(icluster: MiniJournalCluster) -> None:
    w = rolled_writer(icluster, 3)
    names = [f"edits_{s:019d}-{e:019d}" for s, e in [(1, 50), (51, 100)]]
    sizes = [os.path.getsize(os.path.join(icluster.journal_dir(0), n)) for n in names]
    with manager(icluster) as m:
        m.admin_purge(PurgeRequest(before_txid=101), min_retained_txids=10, now=time.time())
    w.close()
    with urllib.request.urlopen(f"http://{icluster.http_address(0)}/status", timeout=SETTLE_TIMEOUT) as r:
        status = json.load(r)
    j = status["journals"][0]
    assert j["purged_segments"] == 2 and j["purged_bytes"] == sum(sizes)
    with urllib.request.urlopen(f"http://{icluster.http_address(0)}/metrics", timeout=SETTLE_TIMEOUT) as r:
        text = r.read().decode()
    assert f'qjm_journal_purged_segments_total{{journal="{j["journal_id"]}"}} 2.0' in text
    assert f'qjm_journal_purged_bytes_total{{journal="{j["journal_id"]}"}} {float(sum(sizes))}' in text


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qjm", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_cli_purge(icluster: MiniJournalCluster) -> None:
    """qjm purge removes on every node and reports it; a refusal exits 1 with nothing removed."""
    w = rolled_writer(icluster, 3)
    r = run_cli("purge", icluster.uri, "--before-txid", "100", "--min-retained-txids", "10")
    assert r.returncode == 0, r.stderr
    assert "1-50" in r.stdout and "51-100" not in r.stdout
    assert all(finalized(icluster, i) == [(51, 100), (101, 150)] for i in range(3))
    r = run_cli("purge", icluster.uri, "--keep-txids", "5", env={"QJM_MIN_RETAINED_TXIDS": "60"})
    assert r.returncode == 1 and "PurgeRefusedError" in r.stderr and "Traceback" not in r.stderr
    assert all(finalized(icluster, i) == [(51, 100), (101, 150)] for i in range(3))
    w.close()


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--before-txid", "10", "--keep-txids", "5"],
        ["--before-txid", "ten"],
        ["--keep-txids", "0"],
        ["--older-than", "7 fortnights"],
        ["--before-txid", "10", "--min-retained-txids", "lots"],
    ],
)
def test_cli_purge_bad_arguments_print_one_line_and_exit_2(args: list[str]) -> None:
    r = run_cli("purge", "qjournal://127.0.0.1:1;127.0.0.1:2;127.0.0.1:3/j", *args)
    assert r.returncode == 2
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
