"""What ``qjm bench`` prints: the summary of each run, the tables, the notes and the plot.

``summarise`` turns a worker's raw samples into the figures (percentiles, rates, CPU per record,
the disk's ceilings); ``table`` sets floor, qjm native and qjm pure side by side, each as a ratio to
the floor; ``peers_table`` adds the peers and checks qjm native against ``qjm.bench.goals``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from qjm.bench import goals
from qjm.bench.workload import (
    PYTHON_FLOORS,
    RECORD_SIZES,
    ROLL_PHASE_LIMIT,
    ROLL_RECORD,
    disk_bytes_per_record,
    iqr,
    pct,
    spread,
)

FAILOVERS = ("failover", "failover_cold", "failover_same_process")
TAIL_STALENESS = "tail_staleness_"  # tail_staleness_p50_ms, _p99_ms: how far a following reader lags


def _sync_quantiles(phases: list[list[float]]) -> dict[str, list[float]]:
    """``sync_p50_us`` and ``sync_p99_us`` of each latency phase (samples in seconds)."""
    return {f"sync_{q}_us": [pct(ph, f) * 1e6 for ph in phases] for q, f in (("p50", 0.5), ("p99", 0.99))}


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    """The figures of one worker's raw samples (``qjm.bench.workers.worker_qjm``'s shape).

    Each figure is the median of its counted phases (failovers: of its repetitions); ``spread``
    holds, per figure, its minimum and maximum over the phases and every phase (failovers: the
    interquartile range and every repetition); ``warmup`` the warm-up phases, not counted."""
    spreads: dict[str, dict[str, Any]] = {k: spread(v) for k, v in _sync_quantiles(raw["latency"]).items()}
    warm = raw.get("latency_warmup", [])
    warmup: dict[str, float] = {"sync_p50_us": pct(warm, 0.5) * 1e6} if warm else {}
    for key in FAILOVERS:  # none for the peers
        if key in raw or "failover" in raw:
            # the floor's disk work is the same whichever process asks for it
            spreads[f"{key}_p50_ms"] = iqr([x * 1e3 for x in raw.get(key, raw.get("failover", []))])
    for size in RECORD_SIZES:
        for kind in ("tput", "batch"):
            if f"{kind}{size}" in raw:
                spreads[f"{kind}{size}_rps"] = spread(raw[f"{kind}{size}"])
                if f"{kind}{size}_warmup" in raw:
                    warmup[f"{kind}{size}_rps"] = raw[f"{kind}{size}_warmup"]
    if "tput_roll" in raw:  # qjm only: pairs of phases with the writer's own rolls and without (roll_variant)
        spreads["tput_roll_rps"] = spread(raw["tput_roll"])
        spreads["tput_noroll_rps"] = spread(raw["tput_noroll"])
        pairs = zip(raw["tput_roll"], raw["tput_noroll"], strict=True)
        spreads["pipelined_roll_ratio"] = spread([_ratio(r, n) for r, n in pairs])
    s: dict[str, Any] = {k: v["median"] for k, v in spreads.items()}
    for size in RECORD_SIZES:
        for kind in ("tput", "batch"):
            if f"{kind}{size}_rps" in s:
                s[f"{kind}{size}_mbps"] = s[f"{kind}{size}_rps"] * size / 1e6
        s[f"tput{size}_in_sync"] = raw.get(f"tput{size}_in_sync", 3)
        for k, v in raw.get(f"tput{size}_cpu", {}).items():
            s[f"tput{size}_{k}"] = v
    if raw.get("latency_cpu"):  # per sync commit, every process of the worker (user + kernel)
        s["sync_cpu_us"] = (raw["latency_cpu"]["cpu_user_ns"] + raw["latency_cpu"]["cpu_kernel_ns"]) / 1e3
    if "tput_roll" in raw:
        s["rolls"] = raw["rolls"]
        s["roll_every_s"] = raw["roll_every"]
        s["roll_in_sync"] = raw["roll_in_sync"]
        s["roll_nodes"] = raw["roll_nodes"]
    for ceiling in ("ceiling", "raw_ceiling"):  # preallocated segments; O_DIRECT writes extending the file
        if f"{ceiling}_bps" in raw:
            bps = raw[f"{ceiling}_bps"]
            s[f"{ceiling}_mbps"] = bps / 1e6
            for size in RECORD_SIZES:
                s[f"{ceiling}{size}_rps"] = bps / disk_bytes_per_record(size)
    if "raw_ceiling_error" in raw:
        s["raw_ceiling_error"] = raw["raw_ceiling_error"]
    if "tail_staleness" in raw:  # qjm only: a follower in another process (``pipeline``)
        s["tail_staleness_p50_ms"] = pct(raw["tail_staleness"], 0.5) * 1e3
        s["tail_staleness_p99_ms"] = pct(raw["tail_staleness"], 0.99) * 1e3
        s["reader_batches_speedup"] = raw["reader_batches_speedup"]
        s["reader_records_rps"] = raw["reader_records_rps"]  # end to end, bound by the transfer
        s["reader_batches_rps"] = raw["reader_batches_rps"]
    if "latency_plain" in raw:  # qjm native with TLS: the plaintext phase run right before each phase
        s["plain_beside"] = _sync_quantiles(raw["latency_plain"]) | {
            f"tput{size}_rps": raw[f"tput{size}_plain"] for size in RECORD_SIZES if f"tput{size}_plain" in raw
        }
    if "latency_beside" in raw:  # qjm native: the C and bare floors run right before each latency phase
        s["floors_beside"] = raw["latency_beside"]
        warmup["floors_beside"] = raw["latency_beside_warmup"]
    s["spread"] = spreads
    s["warmup"] = warmup
    return s


def times(ratio: float, better: str, worse: str) -> str:
    """A ratio where above 1 is good, in words: "3.2x faster", "1.4x slower" (never "0.7x faster")."""
    if ratio != ratio or ratio <= 0:
        return "n/a"
    if ratio >= 1:
        return f"{ratio:.1f}x {better}"
    return f"{1 / ratio:.1f}x {worse}"


def _fig(v: dict[str, Any], key: str) -> str:
    """A figure with its spread over the phases: "284 (270-301)"; a single value when there is none."""
    if key not in v:
        return "n/a"
    sp = v.get("spread", {}).get(key)
    if sp is None or len(sp.get("phases", sp.get("runs", []))) < 2:
        return _fmt(v[key])
    lo, hi = (sp["min"], sp["max"]) if "min" in sp else (sp["q1"], sp["q3"])
    return f"{_fmt(v[key])} ({_fmt(lo)}-{_fmt(hi)})"


ROWS = [
    ("sync commit p50, 1 KiB batch", "sync_p50_us", "µs", "lower"),
    ("sync commit p99, 1 KiB batch", "sync_p99_us", "µs", "lower"),
    ("throughput 100 B records", "tput100_rps", "rec/s", "higher"),
    ("throughput 100 B records", "tput100_mbps", "MB/s", "higher"),
    ("throughput 1 KiB records", "tput1024_rps", "rec/s", "higher"),
    ("throughput 1 KiB records", "tput1024_mbps", "MB/s", "higher"),
    ("CPU per 100 B record, user space (writer + nodes)", "tput100_cpu_user_ns", "ns", "lower"),
    ("CPU per 100 B record, kernel (writer + nodes)", "tput100_cpu_kernel_ns", "ns", "lower"),
    ("CPU per 1 KiB record, user space (writer + nodes)", "tput1024_cpu_user_ns", "ns", "lower"),
    ("CPU per 1 KiB record, kernel (writer + nodes)", "tput1024_cpu_kernel_ns", "ns", "lower"),
    ("failover p50 (fence+recover+commit), standby process", "failover_p50_ms", "ms", "lower"),
    ("failover p50, cold process", "failover_cold_p50_ms", "ms", "lower"),
    ("failover p50, new writer in the old one's process", "failover_same_process_p50_ms", "ms", "lower"),
]


def _fmt(v: float) -> str:
    if v != v:
        return "n/a"
    if v >= 1e4:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.2f}"


def table(result: dict[str, Any]) -> str:
    f, n, p = (result["summary"][k] for k in ("floor", "native", "pure"))
    lines = [
        "Each figure: the median of the counted phases (min-max over them); failovers: the median of "
        "the repetitions (interquartile range). Warm-up phases are not counted.",
        "",
        "| metric | unit | floor | qjm native | native/floor | qjm pure | pure/floor | native vs pure |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, key, unit, better in ROWS:
        ratio_np = _ratio(p[key], n[key]) if better == "lower" else _ratio(n[key], p[key])
        words = ("less", "more") if key.endswith("_ns") else ("faster", "slower")
        lines.append(
            f"| {label} | {unit} | {_fig(f, key)} | {_fig(n, key)} | {_ratio(n[key], f[key]):.2f}x | {_fig(p, key)} "
            f"| {_ratio(p[key], f[key]):.2f}x | native {times(ratio_np, *words)} |"
        )
    for who, v in (("native", n), ("pure", p)):
        for size in RECORD_SIZES:
            if v.get(f"tput{size}_in_sync", 3) < 3:
                lines.append(
                    f"\nqjm {who}, {size} B records: only {v[f'tput{size}_in_sync']} of 3 nodes were in sync at the "
                    "end: a node fell more than queued_edits_limit_bytes behind and was dropped until the next "
                    "segment, so that figure is for fewer replicas than the floor's."
                )
    lines.append("")
    if "tail_staleness_p50_ms" in n:
        lines.append(pipeline_note(n, p))
    else:
        lines.append("tail staleness, qjm native: not measured")
    if "c_floors" in result:
        lines.append("")
        lines.append(c_floor_note(result["c_floors"], n))
    if "control_floor" in result:
        lines.append("")
        lines.append(failover_floor_note(result["control_floor"], result["summary"]))
    if "ceiling_mbps" in f:
        lines.append("")
        lines.append(ceiling_note(result["summary"]))
    for who, v in (("native", n), ("pure", p)):
        if "pipelined_roll_ratio" in v:
            lines.append("")
            lines.append(roll_note(who, v))
    if "download_rss_mib" in result:
        lines.append("")
        lines.append(download_note(result["download_rss_mib"]))
    m = result["machine"]
    lines.append("")
    lines.append(
        f"machine: {m['cpu']}, {m['cpus']} CPUs, Linux {m['kernel']}, Python {m['python']}, "
        f"{m['filesystem']} at {m['directory']}, load {m['loadavg_before'][0]:.1f} before / "
        f"{m['loadavg_after'][0]:.1f} after; capabilities {m['capabilities']}; commit {m['commit'] or '?'}"
    )
    return "\n".join(lines)


def roll_note(who: str, v: dict[str, Any]) -> str:
    """The cost of the writer's own rolls: pipelined throughput with them against without, as the
    median of the ratios of pairs of phases, with their spread, and what would make it doubtful."""
    ratio = v["pipelined_roll_ratio"]
    goal = goals.ROLL_OVER_NO_ROLL
    sp = v["spread"]["pipelined_roll_ratio"]
    pairs = len(sp["phases"])
    note = (
        f"automatic roll, qjm {who}: pipelined {ROLL_RECORD} B records/s with the writer rolling every "
        f"{v['roll_every_s']:g} s {_fig(v, 'tput_roll_rps')} against {_fig(v, 'tput_noroll_rps')} with rolls off, "
        f"in {pairs} pairs of phases: pipelined_roll_ratio {ratio:.2f} ({sp['min']:.2f}-{sp['max']:.2f}), "
        f"the median of the pairs' ratios (goal >= {goal}: {'met' if ratio >= goal else 'missed'})"
    )
    if sp["min"] < goal <= sp["max"]:
        note += "; the pairs fall on both sides of the goal, so this run does not settle it"
    if v["rolls"] < pairs:
        note += f"; only {v['rolls']} rolls in {pairs} rolling phases (a phase ends after {ROLL_PHASE_LIMIT} periods)"
    if v["roll_in_sync"] < v["roll_nodes"]:
        note += f"; only {v['roll_in_sync']} of {v['roll_nodes']} nodes were in sync at the end of some phase"
    return note


def pipeline_note(native: dict[str, Any], pure: dict[str, Any]) -> str:
    """Followers and packed reading (``pipeline``), against their goals."""

    def met(ok: bool) -> str:
        return "met" if ok else "MISSED"

    keys = ("tail_staleness_p50_ms", "tail_staleness_p99_ms", "reader_batches_speedup")
    p50, p99, speedup = (native[k] for k in keys)
    return (
        f"tail staleness (sync returned -> yielded by a tail in another process), qjm native: p50 {p50:.2f} ms "
        f"(goal <= {goals.TAIL_STALENESS_P50_MS:g}: {met(p50 <= goals.TAIL_STALENESS_P50_MS)}), p99 {p99:.2f} ms "
        f"(goal <= {goals.TAIL_STALENESS_P99_MS:g}: {met(p99 <= goals.TAIL_STALENESS_P99_MS)}); pure: p50 "
        f"{pure.get('tail_staleness_p50_ms', float('nan')):.2f} ms. Reader.batches() reads {speedup:.1f}x the "
        f"records/s of per-record iteration (goal >= {goals.BATCHES_SPEEDUP:g}x: "
        f"{met(speedup >= goals.BATCHES_SPEEDUP)})."
    )


TLS_ROWS = [
    ("sync commit p50, 1 KiB batch", "sync_p50_us", "µs", goals.TLS_SYNC_P50_OVER_PLAIN),
    ("sync commit p99, 1 KiB batch", "sync_p99_us", "µs", None),
    *((f"throughput {s} B records", f"tput{s}_rps", "rec/s", goals.TLS_THROUGHPUT_OVER_PLAIN) for s in RECORD_SIZES),
    *((f"CPU per {s} B record, user + kernel", f"tput{s}_cpu_ns", "ns", None) for s in RECORD_SIZES),
    ("failover p50, new writer in the old one's process", "failover_same_process_p50_ms", "ms", None),
]


def _tls_figure(v: dict[str, Any], key: str) -> float:
    if key.endswith("_cpu_ns"):
        base = key[: -len("_cpu_ns")]
        return float(v.get(f"{base}_cpu_user_ns", float("nan")) + v.get(f"{base}_cpu_kernel_ns", float("nan")))
    return float(v[key])


def tls_goals(summary: dict[str, Any]) -> dict[str, Any]:
    """qjm native with mutual TLS against qjm native without, same run: each goal's ratio and verdict.

    With ``plain_beside`` in ``native_tls`` (a plaintext cluster's phase run right before each TLS
    phase, in the TLS worker), the ratio is the median over the phases of each TLS phase's over
    the plaintext phase right before it (``paired``), with their lowest and highest
    (``phases_ratio``), ``settled`` (False when they fall on both sides of the goal) and
    ``separate_runs_ratio``, the ratio to the native worker's figure. Why: that worker ran minutes
    earlier, and the disk's drift between them moved the ratio by more than the goals' margins."""
    plain, tls = summary["native"], summary["native_tls"]
    beside = tls.get("plain_beside", {})
    out: dict[str, Any] = {}
    for _, key, _, goal in TLS_ROWS:
        if goal is None:
            continue
        sync = key.startswith("sync")
        separate = _ratio(tls[key], plain[key])
        mine = tls.get("spread", {}).get(key, {}).get("phases", [])
        theirs = beside.get(key, [])
        if mine and len(mine) == len(theirs):
            ratios = [_ratio(a, b) for a, b in zip(mine, theirs, strict=True)]
            out[key] = _paired(ratios, goal, higher_is_better=not sync) | {"separate_runs_ratio": separate}
        else:
            out[key] = {"ratio": separate, "goal": goal, "met": separate <= goal if sync else separate >= goal}
    return out


def tls_table(result: dict[str, Any]) -> str:
    """qjm native with and without mutual TLS (both planes), side by side, and the TLS goals."""
    plain, tls = result["summary"]["native"], result["summary"]["native_tls"]
    verdicts = result.get("tls_goals") or tls_goals(result["summary"])
    lines = [
        "| metric | unit | qjm native | qjm native + mutual TLS | TLS/plain | goal |",
        "|---|---|---:|---:|---:|---|",
    ]
    for label, key, unit, goal in TLS_ROWS:
        a, b = _tls_figure(plain, key), _tls_figure(tls, key)
        verdict = ""
        if goal is not None:
            v = verdicts[key]
            sign = "<=" if key.startswith("sync") else ">="
            verdict = f"{sign} {goal}x: {'met' if v['met'] else 'missed'}"
        ratio = f"{_ratio(b, a):.2f}x"
        if goal is not None and verdicts[key].get("paired"):
            ratio = f"{verdicts[key]['ratio']:.2f}x ({ratio})"
        lines.append(f"| {label} | {unit} | {_fmt(a)} | {_fmt(b)} | {ratio} | {verdict} |")
    if any(v.get("paired") for v in verdicts.values()):
        lines.append(
            "\nTLS/plain on the goals' rows: the median over the phases of each TLS phase over a plaintext "
            "cluster's phase run right before it, which the goal judges; in parentheses, over the native run's "
            "column, measured minutes earlier."
        )
    return "\n".join(lines)


def download_note(d: dict[str, float]) -> str:
    """The download_rss_mib phase: what serving, catching up and reading one segment cost in RSS."""
    return (
        f"download_rss_mib ({d['segment_mib']:.0f} MiB finalized segment, RSS growth while it streams): "
        f"node catching it up {d['catch_up']:.1f}, node serving it {d['catch_up_serving']:.1f}, "
        f"reader {d['reader']:.1f}, node serving the reader {d['reader_serving']:.1f} "
        f"(read in {d['read_seconds']:.1f} s)"
    )


def c_floor_note(c: dict[str, Any], native: dict[str, Any]) -> str:
    """The C floors beside qjm native: how far the network alone puts any implementation."""
    if "skipped" in c:
        return f"C floors (bench/netfloor): not measured: {c['skipped']}"
    lp, np_ = c["local_p50_us"], c["net_p50_us"]
    verdicts = sync_goals(c, native)
    runs = len(c.get("spread", {}).get("net_p50_us", {}).get("phases", [])) or 1
    return (
        f"C floors (bench/netfloor, this run, median of {runs} runs (min-max)): "
        f"local p50 {_fig(c, 'local_p50_us')} µs, p99 {_fig(c, 'local_p99_us')} µs; "
        "networked (2 of 3 receiver processes over loopback, no protocol, no Python) "
        f"p50 {_fig(c, 'net_p50_us')} µs = {_ratio(np_, lp):.2f}x its local floor, "
        f"p99 {_fig(c, 'net_p99_us')} µs; qjm native sync p50 = {_verdict(verdicts['sync_p50_us'])}, "
        f"p99 = {_verdict(verdicts['sync_p99_us'], 'the networked p99')}, "
        f"{_ratio(native['sync_p50_us'], lp):.2f}x the C local floor"
        + cpu_per_commit_note(c, native)
        + python_floors_note(c, verdicts["sync_p50_us"])
    )


def python_floors_note(c: dict[str, Any], p50: dict[str, Any]) -> str:
    """The Python floors beside the C floor: how much of the sync goal a qjm of Python processes has
    left for its protocol once Python and qjm's own wire have taken their share."""
    if "python_floors" not in p50:
        return ""
    f = p50["python_floors"]
    if p50.get("paired"):
        text = (
            ". Beside each latency phase, the same round over qjm's wire and native receiver with no "
            f"protocol (bare, qjm.bench.pyfloor) = {f['bare']:.2f}x the C floor beside it (median over the "
            "phases). "
        )
    else:
        text = (
            f". The same round in Python processes (qjm.bench.pyfloor, this run): with no protocol p50 "
            f"{_fig(c, 'py_p50_us')} µs = {f['py']:.2f}x the C networked floor; over qjm's wire and native "
            f"receiver with no protocol (bare) {_fig(c, 'bare_p50_us')} µs = {f['bare']:.2f}x. "
        )
    allowance = p50["allowance_us"]
    if allowance >= 0:
        text += f"The goal leaves qjm's protocol {allowance:.0f} µs a commit over bare"
    else:
        text += f"The goal lies {-allowance:.0f} µs a commit below bare itself: out of reach for Python processes"
    if "protocol_us" in p50:
        text += f"; it takes {p50['protocol_us']:.0f} µs"
    if "py_cpu_us" in c and "bare_cpu_us" in c:
        text += f" (CPU per commit, every process: py {c['py_cpu_us']:.0f} µs, bare {c['bare_cpu_us']:.0f} µs)"
    return text


def sync_goals(c: dict[str, Any], native: dict[str, Any]) -> dict[str, Any]:
    """qjm native's sync p50 and p99 against the C networked floor's, same run: each goal's ratio,
    verdict, ``phases_ratio`` and ``settled`` (False when ``phases_ratio`` holds the goal). Empty
    when the C floors were not measured.

    With ``floors_beside`` in ``native`` (the C floor and ``bare`` run right before each latency
    phase), the ratio is the median over the phases of each phase's over its own C floor
    (``paired``), and ``phases_ratio`` their lowest and highest. Otherwise it is the medians' ratio
    against the C floor's separate runs, and ``phases_ratio`` the widest the phases allow (qjm's
    best over the floor's worst, its worst over the floor's best). Paired, the verdict also gives
    ``separate_runs_ratio``: the same against the floor's separate runs.

    Why pairs: the floors swing from minute to minute on a shared machine (the C floor's p50 by a
    quarter between runs, more than the goal's margin), and a floor measured a minute from the
    phase it judges carries that swing into the verdict. Why ``settled``: p99s (qjm's and the
    floor's) can swing 2-3x between phases, and a ratio alone would read as a verdict either way.

    With the Python floors (``qjm.bench.pyfloor``), ``python_floors`` gives theirs over the C floor
    (``py``: Python at both ends, no protocol; ``bare``: qjm's wire and native receiver, no
    protocol), ``protocol_us`` what qjm's protocol adds to ``bare`` and ``allowance_us`` what the
    goal leaves it (negative: the goal is below ``bare`` itself); paired, ``bare``'s figures are
    those run beside each phase (medians over the phases)."""
    if "skipped" in c:
        return {}
    out: dict[str, Any] = {}
    for q, goal in (("p50", goals.SYNC_P50_OVER_NETFLOOR), ("p99", goals.SYNC_P99_OVER_NETFLOOR)):
        key = f"sync_{q}_us"
        pairs = _paired_phases(native, q)
        v = _paired_verdict(pairs, q, goal) if pairs else _separate_verdict(c, native, q, goal)
        if pairs and key in native:
            v["separate_runs_ratio"] = _ratio(native[key], c[f"net_{q}_us"])
        out[key] = v
    return out


def _paired_phases(native: dict[str, Any], q: str) -> list[tuple[float, dict[str, float]]]:
    """(qjm's phase figure, the floors run right before it) for each counted latency phase; empty
    when the floors did not run beside every phase."""
    beside = native.get("floors_beside") or []
    mine = native.get("spread", {}).get(f"sync_{q}_us", {}).get("phases", [])
    if not beside or len(beside) != len(mine):
        return []
    return list(zip(mine, beside, strict=True))


def _paired(ratios: list[float], goal: float, higher_is_better: bool = False) -> dict[str, Any]:
    """A goal judged on phases each measured beside its own reference: the median of their ratios,
    met or not, their range, and ``settled`` (False when the phases fall on both sides of the goal)."""
    ratio = statistics.median(ratios)
    lo, hi = min(ratios), max(ratios)
    return {
        "ratio": ratio, "goal": goal, "met": ratio >= goal if higher_is_better else ratio <= goal, "paired": True,
        "phases_ratio": [lo, hi], "settled": not (lo < goal <= hi if higher_is_better else lo <= goal < hi),
    }  # fmt: skip


def _paired_verdict(pairs: list[tuple[float, dict[str, float]]], q: str, goal: float) -> dict[str, Any]:
    v = _paired([_ratio(mine, f[f"net_{q}_us"]) for mine, f in pairs], goal)
    if all(f"bare_{q}_us" in f for _, f in pairs):
        v["python_floors"] = {"bare": statistics.median(_ratio(f[f"bare_{q}_us"], f[f"net_{q}_us"]) for _, f in pairs)}
        v["allowance_us"] = statistics.median(goal * f[f"net_{q}_us"] - f[f"bare_{q}_us"] for _, f in pairs)
        v["protocol_us"] = statistics.median(mine - f[f"bare_{q}_us"] for mine, f in pairs)
    return v


def _separate_verdict(c: dict[str, Any], native: dict[str, Any], q: str, goal: float) -> dict[str, Any]:
    key, c_key = f"sync_{q}_us", f"net_{q}_us"
    ratio = _ratio(native[key], c[c_key]) if key in native else float("nan")
    v: dict[str, Any] = {"ratio": ratio, "goal": goal, "met": ratio <= goal}
    if all(f"{m}_{q}_us" in c for m in PYTHON_FLOORS):
        v["python_floors"] = {m: _ratio(c[f"{m}_{q}_us"], c[c_key]) for m in PYTHON_FLOORS}
        bare = c[f"bare_{q}_us"]
        v["allowance_us"] = goal * c[c_key] - bare
        if key in native:
            v["protocol_us"] = native[key] - bare
    mine = native.get("spread", {}).get(key)
    theirs = c.get("spread", {}).get(c_key)
    lo, hi = (_ratio(mine["min"], theirs["max"]), _ratio(mine["max"], theirs["min"])) if mine and theirs else (0, 0)
    if math.isfinite(lo) and math.isfinite(hi) and lo > 0:  # phases that say nothing settle nothing
        v["phases_ratio"] = [lo, hi]
        v["settled"] = not lo <= goal < hi
    return v


def _verdict(v: dict[str, Any], floor: str = "the networked floor") -> str:
    if v.get("paired"):
        lo, hi = v["phases_ratio"]
        text = (
            f"{v['ratio']:.2f}x {floor}, phase by phase against the C floor run right before each "
            f"({lo:.2f}x-{hi:.2f}x; against its separate runs {v['separate_runs_ratio']:.2f}x) "
            f"(goal <= {v['goal']}x: {_met(v['met'])}"
        )
        if v["settled"] is False:
            text += "; its phases fall on both sides of the goal: this run does not settle it"
        return text + ")"
    text = f"{v['ratio']:.2f}x {floor} (goal <= {v['goal']}x: {_met(v['met'])}"
    if v.get("settled") is False:
        lo, hi = v["phases_ratio"]
        text += f"; its phases give {lo:.2f}x-{hi:.2f}x, both sides of the goal: this run does not settle it"
    return text + ")"


def failover_floor_note(control: dict[str, Any], summary: dict[str, Any]) -> str:
    """qjm native's cold takeover against its goal and the floors of the same run: the same control
    rounds over bare gRPC and over plain sockets (``qjm.bench.control_floor``), and the disk work alone."""
    native, floor = summary["native"], summary["floor"]
    took, bare = native["failover_cold_p50_ms"], control["cold_p50_ms"]
    goal = goals.FAILOVER_COLD_MS
    note = (
        f"failover by a cold process: qjm native p50 {_fig(native, 'failover_cold_p50_ms')} ms "
        f"(goal <= {goal:g} ms: {_met(took <= goal)}); floors in this run: the same four control rounds "
        "(get_journal_state, new_epoch, finalize, start; 2 of 3 answers each) from a cold process to three "
        f"bare gRPC servers, {_fig(control, 'cold_p50_ms')} ms with the node's disk work in each round "
        f"(the first commit's folded into the last), {_fig(control, 'cold_nodisk_p50_ms')} ms without it"
    )
    if "cold_socket_p50_ms" in control:
        note += f"; the same rounds and disk work over plain TCP sockets, {_fig(control, 'cold_socket_p50_ms')} ms"
    note += (
        f"; the disk work alone {_fig(floor, 'failover_cold_p50_ms')} ms; "
        f"qjm native = {_ratio(took, bare):.2f}x the gRPC floor"
    )
    if bare > goal:
        note += " (that floor is above the goal: a takeover over gRPC cannot meet it on this machine"
        if control.get("cold_socket_p50_ms", goal + 1) <= goal:
            note += "; one whose rounds travel outside gRPC can"
        note += ")"
    return note


def cpu_per_commit_note(c: dict[str, Any], native: dict[str, Any]) -> str:
    """CPU time per sync commit, all processes (user + kernel): on a machine with few cores a
    commit's CPU work is a share of its latency, so the gap to the C floor shows here first."""
    if "net_cpu_us" not in c or "sync_cpu_us" not in native:
        return ""
    return (
        f"; CPU per sync commit (user + kernel, every process): C networked {c['net_cpu_us']:.0f} µs, "
        f"qjm native {native['sync_cpu_us']:.0f} µs ({_ratio(native['sync_cpu_us'], c['net_cpu_us']):.1f}x)"
    )


def _met(ok: bool) -> str:
    return "met" if ok else "missed"


def ceiling_note(summary: dict[str, Any]) -> str:
    """How far the disk lets throughput go: qjm native's share of the bandwidth ceiling, and what
    the native-over-pure goal would need of it."""
    f, n, p = (summary[k] for k in ("floor", "native", "pure"))
    lines = [
        f"disk ceiling, the node's write pattern (three appenders writing ~1 MiB frames into preallocated "
        f"segments, one fdatasync each): {f['ceiling_mbps']:.0f} MB/s each"
    ]
    if "raw_ceiling_mbps" in f:
        raw = f["raw_ceiling_mbps"]
        lines[0] += f"; with no preallocation (1 MiB O_DIRECT writes extending the file): {raw:.0f} MB/s"
    elif "raw_ceiling_error" in f:
        lines[0] += f"; with no preallocation: not measured ({f['raw_ceiling_error']})"
    for size in RECORD_SIZES:
        ceiling = f[f"ceiling{size}_rps"]
        need = goals.NATIVE_OVER_PURE * p[f"tput{size}_rps"]
        share = _ratio(n[f"tput{size}_rps"], ceiling)
        line = (
            f"- {size} B records: at most {_fmt(ceiling)}/s; native reaches {share:.0%} of it;"
            f" {goals.NATIVE_OVER_PURE:.0f}x pure would be {_fmt(need)}/s = {_ratio(need, ceiling):.2f}x it"
        )
        if "raw_ceiling_mbps" in f:
            line += f" ({_ratio(need, f[f'raw_ceiling{size}_rps']):.2f}x the ceiling with no preallocation)"
        lines.append(line)
    return "\n".join(lines)


PEER_LABELS = {"zookeeper": "ZooKeeper", "etcd": "etcd", "nats": "NATS JetStream"}


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


CLIENTS = {"tput": "one record per request", "batch": "batched"}


def best_durable(peers: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    """The durable peer row with the most 1 KiB records/s: (peer, "tput" or "batch"), over both clients."""
    rows = [(k, c) for k, v in peers.items() if v["durable"] for c in CLIENTS if f"{c}1024_rps" in v]
    return max(rows, key=lambda r: peers[r[0]][f"{r[1]}1024_rps"]) if rows else None


def peer_goals(result: dict[str, Any]) -> dict[str, Any]:
    """qjm native against the peers: the best durable peer per figure (throughput over both of its
    clients), the project's goals (one record per request), and the non-durable peers."""
    n = result["summary"]["native"]
    peers: dict[str, dict[str, Any]] = result["peers"]
    durable = {k: v for k, v in peers.items() if v["durable"]}
    out: dict[str, Any] = {}
    if durable:
        lat_best = min(durable, key=lambda k: durable[k]["sync_p50_us"])
        tput_best = max(durable, key=lambda k: durable[k]["tput1024_rps"])
        lat_ratio = _ratio(n["sync_p50_us"], durable[lat_best]["sync_p50_us"])
        tput_ratio = _ratio(n["tput1024_rps"], durable[tput_best]["tput1024_rps"])
        out["latency"] = {"peer": lat_best, "ratio": lat_ratio, "goal": goals.LATENCY_OVER_PEER,
                          "met": lat_ratio <= goals.LATENCY_OVER_PEER}  # fmt: skip
        met = tput_ratio >= goals.THROUGHPUT_OVER_PEER
        out["throughput"] = {"peer": tput_best, "client": CLIENTS["tput"], "ratio": tput_ratio,
                             "goal": goals.THROUGHPUT_OVER_PEER, "met": met}  # fmt: skip
    best = best_durable(peers)
    if best is not None:
        peer, client = best
        ratio = _ratio(n["tput1024_rps"], peers[peer][f"{client}1024_rps"])
        out["best_durable_row"] = {"peer": peer, "client": CLIENTS[client], "ratio": ratio,
                                   "words": times(ratio, "faster", "slower")}  # fmt: skip
    out["non_durable"] = {
        k: {
            "latency_ratio": _ratio(n["sync_p50_us"], v["sync_p50_us"]),
            "throughput_ratio": _ratio(n["tput1024_rps"], max(v.get(f"{c}1024_rps", 0.0) for c in CLIENTS)),
            "met": n["sync_p50_us"] < v["sync_p50_us"]
            and n["tput1024_rps"] > max(v.get(f"{c}1024_rps", 0.0) for c in CLIENTS),
        }
        for k, v in peers.items()
        if not v["durable"]
    }
    return out


def peers_table(result: dict[str, Any]) -> str:
    """Floor, qjm native and each peer both ways (one record per request, its batching client) on
    the two workloads, qjm native against each row in words, and the goals."""
    s = result["summary"]
    n = s["native"]
    lines = [
        "| system | client | durable per commit | sync p50 µs | sync p99 µs | 1 KiB rec/s | 1 KiB MB/s | 100 B rec/s "
        "| qjm native latency | qjm native 1 KiB throughput |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(label: str, client: str, durable: str, v: dict[str, Any], kind: str, ratios: bool) -> None:
        latency = kind == "tput"  # the batched rows have no latency of their own: one record per request
        lat = times(_ratio(v["sync_p50_us"], n["sync_p50_us"]), "faster", "slower") if ratios and latency else "—"
        tput = times(_ratio(n["tput1024_rps"], v[f"{kind}1024_rps"]), "faster", "slower") if ratios else "—"
        p50 = _fig(v, "sync_p50_us") if latency else "—"
        p99 = _fig(v, "sync_p99_us") if latency else "—"
        lines.append(
            f"| {label} | {client} | {durable} | {p50} | {p99} | {_fig(v, f'{kind}1024_rps')} "
            f"| {_fmt(v[f'{kind}1024_mbps'])} | {_fig(v, f'{kind}100_rps')} | {lat} | {tput} |"
        )

    row("disk floor (no network)", "—", "yes (fdatasync)", s["floor"], "tput", False)
    row("qjm native", "pipelined writer", "yes (fdatasync on a majority)", n, "tput", False)
    for name, v in result["peers"].items():
        durable = "yes (fsync on a majority)" if v["durable"] else "**no**: not durable per message (sync interval)"
        label = f"{PEER_LABELS.get(name, name)} {v['version']}"
        row(label, CLIENTS["tput"], durable, v, "tput", True)
        if "batch1024_rps" in v:
            row(label, CLIENTS["batch"], durable, v, "batch", True)
    t = result["peer_goals"]
    lines.append("")
    lines.append(
        "Figures: median of the counted phases (min-max). 'qjm native latency/throughput': how much faster "
        "(or slower) qjm native is than that row."
    )
    if "best_durable_row" in t:
        b = t["best_durable_row"]
        v = result["peers"][b["peer"]]
        kind = "batch" if b["client"] == CLIENTS["batch"] else "tput"
        lines.append(
            f"against the best durable row ({PEER_LABELS.get(b['peer'], b['peer'])}, {b['client']}, "
            f"{_fmt(v[f'{kind}1024_rps'])} 1 KiB rec/s): qjm native {_fmt(n['tput1024_rps'])} rec/s is {b['words']}"
        )
    if "latency" in t:
        lat, tput = t["latency"], t["throughput"]
        p_lat, p_tput = result["peers"][lat["peer"]], result["peers"][tput["peer"]]
        lines.append(
            f"goal latency: qjm native sync p50 <= {lat['goal']}x the best durable peer "
            f"({PEER_LABELS.get(lat['peer'], lat['peer'])}, {_fmt(p_lat['sync_p50_us'])} µs): "
            f"{_fmt(n['sync_p50_us'])} µs = {lat['ratio']:.2f}x -> {_met(lat['met'])}"
        )
        lines.append(
            f"goal throughput: qjm native 1 KiB rec/s >= {tput['goal']:.0f}x the best durable peer, one record per "
            f"request ({PEER_LABELS.get(tput['peer'], tput['peer'])}, {_fmt(p_tput['tput1024_rps'])} rec/s): "
            f"{_fmt(n['tput1024_rps'])} rec/s = {tput['ratio']:.1f}x -> {_met(tput['met'])}"
        )
    for name, v in t["non_durable"].items():
        lines.append(
            f"goal ahead of non-durable {PEER_LABELS.get(name, name)} (its best client): latency "
            f"{times(1 / v['latency_ratio'] if v['latency_ratio'] else float('nan'), 'faster', 'slower')}, "
            f"throughput {times(v['throughput_ratio'], 'faster', 'slower')} -> {_met(v['met'])}"
        )
    m = result["machine"]
    if "loadavg_before_peers" in m:
        before, after = m["loadavg_before_peers"][0], m["loadavg_after"][0]
        lines.append(f"load average {before:.1f} before the peers, {after:.1f} after")
    lines.append("")
    for name, v in result["peers"].items():
        label = f"{PEER_LABELS.get(name, name)} {v['version']}"
        lines.append(f"- {label}, one record per request: {v['how']}")
        if v.get("how_batched"):
            lines.append(f"- {label}, batched: {v['how_batched']}")
    return "\n".join(lines)


def plot_result(result: dict[str, Any], path: str) -> list[str]:
    """Four panels (matplotlib: the ``bench`` extra; the driver checks it is there before the run):
    the sync latency CDF, throughput with its spread, failover with its interquartile range, and
    the tail's staleness (or "not measured"). Returns the texts written: the title, each panel's
    title, the notes, the legends' entries and the throughput axis's tick labels."""
    import matplotlib  # the bench extra: only --plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    m = result["machine"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (ax1, ax2), (ax3, ax4) = axes
    title = f"qjm bench: qjm {m.get('qjm_version', '?')}, commit {str(m.get('commit') or '?')[:12]}, {m['cpus']} CPUs"
    if "loadavg_before" in m and "loadavg_after" in m:
        title += f", load average {m['loadavg_before'][0]:.1f} before, {m['loadavg_after'][0]:.1f} after"
    if result["smoke"]:
        title += "\nSMOKE RUN: tiny counts for CI, not figures to quote"
    fig.suptitle(title, color="red" if result["smoke"] else "black")
    series = {name: (result["raw"][name]["latency"], result["summary"][name]) for name in ("floor", "native", "pure")}
    for name, v in result.get("peers", {}).items():  # --peers: the peers beside qjm
        series[PEER_LABELS.get(name, name)] = (result["raw"]["peers"][name]["latency"], v)
    top = 0.0
    for name, (phases, _) in series.items():
        lat = sorted(x * 1e6 for ph in phases for x in ph)
        if lat:
            top = max(top, pct(lat, 0.9))
            ax1.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=name)
    c = dict(result.get("c_floors", {}))
    beside = result["summary"]["native"].get("floors_beside")
    if beside and "net_p50_us" in c:  # the floors the verdict pairs with qjm's phases: theirs mark the plot
        for key in ("net_p50_us", "bare_p50_us"):
            c[key] = statistics.median(f[key] for f in beside)
    if "net_p50_us" in c:  # the networked floors' medians and the goal, where the CDFs cross p50
        marks = [("net", "C networked floor", ":"), ("py", "Python, no protocol", "-."),
                 ("bare", "qjm's wire, no protocol", "--")]  # fmt: skip
        for key, label, style in marks:
            if f"{key}_p50_us" in c:
                ax1.axvline(c[f"{key}_p50_us"], color="black", linestyle=style, linewidth=0.9, label=f"p50: {label}")
        goal = goals.SYNC_P50_OVER_NETFLOOR * c["net_p50_us"]
        ax1.axvline(goal, color="red", linestyle="--", linewidth=0.9,
                    label=f"goal: p50 <= {goals.SYNC_P50_OVER_NETFLOOR}x the C floor")  # fmt: skip
        top = max(top, goal)
    ax1.set_xlim(0, top * 1.1 or 1)  # linear, to the slowest p90: the tail beyond is in the table
    ax1.set_xlabel("sync commit latency of one 1 KiB record (µs), linear, cut at the slowest p90")
    ax1.set_ylabel("fraction of commits")
    ax1.set_title("sync commit latency (CDF, counted phases)")
    ax1.legend(fontsize=8)
    ax1.grid(True, alpha=0.3)

    bars: list[tuple[str, dict[str, Any], str]] = [(name, v, "tput") for name, (_, v) in series.items()]
    for name, v in result.get("peers", {}).items():
        if "batch1024_rps" in v:
            bars.append((f"{PEER_LABELS.get(name, name)} batched", v, "batch"))
    width = 0.8 / len(bars)
    heights: list[float] = []
    for j, (name, v, kind) in enumerate(bars):
        keys = [f"{kind}{s}_rps" for s in RECORD_SIZES]
        vals = [v[k] for k in keys]
        heights += vals
        lo = [v[k] - v["spread"][k]["min"] if k in v.get("spread", {}) else 0.0 for k in keys]
        hi = [v["spread"][k]["max"] - v[k] if k in v.get("spread", {}) else 0.0 for k in keys]
        offset = (j - (len(bars) - 1) / 2) * width
        ax2.bar([i + offset for i in range(len(RECORD_SIZES))], vals, width, yerr=[lo, hi], capsize=2, label=name)
    ax2.set_xticks(range(len(RECORD_SIZES)), [f"{s} B records" for s in RECORD_SIZES])
    ax2.set_yscale("log")
    # Bars less than a decade or so apart leave few major ticks, and matplotlib then labels minor
    # ticks too, in 10^x form: those get the same short labels, at 2, 3 and 5 times a power of ten;
    # over more decades (the peers beside qjm) the major ticks say enough.
    ax2.yaxis.set_major_formatter(FuncFormatter(lambda y, _: _si(y)))
    few_decades = max(heights) < 30 * min(heights) if heights and min(heights) > 0 else True
    ax2.yaxis.set_minor_formatter(
        FuncFormatter(lambda y, _: _si(y) if few_decades and _leading_digit(y) in (2, 3, 5) else "")
    )
    ax2.set_ylabel("records/s (log scale)")
    ax2.set_title("pipelined throughput: median, whiskers min-max of the phases")
    ax2.legend(fontsize=7, ncol=2)
    ax2.grid(True, axis="y", which="major", alpha=0.3)

    kinds = [("failover_p50_ms", "standby process"), ("failover_cold_p50_ms", "cold process"),
             ("failover_same_process_p50_ms", "same process")]  # fmt: skip
    who = [("floor (disk work)", result["summary"]["floor"]), ("qjm native", result["summary"]["native"]),
           ("qjm pure", result["summary"]["pure"])]  # fmt: skip
    width = 0.8 / len(who)
    tallest = goals.FAILOVER_COLD_MS
    for j, (name, v) in enumerate(who):
        vals = [v[k] for k, _ in kinds]
        sp = [v["spread"][k] for k, _ in kinds]
        err = [
            [x - s["q1"] for x, s in zip(vals, sp, strict=True)],
            [s["q3"] - x for x, s in zip(vals, sp, strict=True)],
        ]
        tallest = max(tallest, *(s["q3"] for s in sp), *vals)
        offset = (j - (len(who) - 1) / 2) * width
        ax3.bar([i + offset for i in range(len(kinds))], vals, width, yerr=err, capsize=2, label=name)
    ax3.set_ylim(0, tallest * 1.6)  # headroom: the legend sits above the bars, not over them
    ax3.axhline(goals.FAILOVER_COLD_MS, color="grey", linestyle="--", label=f"goal {goals.FAILOVER_COLD_MS:.0f} ms")
    if "control_floor" in result:  # over the cold process's bars only: the floor of that takeover
        cold = [k for k, _ in kinds].index("failover_cold_p50_ms")
        ax3.hlines(result["control_floor"]["cold_p50_ms"], cold - 0.45, cold + 0.45, colors="black",
                   linestyles=":", label="cold: bare gRPC rounds + disk work (floor)")  # fmt: skip
        if "cold_socket_p50_ms" in result["control_floor"]:
            ax3.hlines(result["control_floor"]["cold_socket_p50_ms"], cold - 0.45, cold + 0.45, colors="black",
                       linestyles="-.", label="cold: the same rounds over plain sockets + disk work")  # fmt: skip
    ax3.set_xticks(range(len(kinds)), [label for _, label in kinds])
    ax3.set_ylabel("fence + recover + first commit (ms)")
    ax3.set_title("failover: median, whiskers the interquartile range")
    ax3.legend(fontsize=7, ncol=2, loc="upper left")
    ax3.grid(True, axis="y", alpha=0.3)

    n = result["summary"]["native"]
    ax4.set_title("tail staleness (a reader following the writer)")
    if f"{TAIL_STALENESS}p50_ms" in n:
        keys = [k for k in (f"{TAIL_STALENESS}p50_ms", f"{TAIL_STALENESS}p99_ms") if k in n]
        ax4.bar(range(len(keys)), [n[k] for k in keys], 0.5, label="qjm native")
        ax4.set_xticks(range(len(keys)), [k.removeprefix(TAIL_STALENESS).replace("_ms", "") for k in keys])
        ax4.set_ylabel("commit to read by the tail (ms)")
        ax4.grid(True, axis="y", alpha=0.3)
    else:
        ax4.text(0.5, 0.5, "not measured in this run", ha="center", va="center", transform=ax4.transAxes)
        ax4.set_xticks([])
        ax4.set_yticks([])
    fig.tight_layout(rect=(0, 0, 1, 0.94))  # room for the title
    fig.savefig(path, dpi=120)
    texts = [title] + [ax.get_title() for ax in axes.flat] + [t.get_text() for ax in axes.flat for t in ax.texts]
    texts += [t.get_text() for ax in axes.flat if ax.get_legend() is not None for t in ax.get_legend().get_texts()]
    texts += [t.get_text() for minor in (False, True) for t in ax2.get_yticklabels(minor=minor) if t.get_text()]
    plt.close(fig)
    return texts


def _leading_digit(v: float) -> int:
    """The first significant digit of ``v`` > 0: 3 for 300000, 2 for 2.0e6."""
    return int(round(v / 10 ** math.floor(math.log10(v)), 6))


def _si(v: float) -> str:
    """A tick label: 3000 -> "3k", 2.5e6 -> "2.5M"."""
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:g}{suffix}"
    return f"{v:g}"
