"""Protocol bugs on purpose: switches that break one rule each, to prove the fault search has teeth.

A ``ProtocolBugs`` object is handed to ``Journal(bugs=...)`` and to the recovery-source choice
(``choose_recovery_source(..., bugs=...)``); ``None`` everywhere is the correct protocol. The
switches are never globals, so a bugged simulation cannot leak into a correct one running in the
same process.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["BUG_NAMES", "ProtocolBugs"]


@dataclass(frozen=True, slots=True)
class ProtocolBugs:
    """Each field, when True, drops one rule of the protocol (design.md §3 names what it guards)."""

    ignore_writer_epoch_rule: bool = False
    """Recovery ranks in-progress copies by accepted epoch only (the pre-HDFS-3845 rule, seed 004)."""
    ignore_accepted_epoch: bool = False
    """Recovery ignores earlier accepted proposals (design §2.10.7 then finalizes two lengths)."""
    ack_before_fsync: bool = False
    """The node acknowledges frames before they are durable (invariant 4, second half)."""
    skip_data_plane_epoch_check: bool = False
    """The node takes frames from any epoch (invariant 4, data plane fencing)."""
    pick_shortest_log: bool = False
    """Recovery rule 3c reversed: the shorter of two same-epoch copies wins (committed is forever)."""
    restart_segment_of_own_epoch: bool = False
    """A node lets a writer restart a segment that holds the writer's own frames (committed is forever)."""

    @property
    def server_side(self) -> bool:
        """True if the nodes (``Journal``) must be built with this object."""
        return self.ack_before_fsync or self.skip_data_plane_epoch_check or self.restart_segment_of_own_epoch

    @property
    def client_side(self) -> bool:
        """True if the recovery-source choice must be made with this object."""
        return self.ignore_writer_epoch_rule or self.ignore_accepted_epoch or self.pick_shortest_log

    @property
    def enabled(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]

    @classmethod
    def only(cls, name: str) -> ProtocolBugs:
        """The object with exactly one switch on: ``ProtocolBugs.only("pick_shortest_log")``."""
        if name not in BUG_NAMES:
            raise ValueError(f"unknown protocol bug {name!r}; known: {', '.join(BUG_NAMES)}")
        return cls(**{name: True})

    @classmethod
    def parse(cls, text: str) -> ProtocolBugs | None:
        """``"a,b"`` → the object with switches a and b on; ``""`` → None (the correct protocol)."""
        names = [n.strip() for n in text.split(",") if n.strip()]
        if not names:
            return None
        for n in names:
            if n not in BUG_NAMES:
                raise ValueError(f"unknown protocol bug {n!r}; known: {', '.join(BUG_NAMES)}")
        return cls(**dict.fromkeys(names, True))


BUG_NAMES: tuple[str, ...] = tuple(f.name for f in fields(ProtocolBugs))
