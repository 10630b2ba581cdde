"""``plan_rejoin`` (design §4.5): the promise a node that lost its disk starts with covers every
epoch a writer may hold, and every unsafe or unclear case is refused with a clear error."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from qjm.client.rejoin import plan_rejoin
from qjm.errors import (
    AlreadyFormattedError,
    ConfigError,
    NamespaceMismatchError,
    NodeUnavailableError,
    OutOfSyncError,
    QuorumError,
)
from qjm.protocol.messages import NamespaceInfo, RequestInfo, SegmentState
from qjm.server.journal import Journal
from qjm.server.storage import DiskStorage
from qjm.testing.memstore import MemoryStorage

NODES = ["a:1", "b:1", "c:1"]
BLANK: dict[str, object] = {"formatted": False, "promised_epoch": 0}


def peer(promised: int, ns: int = 7, cluster: str = "c", ctime: int = 0) -> dict[str, object]:
    return {"formatted": True, "promised_epoch": promised, "namespace_id": ns, "cluster_id": cluster, "ctime": ctime,
            "highest_written_txid": 10}  # fmt: skip


def test_the_node_starts_with_the_namespace_and_the_highest_promise_of_its_peers() -> None:
    plan = plan_rejoin("j", "a:1", NODES, {"a:1": BLANK, "b:1": peer(3), "c:1": peer(5)})
    assert (plan.node, plan.promised_epoch, plan.peers) == ("a:1", 5, ("b:1", "c:1"))
    assert plan.namespace == NamespaceInfo(7, "c", 0)


def test_every_majority_of_the_cluster_meets_the_peers_a_plan_needs() -> None:
    """Whatever majority a writer won its epoch at, the rejoining node among them or not, the
    peers a plan accepts include one of its members: their highest promise covers that epoch."""
    for size in (3, 5, 7):
        nodes = [f"n{i}:1" for i in range(size)]
        need = size // 2 + 1
        for winners in itertools.combinations(nodes, need):
            for answered in itertools.combinations(nodes[1:], need):
                answers: dict[str, object] = {"n0:1": BLANK}
                for n in nodes[1:]:
                    answers[n] = peer(9 if n in winners else 1) if n in answered else NodeUnavailableError("down")
                plan = plan_rejoin("j", "n0:1", nodes, answers)  # type: ignore[arg-type]
                assert plan.promised_epoch == 9, (winners, answered)


def test_too_few_peers_is_refused_naming_why() -> None:
    with pytest.raises(QuorumError, match=r"rejoin a:1: 1 of the other nodes answered with journal j, 2 needed"):
        plan_rejoin("j", "a:1", NODES, {"a:1": BLANK, "b:1": peer(3), "c:1": NodeUnavailableError("c:1: down")})
    with pytest.raises(QuorumError, match="c:1: AlreadyFormattedError: c:1 does not hold journal j either"):
        plan_rejoin("j", "a:1", NODES, {"a:1": BLANK, "b:1": peer(3), "c:1": BLANK})
    five = [f"n{i}:1" for i in range(5)]
    answers = {"n0:1": BLANK, "n1:1": peer(2), "n2:1": peer(2)}
    with pytest.raises(QuorumError, match="2 of the other nodes answered with journal j, 3 needed"):
        plan_rejoin("j", "n0:1", five, answers)  # n3 and n4 never answered


def test_the_node_itself_must_be_reachable_unformatted_and_named() -> None:
    with pytest.raises(ConfigError, match=r"node x:1 is not one of the journal's nodes \(a:1, b:1, c:1\)"):
        plan_rejoin("j", "x:1", NODES, {})
    with pytest.raises(NodeUnavailableError, match="cannot reach node a:1: OSError: refused"):
        plan_rejoin("j", "a:1", NODES, {"a:1": OSError("refused"), "b:1": peer(3), "c:1": peer(3)})
    with pytest.raises(
        AlreadyFormattedError, match=r"node a:1 holds journal j \(promised epoch 4, written through txid 10"
    ):
        plan_rejoin("j", "a:1", NODES, {"a:1": peer(4), "b:1": peer(3), "c:1": peer(3)})


def test_peers_that_disagree_or_do_not_say_their_namespace_are_refused() -> None:
    with pytest.raises(NamespaceMismatchError, match=r"different namespaces \(b:1: 7/c/0; c:1: 8/c/0\)"):
        plan_rejoin("j", "a:1", NODES, {"a:1": BLANK, "b:1": peer(3), "c:1": peer(3, ns=8)})
    old = peer(3)
    del old["namespace_id"]
    with pytest.raises(NamespaceMismatchError, match="node c:1 does not report the journal's namespace"):
        plan_rejoin("j", "a:1", NODES, {"a:1": BLANK, "b:1": peer(3), "c:1": old})
    with pytest.raises(NamespaceMismatchError, match="node c:1 reported no usable promised_epoch"):
        plan_rejoin("j", "a:1", NODES, {"a:1": BLANK, "b:1": peer(3), "c:1": peer(3) | {"promised_epoch": "x"}})


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_a_journal_formatted_with_a_promise_keeps_it_across_a_restart(kind: str, tmp_path: Path) -> None:
    """The promise is written durably before the stamp, and refuses lower epochs at once."""
    st = MemoryStorage("j") if kind == "memory" else DiskStorage(str(tmp_path / "n"), "j")
    j = Journal(st)
    j.format(NamespaceInfo(7), promised_epoch=5)
    assert j.get_journal_state().last_promised_epoch == 5 and j.status()["namespace_id"] == 7
    if isinstance(st, MemoryStorage):
        assert 5 in st.durable_longs().values()
        again = Journal(st)
    else:
        st.close()
        again = Journal(DiskStorage(str(tmp_path / "n"), "j"))
    assert again.get_journal_state().last_promised_epoch == 5
    with pytest.raises(ConfigError, match="promised epoch must be >= 0"):
        Journal(MemoryStorage("k")).format(NamespaceInfo(7), promised_epoch=-1)


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_a_rejoined_journal_takes_no_part_in_recovery_until_a_writer_starts_a_segment_on_it(
    kind: str, tmp_path: Path
) -> None:
    """Its "no such segment" would be no evidence (it lost its segments): new_epoch and both Paxos
    phases are refused, across a restart, until a writer's start_log_segment reaches it."""
    path = str(tmp_path / "n")
    st = MemoryStorage("j") if kind == "memory" else DiskStorage(path, "j")
    j = Journal(st)
    j.format(NamespaceInfo(7), promised_epoch=5)
    assert j.status()["rejoined_without_segments"] is True
    req = RequestInfo("j", 6, 1)
    for refused in (
        lambda: j.new_epoch(NamespaceInfo(7), 6),
        lambda: j.prepare_recovery(req, 1),
        lambda: j.accept_recovery(req, SegmentState(1, 1, True, 5), "x"),
    ):
        with pytest.raises(OutOfSyncError, match="rejoined journal j after losing its disk"):
            refused()
    assert j.get_journal_state().last_promised_epoch == 5  # nothing promised by a refusal
    if isinstance(st, DiskStorage):
        st.close()
        st = DiskStorage(path, "j")
        j = Journal(st)
    else:
        j = Journal(st)
    assert j.status()["rejoined_without_segments"] is True
    j.start_log_segment(RequestInfo("j", 6, 2), 101)  # the writer's next segment (a higher epoch is adopted)
    assert j.status()["rejoined_without_segments"] is False
    if isinstance(st, DiskStorage):
        j.close()
        st.close()
        j = Journal(DiskStorage(path, "j"))
    else:
        j = Journal(st)
    assert j.status()["rejoined_without_segments"] is False
    j.new_epoch(NamespaceInfo(7), 7)  # takes part again
    assert j.get_journal_state().last_promised_epoch == 7
    plain = Journal(MemoryStorage("k"))
    plain.format(NamespaceInfo(7))
    assert plain.status()["rejoined_without_segments"] is False
