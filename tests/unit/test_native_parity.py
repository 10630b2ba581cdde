"""Hypothesis: segment_io_c / gate_c / fanout_c and their pure twins agree on bytes, decisions and errors.

segment_io: the same operations leave byte-identical files (header, frames, zero preallocation),
the same sizes and the same exceptions, and a scan of what a crash leaves decides the same.
fanout: the receivers split any byte stream, chunked any way, into the same runs and refuse the
same garbage; the engines agree on acks, windows and refusals, and the quorum count matches
``qjm.client.quorum.majority``. gate: a receiver's runs through a write gate pass, refuse, write and
ack the same.
"""

from __future__ import annotations

import functools
import importlib
import os
import queue
import socket
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from qjm.client.quorum import majority
from qjm.errors import CorruptFrameError
from qjm.protocol import wire

framing = importlib.import_module("qjm._native.framing_py")
sio_c = importlib.import_module("qjm._native.segment_io_c")  # an import failure is an error, not a skip
sio_py = importlib.import_module("qjm._native.segment_io_py")
fo_c = importlib.import_module("qjm._native.fanout_c")
fo_py = importlib.import_module("qjm._native.fanout_py")

PARITY = settings(max_examples=120, deadline=None)
BLOCK = 4096


@dataclass(frozen=True)
class Outcome:
    value: Any = None
    exc_type: type[BaseException] | None = None
    errno: int | None = None
    reason: str | None = None


def outcome(fn: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(value=fn())
    except CorruptFrameError as e:
        return Outcome(exc_type=type(e), reason=e.reason)
    except OSError as e:
        return Outcome(exc_type=type(e), errno=e.errno)
    except (ValueError, TypeError, RuntimeError, OverflowError) as e:
        return Outcome(exc_type=type(e))


# -- segment_io ----------------------------------------------------------------------------------

RUN = sio_py.EXTEND_RUN
op_st = st.one_of(
    st.tuples(st.just("append"), st.binary(min_size=0, max_size=9000)),
    st.tuples(st.just("append_big"), st.integers(min_value=1, max_value=3 * BLOCK)),
    # around EXTEND_RUN: a write-out that extends the file without zeros ahead, or just not
    st.tuples(
        st.just("append_big"), st.integers(min_value=sio_py.EXTEND_RUN - BLOCK, max_value=sio_py.EXTEND_RUN + BLOCK)
    ),
    st.tuples(st.just("sync"), st.none()),
    st.tuples(st.just("truncate"), st.floats(min_value=-0.1, max_value=1.1)),
    st.tuples(st.just("close"), st.none()),
)


def run_ops(
    mod: Any, path: str, header: bytes, prealloc: int, ops: list[tuple[str, Any]], direct: bool
) -> list[Outcome]:
    kw = {"direct": direct} if mod is sio_c else {}
    a = mod.Appender(path, header, prealloc=prealloc, **kw)
    seen: list[Outcome] = []
    for op, arg in ops:
        if op == "append":
            seen.append(outcome(functools.partial(a.append, arg)))
        elif op == "append_big":
            seen.append(outcome(functools.partial(a.append, bytes([arg % 255 + 1]) * arg)))
        elif op == "sync":
            seen.append(outcome(a.sync))
        elif op == "truncate":
            seen.append(outcome(functools.partial(a.truncate, int(a.size * arg))))
        else:
            seen.append(outcome(a.close))
        seen.append(Outcome(value=(a.size, a.allocated, a.closed)))
    a.close()
    return seen


@PARITY
@given(
    header=st.binary(max_size=200),
    prealloc=st.sampled_from([BLOCK, 2 * BLOCK, 8 * BLOCK]),
    ops=st.lists(op_st, max_size=25),
    direct=st.booleans(),
)
def test_appender_files_sizes_and_errors_match(
    header: bytes, prealloc: int, ops: list[tuple[str, Any]], direct: bool
) -> None:
    with tempfile.TemporaryDirectory() as d:
        pc, pp = os.path.join(d, "c"), os.path.join(d, "py")
        assert run_ops(sio_c, pc, header, prealloc, ops, direct) == run_ops(sio_py, pp, header, prealloc, ops, direct)
        with open(pc, "rb") as fc, open(pp, "rb") as fp:
            assert fc.read() == fp.read()


@PARITY
@given(
    batches=st.lists(st.lists(st.binary(max_size=700), min_size=1, max_size=6), min_size=1, max_size=12),
    synced=st.integers(min_value=0, max_value=12),
)
def test_scan_after_a_crash_decides_the_same(batches: list[list[bytes]], synced: int) -> None:
    """Frames appended, the first ``synced`` batches synced, then the process "dies" (close, no sync)."""
    header = framing.encode_segment_header(1, 1)
    results = []
    with tempfile.TemporaryDirectory() as d:
        for mod in (sio_c, sio_py):
            path = os.path.join(d, mod.__name__)
            a = mod.Appender(path, header, prealloc=BLOCK)
            txid = 1
            for i, recs in enumerate(batches):
                a.append(framing.encode_frame(recs, epoch=1, segment_txid=1, first_txid=txid))
                txid += len(recs)
                if i < synced:
                    a.sync()
            a.close()
            with open(path, "rb") as f:
                data = f.read()
            results.append((data, framing.scan(data, 1)))
    assert results[0] == results[1]
    res = results[0][1]
    durable = sum(len(r) for r in batches[:synced])
    assert (res.tail, res.last_txid, res.frame_count) == ("clean", durable, min(synced, len(batches)))


# -- fanout: the receivers -------------------------------------------------------------------------


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    parts = [wire.encode_hello(draw(st.text(max_size=10)))]
    txid = 1
    for _ in range(draw(st.integers(min_value=0, max_value=8))):
        kind = draw(st.sampled_from(["frame", "frame", "commit", "garbage", "corrupt"]))
        if kind == "frame":
            recs = draw(st.lists(st.binary(max_size=300), min_size=1, max_size=5))
            parts.append(framing.encode_frame(recs, epoch=1, segment_txid=1, first_txid=txid))
            txid += len(recs)
        elif kind == "commit":
            parts.append(wire.encode_commit(draw(st.integers(0, 2**64 - 1)), draw(st.integers(-1, 2**63 - 1))))
        elif kind == "garbage":
            parts.append(draw(st.binary(min_size=4, max_size=80)))
        else:
            f = bytearray(framing.encode_frame([b"abc"], epoch=1, segment_txid=1, first_txid=txid))
            f[draw(st.integers(0, len(f) - 1))] ^= draw(st.integers(1, 255))
            parts.append(bytes(f))
    data = b"".join(parts)
    cut = draw(st.integers(min_value=0, max_value=len(data)))
    return data[: len(data) - draw(st.sampled_from([0, 0, cut // 3]))]


def receive_all(mod: Any, data: bytes, chunk: int) -> list[Outcome]:
    writer, mine = socket.socketpair()

    def feed() -> None:
        try:
            for i in range(0, len(data), chunk):
                writer.sendall(data[i : i + chunk])
        except OSError:
            pass  # the receiver stopped reading after an error
        writer.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=feed)
    t.start()
    rx = mod.Receiver(mine)
    out = [outcome(rx.hello)]
    frames: list[bytes] = []
    commits: list[tuple[int, int]] = []
    while out[-1].exc_type is None and out[0].value is not None:
        o = outcome(rx.next_run)
        if o.exc_type is None and o.value is not None:
            frames += o.value[0]
            commits += o.value[1]
            continue
        out.append(o)
        break
    mine.close()
    t.join(10)
    writer.close()
    return [*out, Outcome(value=(frames, commits))]


@PARITY
@given(data=streams(), chunk=st.integers(min_value=1, max_value=4096))
def test_receivers_split_and_refuse_the_same(data: bytes, chunk: int) -> None:
    assert receive_all(fo_c, data, chunk) == receive_all(fo_py, data, chunk)


# -- the write gate and the receiver's run through it ----------------------------------------------

gate_c = importlib.import_module("qjm._native.gate_c")
gate_py = importlib.import_module("qjm._native.gate_py")


class _MemAppender:
    def __init__(self) -> None:
        self.data = bytearray(64)
        self.durable = 64

    @property
    def size(self) -> int:
        return len(self.data)

    def append(self, data: bytes) -> None:
        self.data += data

    def sync(self) -> None:
        self.durable = len(self.data)


@st.composite
def gate_streams(draw: st.DrawFn) -> bytes:
    """A writer's stream to a gate admitting epoch 2 in segment 5 from txid 5: mostly what passes,
    then and now another epoch, another segment, a gap, a damaged frame or a notice of any epoch."""
    parts = [wire.encode_hello("j")]
    txid = 5
    for _ in range(draw(st.integers(min_value=0, max_value=10))):
        kind = draw(st.sampled_from(["frame"] * 6 + ["commit", "epoch", "segment", "gap", "corrupt", "garbage"]))
        n = draw(st.integers(min_value=1, max_value=4))
        recs = [bytes(draw(st.integers(0, 200))) for _ in range(n)]
        epoch, seg, first = 2, 5, txid
        if kind == "commit":
            parts.append(wire.encode_commit(draw(st.sampled_from([1, 2, 3])), draw(st.integers(-1, 50))))
            continue
        if kind == "garbage":
            parts.append(draw(st.binary(min_size=4, max_size=80)))
            continue
        if kind == "epoch":
            epoch = draw(st.sampled_from([1, 3]))
        elif kind == "segment":
            seg = draw(st.sampled_from([1, 9]))
            first = max(first, seg)
        elif kind == "gap":
            first += draw(st.integers(1, 3))
        f = bytearray(framing.encode_frame(recs, epoch=epoch, segment_txid=seg, first_txid=first))
        if kind == "corrupt":
            f[draw(st.integers(0, len(f) - 1))] ^= draw(st.integers(1, 255))
        parts.append(bytes(f))
        txid = first + n
    return b"".join(parts)


def gate_run(gmod: Any, fmod: Any, data: bytes) -> tuple[Any, ...]:
    """The node's loop (data.py) on ``data`` sent whole, up to the first message the gate refuses."""
    writer, mine = socket.socketpair()
    writer.sendall(data)
    writer.shutdown(socket.SHUT_WR)
    app = _MemAppender()
    gate = gmod.WriteGate(app, 5, bounds=(0.001, 1.0))
    gate.epoch = 2
    rx = fmod.Receiver(mine, 4096)
    rx.hello()
    statuses = []
    refused = None
    while rx.wait_run():
        statuses.append(rx.journal_run(gate))
        if statuses[-1] == 0:
            refused = outcome(rx.next_run)
            break
    mine.close()
    acks = b""
    while chunk := writer.recv(1 << 16):  # to the end the receiver's close makes
        acks += chunk
    writer.close()
    stats = gate.take_stats()
    return (
        statuses, refused, acks, gate.next_txid, gate.last_epoch, gate.noticed, gate.take_index(),
        stats[:4], bytes(app.data), app.durable,
    )  # fmt: skip


@PARITY
@given(data=gate_streams())
def test_the_gates_pass_refuse_write_and_ack_the_same(data: bytes) -> None:
    assert gate_run(gate_c, fo_c, data) == gate_run(gate_py, fo_py, data)


def events_put(events: queue.Queue[tuple[int, int, str, object]]) -> Callable[..., None]:
    return lambda *a: events.put(a)


# -- fanout: the engines -------------------------------------------------------------------------


def engine_run(mod: Any, sizes: list[int], acks: list[int], max_count: int, max_bytes: int) -> tuple[Any, ...]:
    f = mod.Fanout()
    events: queue.Queue[tuple[int, int, str, object]] = queue.Queue()
    t = threading.Thread(target=f.run, args=(lambda *a: events.put(a),), daemon=True)
    t.start()
    mine, node = socket.socketpair()
    link = f.add_link(mine, max_count=max_count, max_bytes=max_bytes)
    codes = [
        f.send(link, framing.encode_frame([bytes(n)], epoch=1, segment_txid=1, first_txid=i + 1), i + 1)
        for i, n in enumerate(sizes)
    ]
    failed = 1 in codes
    final = max(acks, default=0)
    if failed:
        ev = events.get(timeout=10)
        while ev[2] == "":
            ev = events.get(timeout=10)
        report: tuple[Any, ...] = ev[1:]
    else:
        for a in acks:
            node.sendall(wire.encode_ack(a))
        report = (0, "", None)
        while report[0] != final:
            report = events.get(timeout=10)[1:]
    state = (f.acked(link), f.inflight(link)) if not failed else None
    f.stop()
    t.join(10)
    f.close()
    mine.close()
    node.close()
    return codes, report, state


@PARITY
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=2000), min_size=1, max_size=30),
    acks=st.lists(st.integers(min_value=1, max_value=40), max_size=10),
    max_count=st.integers(min_value=1, max_value=40),
    max_bytes=st.integers(min_value=1, max_value=40_000),
)
def test_engines_agree_on_windows_and_acks(sizes: list[int], acks: list[int], max_count: int, max_bytes: int) -> None:
    assert engine_run(fo_c, sizes, acks, max_count, max_bytes) == engine_run(fo_py, sizes, acks, max_count, max_bytes)


@PARITY
@given(acks=st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=7))
def test_quorum_count_matches_the_majority_rule(acks: list[int]) -> None:
    def dumb(values: list[int]) -> int:
        """The largest txid that at least majority(n) links have acknowledged."""
        return max((t for t in [0, *values] if sum(v >= t for v in values) >= majority(len(values))), default=0)

    for mod in (fo_c, fo_py):
        f = mod.Fanout()
        pairs = [socket.socketpair() for _ in acks]
        links = [f.add_link(m) for m, _ in pairs]
        events: queue.Queue[tuple[int, int, str, object]] = queue.Queue()
        t = threading.Thread(target=f.run, args=(events_put(events),), daemon=True)
        t.start()
        for (_, node), a in zip(pairs, acks, strict=True):
            node.sendall(wire.encode_ack(a))
        want = {link: a for link, a in zip(links, acks, strict=True) if a}
        while want:
            link, acked, _, _ = events.get(timeout=10)
            if want.get(link) == acked:
                del want[link]
        assert f.quorum_txid(links) == (dumb(acks) if acks else 0)
        f.stop()
        t.join(10)
        f.close()
        for m, n in pairs:
            m.close()
            n.close()
