"""Records read back packed: one buffer and an offsets array per frame, no Python object per record.

``RecordBatch`` is the layout of an Arrow large-binary array (``offsets``: n + 1 int64, record i
is ``data[offsets[i]:offsets[i + 1]]``), so numpy and Arrow take it without copying::

    np.frombuffer(b.offsets, dtype=np.int64)
    pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(b), [None, pa.py_buffer(b.offsets), pa.py_buffer(b.data)])
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """Consecutive committed records: txids ``first_txid`` .. ``first_txid + len(self) - 1``."""

    first_txid: int
    data: bytes
    offsets: array[int]  # typecode 'q', len(self) + 1 entries, offsets[0] == 0

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def last_txid(self) -> int:
        return self.first_txid + len(self) - 1

    def __getitem__(self, i: int) -> bytes:
        """The ``i``-th record (0-based, not a txid)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record {i} of a batch of {n}")
        i %= n
        return self.data[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """``(txid, record)`` pairs: a Python object per record, for convenience."""
        data, offs = self.data, self.offsets
        for i in range(len(self)):
            yield self.first_txid + i, data[offs[i] : offs[i + 1]]
