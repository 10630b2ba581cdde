"""Process-wide client resources: per-node call order on shared threads, shared channels, fork."""

from __future__ import annotations

import os
import threading
from concurrent.futures import CancelledError

import pytest

from qjm.client import shared
from qjm.testing.util import eventually

OPTS = (("grpc.enable_retries", 0),)


def test_serial_executor_runs_calls_one_at_a_time_in_order() -> None:
    ex = shared.SerialExecutor()
    gate = threading.Event()
    order: list[int] = []
    running = 0
    overlap = False
    lock = threading.Lock()

    def call(i: int) -> int:
        nonlocal running, overlap
        with lock:
            running += 1
            overlap |= running > 1
        if i == 0:
            assert gate.wait(10)  # the first call blocks; the rest must queue behind it
        order.append(i)
        with lock:
            running -= 1
        return i * i

    futs = [ex.submit(lambda i=i: call(i)) for i in range(50)]
    assert not any(f.done() for f in futs[1:])
    gate.set()
    assert [f.result(10) for f in futs] == [i * i for i in range(50)]
    assert order == list(range(50))
    assert not overlap


def test_serial_executor_reports_errors_and_goes_on() -> None:
    ex = shared.SerialExecutor()

    def boom() -> int:
        raise ValueError("node said no")

    bad = ex.submit(boom)
    good = ex.submit(lambda: 7)
    with pytest.raises(ValueError, match="node said no"):
        bad.result(10)
    assert good.result(10) == 7


def test_serial_executor_shutdown_cancels_the_queued_and_refuses_new() -> None:
    ex = shared.SerialExecutor()
    gate = threading.Event()
    started = threading.Event()

    def first() -> int:
        started.set()
        assert gate.wait(10)
        return 1

    running = ex.submit(first)
    assert started.wait(10)
    queued = ex.submit(lambda: 2)
    ex.shutdown(cancel_futures=True)
    with pytest.raises(CancelledError):
        queued.result(10)
    with pytest.raises(RuntimeError):
        ex.submit(lambda: 3)
    gate.set()
    assert running.result(10) == 1  # a running call finishes


def test_pooled_executor_runs_side_by_side_and_cancels_on_shutdown() -> None:
    ex = shared.PooledExecutor()
    barrier = threading.Barrier(3, timeout=10)
    futs = [ex.submit(barrier.wait) for _ in range(3)]  # would deadlock if they ran one at a time
    assert sorted(f.result(10) for f in futs) == [0, 1, 2]
    ex.shutdown(cancel_futures=True)
    with pytest.raises(RuntimeError):
        ex.submit(lambda: 1)


def test_channels_are_shared_and_closed_with_their_last_user() -> None:
    addr = "127.0.0.1:1"  # never dialled: a channel connects lazily
    a, stub_a = shared.acquire_channel(addr, OPTS)
    b, stub_b = shared.acquire_channel(addr, OPTS)
    assert a is b and stub_a is stub_b and shared.channel_users(addr, OPTS) == 2
    assert shared.acquire_channel(addr, (("grpc.enable_retries", 1),))[0] is not a  # other options, other channel
    shared.release_channel(addr, (("grpc.enable_retries", 1),))
    shared.release_channel(addr, OPTS)
    assert shared.channel_users(addr, OPTS) == 1
    shared.release_channel(addr, OPTS)
    assert shared.channel_users(addr, OPTS) == 0
    c, _ = shared.acquire_channel(addr, OPTS)
    assert c is not a  # the closed one is not handed out again
    shared.release_channel(addr, OPTS)


def test_a_forked_child_builds_its_own_pool_and_channels() -> None:
    """Threads do not survive fork() and gRPC channels must not cross it: the child starts afresh."""
    addr = "127.0.0.1:2"
    shared.acquire_channel(addr, OPTS)
    assert shared.SerialExecutor().submit(lambda: 1).result(10) == 1  # the parent's pool has threads
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report, then leave without running the parent's atexit handlers
        try:
            ok = shared.channel_users(addr, OPTS) == 0 and shared.SerialExecutor().submit(lambda: 41).result(10) == 41
            os.write(w, b"ok" if ok else b"bad")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 16)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"ok"
    assert shared.channel_users(addr, OPTS) == 1  # the parent's state is untouched
    shared.release_channel(addr, OPTS)


def test_workers_are_kept_and_reused() -> None:
    w = shared._Workers(64)
    for _ in range(200):
        ev = threading.Event()
        w.run(ev.set)
        assert ev.wait(10)
        # a finished thread is idle again only just after its job signalled: wait for that, or a
        # stalled thread (a loaded machine) makes the next job spawn another
        eventually(lambda: w._idle == w._threads, what="the thread idle again")
    assert w._threads == 1


def test_workers_beyond_the_limit_wait_their_turn() -> None:
    w = shared._Workers(2)
    gate = threading.Event()
    started = threading.Semaphore(0)
    finished = threading.Semaphore(0)

    def job() -> None:
        started.release()
        assert gate.wait(10)
        finished.release()

    for _ in range(5):
        w.run(job)
    assert started.acquire(timeout=10) and started.acquire(timeout=10)
    assert not started.acquire(timeout=0.2)  # a third job has no thread while two block
    gate.set()
    for _ in range(5):
        assert finished.acquire(timeout=10)
    assert w._threads == 2


def test_workers_do_not_count_a_thread_twice_after_a_backlog() -> None:
    """Jobs queued at the limit are taken by the threads that free up, which then do not also count
    as idle: afterwards a new job still gets a new thread while one is allowed."""
    w = shared._Workers(3)
    gate = threading.Event()
    running = threading.Semaphore(0)

    def blocked() -> None:
        running.release()
        assert gate.wait(10)

    for _ in range(3):
        w.run(blocked)
    for _ in range(3):
        assert running.acquire(timeout=10)
    done = threading.Semaphore(0)
    w.run(done.release)  # backlog: every thread is busy and none may be added
    gate.set()
    assert done.acquire(timeout=10)
    # three threads, each now idle or about to be; three jobs that must run at the same time
    together = threading.Barrier(3, timeout=10)
    finished = threading.Semaphore(0)

    def meet() -> None:
        together.wait()
        finished.release()

    for _ in range(3):
        w.run(meet)
    for _ in range(3):
        assert finished.acquire(timeout=10)
    assert w._threads == 3
