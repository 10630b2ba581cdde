"""The journals a node has open: opened on use, bounded in number, idle ones closed least recently used first.

Why a bound: each open journal holds descriptors (its ``in_use.lock``, the epoch and committed-txid
files, the open segment), and any client may name any valid journal id. Without a bound, a client
probing many ids exhausts the node's descriptors and the real journals' next roll fails.

What may be closed: a journal nobody is using (no call in flight, no data-plane connection) and
without an open segment. Closing one loses only what its files restore on reopening, plus the
request serial of the current epoch (a sanity check against reordered calls of one writer; the
writer's next call, numbered above every earlier one, passes it). A journal with an open segment is
never closed: its writer streams into it, and closing it would make the node drop out of the
segment. When every open journal is busy, a new one is refused with ``ResourceExhaustedError``.

What is never created: a journal directory, except by ``Format``. Every other call on a journal
that has no directory is answered from nothing (``NotFormattedError``, or "not formatted" for
``IsFormatted``), so a read-only probe leaves no trace on disk.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from qjm.config import validate_journal_id
from qjm.errors import NotFormattedError, ResourceExhaustedError
from qjm.server.journal import Journal, JournalHooks, SegmentFetcher
from qjm.server.storage import DiskStorage

log = logging.getLogger("qjm.registry")


class _Entry:
    __slots__ = ("journal", "storage", "users")

    def __init__(self, journal: Journal, storage: DiskStorage) -> None:
        self.journal = journal
        self.storage = storage
        self.users = 0


class JournalRegistry:
    """Thread-safe: RPC threads and data-plane threads lease journals from it concurrently."""

    def __init__(
        self,
        data_dir: str,
        *,
        max_open: int,
        fetcher: SegmentFetcher,
        hooks: JournalHooks | None = None,
        open_storage: Callable[[str, str], DiskStorage] = DiskStorage,
        on_open: Callable[[Journal], None] | None = None,
    ) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be at least 1, got {max_open}")
        self.data_dir = data_dir
        self.max_open = max_open
        self._fetcher = fetcher
        self._hooks = hooks
        self._open_storage = open_storage
        self._on_open = on_open
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self.evictions = 0
        self.refusals = 0

    def exists(self, journal_id: str) -> bool:
        """True if the journal has a directory on this node (validates the id)."""
        validate_journal_id(journal_id)
        return os.path.isdir(os.path.join(self.data_dir, journal_id))

    @contextmanager
    def lease(self, journal_id: str, *, create: bool = False) -> Iterator[Journal]:
        """The journal, kept open until the ``with`` block ends.

        Without ``create``, a journal with no directory raises ``NotFormattedError`` and nothing is
        created. Raises ``ResourceExhaustedError`` when ``max_open`` journals are open and all busy.
        """
        entry = self._acquire(journal_id, create)
        try:
            yield entry.journal
        finally:
            with self._lock:
                entry.users -= 1

    def open_count(self) -> int:
        with self._lock:
            return len(self._entries)

    def open_journals(self) -> list[Journal]:
        """The journals open now (a snapshot: one may be closed as idle right after)."""
        with self._lock:
            return [e.journal for e in self._entries.values()]

    def _acquire(self, journal_id: str, create: bool) -> _Entry:
        with self._lock:
            entry = self._entries.get(journal_id)
            if entry is not None:
                self._entries.move_to_end(journal_id)
                entry.users += 1
                return entry
            if not create and not self.exists(journal_id):
                raise NotFormattedError(f"journal {journal_id} is not formatted on this node (no directory)")
            self._make_room(journal_id)
            # Opening happens under the lock: it takes the directory's flock and reads a few small
            # files; two threads must not open one journal twice.
            storage = self._open_storage(self.data_dir, journal_id)  # validates the id, takes the lock
            try:
                journal = Journal(storage, fetcher=self._fetcher, hooks=self._hooks)
            except BaseException:
                storage.close()  # a journal that failed to open keeps no lock: a repair takes effect
                raise
            entry = _Entry(journal, storage)
            entry.users = 1
            self._entries[journal_id] = entry
            if self._on_open is not None:
                self._on_open(journal)
            return entry

    def _make_room(self, journal_id: str) -> None:
        """Close least recently used idle journals until one more fits (called with the lock held)."""
        while len(self._entries) >= self.max_open:
            victim = next(
                (jid for jid, e in self._entries.items() if e.users == 0 and not e.journal.has_open_segment()),
                None,
            )
            if victim is None:
                self.refusals += 1
                raise ResourceExhaustedError(
                    f"cannot open journal {journal_id}: this node already has {len(self._entries)} journals open "
                    f"and every one is in use or has an open segment (the limit is max_open_journals="
                    f"{self.max_open})"
                )
            self._close(self._entries.pop(victim))
            self.evictions += 1
            log.debug("closed idle journal %s to open %s", victim, journal_id)

    @staticmethod
    def _close(entry: _Entry) -> None:
        entry.journal.close()
        entry.storage.close()

    def close_all(self) -> None:
        with self._lock:
            for entry in self._entries.values():
                self._close(entry)
            self._entries.clear()
