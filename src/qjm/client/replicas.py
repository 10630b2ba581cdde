"""Reading finalized segments from any replica, failing over between them: one reader for
``qjm.client.reader.Reader`` and the Spark source (``qjm.spark.journal``).

Finalized segments are decided (design §3, invariants 2 and 5): every replica holds the same
frames, so any one serves them, and a download that fails part-way resumes at the next txid on
another replica with the same frame boundaries.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from qjm._native import framing
from qjm.client.manager import QuorumJournalManager
from qjm.client.segment_stream import downloaded_frames
from qjm.errors import CorruptFrameError, QJMError, QuorumError
from qjm.protocol.frame import FrameHeader

log = logging.getLogger("qjm.replicas")


@dataclass(frozen=True, slots=True)
class Segment:
    """A finalized segment and the replicas that list it, by name (sorted)."""

    start: int
    end: int
    nodes: tuple[str, ...]


def finalized_segments(qjm: QuorumJournalManager, since: int = 1) -> list[Segment]:
    """Finalized segments ending at or after ``since``, oldest first (manifests of a majority)."""
    manifests = qjm.get_edit_log_manifest(since, in_progress_ok=False)
    groups: dict[int, dict[str, int]] = {}
    for node, m in manifests.items():
        for x in m.logs:
            if not x.in_progress and x.end_txid >= since:
                groups.setdefault(x.start_txid, {})[node] = x.end_txid
    out: list[Segment] = []
    for start in sorted(groups):
        ends = set(groups[start].values())
        if len(ends) > 1:
            raise CorruptFrameError(f"finalized copies of segment {start} disagree on their end: {sorted(ends)}")
        out.append(Segment(start, ends.pop(), tuple(sorted(groups[start]))))
    return out


class ReplicaReader:
    """Whole frames of finalized segments, from one replica at a time. Not thread-safe."""

    def __init__(self, qjm: QuorumJournalManager) -> None:
        self.qjm = qjm
        self.failovers = 0
        self.current_node = ""  # the replica being streamed from

    def frames(
        self, seg: Segment, start: int, stop: int, prefer: int = 0
    ) -> Iterator[tuple[bytes | bytearray, int, FrameHeader]]:
        """``(buffer, offset, header)`` of each frame holding txids ``start..stop`` of ``seg``.

        The caller uses each frame before asking for the next (the buffer is reused). ``prefer``
        rotates the replica order so that parallel readers spread over the nodes. Raises
        ``QuorumError`` naming every replica's failure when none can serve the rest.
        """
        k = prefer % len(seg.nodes)
        nodes = seg.nodes[k:] + seg.nodes[:k]
        nxt = start
        errors: dict[str, BaseException] = {}
        for node in nodes:
            self.current_node = node
            try:
                for buf, pos, h in downloaded_frames(self.qjm.loggers.by_name(node).read_segment(seg.start)):
                    if h.last_txid < nxt:
                        continue
                    if h.first_txid > nxt:
                        raise CorruptFrameError(f"{node}: txid gap: expected {nxt}, frame starts at {h.first_txid}")
                    framing.verify_frame(buf, pos)  # a damaged copy fails over here, not in the caller
                    yield buf, pos, h
                    nxt = min(h.last_txid, stop) + 1
                    if nxt > stop:
                        return
                raise CorruptFrameError(f"{node}: segment {seg.start} ended at txid {nxt - 1}, before {stop}")
            except QJMError as e:
                errors[node] = e
                self.failovers += 1
                log.warning("reading segment %d from %s failed at txid %d (%s); failing over", seg.start, node, nxt, e)
        raise QuorumError(f"no replica could serve txids {nxt}..{stop} of segment {seg.start}-{seg.end}", causes=errors)
