"""Smoke check of an installed qjm (``make wheel-smoke``): run by the Python of a fresh venv that holds
only the wheel and its dependencies, from outside the checkout.

It checks that qjm is imported from that venv (not from a source tree) with its compiled modules,
starts three JournalNode processes from the installation, writes records through a quorum, reads
them back, and asks the installed ``qjm`` command for its version and the journal's status.
Exit 0 when all of it holds; otherwise a message and exit 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time

import qjm
import qjm._native as native
from qjm.client.reader import open_reader
from qjm.client.writer import open_writer
from qjm.testing.minicluster import MiniJournalCluster

RECORDS = 3000


def fail(msg: str) -> None:
    print(f"wheel smoke: FAILED: {msg}", file=sys.stderr)
    raise SystemExit(1)


def main() -> None:
    t0 = time.monotonic()
    site = sysconfig.get_path("purelib")
    if not os.path.realpath(qjm.__file__).startswith(os.path.realpath(site)):
        fail(f"qjm was imported from {qjm.__file__}, not from this venv's {site}")
    caps = native.capabilities()
    if caps["backend"] != "native":
        fail(f"the installed qjm runs without its compiled modules: {caps}")
    cli = os.path.join(sysconfig.get_path("scripts"), "qjm")
    version = subprocess.run([cli, "--version"], capture_output=True, text=True, check=False)
    if version.returncode != 0 or version.stdout.strip() != f"qjm {qjm.__version__}":
        fail(f"`qjm --version` said {version.stdout!r} {version.stderr!r} (exit {version.returncode})")

    records = [f"smoke {i:05d} ".encode() * 4 for i in range(1, RECORDS + 1)]
    with MiniJournalCluster(3, journal_id="smoke") as c:
        with open_writer(c.uri, create=True) as w:
            w.append_many(records[: RECORDS // 2])
            w.roll()
            w.append_many(records[RECORDS // 2 :])
            w.sync()
        r = open_reader(c.uri)
        try:
            got = list(r)
        finally:
            r.qjm.close()
        if got != list(enumerate(records, start=1)):
            fail(f"read back {len(got)} records, not the {RECORDS} written")
        status = subprocess.run([cli, "status", c.uri], capture_output=True, text=True, check=False)
        if status.returncode != 0:
            fail(f"`qjm status` exited {status.returncode}: {status.stdout}{status.stderr}")
    print(
        f"wheel smoke: OK: qjm {qjm.__version__} from {os.path.dirname(qjm.__file__)} ({caps['backend']}); "
        f"3 nodes, {RECORDS} records written and read back, `qjm status` in sync, {time.monotonic() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
