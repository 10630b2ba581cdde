"""Retention: which txid a purge may keep from, for the writer's policy and ``qjm purge`` (design §2.12).

Pure decisions over what the nodes reported; the callers send the purge. A purge names one txid,
``min_txid_to_keep``: every segment wholly below it goes. Two limits hold whatever was asked:

* the newest segment stays (the open one, or the one a restarted writer resumes), so a purge
  never reaches its first txid;
* the newest ``min_retained_txids`` committed txids stay, for readers that still need them.

An explicit request beyond a limit is refused (``PurgeRefusedError``) with nothing removed; the
writer's own policy is clamped to the limits instead, since it runs unattended after every roll.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from qjm.errors import ConfigError, PurgeRefusedError
from qjm.protocol.messages import RemoteEditLog

__all__ = [
    "PurgeRequest",
    "RetentionBugs",
    "check_bound",
    "parse_age",
    "purge_limit",
    "requested_bound",
    "retention_floor",
]

_AGE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


class RetentionBugs(Protocol):
    """The test-only switches a purge decision reads (``qjm.testing.bugs.ProtocolBugs``)."""

    @property
    def purge_ignores_open_segment(self) -> bool: ...

    @property
    def purge_ignores_retention_floor(self) -> bool: ...


def parse_age(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s`` or plain seconds → seconds (> 0)."""
    m = _AGE.fullmatch(text) if isinstance(text, str) else None
    if m is None or float(m.group(1)) <= 0:
        raise ConfigError(f"bad age {text!r}: give a positive number with a unit s, m, h, d or w (e.g. 7d)")
    return float(m.group(1)) * _UNITS[m.group(2)]


@dataclass(frozen=True, slots=True)
class PurgeRequest:
    """What to purge; each criterion set (> 0) must allow a segment's removal (0: not set).

    ``before_txid``: segments wholly below this txid; ``keep_txids``: keep the newest this many
    committed txids; ``older_than``: segments finalized more than this many seconds ago.
    """

    before_txid: int = 0
    keep_txids: int = 0
    older_than: float = 0.0

    @property
    def empty(self) -> bool:
        return not (self.before_txid or self.keep_txids or self.older_than)


def requested_bound(req: PurgeRequest, *, committed: int, segments: Iterable[RemoteEditLog], now: float) -> int:
    """The ``min_txid_to_keep`` the request asks for (1: nothing to purge).

    Age: the segments are taken oldest first, and the run of them finalized before ``now -
    older_than`` is purged (a younger one ends the run); a segment is as old as its youngest
    listed copy, and one whose finalize time a node did not report is never old.
    """
    bounds: list[int] = []
    if req.before_txid:
        bounds.append(req.before_txid)
    if req.keep_txids:
        bounds.append(max(committed - req.keep_txids + 1, 1))
    if req.older_than:
        # a segment's age is that of its youngest copy: every listing must call it old
        youngest: dict[tuple[int, int], float] = {}
        for s in segments:
            if not s.in_progress:
                key = (s.start_txid, s.end_txid)
                at = s.finalized_at if s.finalized_at > 0 else math.inf
                youngest[key] = max(youngest.get(key, 0.0), at)
        bound = 1
        for (_, end), at in sorted(youngest.items()):
            if at > now - req.older_than:
                break
            bound = end + 1
        bounds.append(bound)
    return min(bounds, default=1)


def retention_floor(committed: int, min_retained_txids: int) -> int:
    """The first of the newest ``min_retained_txids`` committed txids: no purge reaches past it."""
    return max(committed - min_retained_txids + 1, 1)


def purge_limit(
    *, newest_segment: int, committed: int, min_retained_txids: int, bugs: RetentionBugs | None = None
) -> int:
    """The highest ``min_txid_to_keep`` a purge may send: not into the newest segment (which
    starts at ``newest_segment``; 0: none), nor into the newest ``min_retained_txids`` committed
    txids, nor past the log."""
    limits = [committed + 1]
    if bugs is None or not bugs.purge_ignores_retention_floor:
        limits.append(retention_floor(committed, min_retained_txids))
    if newest_segment and (bugs is None or not bugs.purge_ignores_open_segment):
        limits.append(newest_segment)
    return min(limits)


def check_bound(
    bound: int, *, segments: Iterable[RemoteEditLog], newest_segment: int, committed: int, min_retained_txids: int
) -> int:
    """The bound to send for an explicit request, or ``PurgeRefusedError`` saying which limit it passes.

    The request may not reach into the newest segment. Only whole finalized segments go, so the
    floor is checked against what would go: the bound is lowered to just past the last finalized
    segment ending below it, and that may not pass the floor.
    """
    if newest_segment and bound > newest_segment:
        raise PurgeRefusedError(
            f"purge below txid {bound} would reach into the open segment (from txid {newest_segment}); "
            f"the newest segment is never purged"
        )
    effective = 1 + max((s.end_txid for s in segments if not s.in_progress and s.end_txid < bound), default=0)
    floor = retention_floor(committed, min_retained_txids)
    if effective > floor:
        raise PurgeRefusedError(
            f"purge below txid {bound} would remove txids up to {effective - 1}, some of the newest "
            f"{min_retained_txids} committed (the retention floor is txid {floor}, the last committed "
            f"{committed}): ask for less, or lower min_retained_txids if readers no longer need them"
        )
    return effective
