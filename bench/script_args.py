"""The command line the bench's measuring scripts share: ``[COUNT] [DIR]``, checked before a run."""

from __future__ import annotations

import os
import sys
import tempfile


def count_and_dir(argv: list[str], script: str, count: str, default: int) -> tuple[int, str]:
    """``COUNT`` (a whole number, at least 1; ``default`` if absent) and ``DIR`` (an existing
    directory; the temporary directory if absent) from ``argv``; exits with a usage line otherwise."""
    usage = f"usage: python bench/{script} [{count}] [DIR]"
    if len(argv) > 2:
        sys.exit(usage)
    try:
        n = int(argv[0]) if argv else default
    except ValueError:
        sys.exit(f"{script}: {count} must be a whole number, not {argv[0]!r}\n{usage}")
    directory = argv[1] if len(argv) > 1 else tempfile.gettempdir()
    if n < 1:
        sys.exit(f"{script}: {count} must be at least 1, not {n}")
    if not os.path.isdir(directory):
        sys.exit(f"{script}: {directory!r} is not a directory")
    return n, directory
