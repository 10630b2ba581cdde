"""Checked value types for the ``qjm`` commands' options: a bad value is argparse's one-line usage
error (exit code 2) naming the option, never a traceback from deep inside the command."""

from __future__ import annotations

import argparse
import math

__all__ = ["duration", "non_negative_int", "positive_int", "positive_seconds", "seed_range"]


def positive_int(text: str) -> int:
    """1, 2, ...: counts of nodes, writers, records, processes."""
    n = _int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def non_negative_int(text: str) -> int:
    """0, 1, ...: step budgets, where 0 is meaningful."""
    n = _int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer of 0 or more, got {text!r}")
    return n


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return v


def duration(text: str) -> float:
    """``"90"``, ``"60s"``, ``"10m"``, ``"1h"``: a positive number of seconds, minutes or hours."""
    t = text.strip().lower()
    mult = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(t[-1:])
    try:
        v = float(t[:-1]) * mult if mult is not None else float(t)
    except ValueError:
        v = math.nan
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive duration such as 90, 60s, 10m or 1h, got {text!r}")
    return v


def seed_range(text: str) -> range:
    """``LO:HI`` (HI excluded; LO defaults to 0) or one seed ``N``; never empty, never negative."""
    lo_text, sep, hi_text = text.partition(":")
    try:
        lo = int(lo_text) if lo_text.strip() or not sep else 0
        hi = int(hi_text) if sep else lo + 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO:HI or N (seeds are integers), got {text!r}") from None
    if lo < 0 or hi <= lo:
        raise argparse.ArgumentTypeError(f"expected 0 <= LO < HI in LO:HI, got {text!r}")
    return range(lo, hi)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
