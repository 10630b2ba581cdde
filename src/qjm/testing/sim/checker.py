"""The invariants of design §2.7, checked as a simulated run goes (``Checker``); a violation raises
``SimViolation`` carrying the seed and the trace.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from qjm._native import framing
from qjm.errors import CorruptFrameError, InvariantViolation
from qjm.protocol.frame import SEGMENT_HEADER_SIZE
from qjm.testing.sim.nodes import Node
from qjm.testing.sim.transport import Msg

if TYPE_CHECKING:
    from qjm.testing.sim.simulation import Simulation

__all__ = [
    "Checker",
    "SimViolation",
]


_FINALIZED = re.compile(r"edits_(\d{19})-(\d{19})")
_INPROGRESS = re.compile(r"edits_inprogress_(\d{19})")


class SimViolation(InvariantViolation):
    """An invariant broke in a simulated run: carries the seed and the trace of every call."""

    def __init__(self, message: str, *, seed: int | None, trace: Sequence[str]) -> None:
        super().__init__(message)
        self.message = message
        self.seed = seed
        self.trace = list(trace)

    def report(self, last: int | None = None) -> str:
        lines = self.trace if last is None else self.trace[-last:]
        return f"seed {self.seed}: {self.message}\n" + "\n".join(lines)


def _records(frames: bytes, start: int) -> dict[int, bytes]:
    """txid → record of a segment's frames (without the segment header)."""
    out: dict[int, bytes] = {}
    for h, off in framing.iter_frames(frames, start, 0):
        for i, rec in enumerate(framing.decode_records(frames, off)):
            out[h.first_txid + i] = rec
    return out


class Checker:
    """The invariants of design §2.7, checked as the run goes (numbers refer to that list)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.majority = len(sim.nodes) // 2 + 1
        self.acked: dict[int, tuple[bytes, int]] = {}  # txid → (record, writer) quorum-acked
        self.records: dict[int, tuple[bytes, str]] = {}  # txid → record in some finalized segment
        self.finalized: dict[int, tuple[int, bytes, str]] = {}  # start → (end, frames, where first seen)
        self.seen_final: list[dict[str, bytes]] = [{} for _ in sim.nodes]  # per node: name → frames
        self.epochs: dict[int, int] = {}  # epoch → writer that won it
        self.recoveries = 0
        self.check_durable_ack = True
        self.purged: list[set[str]] = [set() for _ in sim.nodes]  # per node: finalized names purged
        self._parsed: dict[tuple[int, bytes], dict[int, bytes]] = {}

    def fail(self, message: str) -> None:
        self.sim.note(f"VIOLATION: {message}")
        raise SimViolation(message, seed=self.sim.seed, trace=self.sim.trace)

    # 3: unique epochs
    def on_epoch(self, writer: int, epoch: int) -> None:
        other = self.epochs.get(epoch)
        if other is not None and other != writer:
            self.fail(f"invariant 3 (unique epochs): writers w{other} and w{writer} both won epoch {epoch}")
        self.epochs[epoch] = writer

    # 1, 2: what a writer was told is committed
    def on_acked(self, writer: int, first: int, records: Sequence[bytes]) -> None:
        for i, rec in enumerate(records):
            t = first + i
            prev = self.acked.get(t)
            if prev is not None and prev[0] != rec:
                self.fail(
                    f"invariant 2 (one history): txid {t} acknowledged to w{prev[1]} as {prev[0]!r} "
                    f"and to w{writer} as {rec!r}"
                )
            self.acked[t] = (rec, writer)
            self._committed_is_forever(t, (rec, writer), self.records.get(t))

    def _committed_is_forever(self, t: int, acked: tuple[bytes, int] | None, final: tuple[bytes, str] | None) -> None:
        """Invariant 1: txid ``t``, acknowledged to a writer as a record, is finalized as that record."""
        if acked is not None and final is not None and acked[0] != final[0]:
            self.fail(
                f"invariant 1 (committed is forever): txid {t} acknowledged to w{acked[1]} as {acked[0]!r} "
                f"but finalized as {final[0]!r} in {final[1]}"
            )

    # 4: fencing, and durability before acknowledgement
    def on_request(self, node: Node, op: str, epoch: int, promised_before: int) -> None:
        if epoch < promised_before:
            self.fail(
                f"invariant 4 (fencing): {node.name} accepted {op} in epoch {epoch} "
                f"after promising epoch {promised_before}"
            )

    def on_new_epoch(self, node: Node, epoch: int, promised_before: int) -> None:
        if epoch <= promised_before:
            self.fail(f"invariant 3: {node.name} granted new_epoch({epoch}) after promising {promised_before}")

    def on_frames(
        self, node: Node, acked: Sequence[Msg], promised_before: int, writer_epoch: int, size_before: int
    ) -> None:
        """Every frame the writer will count as acknowledged must have been appended by this very
        call, be durable, and carry the node's promised epoch (the client reads acks by txid)."""
        if not acked:
            return
        name = f"edits_inprogress_{acked[-1].segment:019d}"
        st = node.storage
        data = st.read_file(name) if name in st.file_names() else b""
        durable = st.durable_size(name) if data else 0
        for m in acked:
            pos = data.find(m.frame, max(SEGMENT_HEADER_SIZE, size_before))
            if pos < 0:
                self.fail(
                    f"invariant 4 (acknowledged only when durable): {node.name} acknowledged w{m.io.writer}'s "
                    f"frame (txids {m.first}-{m.last}, epoch {m.epoch}) but did not write it to {name}"
                )
            if m.epoch < promised_before:
                self.fail(
                    f"invariant 4 (fencing): {node.name} acknowledged a frame of epoch {m.epoch} "
                    f"(txids {m.first}-{m.last}) after promising epoch {promised_before}"
                )
            if m.epoch != writer_epoch:
                self.fail(
                    f"invariant 4 (fencing, HDFS-3845): {node.name} appended a frame of epoch {m.epoch} "
                    f"to a segment opened by writer epoch {writer_epoch}"
                )
            if self.check_durable_ack and pos + len(m.frame) > durable:
                self.fail(
                    f"invariant 4 (durable before acknowledged): {node.name} acknowledged txid {m.last} "
                    f"with {pos + len(m.frame) - durable} bytes of it in {name} not yet synced"
                )

    def on_disk_lost(self, node: Node) -> None:
        """The node's files are gone with its disk, not by a protocol step: its finalized segments
        may disappear. What it held still counts where it was counted (a quorum once held it);
        a copy it gets back (catch-up) must equal what it held (invariant 5)."""
        self.check_node(node)
        self.purged[node.index] |= set(self.seen_final[node.index])

    # 2, 5, 6: what the nodes hold
    def check_node(self, node: Node) -> None:
        st = node.storage
        names = st.file_names()
        mine = self.seen_final[node.index]
        finals: dict[int, int] = {}
        inprog: list[int] = []
        for name in names:
            m = _FINALIZED.fullmatch(name)
            if m:
                start, end = int(m.group(1)), int(m.group(2))
                finals[start] = end
                data = st.read_file(name)
                frames = data[SEGMENT_HEADER_SIZE:]
                old = mine.get(name)
                if old is None:
                    self._new_final(node, name, start, end, frames)
                    mine[name] = frames
                elif old != frames:
                    self.fail(f"invariant 5 (finalized never changes): {node.name}/{name} changed")
                continue
            m = _INPROGRESS.fullmatch(name)
            if m:
                inprog.append(int(m.group(1)))
        for name in mine:
            if name not in names and name not in self.purged[node.index]:
                self.fail(f"invariant 5 (finalized never reopens): {node.name}/{name} disappeared")
        for s in inprog:
            for fs, fe in finals.items():
                if fs <= s <= fe:
                    self.fail(
                        f"invariant 5 (finalized never reopens): {node.name} has in-progress segment {s} "
                        f"inside its finalized segment {fs}-{fe}"
                    )
        for s in [*finals, *inprog]:
            if s > 1:
                self._check_chain(node, s)

    def _new_final(self, node: Node, name: str, start: int, end: int, frames: bytes) -> None:
        where = f"{node.name}/{name}"
        prev = self.finalized.get(start)
        if prev is not None:
            if prev[0] != end or prev[1] != frames:
                self.fail(
                    f"invariant 2 (one history): finalized segments starting at {start} differ: "
                    f"{prev[2]} ends at {prev[0]}, {where} ends at {end}"
                    + ("" if prev[0] != end else " (same length, different frames)")
                )
            return
        self.finalized[start] = (end, frames, where)
        try:
            recs = _records(frames, start)
        except CorruptFrameError as e:
            self.fail(f"invariant 5: finalized segment {where} is damaged: {e}")
            return
        if sorted(recs) != list(range(start, end + 1)):
            self.fail(f"finalized segment {where} holds txids {sorted(recs)}, not {start}-{end}")
        for t, rec in recs.items():
            seen = self.records.get(t)
            if seen is not None and seen[0] != rec:
                self.fail(f"invariant 2 (one history): txid {t} is {seen[0]!r} in {seen[1]} but {rec!r} in {where}")
            self.records[t] = (rec, where)
            self._committed_is_forever(t, self.acked.get(t), (rec, where))

    def _check_chain(self, node: Node, start: int) -> None:
        """Invariant 6: a segment at N anywhere means a quorum has a finalized segment ending at N-1."""
        holders = 0
        for other in self.sim.nodes:
            if any(
                (m := _FINALIZED.fullmatch(name)) and int(m.group(2)) == start - 1
                for name in self.seen_final[other.index]
            ):
                holders += 1
        if holders < self.majority:
            self.fail(
                f"invariant 6 (segment chain): {node.name} has a segment starting at {start}, but only "
                f"{holders} node(s) hold a finalized segment ending at {start - 1}"
            )

    # design §2.12: a purge keeps the newest segment and the retention floor
    def on_purge(self, node: Node, before: Sequence[str]) -> None:
        """``before``: the node's files when the purge arrived; what went must be older than both
        the node's newest segment and the floor (the newest ``min_retained_txids`` acknowledged)."""
        after = set(node.storage.file_names())
        starts = {}
        for name in before:
            m = _FINALIZED.fullmatch(name) or _INPROGRESS.fullmatch(name)
            if m:
                starts[name] = int(m.group(1))
        newest = max(starts.values(), default=0)
        floor = max(self.acked, default=0) - self.sim.workload.min_retained_txids + 1
        for name in sorted(set(starts) - after):
            if starts[name] == newest:
                self.fail(f"retention (design §2.12): a purge removed {node.name}'s newest segment {name}")
            m = _FINALIZED.fullmatch(name)
            if m:
                if int(m.group(2)) >= floor:
                    self.fail(
                        f"retention (design §2.12): a purge removed {node.name}/{name}, holding txids at or "
                        f"above the retention floor {floor} (the newest "
                        f"{self.sim.workload.min_retained_txids} acknowledged txids)"
                    )
                self.purged[node.index].add(name)

    # 1: every recovery keeps what was committed
    def after_recovery(self, writer: int, epoch: int, last: int) -> bool:
        """Check a recovery's result; False if the writer was already superseded (nothing to check).

        "Later" is in epoch order: a writer that won its epoch after a newer one was won decided
        from promises the newer writer overtook; it is fenced at its first mutation, and what it
        "recovered" is moot. For the newest epoch, everything acknowledged and everything
        finalized must lie within the result (all of it came from older epochs).
        """
        self.recoveries += 1
        for n in self.sim.nodes:
            self.check_node(n)
        newest = max(self.epochs, default=0)
        if epoch < newest:
            return False
        lost = sorted(t for t in self.acked if t > last)
        if lost:
            t = lost[0]
            self.fail(
                f"invariant 1 (committed is forever): w{writer}'s recovery ended the log at {last}, "
                f"losing txid(s) {lost} acknowledged to w{self.acked[t][1]}"
            )
        beyond = sorted(t for t in self.records if t > last)
        if beyond:
            self.fail(
                f"invariant 1: w{writer}'s recovery ended the log at {last}, but txid {beyond[0]} is in "
                f"finalized segment {self.records[beyond[0]][1]}"
            )
        for t in sorted(self.acked):
            rec, w = self.acked[t]
            holders = sum(1 for n in self.sim.nodes if self._final_record(n, t) == rec)
            if holders < self.majority:
                self.fail(
                    f"invariant 1 (committed is forever): after w{writer}'s recovery to {last}, txid {t} "
                    f"(acknowledged to w{w}) is finalized with its bytes on only {holders} node(s)"
                )
        return True

    def _final_record(self, node: Node, t: int) -> bytes | None:
        for name, frames in self.seen_final[node.index].items():
            m = _FINALIZED.fullmatch(name)
            assert m is not None
            start, end = int(m.group(1)), int(m.group(2))
            if start <= t <= end:
                key = (start, frames)
                recs = self._parsed.get(key)
                if recs is None:
                    recs = self._parsed[key] = _records(frames, start)
                return recs.get(t)
        return None

    def state_key(self) -> tuple[object, ...]:
        return (
            tuple(sorted((t, r, w) for t, (r, w) in self.acked.items())),
            tuple(sorted(self.epochs.items())),
        )
