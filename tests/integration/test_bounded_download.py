"""Downloads hold a chunk, not a segment (design §4.3): a node serving a large finalized segment,
a node catching it up and a reader reading it each grow their resident set by a bounded amount,
measured on the real processes (``/proc/PID/status``) while the download runs. A node serving
the whole segment from memory grew 246 MiB here."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

from qjm._native import framing
from qjm.bench.download import NODE_LOGGER, measure_download_rss
from qjm.testing.rss import rss_bytes

SEGMENT_MIB = 120
BOUND_MIB = 48  # the 1 GiB figure the bench reports is held to 64 MiB


def test_serving_catching_up_and_reading_a_large_segment_hold_a_bounded_amount(tmp_path, capsys, caplog) -> None:  # type: ignore[no-untyped-def]
    with caplog.at_level(logging.WARNING):
        m = measure_download_rss(str(tmp_path / "c"), SEGMENT_MIB, timeout=300)
    assert m["segment_mib"] > SEGMENT_MIB * 0.95
    for who in ("catch_up", "catch_up_serving", "reader", "reader_serving"):
        assert m[who] < BOUND_MIB, f"{who} grew {m[who]:.0f} MiB"
    # the node stopped on purpose is announced, and the writer's warnings about it are left out
    assert "node 2 stopped on purpose" in capsys.readouterr().err
    assert [r.getMessage() for r in caplog.records if r.name == NODE_LOGGER] == []


def test_qjm_dump_of_a_large_segment_holds_a_window_not_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``qjm dump`` scans and lists a 200 MiB segment file a window and a frame at a time: its peak
    resident set stays below the file's size (reading the file whole, it was above)."""
    path = tmp_path / "edits_inprogress_0000000000000000001"
    record = bytes(range(256)) * 4096  # 1 MiB
    with open(path, "wb") as f:
        f.write(framing.encode_segment_header(1, 1))
        for t in range(1, 201):
            f.write(framing.encode_frame([record], epoch=1, segment_txid=1, first_txid=t))
    size = path.stat().st_size
    proc = subprocess.Popen([sys.executable, "-m", "qjm", "dump", str(path)], stdout=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, rss_bytes(proc.pid))
        time.sleep(0.005)  # sampling, not synchronisation: the loop ends when the process does
    assert proc.returncode == 0
    assert 0 < peak < size * 0.6, f"qjm dump peaked at {peak >> 20} MiB for a {size >> 20} MiB file"
