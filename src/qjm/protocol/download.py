"""Segment downloads on the wire (``DownloadSegment``, design §4.3): one ``SegmentChunk`` per chunk
of the file, the last one carrying what the sender verified (length, xxh3 of the whole), so that
neither side holds more than a chunk. The receiver's check is here, shared by the client and the
node; each receiver also verifies every frame as it arrives."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import xxhash

from qjm.errors import CorruptFrameError, NodeUnavailableError
from qjm.protocol import qjournal_pb2 as pb


def sent_chunks(chunks: Iterable[bytes], end_txid: int, in_progress: bool) -> Iterator[pb.SegmentChunk]:
    """The sender's side: each chunk as it is read, and the checksum of all on the last message
    (an empty segment file still sends one)."""
    h = xxhash.xxh3_64()
    total = 0
    pending: bytes | None = None
    for data in chunks:
        if pending is not None:
            yield pb.SegmentChunk(data=pending)
        h.update(data)
        total += len(data)
        pending = data
    yield pb.SegmentChunk(
        data=pending or b"",
        last=True,
        end_txid=end_txid,
        in_progress=in_progress,
        total_bytes=total,
        xxh3=h.intdigest(),
    )


def verified_chunks(messages: Iterable[pb.SegmentChunk], what: str) -> Iterator[bytes]:
    """The receiver's side: each chunk's bytes as it arrives; the last is given only once the
    length and checksum of the whole matched (``CorruptFrameError`` otherwise), and a stream that
    ends without its last message raises ``NodeUnavailableError``."""
    h = xxhash.xxh3_64()
    total = 0
    for chunk in messages:
        h.update(chunk.data)
        total += len(chunk.data)
        if chunk.last:
            if chunk.total_bytes != total or chunk.xxh3 != h.intdigest():
                raise CorruptFrameError(f"{what} arrived damaged", reason="download")
            yield chunk.data
            return
        yield chunk.data
    raise NodeUnavailableError(f"{what} ended early")
