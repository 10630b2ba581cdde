"""What ``qjm status`` makes of the nodes' answers: a state, an exit code, a table.

The exit codes follow the monitoring-plugin convention, so a health check can run the command
as it is: 0 every node reachable, formatted and holding every committed transaction; 1 degraded
(a majority is fine, but some node is unreachable, unformatted, failing or behind); 2 no quorum
(fewer than a majority are fine) or the journal is formatted nowhere; 3 the check itself could
not run (a bad URI or configuration).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

OK, DEGRADED, CRITICAL, UNKNOWN = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class Health:
    state: str  # "in-sync", "degraded", "no-quorum", "not-formatted"
    exit_code: int
    rows: list[dict[str, object]]  # each node's answer, with its own "state"
    summary: str


def _int(row: Mapping[str, object], key: str) -> int:
    v = row.get(key, 0)
    return int(v) if isinstance(v, int | str) else 0


def node_health(answers: Sequence[Mapping[str, object]]) -> Health:
    """Classify each node and the journal as a whole.

    An answer holds ``unreachable`` (the node did not answer), ``error`` (it answered with a
    failure, such as a data directory it cannot lock) or the node's status of the journal. A
    node is *behind* when it lacks transactions some node knows to be committed, or still
    follows an older writer: its copy could not serve a read or a recovery alone.
    """
    n = len(answers)
    majority = n // 2 + 1
    answered = [a for a in answers if "unreachable" not in a and "error" not in a]
    formatted = [a for a in answered if a.get("formatted")]
    committed = max((_int(a, "committed_txid") for a in formatted), default=0)
    writer = max((_int(a, "writer_epoch") for a in formatted), default=0)
    rows: list[dict[str, object]] = []
    fine = 0
    for a in answers:
        row = dict(a)
        if "unreachable" in a:
            row["state"] = "unreachable"
        elif "error" in a:
            row["state"] = "error"
        elif not a.get("formatted"):
            row["state"] = "not formatted"
        elif a.get("rejoined_without_segments"):
            # It takes part in fencing and recovery only from its first segment on (design §4.5):
            # until then a new writer cannot count it, nor can the current one finalize with it.
            row["state"] = "rejoined"
        elif _int(a, "highest_written_txid") < committed or _int(a, "writer_epoch") < writer:
            row["state"] = "behind"
            fine += 1  # it holds the journal and takes the next segment: it counts toward a quorum
        else:
            row["state"] = "in sync"
            fine += 1
        rows.append(row)
    in_sync = sum(1 for r in rows if r["state"] == "in sync")
    if answered and not formatted:
        state, code = "not-formatted", CRITICAL
        summary = f"not formatted: none of the {len(answered)} nodes that answered holds the journal"
    elif fine < majority:
        state, code = "no-quorum", CRITICAL
        summary = f"no quorum: {fine} of {n} nodes usable, {majority} needed"
    elif in_sync == n:
        state, code = "in-sync", OK
        summary = f"in sync: all {n} nodes"
    else:
        state, code = "degraded", DEGRADED
        summary = f"degraded: {in_sync} of {n} nodes in sync, a quorum ({majority}) usable"
    return Health(state, code, rows, summary)


def _sync_note(sync: object) -> str:
    """What catch-up did on the node, when it did anything (design §4.4)."""
    if not isinstance(sync, Mapping):
        return ""
    parts = []
    if _int(sync, "segments_downloaded"):
        parts.append(f"caught up {_int(sync, 'segments_downloaded')} segment(s)")
    if _int(sync, "divergences"):
        parts.append(f"{_int(sync, 'divergences')} divergence(s)")
    return f"  [{', '.join(parts)}]" if parts else ""


def format_status_table(h: Health) -> str:
    """One line per node, then the summary."""
    written = [_int(r, "highest_written_txid") for r in h.rows if r["state"] in ("in sync", "behind")]
    highest = max(written, default=0)
    lines = [
        f"{'node':<24} {'state':<13} {'formatted':<9} {'promised':>8} {'writer':>6} {'committed':>10} "
        f"{'written':>10} {'lag':>6}  segments"
    ]
    for r in h.rows:
        node, state = str(r["node"]), str(r["state"])
        if state in ("unreachable", "error"):
            lines.append(f"{node:<24} {state:<13} {'?':<9} {r.get(state, '')!s}")
            continue
        fmt = "yes" if r.get("formatted") else "no"
        if not r.get("formatted"):
            lines.append(f"{node:<24} {state:<13} {fmt:<9}")
            continue
        segs = [str(s).replace("edits_", "") for s in list(r.get("segments") or [])]  # type: ignore[call-overload]
        shown = ", ".join(segs[-3:]) + (f" (+{len(segs) - 3} older)" if len(segs) > 3 else "")
        w = _int(r, "highest_written_txid")
        lines.append(
            f"{node:<24} {state:<13} {fmt:<9} {_int(r, 'promised_epoch'):>8} {_int(r, 'writer_epoch'):>6} "
            f"{_int(r, 'committed_txid'):>10} {w:>10} {highest - w:>6}  {shown}{_sync_note(r.get('sync'))}"
        )
    lines.append(h.summary)
    return "\n".join(lines)
