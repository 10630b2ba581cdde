"""A cold process's failover (its code imported, nothing else) loads no module on the way: every
import it needs happens with the client's own modules, before the takeover is timed (design §1.4)."""

from __future__ import annotations

import json
import subprocess
import sys

import qjm
from qjm.testing.minicluster import MiniJournalCluster

TAKEOVER = r"""
import json, sys
from qjm.client.writer import open_writer
before = set(sys.modules)
w = open_writer(sys.argv[1])
w.append(b"x" * 1024)
w.sync()
print(json.dumps({"imported": sorted(set(sys.modules) - before), "epoch": w.epoch}))
w.abort()
"""


def test_a_cold_takeover_imports_nothing_more(icluster: MiniJournalCluster) -> None:
    old = qjm.open_writer(icluster.uri, create=True)
    old.append(b"a")
    old.sync()  # the old writer holds an open segment with a committed record
    done = subprocess.run([sys.executable, "-c", TAKEOVER, icluster.uri], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["epoch"] > old.epoch
    assert out["imported"] == []
    old.abort()
