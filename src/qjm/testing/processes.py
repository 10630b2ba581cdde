"""Child processes the test harness starts (nodes, Prometheus): how one is stopped."""

from __future__ import annotations

import subprocess
from typing import Any

__all__ = ["stop_process"]


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
