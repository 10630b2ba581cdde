"""A JournalNode's resource bounds: what any client, well-behaved or not, can make one node hold.

Every bound has a default that fits a node under the common 1,024-descriptor limit and a few
hundred MB of memory, can be set per node (``JournalNode(limits=...)``, ``qjm journalnode`` flags and settings),
and is enforced by refusing the request that would pass it with ``ResourceExhaustedError`` (or, for
frame memory, by making the connection wait a moment for memory first).

=========================  ===========  ==============================================================
bound                      default      what happens past it
=========================  ===========  ==============================================================
max_open_journals          64           least recently used idle journal closed (no open segment, no
                                        call in flight); all busy: the new journal is refused
max_data_connections       256          a new data-plane connection is refused at once (no thread)
max_http_connections       32           a new HTTP-port connection is closed at once (no thread)
max_frame_bytes            64 MiB+hdr   a frame declaring more is refused before any of it is read
frame_memory               256 MiB      bytes all connections may hold for unfinished frames; past
                                        it a connection waits ``frame_memory_wait`` then is refused
hello_timeout              10 s         a connection that has not named its journal is closed; a
                                        control-plane or HTTP-port connection that has not finished
                                        its (TLS) handshake is closed, and so is an HTTP-port one
                                        whose request or reply stalls this long
idle_timeout               0 (off)      a connection that sends nothing for this long is closed (its
                                        writer's node is out of sync until the next segment, so it is
                                        off by default: keepalive and max_data_connections bound idle
                                        connections already)
keepalive idle/intvl/cnt   60 s/10 s/6  TCP keepalive: a vanished peer is noticed in about 2 minutes
=========================  ===========  ==============================================================

Descriptors: an open journal holds at most ``FDS_PER_JOURNAL`` (lock, two epoch files, committed
txid, open segment); a data-plane or HTTP-port connection holds one and one thread. At start the
node lowers ``max_open_journals`` and ``max_data_connections`` (and logs it) if together with
``max_http_connections`` and a reserve for gRPC, logs and downloads they would not fit the
process's RLIMIT_NOFILE.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass, replace

from qjm.errors import ConfigError
from qjm.protocol.frame import FRAME_HEADER_SIZE, MAX_PAYLOAD

log = logging.getLogger("qjm.limits")

FDS_PER_JOURNAL = 5
FDS_RESERVED = 128  # gRPC's listener, poller and client connections, logs, segment downloads


@dataclass(frozen=True, slots=True)
class NodeLimits:
    max_open_journals: int = 64
    max_data_connections: int = 256
    max_http_connections: int = 32
    max_frame_bytes: int = FRAME_HEADER_SIZE + MAX_PAYLOAD
    frame_memory: int = 256 * 1024 * 1024
    frame_memory_wait: float = 5.0
    hello_timeout: float = 10.0
    idle_timeout: float = 0.0  # 0: never
    keepalive_idle: int = 60
    keepalive_interval: int = 10
    keepalive_count: int = 6

    def __post_init__(self) -> None:
        for name in (
            "max_open_journals", "max_data_connections", "max_http_connections", "max_frame_bytes", "frame_memory",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("frame_memory_wait", "hello_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be above 0 seconds, got {getattr(self, name)}")
        if not self.idle_timeout >= 0:
            raise ConfigError(f"idle_timeout must be 0 (never) or more seconds, got {self.idle_timeout}")
        if self.frame_memory < self.max_frame_bytes:
            raise ConfigError(
                f"frame_memory ({self.frame_memory}) must hold at least one frame of max_frame_bytes "
                f"({self.max_frame_bytes})"
            )

    def fitted_to_descriptors(self, soft_limit: int | None = None) -> NodeLimits:
        """These limits, lowered if needed to fit ``soft_limit`` descriptors (RLIMIT_NOFILE by default)."""
        if soft_limit is None:
            soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft_limit == resource.RLIM_INFINITY:
            return self
        reserved = FDS_RESERVED + self.max_http_connections
        need = self.max_open_journals * FDS_PER_JOURNAL + self.max_data_connections + reserved
        if need <= soft_limit:
            return self
        room = max(soft_limit - reserved, 2 * FDS_PER_JOURNAL)
        journals = max(1, min(self.max_open_journals, room // 2 // FDS_PER_JOURNAL))
        conns = max(1, min(self.max_data_connections, room - journals * FDS_PER_JOURNAL))
        log.warning(
            "RLIMIT_NOFILE is %d: lowering max_open_journals %d -> %d and max_data_connections %d -> %d "
            "so that the node cannot run out of descriptors",
            soft_limit,
            self.max_open_journals,
            journals,
            self.max_data_connections,
            conns,
        )
        return replace(self, max_open_journals=journals, max_data_connections=conns)
