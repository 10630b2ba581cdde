"""Ports for test nodes that stay theirs while the node is down.

A test cluster keeps each node's ports across a kill and restart, so for the seconds a node is
down its ports are free to any bind. ``free_port`` therefore hands out ports below the kernel's
ephemeral range (no outgoing connection takes one) and records each in a claims directory shared
by every process of this user on the machine: another test process (a second pytest worker, a
Spark executor) skips a port a live process has claimed, even while nothing is bound to it. A
claim lasts as long as the process that made it; one left by a dead process is taken over.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import random
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

CLAIMS_DIR = os.path.join(tempfile.gettempdir(), f"qjm-test-ports-{os.getuid()}")

_handed_out: set[int] = set()
_claims_usable = True  # False once the directory turned out unwritable: then this process alone keeps count


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = f.read().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port below the kernel's ephemeral range that is free now and that neither this process nor
    another live one has handed out before."""
    lo, _hi = _ephemeral_range()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, lo - 20000), lo)
        if port in _handed_out:
            continue  # free now, but promised to a node of this process that is not running yet
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        if not _claim(port):
            continue  # promised to a node of another process that is down for the moment
        _handed_out.add(port)
        return port
    raise OSError(f"no free port found below {lo}")


@contextmanager
def _claims_locked() -> Iterator[None]:
    os.makedirs(CLAIMS_DIR, mode=0o700, exist_ok=True)
    with open(os.path.join(CLAIMS_DIR, "lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _claim(port: int) -> bool:
    """Record ``port`` as this process's unless a live process holds it."""
    global _claims_usable
    if not _claims_usable:
        return True
    try:
        with _claims_locked():
            path = os.path.join(CLAIMS_DIR, str(port))
            owner = _owner(path)
            if owner is not None and owner != os.getpid() and _alive(owner):
                return False
            with open(path, "w") as f:
                f.write(str(os.getpid()))
            return True
    except OSError:
        _claims_usable = False  # a read-only or foreign temporary directory: the bind probe still protects
        return True


def _owner(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


@atexit.register
def _release() -> None:
    """Drop this process's claims, so the directory holds only those of live processes (and of
    processes that were killed, which the next claim of the port takes over)."""
    if not _handed_out or not _claims_usable:
        return
    pid = os.getpid()
    try:
        with _claims_locked():
            for port in _handed_out:
                path = os.path.join(CLAIMS_DIR, str(port))
                if _owner(path) == pid:
                    os.unlink(path)
    except OSError:
        pass  # the claims are then taken over as a dead process's
