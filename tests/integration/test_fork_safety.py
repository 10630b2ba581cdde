"""Children forked with pre-exec work while gRPC is busy must start (PySpark launches its JVM so).

gRPC 1.80+ restarts its poller in such a child, where closing the inherited fds before exec could
kill it (grpc/grpc#43055; CI lost a Spark session to it once). ``import qjm`` switches gRPC's fork
handlers off; this test forks hundreds of times while a writer streams to real nodes.
"""

from __future__ import annotations

import os
import subprocess
import threading

import qjm
from qjm.testing.minicluster import MiniJournalCluster


def test_children_forked_during_rpcs_start() -> None:
    assert os.environ.get("GRPC_ENABLE_FORK_SUPPORT") == "false"
    with MiniJournalCluster(3, in_process=True) as c:
        w = qjm.open_writer(c.uri, create=True)
        stop = threading.Event()
        written = [0]

        def stream() -> None:
            while not stop.is_set():
                w.append(b"x" * 100)
                written[0] = w.sync()
                if written[0] % 50 == 0:
                    w.roll()

        t = threading.Thread(target=stream)
        t.start()
        try:
            codes = [subprocess.run(["true"], preexec_fn=lambda: None).returncode for _ in range(300)]
        finally:
            stop.set()
            t.join()
        assert codes == [0] * 300
        assert written[0] > 0
        w.close()
