"""Observability on real nodes: /metrics against what a writer did, /health, /status, the writer's
stats, the node's lifecycle logs; and a real Prometheus server scraping three nodes and a writer."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, start_http_server

import qjm
from qjm.client.metrics import WriterCollector
from qjm.protocol.messages import NamespaceInfo
from qjm.server.journal import Journal
from qjm.server.storage import DiskStorage
from qjm.testing import prometheus
from qjm.testing.minicluster import READY_TIMEOUT, MiniJournalCluster
from qjm.testing.ports import free_port
from qjm.testing.prometheus import PrometheusServer, scrape
from qjm.testing.util import eventually, txn_data, wait_for_every_node

J = '{journal="test-journal"}'


def get(address: str, path: str) -> tuple[int, bytes, str]:
    """(status, body, content type) of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


def test_node_metrics_count_what_the_writer_wrote(icluster: MiniJournalCluster) -> None:
    w = qjm.open_writer(icluster.uri, create=True, batch_bytes=4096)
    for i in range(1, 3001):
        w.append(txn_data(i))
        if i % 100 == 0:
            w.sync()
    w.sync()
    wait_for_every_node(w)
    ws = w.stats()
    assert ws.txns_sent == 3000 and ws.committed_txid == 3000
    for i in range(3):
        m = scrape(icluster.http_address(i))
        assert m[f"qjm_journal_txns_written_total{J}"] == 3000
        assert m[f"qjm_journal_batches_written_total{J}"] == ws.batches_sent
        assert m[f"qjm_journal_bytes_written_total{J}"] == ws.bytes_sent
        assert m[f"qjm_journal_last_written_txid{J}"] == 3000
        assert m[f"qjm_journal_last_promised_epoch{J}"] == w.epoch
        assert m[f"qjm_journal_last_writer_epoch{J}"] == w.epoch
        assert 1 <= m[f"qjm_journal_sync_seconds_count{J}"] <= ws.batches_sent
        assert (
            m['qjm_journal_sync_seconds_bucket{journal="test-journal",le="+Inf"}']
            == (m[f"qjm_journal_sync_seconds_count{J}"])
        )
        assert m[f"qjm_journal_segments{J}"] == 1
        assert m[f"qjm_journal_disk_bytes{J}"] >= ws.bytes_sent
        assert m[f"qjm_journal_fenced_requests_total{J}"] == 0
        assert m[f"qjm_journal_out_of_sync{J}"] == 0
        assert m["qjm_node_journals"] == 1 and m["qjm_node_storage_writable"] == 1
    w.roll()  # the finalize carries the committed txid to every node
    w.append(b"one more")
    w.sync()
    wait_for_every_node(w)
    for i in range(3):
        m = scrape(icluster.http_address(i))
        assert m[f"qjm_journal_segments{J}"] == 2
        assert m[f"qjm_journal_committed_txid{J}"] >= 3000
        assert m[f"qjm_journal_current_lag_txns{J}"] == 0
    w.close()


def test_fencing_shows_on_the_nodes_and_in_the_old_writers_stats(icluster: MiniJournalCluster) -> None:
    old = qjm.open_writer(icluster.uri, create=True)
    old.append(b"a")
    old.sync()
    new = qjm.open_writer(icluster.uri)
    with pytest.raises(qjm.FencedError):
        old.append(b"b")
        old.sync()
    refused = sum(scrape(icluster.http_address(i))[f"qjm_journal_fenced_requests_total{J}"] for i in range(3))
    assert refused >= 2  # a majority refused the old writer's batch
    st = old.stats()
    assert sum(n.fenced for n in st.nodes) >= 2
    assert all(n.out_of_sync for n in st.nodes if n.fenced)
    old.abort()
    new.close()


def test_health_turns_503_when_the_data_directory_becomes_read_only(icluster: MiniJournalCluster) -> None:
    w = qjm.open_writer(icluster.uri, create=True)
    w.append(b"x")
    w.sync()
    addr = icluster.http_address(0)
    code, body, ctype = get(addr, "/health")
    assert (code, json.loads(body)) == (200, {"healthy": True, "reasons": []}) and ctype == "application/json"
    d = icluster.node_dir(0)
    # a read-only bind mount over the directory (root ignores file modes, so chmod would prove nothing)
    r = subprocess.run(["mount", "--bind", d, d], capture_output=True)
    assert r.returncode == 0, f"cannot bind-mount (need root): {r.stderr!r}"
    try:
        r = subprocess.run(["mount", "-o", "remount,bind,ro", d], capture_output=True)
        assert r.returncode == 0, r.stderr
        code, body, _ = get(addr, "/health")
        h = json.loads(body)
        assert code == 503 and not h["healthy"]
        assert any("not writable" in why and "Read-only file system" in why for why in h["reasons"]), h
        assert scrape(addr)["qjm_node_storage_writable"] == 0
        assert get(icluster.http_address(1), "/health")[0] == 200  # the other nodes are fine
    finally:
        subprocess.run(["umount", "-l", d], check=False)
    assert get(addr, "/health")[0] == 200
    w.close()


def test_health_turns_503_when_a_journal_does_not_load(icluster: MiniJournalCluster) -> None:
    w = qjm.open_writer(icluster.uri, create=True)
    w.append(b"x")
    w.close()
    icluster.stop(0)
    with open(os.path.join(icluster.journal_dir(0), "VERSION"), "w") as f:
        f.write("namespaceID=not-a-number\n")
    icluster.start(0)
    addr = icluster.http_address(0)
    code, body, _ = get(addr, "/health")
    h = json.loads(body)
    assert code == 503
    assert any(why.startswith("journal test-journal did not load") and "VERSION" in why for why in h["reasons"]), h
    st = json.loads(get(addr, "/status")[1])
    assert "test-journal" in st["load_failures"] and st["journals"] == []
    assert scrape(addr)["qjm_node_journal_load_failures"] == 1


def test_status_page_as_json_and_as_html(icluster: MiniJournalCluster) -> None:
    w = qjm.open_writer(icluster.uri, create=True)
    for i in range(1, 51):
        w.append(txn_data(i))
    w.sync()
    wait_for_every_node(w)
    addr = icluster.http_address(1)
    code, body, ctype = get(addr, "/status")
    st = json.loads(body)
    assert code == 200 and ctype == "application/json"
    assert st["healthy"] and st["rpc_address"] == icluster.addresses[1] and st["http_address"] == addr
    (j,) = st["journals"]
    assert j["journal_id"] == "test-journal" and j["last_written_txid"] == 50 and j["txns_written"] == 50
    assert j["writer_epoch"] == w.epoch and j["open_segment"] == 1 and j["segments"] == 1
    req = urllib.request.Request(f"http://{addr}/status", headers={"Accept": "text/html,*/*"})
    with urllib.request.urlopen(req, timeout=10) as r:
        page = r.read().decode()
        assert r.headers["Content-Type"].startswith("text/html")
    assert "<table>" in page and "test-journal" in page and "healthy" in page
    assert get(addr, "/nope")[0] == 404
    w.close()


def test_node_logs_start_each_journal_ready_and_shutdown_as_json(tmp_path: Path) -> None:
    data = tmp_path / "jn"
    storage = DiskStorage(str(data), "j1")
    Journal(storage).format(NamespaceInfo(7, "c"))
    storage.close()
    cmd = [
        sys.executable, "-m", "qjm", "journalnode", "--data-dir", str(data), "--rpc-port", str(free_port()),
        "--data-port", str(free_port()), "--http-port", str(free_port()), "--ready-line", "--log-format", "json",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        assert sel.select(READY_TIMEOUT), "no READY line"
        assert proc.stdout.readline().startswith(b"READY ")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    lines = [json.loads(line) for line in err.decode().splitlines()]  # every line is one JSON object
    messages = [rec["message"] for rec in lines]
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    order = ["starting JournalNode", "loaded journal j1", "READY rpc=", "received SIGTERM", "JournalNode stopped"]
    at = [next(i for i, m in enumerate(messages) if m.startswith(prefix)) for prefix in order]
    assert at == sorted(at), messages


def wait_rising(prom: PrometheusServer, query: str, what: str) -> None:
    """Wait until Prometheus has a positive value for ``query``, then a larger one."""
    first: list[float] = []

    def seen() -> bool:
        v = prom.value(query)
        if v is not None and v > 0:
            first.append(v)
        return bool(first)

    eventually(seen, 60, f"{what} seen by Prometheus")
    eventually(lambda: (prom.value(query) or 0) > first[0], 60, f"{what} rising in Prometheus")


@pytest.mark.skipif(not prometheus.available(), reason="Debian's prometheus: scripts/install-system-deps.sh")
def test_prometheus_sees_txns_rise_and_a_paused_nodes_lag_grow(cluster: MiniJournalCluster) -> None:
    """Debian's Prometheus scraping three real nodes and the writer; queried through its HTTP API."""
    w = qjm.open_writer(cluster.uri, create=True)
    registry = CollectorRegistry()
    registry.register(WriterCollector(w))
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    stop = threading.Event()
    failed: list[BaseException] = []

    def write() -> None:
        i = 0
        try:
            while not stop.is_set():
                for _ in range(20):
                    i += 1
                    w.append(txn_data(i))
                w.sync()
        except BaseException as e:
            failed.append(e)

    writer = threading.Thread(target=write, name="test-writer")
    writer.start()
    try:
        jobs = {
            "nodes": [cluster.http_address(i) for i in range(3)],
            "writer": [f"127.0.0.1:{server.server_address[1]}"],
        }
        with PrometheusServer(jobs) as prom:
            wait_rising(prom, 'sum(qjm_journal_txns_written_total{journal="test-journal"})', "txns written")
            paused = cluster.name(2)
            cluster.pause(2)
            lag = f'qjm_writer_node_lag_txns{{journal="test-journal",node="{paused}"}}'
            wait_rising(prom, lag, "the paused node's lag")
            up = f'up{{job="nodes",instance="{cluster.http_address(2)}"}}'
            eventually(lambda: prom.value(up) == 0, 60, "the paused node's scrapes failing")
            assert not failed, failed
            cluster.resume(2)
    finally:
        stop.set()
        writer.join(timeout=60)
        server.shutdown()
        server.server_close()
        thread.join()
        w.close()
    assert not failed, failed
