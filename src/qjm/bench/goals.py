"""The project's performance goals, which ``qjm bench`` reports as met or missed.

Each is a ratio of a qjm native figure to another figure of the same run on the same disk.
"""

from __future__ import annotations

from typing import Final

SYNC_P50_OVER_FLOOR: Final = 1.25  # qjm native sync p50 <= this x the disk's floor
NATIVE_OVER_PURE: Final = 10.0  # qjm native throughput >= this x qjm pure
LATENCY_OVER_PEER: Final = 0.4  # qjm native sync p50 <= this x the best durable peer's
THROUGHPUT_OVER_PEER: Final = 50.0  # qjm native 1 KiB records/s >= this x the best durable peer's
# and ahead of every peer that is not durable per commit, on both figures
TLS_SYNC_P50_OVER_PLAIN: Final = 1.15  # qjm native with mutual TLS: sync p50 <= this x without
TLS_THROUGHPUT_OVER_PLAIN: Final = 0.8  # and pipelined records/s >= this x without (each record size)
