"""Reading what a journal holds, shared by ``Reader`` and the Spark source: frames of a segment
parsed while its download arrives, and the committed part of the open segment.

Kept in one place because both rules are subtle: a download must be parsed incrementally (a reader
gets records before a large segment has arrived) and closed when the reader stops early; the
open segment's committed length is the majority-th highest count among the newest writer's nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from qjm._native import framing
from qjm.client.manager import QuorumJournalManager
from qjm.client.quorum import majority
from qjm.errors import QuorumError
from qjm.protocol.frame import FRAME_HEADER_SIZE, SEGMENT_HEADER_SIZE, FrameHeader
from qjm.protocol.messages import JournaledEdits

_COMPACT_AT = 1 << 22  # drop consumed bytes once this many have piled up


def downloaded_frames(download: Iterable[bytes]) -> Iterator[tuple[bytearray, int, FrameHeader]]:
    """``(buffer, offset, header)`` for each whole frame of a segment download, as it arrives.

    The buffer is reused: use the frame before asking for the next one. The download is closed
    when the caller stops early, so a node does not keep streaming to nobody.
    """
    buf = bytearray()
    pos = 0
    header_done = False
    try:
        for chunk in download:
            buf += chunk
            if not header_done:
                if len(buf) < SEGMENT_HEADER_SIZE:
                    continue
                framing.decode_segment_header(buf)
                pos = SEGMENT_HEADER_SIZE
                header_done = True
            while len(buf) - pos >= FRAME_HEADER_SIZE:
                h = framing.decode_header(buf, pos)
                if len(buf) - pos < h.frame_len:
                    break
                yield buf, pos, h
                pos += h.frame_len
            if pos > _COMPACT_AT:
                del buf[:pos]
                pos = 0
    finally:
        close = getattr(download, "close", None)
        if close is not None:
            close()


def committed_in_progress(qjm: QuorumJournalManager, since: int, max_txns: int) -> tuple[int, JournaledEdits | None]:
    """How many txids from ``since`` of the open segment are committed, and a reply holding them.

    Only the newest writer's frames count (an older writer may still be writing to a partitioned
    node): nodes answering for another epoch count as holding nothing, and the count is the
    majority-th highest over all nodes (reference §4.3).
    """
    loggers = qjm.loggers
    call = loggers.call(lambda lg: lg.get_journaled_edits(since, max_txns))
    try:
        call.wait_for(
            loggers.size, 0, loggers.size - loggers.majority, qjm.config.timeouts.select_input_streams, "edits"
        )
    except QuorumError:
        pass  # whoever answered in time decides; too few answers give a count of 0 below
    replies = {n: r for n, r in dict(call.successes).items() if r.txn_count > 0}
    if not replies:
        return 0, None
    epochs = {n: framing.decode_header(r.frames).epoch for n, r in replies.items()}
    newest = max(epochs.values())
    qjm.note_epoch(newest)  # a reader following the writer knows whom to fence, should it take over
    counts = sorted((r.txn_count if epochs[n] == newest else 0 for n, r in replies.items()), reverse=True)
    counts += [0] * (loggers.size - len(counts))
    durable = counts[majority(loggers.size) - 1]
    if durable <= 0:
        return 0, None
    source = max((n for n in replies if epochs[n] == newest), key=lambda n: replies[n].txn_count)
    return durable, replies[source]
