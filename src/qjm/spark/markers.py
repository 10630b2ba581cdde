"""Marker records that frame each batch the Spark sink writes, so a replayed batch can be recognised.

A marker is ``MAGIC`` followed by compact JSON. The magic starts with a NUL and a 0xFF byte, so it
is never the start of text or JSON, and the sink refuses user records that begin with it: a record
is a marker exactly when it starts with ``MAGIC``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

from qjm.errors import CorruptFrameError

MAGIC = b"\x00\xffQJM-SPARK-MARK\x01"
VERSION = 1

Kind = Literal["begin", "end"]


@dataclass(frozen=True, slots=True)
class Marker:
    """``begin`` opens a batch of ``tag`` (query id or write id); ``end`` closes it, counting its records.

    ``first``/``last`` in an end marker are the txids of the batch's first and last user record
    (both 0 when it held none).
    """

    kind: Kind
    tag: str
    batch: int
    records: int = 0
    first: int = 0
    last: int = 0

    def encode(self) -> bytes:
        body = {"v": VERSION, **asdict(self)}
        return MAGIC + json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def is_marker(record: bytes | bytearray | memoryview) -> bool:
    return bytes(record[: len(MAGIC)]) == MAGIC


def decode_marker(record: bytes) -> Marker:
    """Parse a record known to start with ``MAGIC``."""
    try:
        body = json.loads(record[len(MAGIC) :])
        if body.pop("v") != VERSION or body.get("kind") not in ("begin", "end"):
            raise ValueError(f"unknown marker {body!r}")
        return Marker(**body)
    except (ValueError, TypeError, KeyError) as e:
        raise CorruptFrameError(f"a record starts with the marker magic but is no valid marker: {e}") from None
