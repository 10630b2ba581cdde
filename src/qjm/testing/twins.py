"""Comparing a compiled module with its pure twin: one call's outcome, as a value both can equal.

The parity and fuzz tests call the same function of both twins with the same arguments and assert
the outcomes are equal: the same value, or the same error -- for a ``CorruptFrameError`` also its
reason, offset and message, for a bad argument its type.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qjm.errors import CorruptFrameError

BAD_ARGUMENT = (ValueError, TypeError, OverflowError, struct.error)
"""What a twin raises for an argument it refuses (``encode`` passes struct's errors through)."""


@dataclass(frozen=True)
class Outcome:
    value: Any = None
    exc_type: type[BaseException] | None = None
    reason: str | None = None
    offset: int | None = None
    message: str | None = None


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    """``fn(*args, **kwargs)``'s value, or the error it raised (any other error propagates)."""
    try:
        return Outcome(value=fn(*args, **kwargs))
    except CorruptFrameError as e:
        return Outcome(exc_type=type(e), reason=e.reason, offset=e.offset, message=str(e))
    except BAD_ARGUMENT as e:
        return Outcome(exc_type=type(e))
