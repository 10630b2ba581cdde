"""The Python floors of ``qjm bench``: the C networked floor's round, run by Python processes.

    python -m qjm.bench.pyfloor py|bare DIR ROUNDS

Both commit ROUNDS 1 KiB commits (the first ``WARMUP`` not counted) to two of three receiver
processes forked on loopback TCP, as ``bench/netfloor``'s ``net`` mode does in C: one Python thread
at each end, the writer sending each commit to the three receivers one after another, then waiting
with ``select`` until two have acked it; each receiver appends it with qjm's segment appender
(``qjm._native.segment_io``: O_DIRECT, preallocated, ``pwrite`` + ``fdatasync`` with the GIL
released, the code a JournalNode appends with) and acks it.

- ``py``: no protocol: a fixed-size 1,088-byte message (an 8-byte round number, 1,080 random
  bytes), acked with its round number. What Python processes cost over C.
- ``bare``: qjm's data-plane wire without qjm's protocol: a hello, then one qjm frame a commit
  (header, checksum), each receiver running qjm's native ``Receiver``, frame check and appender in
  one thread and acking the frame's last txid as a node does. No ``Journal``, no JournalNode, no
  fencing, no commit notices, no writer state. What a qjm whose writer and nodes are Python
  processes could reach if its protocol cost nothing: the sync goal's ratio set beside it tells
  how much of the goal is left for the protocol (``qjm.bench.report.sync_goals``).

Output: one JSON line, as netfloor's: the counted rounds' p50, p90 and p99 in µs, and ``cpu_us``,
the CPU (user + system) of the writer and its three receivers per round, from the first fork to
the last receiver's exit, warm-up rounds included, as netfloor's is counted. A measuring tool,
not a test: nothing here asserts a time.
"""

from __future__ import annotations

import json
import os
import resource
import select
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Final

from qjm._native import fanout, framing, segment_io
from qjm.bench.workload import PYTHON_FLOORS, pct
from qjm.protocol import wire

MODES: Final = PYTHON_FLOORS
MESSAGE: Final = 1088  # py's message: what netfloor.c sends
RECORD: Final = 1024  # bare's record: one a frame, 1,088 bytes with the frame's header
WARMUP: Final = 200  # rounds run before any is counted, as netfloor.c does
_ROUND: Final = struct.Struct("<Q")


def commit_rounds(
    socks: Sequence[socket.socket], message: Callable[[int], bytes], rounds: int, ack_size: int,
    check_ack: Callable[[int, bytes], None] | None = None,
) -> list[float]:  # fmt: skip
    """Send ``message(r)`` to every socket for each round ``r``, then ``select`` until two of them
    have acked it; returns the counted rounds' latencies in seconds (the first ``WARMUP`` rounds are
    not counted).

    Each socket acks every message in order with ``ack_size`` bytes, so one that has sent r + 1
    acks has acked round r; the third receiver's acks are read when they come, as netfloor.c
    drains them. ``check_ack(i, ack)`` sees each whole ack of socket ``i`` and raises to refuse it."""
    acks = [0] * len(socks)
    bufs = [bytearray() for _ in socks]
    lat: list[float] = []
    for r in range(rounds):
        msg = message(r)
        t = time.perf_counter()
        for s in socks:
            s.sendall(msg)
        while sum(n > r for n in acks) < 2:
            ready, _, _ = select.select(socks, [], [])
            for s in ready:
                i = socks.index(s)
                data = s.recv(65536)
                if not data:
                    raise RuntimeError(f"receiver {i} hung up")
                buf = bufs[i]
                buf += data
                while len(buf) >= ack_size:
                    if check_ack is not None:
                        check_ack(i, bytes(buf[:ack_size]))
                    del buf[:ack_size]
                    acks[i] += 1
        if r >= WARMUP:
            lat.append(time.perf_counter() - t)
    return lat


def _py_receiver(sock: socket.socket, path: str) -> None:
    app = segment_io.Appender(path, bytes(64))
    buf = bytearray()
    while True:
        data = sock.recv(65536)
        if not data:
            return
        buf += data
        while len(buf) >= MESSAGE:
            msg = bytes(buf[:MESSAGE])
            del buf[:MESSAGE]
            app.append(msg)
            app.sync()
            sock.sendall(msg[: _ROUND.size])


def _bare_receiver(sock: socket.socket, path: str) -> None:
    rx = fanout.Receiver(sock)
    try:
        if rx.hello() is None:
            return
        app = segment_io.Appender(path, framing.encode_segment_header(1, 1))
        while True:
            run = rx.next_run()
            if run is None:
                return
            last = 0
            for frame in run[0]:
                _, _, _, last = framing.verify_frame_ids(frame)
                app.append(frame)
            if last:
                app.sync()
                rx.ack(last)
    finally:
        rx.close()


def check_ack(i: int, ack: bytes) -> None:
    """``commit_rounds``'s ``check_ack`` for qjm's data plane: an ERROR (or anything but an ACK)
    from receiver ``i`` ends the run, naming what it said."""
    if ack[: len(wire.ACK_MAGIC)] != wire.ACK_MAGIC:
        said, _ = wire.parse_reply(bytearray(ack))
        raise RuntimeError(f"receiver {i} answered {said if said is not None else ack!r} instead of an ack")


def _cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


def measure(mode: str, directory: str, rounds: int) -> dict[str, float]:
    """Run ``mode``'s round ``rounds`` times (warm-up included) with segment files in ``directory``;
    returns ``p50_us``, ``p90_us`` and ``p99_us`` of the counted rounds, and ``cpu_us``, the CPU of
    the writer and its receivers from the first fork on, per round (warm-up rounds included)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if rounds <= WARMUP:
        raise ValueError(f"rounds must be more than the {WARMUP} warm-up rounds, not {rounds}")
    receiver = _py_receiver if mode == "py" else _bare_receiver
    paths = [os.path.join(directory, f"pyfloor-{mode}-{i}") for i in range(3)]
    socks: list[socket.socket] = []
    pids: list[int] = []
    start = resource.getrusage(resource.RUSAGE_SELF)
    cpu = 0.0
    try:
        for path in paths:
            a, b = _pair()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the receiver's process
                a.close()
                code = 0
                try:
                    receiver(b, path)
                except ConnectionError:
                    pass  # the writer closed with acks unread: the end of the run
                except BaseException:
                    traceback.print_exc()
                    code = 1
                finally:
                    os._exit(code)
            b.close()
            socks.append(a)
            pids.append(pid)
        if mode == "py":
            payload = os.urandom(MESSAGE - _ROUND.size)
            lat = commit_rounds(socks, lambda r: _ROUND.pack(r) + payload, rounds, _ROUND.size)
        else:
            for s in socks:
                s.sendall(wire.encode_hello("pyfloor"))
            record = os.urandom(RECORD)
            lat = commit_rounds(
                socks, lambda r: framing.encode_frame([record], epoch=1, segment_txid=1, first_txid=r + 1), rounds,
                wire.ACK.size, check_ack,
            )  # fmt: skip
        cpu = _cpu(resource.getrusage(resource.RUSAGE_SELF)) - _cpu(start)
    finally:
        for s in socks:
            s.close()
        for pid in pids:
            _, status, usage = os.wait4(pid, 0)
            cpu += _cpu(usage)
            if status != 0:
                raise RuntimeError(f"a receiver failed (wait status {status})")
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    cpu /= rounds
    return {
        "p50_us": round(pct(lat, 0.5) * 1e6, 1), "p90_us": round(pct(lat, 0.9) * 1e6, 1),
        "p99_us": round(pct(lat, 0.99) * 1e6, 1), "cpu_us": round(cpu * 1e6, 1),
    }  # fmt: skip


def main(argv: list[str]) -> int:
    usage = f"usage: python -m qjm.bench.pyfloor py|bare DIR ROUNDS (ROUNDS: a whole number > {WARMUP})"
    if len(argv) != 3 or argv[0] not in MODES or not argv[2].isdigit() or int(argv[2]) <= WARMUP:
        print(usage, file=sys.stderr)
        return 2
    mode, directory, rounds = argv[0], argv[1], int(argv[2])
    if not os.path.isdir(directory):
        print(f"pyfloor: {directory!r} is not a directory", file=sys.stderr)
        return 2
    try:
        result = measure(mode, directory, rounds)
    except (OSError, RuntimeError) as e:
        print(f"pyfloor {mode}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"mode": mode, "rounds": rounds, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
