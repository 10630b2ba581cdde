"""``qjm demo`` as a user runs it: the narration reads without log lines in it, and the log it
announces holds the warnings of the faults the demo makes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

# The prefix of a log record in the format the command line logs with (qjm.cli).
LOG_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def test_demo_narration_has_no_log_lines(tmp_path: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the demo's directory goes under tmp_path
    r = subprocess.run(
        [sys.executable, "-m", "qjm", "demo", "--records", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, as on a terminal: a log line would land inside the story
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    out = r.stdout
    assert r.returncode == 0, out
    assert not LOG_RECORD.search(out), out
    assert '"level": ' not in out, out  # nor a record in the JSON log format
    steps = [int(m) for m in re.findall(r"^\[(\d)\] ", out, re.MULTILINE)]
    assert steps == list(range(1, 10)), out
    assert "demo OK" in out
    logs = re.search(r"^logs: (\S+/demo\.log) and ", out, re.MULTILINE)
    assert logs is not None, out
    demo_log = Path(logs.group(1))
    assert demo_log.parent.parent == tmp_path
    text = demo_log.read_text()
    # Writer A, fenced by B, logs its failure as an error: in the log, not on screen.
    assert re.search(r" ERROR qjm\.writer: journal demo: writer in epoch 1 failed: fenced", text), text
    assert all(LOG_RECORD.match(line) for line in text.splitlines() if line and not line.startswith(" ")), text
    for i in range(3):
        assert (demo_log.parent / f"jn{i}.log").exists()
