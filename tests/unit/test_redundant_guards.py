"""The two node guards no fault search reaches, and why (design §7.5, ``UNREACHED`` in test_teeth.py).

``skip_serial_check`` and ``skip_committed_loss_check`` each drop a guard of ``Journal`` that
another rule already covers in every execution the protocol allows. These tests show, on a real
``Journal`` over ``MemoryStorage``, exactly what each guard refuses and which other rule refuses
the same request, or why the request is harmless, when the guard is off.

The serial check refuses a copy of a request of the promised epoch whose serial is not above the
last one. Every other copy is refused by fencing first: a writer's epoch is its own, so a copy
from an earlier writer (of this process or another) carries a lower epoch. So the serial check
only ever sees a writer's own late or repeated calls, and every control call is idempotent at the
node (the client's retries rely on it, design §5.4): a late copy is refused by a segment rule,
repeats what the node already did, or aborts the node's open segment, which drops the node from
the writer's current segment (availability) but loses nothing it acknowledged.

The committed-loss check refuses an accept that would drop a txid this node knows committed. A
committed txid is on a quorum, so on one of the prepare quorum's responders, whose copy the
recovery choice ranks first, and the client refuses any decision below a committed txid a
responder reports (``check_no_committed_loss``): the correct client never proposes such an accept.
"""

from __future__ import annotations

import pytest

from qjm._native import framing
from qjm.client.recovery import check_no_committed_loss, choose_recovery_source
from qjm.errors import FencedError, InvariantViolation, OutOfOrderError, OutOfSyncError, SegmentStateError
from qjm.protocol.messages import NO_TXID, NamespaceInfo, PrepareRecoveryResponse, RequestInfo, SegmentState
from qjm.server.journal import Journal
from qjm.testing.bugs import ProtocolBugs
from qjm.testing.memstore import MemoryStorage

JID = "j"
NS = NamespaceInfo(42, "cluster-a")
SERIAL = ProtocolBugs.only("skip_serial_check")
COMMITTED_LOSS = ProtocolBugs.only("skip_committed_loss_check")


def frame(first: int, n: int, *, epoch: int, seg: int) -> bytes:
    records = [b"e%d-t%d" % (epoch, t) for t in range(first, first + n)]
    return bytes(framing.encode_frame(records, epoch=epoch, segment_txid=seg, first_txid=first))


def node(bugs: ProtocolBugs | None = None, *, peers: dict[str, Journal] | None = None) -> Journal:
    def fetch(source: str, journal_id: str, segment: int) -> list[bytes]:
        assert peers is not None
        return list(peers[source].open_download(segment).chunks())

    j = Journal(MemoryStorage(JID), fetcher=fetch, bugs=bugs)
    j.format(NS)
    return j


def req(epoch: int, serial: int, committed: int = NO_TXID) -> RequestInfo:
    return RequestInfo(JID, epoch, serial, committed)


def log_of(j: Journal) -> list[tuple[int, int]]:
    return [(x.start_txid, x.end_txid) for x in j.get_edit_log_manifest(1, in_progress_ok=True).logs]


# -- the serial check ------------------------------------------------------------------------


@pytest.mark.parametrize("bugs", [None, SERIAL], ids=["checked", "skip_serial_check"])
def test_a_late_start_after_its_frames_is_refused_by_the_restart_rule_too(bugs: ProtocolBugs | None) -> None:
    """start_log_segment(1) (serial 1) delivered again after txids 1-3 were written and acked."""
    j = node(bugs)
    j.new_epoch(NS, 1)
    j.start_log_segment(req(1, 1), 1)
    assert j.journal([frame(1, 3, epoch=1, seg=1)]) == 3
    j.finalize_log_segment(req(1, 2), 1, 3)
    j.start_log_segment(req(1, 3), 4)
    assert j.journal([frame(4, 2, epoch=1, seg=4)]) == 5
    late = req(1, 1)
    if bugs is None:
        with pytest.raises(OutOfOrderError):
            j.start_log_segment(late, 1)
        assert j.journal([frame(6, 1, epoch=1, seg=4)]) == 6  # the node goes on with the segment
        return
    # Without it: a finalized segment at that txid refuses the restart; had segment 1 still been in
    # progress, its frames of the writer's own epoch would (test_journal's restart tooth). Nothing
    # acknowledged is lost, but the node's open segment was closed on the way: it is out of the
    # writer's segment until the next start (availability, not safety).
    with pytest.raises(SegmentStateError, match="already have a finalized segment"):
        j.start_log_segment(late, 1)
    assert log_of(j) == [(1, 3), (4, 5)]
    with pytest.raises(OutOfSyncError, match="no segment is open"):
        j.journal([frame(6, 1, epoch=1, seg=4)])


@pytest.mark.parametrize("bugs", [None, SERIAL], ids=["checked", "skip_serial_check"])
def test_a_late_start_of_an_open_segment_is_refused_by_its_own_epochs_frames(bugs: ProtocolBugs | None) -> None:
    j = node(bugs)
    j.new_epoch(NS, 1)
    j.start_log_segment(req(1, 1), 1)
    assert j.journal([frame(1, 3, epoch=1, seg=1)]) == 3
    j.heartbeat(req(1, 2))
    with pytest.raises(OutOfOrderError if bugs is None else SegmentStateError):
        j.start_log_segment(req(1, 1), 1)
    assert log_of(j) == [(1, 3)]


def test_the_serial_check_backs_up_the_restart_rule() -> None:
    """Only with both guards dropped does a late start lose acknowledged txids."""
    j = node(ProtocolBugs(skip_serial_check=True, restart_segment_of_own_epoch=True))
    j.new_epoch(NS, 1)
    j.start_log_segment(req(1, 1), 1)
    assert j.journal([frame(1, 3, epoch=1, seg=1)]) == 3
    j.heartbeat(req(1, 2))
    j.start_log_segment(req(1, 1), 1)
    assert log_of(j) == []  # txids 1-3, acknowledged, are gone


@pytest.mark.parametrize("bugs", [None, SERIAL], ids=["checked", "skip_serial_check"])
def test_late_copies_of_finalize_accept_purge_and_prepare_repeat_what_the_node_did(bugs: ProtocolBugs | None) -> None:
    """A recovering writer (epoch 2) whose calls each reach the node once more, late, after it has
    finalized the recovered segment and written the next one."""
    peer = node()
    j = node(bugs, peers={"peer": peer})
    for n in (peer, j):
        n.new_epoch(NS, 1)
        n.start_log_segment(req(1, 1), 1)
    assert peer.journal([frame(1, 3, epoch=1, seg=1)]) == 3
    assert j.journal([frame(1, 2, epoch=1, seg=1)]) == 2
    j.new_epoch(NS, 2)
    calls = [
        ("prepare_recovery", (req(2, 1), 1)),
        ("accept_recovery", (req(2, 2), SegmentState(1, 3, True, 1), "peer")),
        ("finalize_log_segment", (req(2, 3), 1, 3, 1)),
        ("start_log_segment", (req(2, 4), 4)),
        ("purge_logs", (req(2, 5), 1)),
    ]
    for op, args in calls:
        getattr(j, op)(*args)
    assert j.journal([frame(4, 2, epoch=2, seg=4)]) == 5
    j.heartbeat(req(2, 6))
    before = log_of(j)
    assert before == [(1, 3), (4, 5)]
    for op, args in calls[:3] + calls[4:]:  # the late copies, serials 1, 2, 3 and 5
        if bugs is None:
            with pytest.raises(OutOfOrderError):
                getattr(j, op)(*args)
        else:
            getattr(j, op)(*args)  # idempotent: the same decision again
        assert log_of(j) == before  # nothing acknowledged moves, either way
    if bugs is not None:
        # What the serial check saves: a late prepare or accept closes the open segment 4, so the
        # node drops out of the writer's segment until its next start.
        with pytest.raises(OutOfSyncError):
            j.journal([frame(6, 1, epoch=2, seg=4)])


@pytest.mark.parametrize("bugs", [None, SERIAL], ids=["checked", "skip_serial_check"])
def test_a_previous_writers_late_copy_is_fenced_before_its_serial_is_read(bugs: ProtocolBugs | None) -> None:
    """A copy from an earlier writer, of this process or another, carries that writer's lower epoch."""
    j = node(bugs)
    j.new_epoch(NS, 1)
    j.start_log_segment(req(1, 1), 1)
    assert j.journal([frame(1, 3, epoch=1, seg=1)]) == 3
    j.new_epoch(NS, 2)
    j.prepare_recovery(req(2, 1), 1)
    for late in (req(1, 1), req(1, 7)):  # an old serial, and one above the new epoch's
        with pytest.raises(FencedError):
            j.start_log_segment(late, 1)
    assert log_of(j) == [(1, 3)]


# -- the committed-loss check ----------------------------------------------------------------


@pytest.mark.parametrize("bugs", [None, COMMITTED_LOSS], ids=["checked", "skip_committed_loss_check"])
def test_an_accept_that_drops_a_committed_txid_is_what_the_guard_refuses(bugs: ProtocolBugs | None) -> None:
    short = node()
    j = node(bugs, peers={"short": short})
    for n in (short, j):
        n.new_epoch(NS, 1)
        n.start_log_segment(req(1, 1), 1)
    assert short.journal([frame(1, 3, epoch=1, seg=1)]) == 3
    assert j.journal([frame(1, 3, epoch=1, seg=1), frame(4, 2, epoch=1, seg=1)]) == 5
    j.note_committed(1, 5)  # a quorum held txid 5: the writer said so on the data plane
    j.new_epoch(NS, 2)
    proposal = SegmentState(1, 3, True, 1)  # the shorter copy
    if bugs is None:
        with pytest.raises(InvariantViolation, match="would discard committed txid 5"):
            j.accept_recovery(req(2, 1), proposal, "short")
        assert log_of(j) == [(1, 5)]
    else:
        j.accept_recovery(req(2, 1), proposal, "short")
        assert log_of(j) == [(1, 3)]  # committed txids 4-5 are gone from this node


def test_the_correct_client_never_proposes_an_accept_below_a_committed_txid() -> None:
    """The other rule: txid 5 is committed, so a quorum (here n0 and n2 of three) holds it, and every
    prepare quorum has one of them. The choice ranks it first; a choice that did not (the
    ``pick_shortest_log`` bug) is refused by the client before any accept is sent."""
    held = PrepareRecoveryResponse(SegmentState(1, 5, True, 1), None, 1, 5)
    short = PrepareRecoveryResponse(SegmentState(1, 3, True, 1), None, 1, 3)
    for quorum in ({"n0": held, "n1": short}, {"n1": short, "n2": held}, {"n0": held, "n2": held}):
        chosen = choose_recovery_source(quorum)
        assert chosen is not None and chosen[1].segment_state == SegmentState(1, 5, True, 1)
        check_no_committed_loss(SegmentState(1, 5, True, 1), quorum)
    quorum = {"n0": held, "n1": short}
    wrong = choose_recovery_source(quorum, bugs=ProtocolBugs.only("pick_shortest_log"))
    assert wrong is not None and wrong[1].segment_state == SegmentState(1, 3, True, 1)
    with pytest.raises(InvariantViolation):
        check_no_committed_loss(SegmentState(1, 3, True, 1), quorum)
