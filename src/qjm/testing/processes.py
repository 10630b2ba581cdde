"""Child processes the test harness starts (nodes, Prometheus): waiting for a node's ready line,
and stopping one."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from typing import Any

__all__ = ["NotReady", "read_ready_line", "stop_process"]


class NotReady(RuntimeError):
    """The child wrote no ready line: not within the time allowed, or it exited first."""


def read_ready_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The first line ``proc`` writes on its stdout pipe (a node's ``READY ...``), within ``timeout`` s.

    Raises ``NotReady`` ("not ready in N s", "exited with CODE"); the child is left running in the
    first case, for the caller to stop.
    """
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise NotReady(f"not ready in {timeout:g} s")
            b = os.read(proc.stdout.fileno(), 4096)
            if not b:
                raise NotReady(f"exited with {proc.wait()}")
            line += b
    return line


def stop_process(proc: subprocess.Popen[Any], grace: float) -> None:
    """Ask ``proc`` to exit (SIGTERM), wait up to ``grace`` seconds, then SIGKILL it; reaped either way.

    A process that has already exited is only reaped.
    """
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
