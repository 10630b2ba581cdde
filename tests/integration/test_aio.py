"""``qjm.aio`` on real nodes: commit futures, awaitable sync, an async tail, and back-pressure that
awaits instead of blocking the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from pathlib import Path

import pytest

from qjm import aio
from qjm.errors import ResourceExhaustedError
from qjm.testing.minicluster import MiniJournalCluster


def test_commit_futures_sync_and_an_async_tail(icluster: MiniJournalCluster) -> None:
    async def main() -> None:
        async with await aio.open_writer(icluster.uri, create=True) as w:
            r = await aio.open_reader(icluster.uri, heartbeat=0.05)
            seen: list[tuple[int, bytes]] = []

            async def follow() -> None:
                async for rec in r:
                    seen.append(rec)
                    if rec[0] == 301:
                        return

            follower = asyncio.create_task(follow())
            futs = [w.append_nowait(f"a{i}".encode()) for i in range(100)]
            assert await asyncio.gather(*futs) == list(range(1, 101))  # resolved once committed
            assert w.committed_txid >= 100
            txids = [await w.append(f"b{i}".encode()) for i in range(100)]
            assert txids == list(range(101, 201))
            assert await w.sync() == 200 and w.committed_txid == 200
            batch = await w.submit_many([f"c{i}".encode() for i in range(100)])
            one = await w.submit(b"last")
            assert await batch == 300 and await one == 301
            await asyncio.wait_for(follower, 60)
            await r.close()
        expect = [f"a{i}" for i in range(100)] + [f"b{i}" for i in range(100)] + [f"c{i}" for i in range(100)]
        assert seen == list(enumerate([x.encode() for x in expect] + [b"last"], start=1))

    asyncio.run(main())


def test_back_pressure_awaits_and_the_loop_keeps_running(cluster: MiniJournalCluster) -> None:
    """With two of three nodes paused nothing commits and the writer thread blocks; the queue
    fills, ``submit`` waits, ``append_nowait`` refuses, and the loop keeps running other tasks."""

    async def main() -> None:
        w = await aio.open_writer(cluster.uri, create=True, write_txns_timeout=300, max_pending_bytes=64 * 1024)
        await w.sync()
        cluster.pause(1)
        cluster.pause(2)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        t = asyncio.create_task(ticker())
        rec = bytes(1000)
        futs = []
        queued = 0
        while True:  # until the queue is full: the writer thread blocks on its first sync
            try:
                futs.append(w.append_nowait(rec))
            except ResourceExhaustedError:
                break
            queued += 1
            await asyncio.sleep(0)
        assert queued >= 10
        waiting = asyncio.create_task(w.submit(rec))
        before = ticks
        while ticks < before + 20:  # the loop runs on while the producer waits for room
            await asyncio.sleep(0.001)
        assert not waiting.done() and not any(f.done() for f in futs)
        cluster.resume(1)
        cluster.resume(2)
        last = await asyncio.wait_for(await asyncio.wait_for(waiting, 120), 120)
        assert await asyncio.gather(*futs) == list(range(1, queued + 1)) and last == queued + 1
        t.cancel()
        await w.close()

    asyncio.run(main())


def test_a_closed_writer_refuses_new_records(icluster: MiniJournalCluster) -> None:
    async def main() -> None:
        w = await aio.open_writer(icluster.uri, create=True)
        await w.close()
        with pytest.raises(Exception, match="closed"):
            await w.append(b"late")

    asyncio.run(main())


def test_the_readme_example_runs(icluster: MiniJournalCluster) -> None:
    """The README's asyncio example, as written, against real nodes."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "qjm.aio" in b]
    assert len(blocks) == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), {"uri": icluster.uri, "__name__": "readme"})
    assert out.getvalue() == "1 b'one'\n2 b'two'\n"
