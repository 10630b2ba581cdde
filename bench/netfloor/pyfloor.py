"""pyfloor: netfloor's `net` mode with Python at both ends and no protocol, to tell apart what a
Python host costs from what qjm's own per-commit work costs.

    python bench/netfloor/pyfloor.py DIR [ROUNDS]

A writer and three forked receiver processes on loopback TCP, as in netfloor.c's `net` mode: the
writer sends a 1,088-byte message (an 8-byte round number, 1,080 random bytes) to the three
receivers one after another, then waits with ``select`` in its own thread until two have acked.
Each receiver ``recv``s, appends the message with qjm's own segment appender
(``qjm._native.segment_io.Appender``: O_DIRECT, preallocated, ``pwrite`` + ``fdatasync`` with the
GIL released, the code a JournalNode appends with) and sends back the round number. No framing
beyond a fixed size, no checksum, no fencing, no commit notices, no threads besides each process's
main one. The first 200 rounds are not counted.

Output: one JSON line, as netfloor.c's: p50/p90/p99 in µs, and the CPU (user + system) that the
writer and its three receivers used per round. Run it beside ``netfloor net`` and a qjm sync loop
(``bench/sync_timeline.py``), interleaved: the three share the machine's noise. A measuring tool,
not a test: nothing here asserts a time.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import sys
import time

from qjm._native import segment_io
from qjm.bench.workload import cpu_seconds

MSG = 1088
WARMUP = 200


def _receiver(sock: socket.socket, path: str) -> None:
    app = segment_io.Appender(path, bytes(64))
    buf = bytearray()
    while True:
        data = sock.recv(65536)
        if not data:
            return
        buf += data
        while len(buf) >= MSG:
            msg = bytes(buf[:MSG])
            del buf[:MSG]
            app.append(msg)
            app.sync()
            sock.sendall(msg[:8])


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        a = socket.create_connection(lsock.getsockname())
        b, _ = lsock.accept()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


def _cpu_seconds(pids: list[int]) -> float:
    return sum(cpu_seconds(pids))  # this process and the receivers


def main(directory: str, rounds: int) -> None:
    try:
        os.makedirs(directory, exist_ok=True)
        segment_io.Appender(os.path.join(directory, "pyfloor-probe"), bytes(64)).close()
        os.unlink(os.path.join(directory, "pyfloor-probe"))
    except OSError as e:
        sys.exit(f"pyfloor: cannot append in {directory}: {e}")
    socks: list[socket.socket] = []
    pids: list[int] = []
    for i in range(3):
        a, b = _pair()
        pid = os.fork()
        if pid == 0:
            a.close()
            try:
                _receiver(b, os.path.join(directory, f"pyfloor-{i}"))
            finally:
                os._exit(0)
        b.close()
        socks.append(a)
        pids.append(pid)
    payload = os.urandom(MSG - 8)
    lat: list[float] = []
    acks = [0, 0, 0]  # acks read from each receiver
    partial = [0, 0, 0]  # bytes of an ack not read whole yet
    cpu0 = 0.0
    try:
        for r in range(rounds + WARMUP):
            if r == WARMUP:
                cpu0 = _cpu_seconds(pids)
            msg = struct.pack("<Q", r) + payload
            t = time.perf_counter()
            for s in socks:
                s.sendall(msg)
            # Acks come in order on each connection: one that has sent r + 1 acks has acked round
            # r. The third receiver's ack is read when it comes, as netfloor.c drains it.
            while sum(n > r for n in acks) < 2:
                ready, _, _ = select.select(socks, [], [])
                for s in ready:
                    i = socks.index(s)
                    got = len(s.recv(65536))
                    if not got:
                        raise RuntimeError("pyfloor: a receiver hung up")
                    partial[i] += got
                    acks[i] += partial[i] // 8
                    partial[i] %= 8
            if r >= WARMUP:
                lat.append(time.perf_counter() - t)
        cpu = (_cpu_seconds(pids) - cpu0) / rounds
    finally:
        for s in socks:
            s.close()
        for pid in pids:
            os.waitpid(pid, 0)
        for i in range(3):
            try:
                os.unlink(os.path.join(directory, f"pyfloor-{i}"))
            except FileNotFoundError:
                pass
    lat.sort()

    def pct(q: float) -> float:
        return round(lat[min(len(lat) - 1, int(len(lat) * q))] * 1e6, 1)

    print(json.dumps({"mode": "pyfloor", "rounds": rounds, "p50_us": pct(0.5), "p90_us": pct(0.9),
                      "p99_us": pct(0.99), "cpu_us": round(cpu * 1e6, 1)}))  # fmt: skip


if __name__ == "__main__":
    usage = "usage: python bench/netfloor/pyfloor.py DIR [ROUNDS] (ROUNDS: a whole number >= 1, default 3000)"
    if not 2 <= len(sys.argv) <= 3 or (len(sys.argv) == 3 and not (sys.argv[2].isdigit() and int(sys.argv[2]) >= 1)):
        sys.exit(usage)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3000)
