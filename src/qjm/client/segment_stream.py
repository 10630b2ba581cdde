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
from qjm.errors import CorruptFrameError, QJMError, QuorumError
from qjm.protocol.frame import FRAME_HEADER_SIZE, SEGMENT_HEADER_SIZE, FrameHeader
from qjm.protocol.messages import NO_TXID, JournaledEdits, JournalState

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
    majority-th highest over all nodes (reference §4.3). That is asked of the nodes' open
    segments; when fewer than a majority have the segment open (restarted nodes open no segment
    until the writer's next one), the same count is made from what the nodes hold on disk
    (``_committed_on_disk``). Raises ``QuorumError`` when neither way can establish it.
    """
    loggers = qjm.loggers
    call = loggers.call(lambda lg: lg.get_journaled_edits(since, max_txns))
    try:
        call.wait_for(
            loggers.size, 0, loggers.size - loggers.majority, qjm.config.timeouts.select_input_streams, "edits"
        )
    except QuorumError:
        pass  # whoever answered in time decides; too few answers fall back to the disk below
    answered = dict(call.successes)
    if len(answered) < majority(loggers.size):
        return _committed_on_disk(qjm, since, max_txns)
    replies = {n: r for n, r in answered.items() if r.txn_count > 0}
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


def _committed_on_disk(qjm: QuorumJournalManager, since: int, max_txns: int) -> tuple[int, JournaledEdits | None]:
    """The committed part of the in-progress segment from the nodes' files (Hadoop's fallback to
    streaming the in-progress segment when the journaled-edits cache cannot answer).

    A txid is committed when it is durable on a majority of nodes in the newest writer's epoch, or
    when any node heard it committed. A node whose last writer epoch is the newest holds only that
    writer's frames past the last recovery (older writers are fenced once it promised), so its
    highest written txid counts; any other node counts as holding nothing. The records are read
    from the in-progress segment of such a node that reaches the bound.
    """
    manifests = qjm.get_edit_log_manifest(since, in_progress_ok=True)  # a majority, or QuorumError
    if any(not x.in_progress and x.start_txid <= since <= x.end_txid for m in manifests.values() for x in m.logs):
        # The writer finalized the segment holding ``since`` since the caller looked (a roll): its
        # records are read as a finalized segment, not from an in-progress copy.
        return 0, None
    states = {n: s for n, s in qjm.get_journal_states().items() if isinstance(s, JournalState)}
    size = qjm.loggers.size
    if len(states) < majority(size):
        raise QuorumError(
            f"cannot establish what is committed past txid {since - 1}: only {len(states)} of {size} nodes "
            "reported their state, and the open segment is open on fewer than a majority"
        )
    newest = max(s.last_writer_epoch for s in states.values())
    counts = sorted(
        (s.highest_written_txid if s.last_writer_epoch == newest else 0 for s in states.values()), reverse=True
    )
    counts += [0] * (size - len(counts))
    hinted = max((m.committed_txid for m in manifests.values()), default=NO_TXID)
    bound = min(max(counts[majority(size) - 1], hinted), since + max_txns - 1)
    if bound < since:
        return 0, None
    copies = sorted(
        (n, x.start_txid)
        for n, m in manifests.items()
        if n in states and states[n].last_writer_epoch == newest
        for x in m.logs
        # The states were asked after the manifests: a copy listed shorter may hold ``bound`` by now,
        # and ``_frames_between`` refuses one that does not.
        if x.in_progress and x.start_txid <= since and states[n].highest_written_txid >= bound
    )
    if not copies and any(s.last_writer_epoch == newest and 0 < s.open_segment_txid <= since for s in states.values()):
        # A node lists no copy of the segment it has open (its writer is writing it): the nodes'
        # open-segment replies answer on the next read, as they do once the roll that sent this
        # read here has reached every node.
        return 0, None
    errors: dict[str, BaseException] = {}
    for node, segment in copies:
        try:
            frames = _frames_between(qjm.loggers.by_name(node).read_segment(segment), since, bound)
        except QJMError as e:
            errors[node] = e
            continue
        return bound - since + 1, JournaledEdits(bound - since + 1, frames)
    raise QuorumError(
        f"txids {since}..{bound} are committed but no node in writer epoch {newest} could serve them "
        "from its in-progress segment",
        causes=errors,
    )


def _frames_between(download: Iterable[bytes], first: int, last: int) -> bytes:
    """The whole frames of a segment download that hold txids ``first..last``."""
    out = bytearray()
    for buf, pos, h in downloaded_frames(download):
        if h.last_txid < first:
            continue
        if not out and h.first_txid > first:
            raise CorruptFrameError(f"txid gap: expected {first}, frame starts at {h.first_txid}")
        out += buf[pos : pos + h.frame_len]
        if h.last_txid >= last:
            return bytes(out)
    raise CorruptFrameError(f"the in-progress segment ended before txid {last}")
