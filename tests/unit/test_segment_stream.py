"""Frames of a segment parsed as its download arrives, whatever the chunk boundaries; the download
closed when the reader stops early."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from qjm._native import framing
from qjm.client.segment_stream import downloaded_frames
from qjm.errors import CorruptFrameError


def _segment() -> tuple[bytes, list[bytes]]:
    frames = [
        framing.encode_frame([b"r%d" % t * (t % 7 + 1) for t in range(f, f + 3)], epoch=2, segment_txid=1, first_txid=f)
        for f in range(1, 300, 3)
    ]
    return framing.encode_segment_header(1, 2) + b"".join(frames), frames


class Download:
    def __init__(self, data: bytes, size: int) -> None:
        self.chunks = [data[i : i + size] for i in range(0, len(data), size)]
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.chunks)

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("size", [1, 7, 64, 1000, 1 << 20])
def test_every_frame_whole_and_in_order_for_any_chunking(size: int) -> None:
    data, frames = _segment()
    d = Download(data, size)
    got = [bytes(buf[pos : pos + h.frame_len]) for buf, pos, h in downloaded_frames(d)]
    assert got == frames
    assert d.closed


def test_an_early_stop_closes_the_download() -> None:
    data, _ = _segment()
    d = Download(data, 100)
    for _, _, h in downloaded_frames(d):
        assert h.first_txid == 1
        break
    assert d.closed


def test_a_corrupt_frame_header_is_refused() -> None:
    data, frames = _segment()
    bad = bytearray(data)
    bad[len(data) - len(frames[-1]) + 8] ^= 0xFF  # inside the last frame's header
    with pytest.raises(CorruptFrameError):
        list(downloaded_frames(Download(bytes(bad), 50)))
