"""What a node tells a remote caller about an error: its message without the node's local paths
(design §9.3). The node's own log keeps the full message."""

from __future__ import annotations

import os

DATA_DIR_MARK = "<data_dir>"


def public_message(text: str, data_dir: str) -> str:
    """``text`` with the node's data directory (as given and resolved) replaced by ``<data_dir>``:
    a journal's files are then named relative to it, and the node's layout stays private."""
    for d in sorted({data_dir.rstrip("/"), os.path.realpath(data_dir)}, key=len, reverse=True):
        if d and d != "/":
            text = text.replace(d, DATA_DIR_MARK)
    return text
