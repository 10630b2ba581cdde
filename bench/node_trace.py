"""Node processes that log timestamps: a ``sitecustomize`` put on the PYTHONPATH they inherit.

``bench/sync_timeline.py`` and ``bench/control_split.py`` wrap methods inside the JournalNode
processes that ``MiniJournalCluster`` starts; this writes their ``sitecustomize`` to a temporary
directory, points ``env_var`` at the trace files' prefix, and removes the directory (the cluster's
data included) when the measurement is done.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def traced_nodes(sitecustomize: str, env_var: str, prefix: str) -> Iterator[tuple[str, str]]:
    """Yields (a work directory for the cluster, the trace files' prefix: one file per node pid)."""
    work = tempfile.mkdtemp(prefix=prefix)
    saved = {k: os.environ.get(k) for k in (env_var, "PYTHONPATH")}
    try:
        with open(os.path.join(work, "sitecustomize.py"), "w") as f:
            f.write(sitecustomize)
        trace = os.path.join(work, "trace")
        os.environ[env_var] = trace
        os.environ["PYTHONPATH"] = work + os.pathsep + os.environ.get("PYTHONPATH", "")
        yield work, trace
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(work, ignore_errors=True)
