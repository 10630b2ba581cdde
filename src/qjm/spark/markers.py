"""Marker records that frame each batch the Spark sink writes: replay detection and read-committed views.

A marker is ``MAGIC`` followed by compact JSON. The magic starts with a NUL and a 0xFF byte, so it
is never the start of text or JSON, and the sink refuses user records that begin with it: a record
is a marker exactly when it starts with ``MAGIC``.

Kinds, in the order a write produces them (design of the read-committed view: docs/spark.md):

* ``begin``: the first record of a write task's first segment; opens a transaction ``(tag, batch)``.
* ``resume``: the first record of a retried attempt's segment that goes on with an interrupted batch.
* ``end``: the task's last record: its share of the batch is in the journal.
* ``commit`` / ``abort``: written by Spark's driver, alone in a segment of its own, once the job
  (or micro-batch) succeeded / failed. Only a committed transaction is visible by default.

Marker version 1 (begin/end only) predates commit markers: its transactions count as committed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Literal

from qjm.errors import CorruptFrameError

MAGIC = b"\x00\xffQJM-SPARK-MARK\x01"
VERSION = 2
KINDS = ("begin", "resume", "end", "commit", "abort")
DECISIONS = ("commit", "abort")  # written by the driver, alone in a segment

Kind = Literal["begin", "resume", "end", "commit", "abort"]


@dataclass(frozen=True, slots=True)
class Marker:
    """``begin`` opens a batch of ``tag`` (query id or write id); ``end``/``commit`` count its records.

    ``first``/``last`` in an end or commit marker are the txids of the batch's first and last user
    record (both 0 when it held none).
    """

    kind: Kind
    tag: str
    batch: int
    records: int = 0
    first: int = 0
    last: int = 0
    version: int = field(default=VERSION, compare=False)

    def encode(self) -> bytes:
        body = asdict(self)
        body["v"] = body.pop("version")
        return MAGIC + json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def is_marker(record: bytes | bytearray | memoryview) -> bool:
    return bytes(record[: len(MAGIC)]) == MAGIC


def decode_marker(record: bytes) -> Marker:
    """Parse a record known to start with ``MAGIC``."""
    try:
        body = json.loads(record[len(MAGIC) :])
        version = body.pop("v")
        if version not in (1, VERSION) or body.get("kind") not in KINDS:
            raise ValueError(f"unknown marker {body!r}")
        return Marker(**body, version=version)
    except (ValueError, TypeError, KeyError) as e:
        raise CorruptFrameError(f"a record starts with the marker magic but is no valid marker: {e}") from None
