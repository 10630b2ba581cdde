"""The control plane's floor for a takeover: qjm's rounds over bare gRPC, the node's disk work in each.

A takeover by a cold process is four control rounds, each done once two of three nodes answer:
get_journal_state, new_epoch, finalize_log_segment, start_log_segment; then the first batch. The
floor keeps exactly that shape and drops everything else. Three server processes
(``python -m qjm.bench.control_floor serve DIR``) each run a gRPC server of one bytes-in,
bytes-out method with no protocol, no journal and no qjm code but ``TakeoverDisk``: each round's
handler does the disk work a node does in that round (``qjm.bench.floor.TakeoverDisk``; the first
commit's append and fdatasync are folded into the start round, which saves the first batch's own
round trip, so the figure stays a lower bound). A fresh process
(``python -m qjm.bench.control_floor cold ...``, gRPC imported before the clock starts, as in
``qjm bench``'s cold failover) makes three channels with qjm's client options and runs the rounds:
each node gets a round once the previous round had its quorum and that node had answered it, as
qjm's writer sends them (one ordered executor per node). It reports the time from making the
channels to the fourth round's quorum.

The same servers answer the rounds with no disk work too, which leaves what the gRPC rounds of a
cold process cost on this machine by themselves. And each server also answers the same rounds, with
the same disk work, over a plain TCP socket (one line per request and per reply,
``python -m qjm.bench.control_floor cold-socket ...``): what a takeover costs from a cold process
when its rounds travel by a transport without gRPC's per-call cost, one connection per node, made
inside the timed span.
"""

from __future__ import annotations

import os
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent import futures
from typing import Any, Final

from qjm.bench.floor import TakeoverDisk
from qjm.bench.workload import FULL, SMOKE, iqr, progress

METHOD: Final = "/qjm.bench.ControlFloor/Round"
ROUNDS: Final = (b"G", b"N", b"F", b"S")  # get_journal_state, new_epoch, finalize, start (+ first commit)
WARMUP: Final = 1  # cold takeovers of each kind run before the counted ones
TIMEOUT: Final = 30.0


def serve(directory: str) -> None:
    """Serve the rounds for one node directory; prints its gRPC port and its socket port on one
    line, then serves until killed."""
    import grpc

    disk = TakeoverDisk(directory)
    lock = threading.Lock()  # a node does one takeover step at a time, as the journal's lock makes it

    def step(request: bytes) -> None:
        what, k, with_disk = request.split()
        if with_disk == b"1":
            with lock:
                if what == b"N":
                    disk.promise(int(k))
                elif what == b"F":
                    disk.finalize(int(k))
                elif what == b"S":
                    disk.start(int(k))
                    disk.first_commit()
                    disk.release()

    def handle(request: bytes, context: Any) -> bytes:
        step(request)
        return b"ok"

    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_serve_sockets, args=(listener, step), daemon=True).start()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service, method = METHOD.lstrip("/").split("/")
    handler = grpc.method_handlers_generic_handler(service, {method: grpc.unary_unary_rpc_method_handler(handle)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, listener.getsockname()[1], flush=True)
    server.wait_for_termination()


def _serve_sockets(listener: socket.socket, step: Any) -> None:
    """The rounds over plain TCP: a thread per connection, a request line in, ``ok`` or ``error
    WHY`` out."""

    def conn(sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with sock, sock.makefile("rb") as lines:
            for line in lines:
                try:
                    step(line)
                    reply = b"ok\n"
                except Exception as e:  # the client reports it: a failed round is no figure
                    reply = f"error {type(e).__name__}: {e}".replace("\n", " ").encode() + b"\n"
                sock.sendall(reply)

    while True:
        sock, _ = listener.accept()
        threading.Thread(target=conn, args=(sock,), daemon=True).start()


def cold(k: int, with_disk: bool, ports: list[int]) -> float:
    """One takeover's rounds from this process (gRPC imported, no channel made yet); seconds to the
    last round's quorum. Returns after every node answered the last round (untimed), so that the
    next takeover finds every node done with this one."""
    import grpc

    from qjm.protocol.rpcmeta import CLIENT_GRPC_OPTIONS

    lock = threading.RLock()  # a future already done runs its callback at once, in the caller
    sent = [-1] * len(ports)  # the last round sent to each node
    answered = [-1] * len(ports)  # the last round each node answered
    released = [0]  # the rounds the writer has let go: round r once round r - 1 had its quorum
    replies = [0] * len(ROUNDS)
    quorum = [threading.Event() for _ in ROUNDS]
    everyone = threading.Event()
    failures: list[str] = []
    need = len(ports) // 2 + 1

    t0 = time.perf_counter()
    calls = [
        grpc.insecure_channel(f"127.0.0.1:{p}", options=CLIENT_GRPC_OPTIONS).unary_unary(METHOD, None, None)
        for p in ports
    ]

    def send(i: int, r: int) -> None:
        sent[i] = r
        f = calls[i].future(b"%s %d %d" % (ROUNDS[r], k, with_disk), timeout=TIMEOUT)
        f.add_done_callback(lambda f: answer(i, r, f))

    def answer(i: int, r: int, f: Any) -> None:
        with lock:
            if f.exception() is not None:
                failures.append(f"node {i} round {ROUNDS[r].decode()}: {f.exception()}")
                for e in (*quorum, everyone):
                    e.set()
                return
            answered[i] = r
            replies[r] += 1
            if replies[r] == need:
                quorum[r].set()
            if r + 1 < len(ROUNDS) and released[0] > r:
                send(i, r + 1)
            if r + 1 == len(ROUNDS) and replies[r] == len(ports):
                everyone.set()

    with lock:
        for i in range(len(ports)):
            send(i, 0)
    for r in range(len(ROUNDS)):
        if not quorum[r].wait(TIMEOUT) or failures:
            raise RuntimeError(failures[0] if failures else f"round {ROUNDS[r].decode()}: no quorum in {TIMEOUT:g} s")
        if r + 1 < len(ROUNDS):
            with lock:
                released[0] = r + 1
                for i in range(len(ports)):
                    if answered[i] == r and sent[i] == r:
                        send(i, r + 1)
    took = time.perf_counter() - t0
    if not everyone.wait(TIMEOUT) or failures:
        raise RuntimeError(failures[0] if failures else "a node did not answer the last round")
    return took


def cold_socket(k: int, ports: list[int]) -> float:
    """``cold``'s takeover, with the disk work, over plain TCP sockets: one connection per node,
    made inside the timed span, and the same rule for sending each node its rounds."""
    need = len(ports) // 2 + 1
    sent = [-1] * len(ports)
    answered = [-1] * len(ports)
    replies = [0] * len(ROUNDS)
    released = 0  # round r is let go once round r - 1 had its quorum
    buffered = [b""] * len(ports)
    deadline = time.monotonic() + TIMEOUT
    took = 0.0

    t0 = time.perf_counter()
    socks = [socket.create_connection(("127.0.0.1", p), timeout=TIMEOUT) for p in ports]
    sel = selectors.DefaultSelector()
    try:
        for i, s in enumerate(socks):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sel.register(s, selectors.EVENT_READ, i)

        def send(i: int, r: int) -> None:
            sent[i] = r
            socks[i].sendall(b"%s %d 1\n" % (ROUNDS[r], k))

        for i in range(len(ports)):
            send(i, 0)
        while answered.count(len(ROUNDS) - 1) < len(ports):
            if time.monotonic() > deadline:
                raise RuntimeError(f"round {ROUNDS[min(answered) + 1].decode()}: no answer in {TIMEOUT:g} s")
            for key, _ in sel.select(1.0):
                i = key.data
                data = socks[i].recv(4096)
                if not data:
                    raise RuntimeError(f"node {i} closed the connection in round {ROUNDS[sent[i]].decode()}")
                buffered[i] += data
                while b"\n" in buffered[i]:
                    line, buffered[i] = buffered[i].split(b"\n", 1)
                    r = answered[i] + 1
                    if line != b"ok":
                        raise RuntimeError(f"node {i} round {ROUNDS[r].decode()}: {line.decode(errors='replace')}")
                    answered[i] = r
                    replies[r] += 1
                    if replies[r] == need:
                        if r + 1 == len(ROUNDS):
                            took = time.perf_counter() - t0
                        else:
                            released = r + 1
                            for j in range(len(ports)):
                                if answered[j] == r and sent[j] == r:
                                    send(j, r + 1)
                    elif r + 1 < len(ROUNDS) and released > r:
                        send(i, r + 1)
    finally:
        sel.close()
        for s in socks:
            s.close()
    return took


def start_server(directory: str) -> tuple[subprocess.Popen[str], int, int]:
    """A node of the floor serving ``directory`` in its own process: (the process, its gRPC port,
    its socket port)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "qjm.bench.control_floor", "serve", directory],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()  # the two ports, or nothing when the server could not start
    if len(line) != 2 or not all(p.isdigit() for p in line):
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"qjm bench: control floor server did not start:\n{err[-4000:]}")
    return proc, int(line[0]), int(line[1])


def cold_run(k: int, with_disk: bool, ports: list[int], *, over_sockets: bool = False) -> float:
    """Takeover ``k`` by a fresh process (``cold``, or ``cold_socket`` to the socket ports); its seconds."""
    argv = [sys.executable, "-m", "qjm.bench.control_floor"]
    if over_sockets:
        argv += ["cold-socket", str(k), *map(str, ports)]
    else:
        argv += ["cold", str(k), str(int(with_disk)), *map(str, ports)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"qjm bench: control floor takeover failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def run_control_floor(base: str, smoke: bool) -> dict[str, Any]:
    """The takeover's floor in this run: over bare gRPC, ``cold_p50_ms`` (the node's disk work in
    each round) and ``cold_nodisk_p50_ms`` (none); over plain sockets, ``cold_socket_p50_ms`` (the
    disk work); each the median of ``cold_failovers`` cold processes after a warm-up one, the kinds
    taking turns; ``spread`` holds each one's interquartile range and runs.

    Each takeover with disk work finalizes the segment the one before it started, whichever
    transport carried it: repetition ``n`` is takeover ``2n`` over gRPC and ``2n + 1`` over sockets."""
    cfg = SMOKE if smoke else FULL
    reps = WARMUP + int(cfg["cold_failovers"])
    servers: list[subprocess.Popen[str]] = []
    runs: dict[str, list[float]] = {"cold_p50_ms": [], "cold_nodisk_p50_ms": [], "cold_socket_p50_ms": []}
    try:
        grpc_ports, socket_ports = [], []
        for i in range(3):
            proc, port, sport = start_server(os.path.join(base, f"control-{i}"))
            servers.append(proc)
            grpc_ports.append(port)
            socket_ports.append(sport)
        progress(
            f"{reps} cold takeovers of each kind: over gRPC with the disk work and without, over plain sockets "
            f"with it ({WARMUP} not counted)"
        )
        for n in range(reps):
            for key, k, ports, with_disk, over_sockets in (
                ("cold_p50_ms", 2 * n, grpc_ports, True, False),
                ("cold_nodisk_p50_ms", 2 * n, grpc_ports, False, False),
                ("cold_socket_p50_ms", 2 * n + 1, socket_ports, True, True),
            ):
                took = cold_run(k, with_disk, ports, over_sockets=over_sockets) * 1e3
                if n >= WARMUP:
                    runs[key].append(took)
    finally:
        for proc in servers:
            proc.kill()
            proc.communicate()
    out: dict[str, Any] = {key: statistics.median(values) for key, values in runs.items()}
    out["spread"] = {key: iqr(values) for key, values in runs.items()}
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "serve":
        serve(argv[1])
        return 0
    if len(argv) == 6 and argv[0] == "cold":
        print(cold(int(argv[1]), argv[2] == "1", [int(p) for p in argv[3:]]))
        return 0
    if len(argv) == 5 and argv[0] == "cold-socket":
        print(cold_socket(int(argv[1]), [int(p) for p in argv[2:]]))
        return 0
    print(
        "usage: python -m qjm.bench.control_floor serve DIR | cold K 0|1 PORT PORT PORT | cold-socket K PORT PORT PORT",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
