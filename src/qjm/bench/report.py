"""What ``qjm bench`` prints: the summary of each run, the tables, the notes and the plot.

``summarise`` turns a worker's raw samples into the figures (percentiles, rates, CPU per record,
the disk's ceilings); ``table`` sets floor, qjm native and qjm pure side by side, each as a ratio to
the floor; ``peers_table`` adds the peers and checks qjm native against ``qjm.bench.goals``.
"""

from __future__ import annotations

from typing import Any

from qjm.bench import goals
from qjm.bench.workload import RECORD_SIZES, disk_bytes_per_record, pct


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {
        "sync_p50_us": pct(raw["latency"], 0.5) * 1e6,
        "sync_p99_us": pct(raw["latency"], 0.99) * 1e6,
        "failover_p50_ms": pct(raw["failover"], 0.5) * 1e3,
        # the floor's disk work is the same whichever process asks for it
        "failover_cold_p50_ms": pct(raw.get("failover_cold", raw["failover"]), 0.5) * 1e3,
        "failover_same_process_p50_ms": pct(raw.get("failover_same_process", raw["failover"]), 0.5) * 1e3,
    }
    for size in RECORD_SIZES:
        s[f"tput{size}_rps"] = raw[f"tput{size}"]
        s[f"tput{size}_mbps"] = raw[f"tput{size}"] * size / 1e6
        s[f"tput{size}_in_sync"] = raw.get(f"tput{size}_in_sync", 3)
        for k, v in raw.get(f"tput{size}_cpu", {}).items():
            s[f"tput{size}_{k}"] = v
    for ceiling in ("ceiling", "raw_ceiling"):  # preallocated segments; O_DIRECT writes extending the file
        if f"{ceiling}_bps" in raw:
            bps = raw[f"{ceiling}_bps"]
            s[f"{ceiling}_mbps"] = bps / 1e6
            for size in RECORD_SIZES:
                s[f"{ceiling}{size}_rps"] = bps / disk_bytes_per_record(size)
    if "raw_ceiling_error" in raw:
        s["raw_ceiling_error"] = raw["raw_ceiling_error"]
    return s


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
    if v >= 1e5:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.2f}"


def table(result: dict[str, Any]) -> str:
    f, n, p = (result["summary"][k] for k in ("floor", "native", "pure"))
    lines = [
        "| metric | unit | floor | qjm native | native/floor | qjm pure | pure/floor | native vs pure |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, key, unit, better in ROWS:
        ratio_np = _ratio(p[key], n[key]) if better == "lower" else _ratio(n[key], p[key])
        lines.append(
            f"| {label} | {unit} | {_fmt(f[key])} | {_fmt(n[key])} | {_ratio(n[key], f[key]):.2f}x | {_fmt(p[key])} "
            f"| {_ratio(p[key], f[key]):.2f}x | {ratio_np:.1f}x better |"
        )
    for who, v in (("native", n), ("pure", p)):
        for size in RECORD_SIZES:
            if v.get(f"tput{size}_in_sync", 3) < 3:
                lines.append(
                    f"\nqjm {who}, {size} B records: only {v[f'tput{size}_in_sync']} of 3 nodes were in sync at the "
                    "end: a node fell more than queued_edits_limit_bytes behind and was dropped until the next "
                    "segment, so that figure is for fewer replicas than the floor's."
                )
    if "c_floors" in result:
        lines.append("")
        lines.append(c_floor_note(result["c_floors"], n))
    if "ceiling_mbps" in f:
        lines.append("")
        lines.append(ceiling_note(result["summary"]))
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
    return (
        f"C floors (bench/netfloor, this run): local p50 {lp:.0f} µs, p99 {c['local_p99_us']:.0f} µs; "
        f"networked (2 of 3 receiver processes over loopback, no protocol, no Python) p50 {np_:.0f} µs "
        f"= {_ratio(np_, lp):.2f}x its local floor, p99 {c['net_p99_us']:.0f} µs; "
        f"qjm native sync p50 = {_ratio(native['sync_p50_us'], np_):.2f}x the networked floor, "
        f"{_ratio(native['sync_p50_us'], lp):.2f}x the C local floor "
        f"(goal: <= {goals.SYNC_P50_OVER_FLOOR}x the floor)"
    )


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


def peer_goals(result: dict[str, Any]) -> dict[str, Any]:
    """qjm native against the project's goals for the peers: the best durable peer per figure, and the rest."""
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
        out["throughput"] = {"peer": tput_best, "ratio": tput_ratio, "goal": goals.THROUGHPUT_OVER_PEER,
                             "met": tput_ratio >= goals.THROUGHPUT_OVER_PEER}  # fmt: skip
    out["non_durable"] = {
        k: {
            "latency_ratio": _ratio(n["sync_p50_us"], v["sync_p50_us"]),
            "throughput_ratio": _ratio(n["tput1024_rps"], v["tput1024_rps"]),
            "met": n["sync_p50_us"] < v["sync_p50_us"] and n["tput1024_rps"] > v["tput1024_rps"],
        }
        for k, v in peers.items()
        if not v["durable"]
    }
    return out


def peers_table(result: dict[str, Any]) -> str:
    """Floor, qjm native and each peer on the two workloads, qjm native's ratio to each, and the goals."""
    s = result["summary"]
    n = s["native"]
    lines = [
        "| system | durable per commit | sync p50 µs | sync p99 µs | 1 KiB rec/s | 1 KiB MB/s | 100 B rec/s "
        "| latency qjm/peer | throughput qjm/peer |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(label: str, durable: str, v: dict[str, Any], ratios: bool) -> None:
        lat = f"{_ratio(n['sync_p50_us'], v['sync_p50_us']):.2f}x" if ratios else "—"
        tput = f"{_ratio(n['tput1024_rps'], v['tput1024_rps']):.1f}x" if ratios else "—"
        lines.append(
            f"| {label} | {durable} | {_fmt(v['sync_p50_us'])} | {_fmt(v['sync_p99_us'])} "
            f"| {_fmt(v['tput1024_rps'])} | {_fmt(v['tput1024_mbps'])} | {_fmt(v['tput100_rps'])} | {lat} | {tput} |"
        )

    row("disk floor (no network)", "yes (fdatasync)", s["floor"], False)
    row("qjm native", "yes (fdatasync on a majority)", n, False)
    for name, v in result["peers"].items():
        durable = "yes (fsync on a majority)" if v["durable"] else "**no**: not durable per message (sync interval)"
        row(f"{PEER_LABELS.get(name, name)} {v['version']}", durable, v, True)
    t = result["peer_goals"]
    lines.append("")
    if "latency" in t:
        lat, tput = t["latency"], t["throughput"]
        p_lat, p_tput = result["peers"][lat["peer"]], result["peers"][tput["peer"]]
        lines.append(
            f"goal latency: qjm native sync p50 <= {lat['goal']}x the best durable peer "
            f"({PEER_LABELS.get(lat['peer'], lat['peer'])}, {_fmt(p_lat['sync_p50_us'])} µs): "
            f"{_fmt(n['sync_p50_us'])} µs = {lat['ratio']:.2f}x -> {'met' if lat['met'] else 'missed'}"
        )
        lines.append(
            f"goal throughput: qjm native 1 KiB rec/s >= {tput['goal']:.0f}x the best durable peer "
            f"({PEER_LABELS.get(tput['peer'], tput['peer'])}, {_fmt(p_tput['tput1024_rps'])} rec/s): "
            f"{_fmt(n['tput1024_rps'])} rec/s = {tput['ratio']:.1f}x -> {'met' if tput['met'] else 'missed'}"
        )
    for name, v in t["non_durable"].items():
        lines.append(
            f"goal ahead of non-durable {PEER_LABELS.get(name, name)}: latency {v['latency_ratio']:.2f}x, "
            f"throughput {v['throughput_ratio']:.1f}x -> {'met' if v['met'] else 'missed'}"
        )
    m = result["machine"]
    if "loadavg_before_peers" in m:
        before, after = m["loadavg_before_peers"][0], m["loadavg_after"][0]
        lines.append(f"load average {before:.1f} before the peers, {after:.1f} after")
    lines.append("")
    for name, v in result["peers"].items():
        lines.append(f"- {PEER_LABELS.get(name, name)} {v['version']}: {v['how']}")
    return "\n".join(lines)


def plot_result(result: dict[str, Any], path: str) -> None:
    """Latency CDF of the three runs and throughput bars (matplotlib: the ``bench`` extra)."""
    import matplotlib  # the bench extra: only --plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = {name: (result["raw"][name]["latency"], result["summary"][name]) for name in ("floor", "native", "pure")}
    for name, v in result.get("peers", {}).items():  # --peers: the peers beside qjm
        series[PEER_LABELS.get(name, name)] = (result["raw"]["peers"][name]["latency"], v)
    for name, (samples, _) in series.items():
        lat = sorted(x * 1e6 for x in samples)
        ax1.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=name)
    ax1.set_xscale("log")
    ax1.set_xlabel("sync commit latency of a 1 KiB batch (µs)")
    ax1.set_ylabel("fraction of commits")
    ax1.legend()
    ax1.grid(True, which="both", alpha=0.3)
    width = 0.8 / len(series)
    for j, (name, (_, summary)) in enumerate(series.items()):
        vals = [summary[f"tput{s}_rps"] for s in RECORD_SIZES]
        offset = (j - (len(series) - 1) / 2) * width
        ax2.bar([i + offset for i in range(len(RECORD_SIZES))], vals, width, label=name)
    ax2.set_xticks(range(len(RECORD_SIZES)), [f"{s} B records" for s in RECORD_SIZES])
    ax2.set_ylabel("records/s")
    ax2.set_yscale("log")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
