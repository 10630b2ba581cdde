"""qjm: a replicated, fenced write-ahead log — Hadoop's Quorum Journal Manager in Python and Cython.

>>> w = qjm.open_writer("qjournal://h1:8485;h2:8485;h3:8485/my-log", create=True)
>>> w.append(b"hello"); w.sync()
>>> for txid, record in qjm.open_reader("qjournal://h1:8485;h2:8485;h3:8485/my-log"): ...
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# gRPC (1.80 and later, grpc/grpc#43055) restarts its poller thread in a child forked with
# pre-exec work (subprocess.Popen(preexec_fn=...), as PySpark starts its JVM); closing the
# inherited fds before exec then kills the child now and then ("Java gateway process exited").
# qjm never uses gRPC in a forked child, so its fork handlers are switched off, before gRPC is
# first imported; set GRPC_ENABLE_FORK_SUPPORT yourself to choose otherwise.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from qjm._version import __version__
from qjm.errors import (
    CorruptFrameError,
    FencedError,
    NotFormattedError,
    QJMError,
    QuorumError,
)

if TYPE_CHECKING:
    from qjm.client.manager import QuorumJournalManager
    from qjm.client.reader import Reader, open_reader
    from qjm.client.writer import Writer, open_writer
    from qjm.config import QJMConfig
    from qjm.security.tls import TlsConfig

__all__ = [
    "CorruptFrameError",
    "FencedError",
    "NotFormattedError",
    "QJMConfig",
    "QJMError",
    "QuorumError",
    "QuorumJournalManager",
    "Reader",
    "TlsConfig",
    "Writer",
    "__version__",
    "open_reader",
    "open_writer",
]

_LAZY = {
    "QuorumJournalManager": "qjm.client.manager",
    "Writer": "qjm.client.writer",
    "open_writer": "qjm.client.writer",
    "QJMConfig": "qjm.config",
    "TlsConfig": "qjm.security.tls",
    "Reader": "qjm.client.reader",
    "open_reader": "qjm.client.reader",
}


def __getattr__(name: str) -> Any:
    """Import the client lazily so ``import qjm`` stays light and never pulls in gRPC."""
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'qjm' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(mod), name)
