"""Shapes of the protocol's requests and replies as frozen dataclasses, free of any transport.

``qjm.protocol.convert`` translates them to and from the gRPC messages; the in-process transport of
the simulation passes them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NO_TXID = -1  # Hadoop's INVALID_TXID role: "no committed txid known yet"


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    """What ``format`` stamps into VERSION; every writer must present the same (reference §1.4)."""

    namespace_id: int
    cluster_id: str = "qjm"
    ctime: int = 0


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """Stamped on every mutating control-plane call: who is asking, in which epoch, in what order."""

    journal_id: str
    epoch: int
    serial: int
    committed_txid: int = NO_TXID


@dataclass(frozen=True, slots=True)
class SegmentState:
    """A segment as a node holds it: [start, end], finalized or still in progress."""

    start_txid: int
    end_txid: int
    in_progress: bool
    # Writer epoch of the segment's frames (0: unknown). One writer epoch writes one byte stream,
    # so equal (start, end, epoch) means equal contents: Hadoop got this from its START_LOG_SEGMENT
    # op; qjm segments have no such op, and two writers can leave same-length, different logs.
    epoch: int = 0

    def __str__(self) -> str:
        kind = "inprogress" if self.in_progress else "finalized"
        return f"{self.start_txid}-{self.end_txid}({kind}, epoch {self.epoch})"


@dataclass(frozen=True, slots=True)
class PersistedPaxosData:
    """An accepted recovery proposal (design §2.8 step 3b): kept in ``paxos/<segment>``."""

    segment_state: SegmentState
    accepted_in_epoch: int


@dataclass(frozen=True, slots=True)
class JournalState:
    """Reply to get_journal_state; the epochs are what fencing and recovery compare."""

    last_promised_epoch: int
    last_writer_epoch: int
    committed_txid: int
    highest_written_txid: int
    open_segment_txid: int  # 0 when no segment is open
    data_address: str = ""


@dataclass(frozen=True, slots=True)
class NewEpochResponse:
    """Reply to new_epoch: the first txid of the node's newest segment, if it has any, and the
    Paxos phase-1 answer for that segment (``recovery``), so a new writer needs no separate
    prepare round. ``recovery`` is None only from a node that predates it."""

    last_segment_txid: int | None
    recovery: PrepareRecoveryResponse | None = None


@dataclass(frozen=True, slots=True)
class PrepareRecoveryResponse:
    """Paxos phase 1b for one segment (design §2.8 step 2, with the writer epoch of HDFS-3845)."""

    segment_state: SegmentState | None
    accepted_in_epoch: int | None
    last_writer_epoch: int
    last_committed_txid: int = NO_TXID


@dataclass(frozen=True, slots=True)
class RemoteEditLog:
    start_txid: int
    end_txid: int
    in_progress: bool = False
    # when a finalized segment was finalized (wall clock; 0.0: unknown); not part of its identity,
    # so copies listed by different nodes compare equal
    finalized_at: float = field(default=0.0, compare=False)


@dataclass(frozen=True, slots=True)
class EditLogManifest:
    logs: tuple[RemoteEditLog, ...] = field(default_factory=tuple)
    committed_txid: int = NO_TXID


@dataclass(frozen=True, slots=True)
class JournaledEdits:
    """Whole frames holding txids from ``since`` on; ``txn_count`` counts only txids >= since."""

    txn_count: int
    frames: bytes = b""
