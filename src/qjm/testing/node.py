"""A JournalNode with node-side faults: ``python -m qjm.testing.node --fault SPEC <journalnode options>``.

``MiniJournalCluster`` starts its node processes with this entry point, so a test can make a node
fail or die at a fault point (``ServerFaults``: ``before_persist_paxos=exit,before_append=fail``).
Without ``--fault`` the node is served exactly as ``qjm journalnode`` serves one: the operator's
command has no way to inject a fault.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from qjm.cli import add_node_arguments, serve_node
from qjm.testing.faults import ServerFaults


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qjm.testing.node", description="a JournalNode with node-side faults")
    add_node_arguments(p)
    p.add_argument("--fault", default="", help="node-side faults, e.g. before_persist_paxos=exit,before_append=fail")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return serve_node(a, ServerFaults.parse(a.fault) if a.fault else None)


if __name__ == "__main__":
    raise SystemExit(main())
