"""Protocol bugs on purpose: switches that break one rule each, to prove the fault search has teeth.

A ``ProtocolBugs`` object is handed to ``Journal(bugs=...)``, to the recovery choices of
``qjm.client.recovery`` (``choose_recovery_source``, ``in_sync_copy``) and to the client transport
(``RemoteLogger(bugs=...)``, ``PendingBatches(bugs)``); ``None`` everywhere is the correct
protocol. The switches are never globals, so a bugged simulation cannot leak into a correct one
running in the same process. The protocol modules declare the switches they read as protocols
(``NodeBugs``, ``RecoveryBugs``, ``TransportBugs``, ``LinkBugs``) and never import this module.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from qjm.errors import ConfigError

__all__ = ["BUG_NAMES", "ProtocolBugs"]


@dataclass(frozen=True, slots=True)
class ProtocolBugs:
    """Each field, when True, drops one rule of the protocol (design §2.7 names what it guards)."""

    ignore_writer_epoch_rule: bool = False
    """Recovery ranks in-progress copies by accepted epoch only (the rule before HDFS-3845, design §2.9.3)."""
    ignore_accepted_epoch: bool = False
    """Recovery ignores earlier accepted proposals (design §2.10.7 then finalizes two lengths)."""
    ack_before_fsync: bool = False
    """The node acknowledges frames before they are durable (invariant 4, second half)."""
    skip_data_plane_epoch_check: bool = False
    """The node takes frames from any epoch (invariant 4, data plane fencing)."""
    pick_shortest_log: bool = False
    """Recovery rule 3c reversed: the shorter of two same-epoch copies wins (committed is forever)."""
    skip_accept_on_quorum_copy: bool = False
    """Recovery skips its accept round when a quorum, not every node, reported one in-progress copy:
    a node that did not answer may hold a longer copy a later recovery prefers (``in_sync_copy``)."""
    finalize_any_same_length_copy: bool = False
    """A node finalizes whatever copy of the right length it holds, not only the copy the writer
    named or accepted: a node that missed the accept round may hold another writer's copy."""
    restart_segment_of_own_epoch: bool = False
    """A node lets a writer restart a segment that holds the writer's own frames (committed is forever)."""
    purge_ignores_open_segment: bool = False
    """Purges reach into the newest segment: the writer's bound is not capped at it and the node
    does not refuse (design §2.12: the open segment is never purged)."""
    purge_ignores_retention_floor: bool = False
    """The writer's purge bound ignores ``min_retained_txids``: committed txids readers still need go."""
    sync_takes_in_progress: bool = False
    """Catch-up copies a peer's in-progress segment as if it were finalized (design §4.4: only
    finalized segments are decided)."""
    sync_replaces_finalized_copy: bool = False
    """Catch-up replaces a finalized segment here that differs from the peer's instead of refusing
    it as a divergence (invariant 5: a finalized segment never changes)."""
    accept_txid_gap: bool = False
    """The node appends a batch whose first txid skips past the next one it expects (segments are
    contiguous; the writer counts a cumulative ack as covering every txid below it)."""
    skip_serial_check: bool = False
    """The node runs a request whose serial is not above the last one of its epoch: a duplicated or
    late copy of an old call runs after newer ones (design §5.4)."""
    skip_committed_loss_check: bool = False
    """The node lets an accepted recovery discard a txid it knows is committed (the guard of
    ``Journal.accept_recovery``; committed is forever)."""
    retry_reuses_serial: bool = False
    """The client retries a control call that got no reply with the same request and serial: a
    node that ran the first attempt refuses the retry, and the writer counts the node as failed."""
    failed_start_never_cleared: bool = False
    """The client never ends a segment start that failed: batches wait behind it for good."""
    fenced_refusal_counts_as_ack: bool = False
    """The client's data link counts the batches a node refused as fenced as acknowledged."""
    rejoined_node_votes: bool = False
    """A node that rejoined after losing its disk takes part in fencing and recovery at once: its
    "no such segment" counts as evidence for segments it lost (design §4.5)."""

    @property
    def server_side(self) -> bool:
        """True if the nodes (``Journal``) must be built with this object."""
        return (
            self.ack_before_fsync
            or self.skip_data_plane_epoch_check
            or self.finalize_any_same_length_copy
            or self.restart_segment_of_own_epoch
            or self.purge_ignores_open_segment
            or self.sync_takes_in_progress
            or self.sync_replaces_finalized_copy
            or self.accept_txid_gap
            or self.skip_serial_check
            or self.skip_committed_loss_check
            or self.rejoined_node_votes
        )

    @property
    def transport_side(self) -> bool:
        """True if the writer's ``RemoteLogger`` and data links must be built with this object."""
        return self.retry_reuses_serial or self.failed_start_never_cleared or self.fenced_refusal_counts_as_ack

    @property
    def client_side(self) -> bool:
        """True if the writer's recovery choices must be made with this object."""
        return (
            self.ignore_writer_epoch_rule
            or self.ignore_accepted_epoch
            or self.pick_shortest_log
            or self.skip_accept_on_quorum_copy
            or self.purge_ignores_open_segment
            or self.purge_ignores_retention_floor
        )

    @property
    def enabled(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]

    def spec(self) -> str:
        """The text ``parse`` reads back: the switches that are on, comma separated."""
        return ",".join(self.enabled)

    @classmethod
    def only(cls, name: str) -> ProtocolBugs:
        """The object with exactly one switch on: ``ProtocolBugs.only("pick_shortest_log")``."""
        _check_names([name])
        return cls(**{name: True})

    @classmethod
    def parse(cls, text: str) -> ProtocolBugs | None:
        """``"a,b"`` → the object with switches a and b on; ``""`` → None (the correct protocol).

        Raises ``ConfigError`` naming every valid switch when a name is not one of them.
        """
        names = [n.strip() for n in text.split(",") if n.strip()]
        if not names:
            return None
        _check_names(names)
        return cls(**dict.fromkeys(names, True))


def _check_names(names: list[str]) -> None:
    unknown = [n for n in names if n not in BUG_NAMES]
    if unknown:
        raise ConfigError(
            f"unknown protocol bug{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"the valid ones are: {', '.join(BUG_NAMES)}"
        )


BUG_NAMES: tuple[str, ...] = tuple(f.name for f in fields(ProtocolBugs))
