"""asyncio faces of the writer and the reader: nothing here blocks the event loop.

``AsyncWriter`` hands every blocking call of its ``Writer`` (an append that waits for room in the
writer's window of batches in flight, ``sync``, ``close``) to one dedicated thread, and back with
``loop.call_soon_threadsafe``. Records wait for that thread in a queue bounded in bytes
(``max_pending_bytes``): ``await append`` / ``await submit`` wait while it is full, so a
producer faster than the nodes is held back by awaiting, not by blocking the loop. Commit futures
(``submit``, ``append_nowait``) resolve with their txid once a majority holds the record: the
thread syncs whenever its queue runs dry with records still awaiting commit, so records submitted
together share one commit.

``AsyncReader`` runs ``Reader.tail_batches`` on a thread of its own and yields what it pushes.

    async with await qjm.aio.open_writer(uri, create=True) as w:
        txid = await w.append(b"one")            # appended (durable after sync)
        committed = await (await w.submit(b"two"))  # its commit future: the txid, once committed
        await w.sync()
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from qjm.client.reader import Reader
from qjm.client.reader import open_reader as _sync_open_reader
from qjm.client.record_batch import RecordBatch
from qjm.client.writer import Buffer, Writer
from qjm.client.writer import open_writer as _sync_open_writer
from qjm.errors import QJMError, ResourceExhaustedError

__all__ = ["AsyncReader", "AsyncWriter", "open_reader", "open_writer"]

MAX_PENDING_BYTES = 16 << 20  # records handed to the writer thread and not yet appended
READ_AHEAD = 64  # batches a reader's thread may push before the loop takes them


@dataclass(slots=True)
class _Op:
    """One call for the writer thread. ``appended``/``committed`` resolve with the (last) txid."""

    kind: str  # "append", "append_many", "sync", "close", "abort"
    records: Any = None
    offsets: Buffer | None = None
    nbytes: int = 0
    appended: asyncio.Future[int] | None = None
    committed: asyncio.Future[int] | None = None
    done: asyncio.Future[int] | None = None  # sync / close / abort


def _settle(results: list[tuple[asyncio.Future[int], int | BaseException]]) -> None:
    """On the loop: resolve futures the writer thread finished (a cancelled one is left alone)."""
    for fut, value in results:
        if fut.done():
            continue
        if isinstance(value, BaseException):
            fut.set_exception(value)
        else:
            fut.set_result(value)


class AsyncWriter:
    """A ``Writer`` driven from asyncio. Use from the event loop it was opened on."""

    def __init__(self, writer: Writer, *, max_pending_bytes: int = MAX_PENDING_BYTES) -> None:
        if max_pending_bytes < 1:
            raise ValueError(f"max_pending_bytes must be >= 1, got {max_pending_bytes}")
        self.writer = writer
        self.max_pending_bytes = max_pending_bytes
        self._loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue[_Op] = queue.SimpleQueue()
        self._pending_bytes = 0
        self._room = asyncio.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="qjm-aio-writer", daemon=True)
        self._thread.start()

    # -- the loop's side ---------------------------------------------------------------------

    @property
    def last_txid(self) -> int:
        return self.writer.last_txid

    @property
    def committed_txid(self) -> int:
        return self.writer.committed_txid

    async def append(self, record: Buffer) -> int:
        """Append one record, waiting (not blocking) while the queue is full; its txid once
        appended. Durable after ``sync`` or once its commit future (``submit``) resolves."""
        op = await self._queued(_Op("append", record, nbytes=memoryview(record).nbytes), appended=True)
        assert op.appended is not None
        return await op.appended

    async def submit(self, record: Buffer) -> asyncio.Future[int]:
        """Queue one record, waiting while the queue is full; its commit future (the txid)."""
        op = await self._queued(_Op("append", record, nbytes=memoryview(record).nbytes), committed=True)
        assert op.committed is not None
        return op.committed

    def append_nowait(self, record: Buffer) -> asyncio.Future[int]:
        """``submit`` without waiting: raises ``ResourceExhaustedError`` when the queue is full."""
        op = _Op("append", record, nbytes=memoryview(record).nbytes)
        if self._pending_bytes > 0 and self._pending_bytes + op.nbytes > self.max_pending_bytes:
            raise ResourceExhaustedError(
                f"{self._pending_bytes} bytes already wait for the writer (max_pending_bytes "
                f"{self.max_pending_bytes}): await submit() or append() to wait for room"
            )
        self._check_open()
        op.committed = self._loop.create_future()
        self._put(op)
        return op.committed

    async def append_many(self, records: Iterable[Buffer] | Buffer, offsets: Buffer | None = None) -> int:
        """``Writer.append_many`` (the same packed forms); the last txid once appended."""
        op = await self._queued(_many(records, offsets), appended=True)
        assert op.appended is not None
        return await op.appended

    async def submit_many(
        self, records: Iterable[Buffer] | Buffer, offsets: Buffer | None = None
    ) -> asyncio.Future[int]:
        """Queue many records; one commit future for them all (the last txid)."""
        op = await self._queued(_many(records, offsets), committed=True)
        assert op.committed is not None
        return op.committed

    async def sync(self) -> int:
        """Everything queued so far committed; returns the last txid."""
        return await self._call("sync")

    async def close(self) -> None:
        """Sync, finalize, release the nodes (``Writer.close``); the thread ends. Idempotent."""
        if self._closing:
            return
        await self._call("close")
        self._closing = True
        await asyncio.to_thread(self._thread.join)

    async def abort(self) -> None:
        """Drop the writer without finalizing; records still queued fail."""
        if self._closing:
            return
        await self._call("abort")
        self._closing = True
        await asyncio.to_thread(self._thread.join)

    async def __aenter__(self) -> AsyncWriter:
        return self

    async def __aexit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.abort()

    def _check_open(self) -> None:
        if self._closing:
            raise QJMError("this writer is closed")

    async def _queued(self, op: _Op, *, appended: bool = False, committed: bool = False) -> _Op:
        """Wait for room for ``op`` (an op larger than the whole queue goes alone), then queue it."""
        self._check_open()
        async with self._room:
            await self._room.wait_for(
                lambda: self._pending_bytes == 0 or self._pending_bytes + op.nbytes <= self.max_pending_bytes
            )
        self._check_open()
        if appended:
            op.appended = self._loop.create_future()
        if committed:
            op.committed = self._loop.create_future()
        self._put(op)
        return op

    def _put(self, op: _Op) -> None:
        self._pending_bytes += op.nbytes
        self._queue.put(op)

    async def _call(self, kind: str) -> int:
        self._check_open()
        op = _Op(kind, done=self._loop.create_future())
        self._queue.put(op)
        assert op.done is not None
        return await op.done

    def _appended(self, nbytes: int) -> None:
        """On the loop: the writer thread took ``nbytes`` off the queue."""
        self._pending_bytes -= nbytes

        async def wake() -> None:
            async with self._room:
                self._room.notify_all()

        self._loop.create_task(wake())

    # -- the writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        w = self.writer
        awaiting: list[tuple[int, asyncio.Future[int]]] = []  # commit futures, by txid
        while True:
            ops = [self._queue.get()]
            while True:  # everything queued meanwhile goes into the same batches and commit
                try:
                    ops.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            results: list[tuple[asyncio.Future[int], int | BaseException]] = []
            taken = 0
            end: _Op | None = None
            for op in ops:
                taken += op.nbytes
                if end is not None:
                    _fail_op(op, QJMError("this writer is closed"), results)
                    continue
                if op.kind in ("append", "append_many"):
                    try:
                        many = op.kind == "append_many"
                        txid = w.append_many(op.records, op.offsets) if many else w.append(op.records)
                    except QJMError as e:
                        _fail_op(op, e, results)
                        continue
                    if op.appended is not None:
                        results.append((op.appended, txid))
                    if op.committed is not None:
                        awaiting.append((txid, op.committed))
                elif op.kind == "sync":
                    assert op.done is not None
                    awaiting.append((-1, op.done))
                else:
                    end = op
            if awaiting or end is not None:
                self._commit(awaiting, end, results)
                awaiting = []
            self._loop.call_soon_threadsafe(self._finish, taken, results)
            if end is not None:
                return

    def _commit(
        self,
        awaiting: list[tuple[int, asyncio.Future[int]]],
        end: _Op | None,
        results: list[tuple[asyncio.Future[int], int | BaseException]],
    ) -> None:
        """Sync (or close / abort) once for everything appended; settle what waited on it."""
        w = self.writer
        outcome: int | BaseException
        try:
            if end is not None and end.kind == "abort":
                w.abort()
                outcome = QJMError("the writer was aborted before this record was committed")
            else:
                outcome = w.sync() if awaiting else w.last_txid
                if end is not None:
                    w.close()
        except QJMError as e:
            outcome = e
        for txid, fut in awaiting:
            if isinstance(outcome, BaseException):
                results.append((fut, outcome))
            else:
                results.append((fut, outcome if txid < 0 else txid))
        if end is not None and end.done is not None:
            results.append((end.done, 0 if not isinstance(outcome, BaseException) or end.kind == "abort" else outcome))

    def _finish(self, taken: int, results: list[tuple[asyncio.Future[int], int | BaseException]]) -> None:
        _settle(results)
        if taken:
            self._appended(taken)


def _fail_op(op: _Op, e: BaseException, results: list[tuple[asyncio.Future[int], int | BaseException]]) -> None:
    for fut in (op.appended, op.committed, op.done):
        if fut is not None:
            results.append((fut, e))


def _many(records: Iterable[Buffer] | Buffer, offsets: Buffer | None) -> _Op:
    """An ``append_many`` op counting its bytes; an iterable of records is made a list first (the
    caller may reuse it once the call returns)."""
    if offsets is not None:
        return _Op("append_many", records, offsets, nbytes=memoryview(cast(Buffer, records)).nbytes)
    try:
        mv = memoryview(cast(Buffer, records))
    except TypeError:
        recs = list(cast(Iterable[Buffer], records))
        return _Op("append_many", recs, nbytes=sum(memoryview(r).nbytes for r in recs))
    return _Op("append_many", records, nbytes=mv.nbytes)


class AsyncReader:
    """A ``Reader`` driven from asyncio: ``async for txid, record in r`` follows the journal
    (``Reader.tail``); ``r.batches()`` follows it packed (``Reader.tail_batches``)."""

    def __init__(self, reader: Reader, *, heartbeat: float = 0.25, read_ahead: int = READ_AHEAD) -> None:
        self.reader = reader
        self.heartbeat = heartbeat
        self._slots = threading.Semaphore(read_ahead)  # back-pressure on the reading thread
        self._started = False

    def __aiter__(self) -> AsyncIterator[tuple[int, bytes]]:
        return self._records()

    async def _records(self) -> AsyncIterator[tuple[int, bytes]]:
        async for b in self.batches():
            for rec in b:
                yield rec

    async def batches(self) -> AsyncIterator[RecordBatch]:
        """Committed records as the nodes push them, a ``RecordBatch`` per frame, until ``close``."""
        if self._started:
            raise QJMError("this reader is already following")
        self._started = True
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[RecordBatch | BaseException | None] = asyncio.Queue()
        thread = threading.Thread(target=self._pump, args=(loop, q.put_nowait), name="qjm-aio-reader", daemon=True)
        thread.start()
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                self._slots.release()
                yield item
        finally:
            self.reader.close()
            self._slots.release()  # a thread waiting for a slot sees the reader closed
            await asyncio.to_thread(thread.join)

    def _pump(self, loop: asyncio.AbstractEventLoop, put: Callable[[Any], None]) -> None:
        try:
            for b in self.reader.tail_batches(heartbeat=self.heartbeat):
                self._slots.acquire()
                loop.call_soon_threadsafe(put, b)
        except BaseException as e:  # handed to the loop, raised there
            loop.call_soon_threadsafe(put, e)
            return
        loop.call_soon_threadsafe(put, None)

    async def close(self) -> None:
        """End the follow (``Reader.close``) and release the nodes."""
        self.reader.close()

    async def __aenter__(self) -> AsyncReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def open_writer(uri: str, *, max_pending_bytes: int = MAX_PENDING_BYTES, **options: Any) -> AsyncWriter:
    """``qjm.open_writer`` (same options) on a thread; the fenced writer, driven from this loop."""
    w = await asyncio.to_thread(lambda: _sync_open_writer(uri, **options))
    return AsyncWriter(w, max_pending_bytes=max_pending_bytes)


async def open_reader(uri: str, from_txid: int = 1, *, heartbeat: float = 0.25, **options: Any) -> AsyncReader:
    """``qjm.open_reader`` (same options) on a thread; ``async for`` follows the journal."""
    r = await asyncio.to_thread(lambda: _sync_open_reader(uri, from_txid, **options))
    return AsyncReader(r, heartbeat=heartbeat)
