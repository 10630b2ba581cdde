"""The project's performance goals, which ``qjm bench`` reports as met or missed.

Each is a ratio of a qjm native figure to another figure of the same run on the same disk.
"""

from __future__ import annotations

from typing import Final

SYNC_P50_OVER_FLOOR: Final = 1.25  # qjm native sync p50 <= this x the disk's floor
ROLL_OVER_NO_ROLL: Final = 0.9  # pipelined throughput with the writer rolling every second >= this x without
# (the median of the ratios of pairs of phases, one with rolls and one without)
SYNC_P50_OVER_NETFLOOR: Final = 1.2  # qjm native sync p50 <= this x the C networked floor (bench/netfloor)
SYNC_P99_OVER_NETFLOOR: Final = 1.5  # qjm native sync p99 <= this x the C networked floor's p99
FAILOVER_COLD_MS: Final = 10.0  # failover by a cold process (code imported, nothing else), p50
NATIVE_OVER_PURE: Final = 10.0  # qjm native throughput >= this x qjm pure
LATENCY_OVER_PEER: Final = 0.4  # qjm native sync p50 <= this x the best durable peer's
THROUGHPUT_OVER_PEER: Final = 50.0  # qjm native 1 KiB records/s >= this x the best durable peer's, one
# record per request; against a peer's batching client the disk bounds any system (README, performance.md)
# and ahead of every peer that is not durable per commit, on both figures
TAIL_STALENESS_P50_MS: Final = 1.0  # sync returned -> record yielded by a tail in another process
TAIL_STALENESS_P99_MS: Final = 5.0
BATCHES_SPEEDUP: Final = 5.0  # Reader.batches() records/s >= this x per-record iteration's
TLS_SYNC_P50_OVER_PLAIN: Final = 1.15  # qjm native with mutual TLS: sync p50 <= this x without
TLS_THROUGHPUT_OVER_PLAIN: Final = 0.8  # and pipelined records/s >= this x without (each record size)
