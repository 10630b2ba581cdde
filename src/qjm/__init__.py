"""qjm: a replicated, fenced write-ahead log — Hadoop's Quorum Journal Manager in Python and Cython.

>>> w = qjm.open_writer("qjournal://h1:8485;h2:8485;h3:8485/my-log", create=True)
>>> w.append(b"hello"); w.sync()
>>> for txid, record in qjm.open_reader("qjournal://h1:8485;h2:8485;h3:8485/my-log"): ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

__all__ = [
    "CorruptFrameError",
    "FencedError",
    "NotFormattedError",
    "QJMError",
    "QuorumError",
    "QuorumJournalManager",
    "Reader",
    "Writer",
    "__version__",
    "open_reader",
    "open_writer",
]

_LAZY = {
    "QuorumJournalManager": "qjm.client.manager",
    "Writer": "qjm.client.writer",
    "open_writer": "qjm.client.writer",
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
