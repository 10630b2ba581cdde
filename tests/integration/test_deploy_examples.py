"""examples/deploy/ holds what an operator copies: a systemd unit, a TOML file and an hdfs-site.xml.
Each is checked as the tool that reads it would: systemd's own verifier for the unit, qjm's settings
loader for the files, and the unit's command line run for real against the sample TOML."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qjm.settings import client_settings, gather, node_settings
from qjm.testing.certs import Pki
from qjm.testing.netns import NodeProcess

DEPLOY = Path(__file__).resolve().parents[2] / "examples" / "deploy"
UNIT = DEPLOY / "qjm-journalnode.service"
TOML = DEPLOY / "journalnode.toml"
HDFS_SITE = DEPLOY / "hdfs-site.xml"
# Where the unit expects the installed qjm and its TOML file.
INSTALLED_QJM = "/opt/qjm/bin/qjm"
INSTALLED_TOML = "/etc/qjm/journalnode.toml"
PEERS = ("jn1.example:8485", "jn2.example:8485", "jn3.example:8485")
URI = "qjournal://jn1.example:8485;jn2.example:8485;jn3.example:8485/edits"


def exec_start() -> list[str]:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    unit.read(UNIT)
    return shlex.split(unit["Service"]["ExecStart"])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    """`systemd-analyze verify` passes with no complaint about the unit. It wants ExecStart's program
    to exist, so a copy runs this Python's qjm instead of /opt/qjm/bin/qjm."""
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED_QJM} " in text
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(INSTALLED_QJM, f"{sys.executable} -m qjm"))
    r = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in (r.stdout + r.stderr).splitlines() if UNIT.name in line]
    assert r.returncode == 0 and not complaints, r.stdout + r.stderr


def test_the_unit_command_starts_a_node_on_the_sample_toml(tmp_path: Path, pki: Pki) -> None:
    """The unit's command line with the sample TOML in place of /etc/qjm/journalnode.toml: the node
    reads the file and serves, advertising the file's host name. Flags move it to loopback, free
    ports, a scratch directory and test certificates."""
    cmd = exec_start()
    assert cmd[:2] == [INSTALLED_QJM, "journalnode"] and INSTALLED_TOML in cmd, cmd
    args = [str(TOML) if a == INSTALLED_TOML else a for a in cmd[2:]]
    overrides = ["--data-dir", str(tmp_path / "data"), "--bind", "127.0.0.1"]
    overrides += ["--rpc-port", "0", "--data-port", "0", "--http-port", "0"]
    tls = pki.nodes[0]
    overrides += ["--tls-ca", tls.ca_file, "--tls-cert", tls.cert_file, "--tls-key", tls.key_file]
    log = tmp_path / "node.log"
    node = NodeProcess([*args, *overrides], log=log)
    try:
        rpc_port = node.ready["rpc_bind"].rsplit(":", 1)[1]
        assert node.ready["rpc_bind"].startswith("127.0.0.1:")
        assert node.ready["rpc"] == f"jn1.example:{rpc_port}", node.ready  # advertise, from the file
        assert (tmp_path / "data").is_dir()
    finally:
        node.stop()
    assert node.proc.returncode == 0, log.read_text()  # SIGTERM: a clean stop
    assert f"advertise from {TOML}" in log.read_text()  # the start log names where each setting came from
    assert "mutual TLS, 5 identities granted" in log.read_text()  # the sample's [authz] table


def test_the_sample_toml_is_what_it_says() -> None:
    node = node_settings(gather("journalnode", config_path=str(TOML), env={}))
    assert (node.data_dir, node.rpc_bind, node.data_bind) == ("/var/lib/qjm", "0.0.0.0", "0.0.0.0")
    assert (node.rpc_port, node.data_port, node.http_bind, node.http_port) == (8485, 8486, "0.0.0.0", 8480)
    assert (node.rpc_advertise, node.data_advertise) == ("jn1.example", "jn1.example")
    assert node.tls is not None and node.tls.cert_file == "/etc/qjm/pki/jn1.pem" and not node.insecure
    assert node.http_client_auth == "optional"  # HTTPS with the node's certificate; scrapers need none
    assert node.authz is not None and node.authz.allowed("namenode", "edits", "writer")
    assert not node.authz.allowed("namenode", "edits", "admin") and node.authz.allowed("jn2", "edits", "reader")
    assert node.peers == PEERS
    client = client_settings(gather("client", config_path=str(TOML), env={}))
    assert client.tls is not None and client.config.tls == client.tls
    assert client.uri == URI
    assert client.config.timeouts.write_txns == 20.0 and client.config.queued_edits_limit_bytes == 10 << 20


def test_the_sample_hdfs_site_is_what_it_says() -> None:
    node = node_settings(gather("journalnode", hadoop_conf=str(HDFS_SITE), env={}))
    assert (node.data_dir, node.rpc_bind, node.rpc_port) == ("/var/lib/qjm", "0.0.0.0", 8485)
    assert (node.data_bind, node.rpc_advertise, node.data_advertise) == ("0.0.0.0", "jn1.example", "jn1.example")
    assert (node.http_bind, node.http_port) == ("0.0.0.0", 8480)
    assert node.peers == PEERS  # from dfs.namenode.shared.edits.dir, as Hadoop's JournalNodeSyncer
    client = client_settings(gather("client", hadoop_conf=str(HDFS_SITE), env={}))
    assert client.uri == URI
    assert client.config.timeouts.write_txns == 20.0 and client.config.queued_edits_limit_bytes == 10 << 20
