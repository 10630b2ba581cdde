"""The open segment's write gate (``qjm._native.gate``, both twins) and the receiver's run through it.

The gate passes only the common case (a whole, intact frame of the admitted epoch, of its segment,
at the next txid; a notice of the admitted epoch) and leaves everything else, untouched, to the
journal's checks; what it passes is durable before it is acked, and its index and counters are
what the journal takes.
"""

from __future__ import annotations

import importlib
import os
import socket
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from qjm._native import framing
from qjm.errors import CorruptFrameError, ResourceExhaustedError, StorageError
from qjm.histogram import LATENCY_BUCKETS
from qjm.protocol import wire
from qjm.server.storage import DiskStorage

NO_EXTENSIONS = os.environ.get("QJM_NO_EXTENSIONS", "") in ("1", "true", "yes")
BACKENDS = ["py"] if NO_EXTENSIONS else ["py", "native"]
SEG = 11


@pytest.fixture(params=BACKENDS)
def twins(request: pytest.FixtureRequest) -> tuple[ModuleType, ModuleType]:
    """(gate module, fanout module) of one backend; a native module that fails to import fails the test."""
    if request.param == "native":
        return importlib.import_module("qjm._native.gate_c"), importlib.import_module("qjm._native.fanout_c")
    return importlib.import_module("qjm._native.gate_py"), importlib.import_module("qjm._native.fanout_py")


def frame(first: int, n: int = 2, *, epoch: int = 3, seg: int = SEG, size: int = 5) -> bytes:
    return bytes(
        framing.encode_frame([bytes([t % 256]) * size for t in range(first, first + n)], epoch=epoch,
                             segment_txid=seg, first_txid=first)
    )  # fmt: skip


class MemAppender:
    """A segment appender in memory that records its syncs, and can be told to fail one."""

    def __init__(self) -> None:
        self.data = bytearray(b"H" * 64)  # a header's worth
        self.durable = len(self.data)
        self.syncs = 0
        self.fail = False

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def stager(self) -> None:
        return None

    def append(self, data: bytes) -> None:
        self.data += data

    def sync(self) -> None:
        if self.fail:
            raise StorageError("fdatasync failed: the disk is gone")
        self.syncs += 1
        self.durable = len(self.data)


def armed(gate_mod: ModuleType, app: Any = None, *, epoch: int = 3) -> Any:
    g = gate_mod.WriteGate(app or MemAppender(), SEG, bounds=LATENCY_BUCKETS)
    g.epoch = epoch
    return g


def test_the_gate_passes_the_common_case_and_nothing_else(twins: tuple[ModuleType, ModuleType]) -> None:
    g = armed(twins[0])
    assert g.stage(frame(11)) and g.stage(frame(13, 3)) and g.staged_txid == 15
    bad_payload = bytearray(frame(16))
    bad_payload[-1] ^= 1
    bad_header = bytearray(frame(16))
    bad_header[20] ^= 1
    refused = {
        "another epoch": frame(16, epoch=2),
        "a newer epoch": frame(16, epoch=4),
        "another segment": frame(16, seg=16),
        "a gap": frame(17),
        "a repeat": frame(13, 3),
        "a damaged payload": bytes(bad_payload),
        "a damaged header": bytes(bad_header),
        "a cut frame": frame(16)[:-1],
        "no frame": b"",
    }
    for why, f in refused.items():
        assert not g.stage(f), why
    assert g.staged_txid == 15 and g.next_txid == SEG  # nothing more staged, nothing durable yet
    g.epoch = 0  # the journal's "nothing passes" (a writer epoch below the promised one)
    assert not g.stage(frame(16))
    g.stage_checked(frame(16, epoch=2), 2, 16, 17)  # what the journal's own checks let through
    assert g.staged_txid == 17


def test_sync_makes_the_run_durable_then_acks_then_keeps_its_index(twins: tuple[ModuleType, ModuleType]) -> None:
    app = MemAppender()
    g = armed(twins[0], app)
    assert g.sync() == SEG - 1 and app.syncs == 0  # nothing staged: no sync
    frames = [frame(11), frame(13, 3)]
    for f in frames:
        assert g.stage(f)
    seen: list[tuple[int, int]] = []
    assert g.sync(lambda txid: seen.append((txid, app.durable))) == 15
    assert seen == [(15, 64 + len(frames[0]) + len(frames[1]))]  # acked once durable, not before
    assert (g.next_txid, g.last_epoch, g.staged_txid, app.syncs) == (16, 3, 0, 1)
    assert g.take_index() == [(11, 12, 64, len(frames[0])), (13, 15, 64 + len(frames[0]), len(frames[1]))]
    assert g.take_index() == []  # taken
    assert bytes(app.data[64:]) == b"".join(frames)


def test_a_failed_sync_keeps_the_frames_staged_and_a_failed_ack_keeps_the_bookkeeping(
    twins: tuple[ModuleType, ModuleType],
) -> None:
    app = MemAppender()
    g = armed(twins[0], app)
    g.stage(frame(11))
    app.fail = True
    with pytest.raises(StorageError, match="disk is gone"):
        g.sync(lambda txid: pytest.fail("acked what is not durable"))
    assert g.staged_txid == 12 and g.next_txid == SEG  # the journal drops the open segment on this
    app.fail = False

    def refuse(txid: int) -> None:
        raise OSError("the writer hung up")

    with pytest.raises(OSError, match="hung up"):
        g.sync(refuse)
    assert (g.staged_txid, g.next_txid) == (0, 13)  # durable, and counted as such
    assert g.take_index() == [(11, 12, 64, len(frame(11)))]


def test_the_hook_sees_each_frame_before_it_is_staged(twins: tuple[ModuleType, ModuleType]) -> None:
    app = MemAppender()
    g = armed(twins[0], app)
    seen: list[tuple[int, int]] = []
    g.hook = lambda first: seen.append((first, app.size))
    g.stage(frame(11))
    g.stage(frame(13))

    class Crash(Exception):
        pass

    def crash(first: int) -> None:
        raise Crash(first)

    g.hook = crash
    with pytest.raises(Crash):
        g.stage(frame(15))
    assert seen == [(11, 64), (13, 64 + len(frame(11)))]
    assert g.staged_txid == 14 and app.size == 64 + 2 * len(frame(11))  # the crashed frame never staged


def test_sync_data_false_acks_without_a_sync(twins: tuple[ModuleType, ModuleType]) -> None:
    """The switch a protocol bug under test uses (``ack_before_fsync``): the fault search must see it."""
    app = MemAppender()
    g = armed(twins[0], app)
    g.sync_data = False
    g.stage(frame(11))
    assert g.sync() == 12 and app.syncs == 0


def test_notices_of_the_admitted_epoch_are_kept_at_their_highest(twins: tuple[ModuleType, ModuleType]) -> None:
    g = armed(twins[0])
    assert g.note(3, 40) and g.note(3, 20) and g.noticed == 40
    assert not g.note(2, 50) and not g.note(4, 50) and g.noticed == 40
    g.epoch = 0
    assert not g.note(3, 60)


def test_the_counters_are_what_was_made_durable_and_are_taken_once(twins: tuple[ModuleType, ModuleType]) -> None:
    g = armed(twins[0])
    g.committed = 12  # frames ending at or below it were on a quorum before they came
    for f in (frame(11), frame(13, 3)):
        g.stage(f)
    g.sync()
    g.stage(frame(16, 1))
    g.sync()
    batches, txns, nbytes, lagging, counts, total, last = g.take_stats()
    assert (batches, txns, nbytes, lagging) == (3, 6, len(frame(11)) + len(frame(13, 3)) + len(frame(16, 1)), 1)
    assert len(counts) == len(LATENCY_BUCKETS) + 1 and sum(counts) == 2 and total >= 0.0 and last > 0.0
    assert g.take_stats()[:5] == (0, 0, 0, 0, [0] * (len(LATENCY_BUCKETS) + 1))


def test_a_gate_refuses_a_segment_no_log_can_hold(twins: tuple[ModuleType, ModuleType]) -> None:
    with pytest.raises(ValueError, match="txid 1 or later, not 0"):
        twins[0].WriteGate(MemAppender(), 0)
    with pytest.raises(ValueError, match="at most 32 bounds"):
        twins[0].WriteGate(MemAppender(), 1, bounds=[i / 100 for i in range(40)])


def test_frames_staged_in_place_make_the_same_file(twins: tuple[ModuleType, ModuleType], tmp_path: Any) -> None:
    """On disk the native gate copies frames into the segment's native appender (its ``stager``)."""
    files = []
    for n, use_stager in enumerate((True, False)):
        st = DiskStorage(str(tmp_path / f"d{n}"), "j")
        app = st.create_segment(SEG, framing.encode_segment_header(SEG, 3))
        g = twins[0].WriteGate(app, SEG, stager=app.stager if use_stager else None)
        g.epoch = 3
        for f in (frame(11), frame(13, 40, size=300), frame(53)):
            assert g.stage(f)
        assert g.sync() == 54 and app.size == 64 + len(frame(11)) * 2 + len(frame(13, 40, size=300))
        app.close()
        with open(tmp_path / f"d{n}" / "j" / "current" / f"edits_inprogress_{SEG:019d}", "rb") as fh:
            files.append(fh.read())
        st.close()
    assert files[0] == files[1]


# -- the receiver's run through a gate --------------------------------------------------------


class Link:
    """A writer's end of one data-plane connection and the node's receiver on the other end."""

    def __init__(self, fo: ModuleType, max_frame: int = 1 << 20) -> None:
        self.writer, mine = socket.socketpair()
        self.rx = fo.Receiver(mine, max_frame)
        self._mine = mine

    def send(self, data: bytes) -> None:
        self.writer.sendall(data)

    def acks(self) -> list[int]:
        self.writer.settimeout(0.0)
        out = b""
        try:
            while chunk := self.writer.recv(4096):
                out += chunk
        except BlockingIOError:
            pass
        return [wire.ACK.unpack_from(out, i)[2] for i in range(0, len(out), wire.ACK.size)]

    def close(self) -> None:
        self.writer.close()
        self._mine.close()


@pytest.fixture
def link(twins: tuple[ModuleType, ModuleType]) -> Iterator[Link]:
    ln = Link(twins[1])
    yield ln
    ln.close()


# A socketpair hands over what one sendall wrote in one read, so a run here is all that was sent.


def test_a_run_is_staged_synced_and_acked_once(twins: tuple[ModuleType, ModuleType], link: Link) -> None:
    app = MemAppender()
    g = armed(twins[0], app)
    link.send(frame(11) + wire.encode_commit(3, 9) + frame(13, 3) + wire.encode_commit(3, 12))
    assert link.rx.wait_run()
    assert link.rx.journal_run(g) == 1
    assert link.acks() == [15] and link.rx.acked == 15 and app.syncs == 1  # one sync, one ack
    assert g.noticed == 12 and g.next_txid == 16 and bytes(app.data[64:]) == frame(11) + frame(13, 3)


def test_a_run_stops_at_what_the_gate_refuses_and_next_run_takes_the_rest(
    twins: tuple[ModuleType, ModuleType], link: Link
) -> None:
    g = armed(twins[0])
    rest = [frame(13, epoch=2), frame(15)]
    link.send(frame(11) + b"".join(rest) + wire.encode_commit(3, 20))
    assert link.rx.wait_run()
    assert link.rx.journal_run(g) == 0
    assert link.acks() == [12] and g.next_txid == 13  # what came before the refused frame is durable and acked
    assert link.rx.next_run() == (rest, [(3, 20)])  # untouched, for the journal's checks


def test_a_notice_of_another_epoch_stops_the_run_too(twins: tuple[ModuleType, ModuleType], link: Link) -> None:
    g = armed(twins[0])
    link.send(wire.encode_commit(2, 9) + frame(11))
    assert link.rx.wait_run()
    assert link.rx.journal_run(g) == 0 and link.acks() == [] and g.noticed == 0
    assert link.rx.next_run() == ([frame(11)], [(2, 9)])


@pytest.mark.parametrize(
    ("garbage", "error"),
    [(b"JUNKJUNK", CorruptFrameError), (frame(11)[:8] + b"\0" * 56, CorruptFrameError)],
)
def test_a_malformed_message_is_left_for_next_run_to_refuse(
    twins: tuple[ModuleType, ModuleType], link: Link, garbage: bytes, error: type[Exception]
) -> None:
    g = armed(twins[0])
    link.send(garbage)
    assert link.rx.wait_run()
    assert link.rx.journal_run(g) == 0 and g.staged_txid == 0
    with pytest.raises(error):
        link.rx.next_run()


def test_a_frame_past_max_frame_bytes_is_left_for_next_run_to_refuse(twins: tuple[ModuleType, ModuleType]) -> None:
    ln = Link(twins[1], max_frame=200)
    try:
        g = armed(twins[0])
        ln.send(frame(11, 1, size=500)[:64])  # the header says how long it is: that is enough
        assert ln.rx.wait_run()
        assert ln.rx.journal_run(g) == 0
        with pytest.raises(ResourceExhaustedError, match="max_frame_bytes"):
            ln.rx.next_run()
    finally:
        ln.close()


def test_wait_run_waits_for_a_whole_message_and_ends_with_the_stream(
    twins: tuple[ModuleType, ModuleType], link: Link
) -> None:
    f = frame(11)
    link.send(f[:30])
    done = threading.Event()
    result: list[bool] = []

    def wait() -> None:
        result.append(link.rx.wait_run())
        done.set()

    t = threading.Thread(target=wait)
    t.start()
    assert not done.wait(0.2)  # half a frame is not a message (a pass here proves nothing, a fail does)
    link.send(f[30:])
    t.join(10)
    assert result == [True]
    g = armed(twins[0])
    assert link.rx.journal_run(g) == 1 and g.next_txid == 13
    link.send(frame(13)[:10])
    link.writer.shutdown(socket.SHUT_WR)
    assert link.rx.wait_run() is False  # a torn message at the end is no message
