"""A real Prometheus server for tests: Debian's ``prometheus`` binary, a generated config, a free port.

``scripts/install-system-deps.sh`` installs the package without starting it as a service; this
starts one server per test on loopback, scraping the given targets every ``interval``, with its
database in a temporary directory, and stops it (SIGTERM, by its pid) afterwards. Queries go
through the HTTP API, as a dashboard's would. A job given an ``HttpsClient`` is scraped over HTTPS
(nodes with TLS, design §9.5): ``scheme: https`` and a ``tls_config`` with the CA, and the client
certificate when the client has one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from types import TracebackType

from prometheus_client.parser import text_string_to_metric_families

from qjm.testing.http_client import HttpsClient, http_get
from qjm.testing.minicluster import READY_TIMEOUT
from qjm.testing.ports import free_port
from qjm.testing.processes import stop_process

BINARY = "prometheus"


def available() -> bool:
    return shutil.which(BINARY) is not None


def scrape(address: str, path: str = "/metrics", *, https: HttpsClient | None = None) -> dict[str, float]:
    """Every sample of ``http://address/metrics`` (``https://`` with ``https``), keyed
    ``name{label="value",...}`` (labels sorted)."""
    status, body, _ = http_get(address, path, https=https)
    if status != 200:
        raise RuntimeError(f"{address}{path} answered {status}: {body[:200]!r}")
    text = body.decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


class PrometheusServer:
    """``with PrometheusServer({"nodes": [...], "writer": [...]}) as p: p.query("up")``; ``https``
    names the jobs scraped over HTTPS, with the CA and certificate of each."""

    def __init__(
        self,
        jobs: dict[str, Sequence[str]],
        *,
        interval: str = "500ms",
        https: Mapping[str, HttpsClient] | None = None,
    ) -> None:
        https = dict(https or {})
        unknown = set(https) - set(jobs)
        if unknown:
            raise ValueError(f"https names jobs that are not scraped: {sorted(unknown)}")
        self.dir = tempfile.mkdtemp(prefix="qjm-prometheus-")
        self.port = free_port()
        scrape_configs: list[dict[str, object]] = [
            {"job_name": job, "scrape_interval": interval, "scrape_timeout": interval,
             "static_configs": [{"targets": list(targets)}]}
            for job, targets in jobs.items()
        ]  # fmt: skip
        for job in scrape_configs:
            client = https.get(str(job["job_name"]))
            if client is not None:
                job["scheme"] = "https"
                job["tls_config"] = client.prometheus_tls_config()
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            json.dump({"global": {"scrape_interval": interval}, "scrape_configs": scrape_configs}, f)  # JSON is YAML
        self.log_path = os.path.join(self.dir, "prometheus.log")
        cmd = [
            BINARY, f"--config.file={config}", f"--storage.tsdb.path={self.dir}/data",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._await_ready()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _await_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        pause = threading.Event()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready after {READY_TIMEOUT} s: {self.log_tail()}")
            pause.wait(0.05)  # a starting process's port: nothing to be woken by, so look again shortly

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: (labels, value) per series of the result vector."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {body}")
        return [(s["metric"], float(s["value"][1])) for s in body["data"]["result"]]

    def value(self, promql: str) -> float | None:
        """The single value of ``promql``, or None while it has no series."""
        res = self.query(promql)
        if not res:
            return None
        if len(res) > 1:
            raise AssertionError(f"{promql!r} has {len(res)} series, expected one: {res}")
        return res[0][1]

    def stop(self) -> None:
        stop_process(self.proc, 15)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
