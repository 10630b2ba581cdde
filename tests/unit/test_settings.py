"""Addresses, the settings layers and ``qjm status``'s verdicts, without nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from qjm.addresses import advertised, is_wildcard, join_host_port, reachable_at, split_host_port
from qjm.config import parse_uri
from qjm.errors import ConfigError
from qjm.settings import client_settings, gather, load_client_settings, node_settings
from qjm.status import format_status_table, node_health


@pytest.mark.parametrize(
    "text, host, port",
    [
        ("jn1:8485", "jn1", 8485),
        ("jn1", "jn1", 1),
        ("[::1]:9", "::1", 9),
        ("[::]", "::", 1),
        ("fd00::7", "fd00::7", 1),
        ("10.0.0.1:0", "10.0.0.1", 0),
    ],
)
def test_split_host_port(text: str, host: str, port: int) -> None:
    assert split_host_port(text, 1) == (host, port)


@pytest.mark.parametrize("text", ["[::1", "[::1]x", "[jn1]:1", "a:b", "a:70000", "a,b:1", "fd00::7:zz"])
def test_split_host_port_refuses(text: str) -> None:
    with pytest.raises(ConfigError):
        split_host_port(text, 1)


def test_wildcards_are_never_advertised() -> None:
    assert all(is_wildcard(h) for h in ("0.0.0.0", "::", "[::]", "", "0:0:0:0:0:0:0:0"))
    assert not any(is_wildcard(h) for h in ("127.0.0.1", "::1", "jn1"))
    assert advertised("0.0.0.0", 8486, None) == ":8486"
    assert advertised("::", 8486, None) == ":8486"
    assert advertised("::1", 8486, None) == "[::1]:8486"
    assert advertised("0.0.0.0", 8486, "jn1") == "jn1:8486"
    assert advertised("0.0.0.0", 8486, "fd00::1") == "[fd00::1]:8486"
    assert advertised("0.0.0.0", 8486, "proxy:9000") == "proxy:9000"
    with pytest.raises(ConfigError, match="wildcard"):
        advertised("10.0.0.1", 8486, "0.0.0.0")
    assert reachable_at(":8486", "fd00::1") == "[fd00::1]:8486"
    assert reachable_at("jn1:8486", "10.0.0.1") == "jn1:8486"
    assert join_host_port("::1", 1) == "[::1]:1"


def test_ipv6_uris() -> None:
    u = parse_uri("qjournal://[fd00::1]:8485;[fd00::2];jn3:1/j")
    assert [(n.host, n.port) for n in u.nodes] == [("fd00::1", 8485), ("fd00::2", 8485), ("jn3", 1)]
    assert str(u) == "qjournal://[fd00::1]:8485;[fd00::2]:8485;jn3:1/j"
    with pytest.raises(ConfigError, match="use ';'"):
        parse_uri("qjournal://a:1,b:1,c:1/j")


def _toml(tmp_path: Path, text: str) -> str:
    p = tmp_path / "qjm.toml"
    p.write_text(text)
    return str(p)


def test_precedence_flags_env_file_defaults(tmp_path: Path) -> None:
    cfg = _toml(tmp_path, '[journalnode]\ndata_dir = "/f"\nrpc_port = 1\ndata_port = 2\nbind = "10.0.0.9"\n')
    env = {"QJM_RPC_PORT": "11", "QJM_DATA_PORT": "12"}
    st = node_settings(gather("journalnode", flags={"data_port": "22"}, config_path=cfg, env=env))
    assert (st.data_dir, st.rpc_port, st.data_port) == ("/f", 11, 22)
    assert st.rpc_bind == st.data_bind == "10.0.0.9"
    assert dict(st.origins)["rpc_port"] == "environment variable QJM_RPC_PORT"
    defaults = node_settings(gather("journalnode", flags={"data_dir": "/d"}))
    assert (defaults.rpc_bind, defaults.rpc_port, defaults.data_port) == ("127.0.0.1", 8485, 8486)
    assert defaults.rpc_advertise is None


def test_a_shared_key_counts_at_its_own_layer(tmp_path: Path) -> None:
    """A flag --bind beats the file's rpc_bind; inside one layer the per-port key is more specific."""
    cfg = _toml(tmp_path, '[journalnode]\ndata_dir = "/f"\nrpc_bind = "10.0.0.1"\nbind = "10.0.0.2"\n')
    from_file = node_settings(gather("journalnode", config_path=cfg))
    assert (from_file.rpc_bind, from_file.data_bind) == ("10.0.0.1", "10.0.0.2")
    flagged = node_settings(gather("journalnode", flags={"bind": "::"}, config_path=cfg))
    assert (flagged.rpc_bind, flagged.data_bind) == ("::", "::")


def test_hadoop_node_keys(tmp_path: Path) -> None:
    """As in Hadoop, rpc-bind-host moves the listener, and rpc-address's host becomes the advertised one;
    the data plane follows the control plane."""
    xml = tmp_path / "hdfs-site.xml"
    xml.write_text(
        "<configuration>"
        "<property><name>dfs.journalnode.edits.dir</name><value>/var/lib/jn</value></property>"
        "<property><name>dfs.journalnode.rpc-address</name><value>jn1.example:8485</value></property>"
        "<property><name>dfs.journalnode.rpc-bind-host</name><value>0.0.0.0</value></property>"
        "<property><name>dfs.journalnode.http-address</name><value>0.0.0.0:8480</value></property>"
        "<property><name>dfs.replication</name><value>3</value></property>"
        "</configuration>"
    )
    st = node_settings(gather("journalnode", hadoop_conf=str(xml)))
    assert (st.data_dir, st.rpc_bind, st.rpc_port, st.rpc_advertise) == ("/var/lib/jn", "0.0.0.0", 8485, "jn1.example")
    assert (st.data_bind, st.data_port, st.data_advertise) == ("0.0.0.0", 8486, "jn1.example")
    assert (st.http_bind, st.http_port) == ("0.0.0.0", 8480)
    # a flag's port or bind beats the file's http-address, each for its own half
    st = node_settings(gather("journalnode", flags={"http_port": "9480"}, hadoop_conf=str(xml)))
    assert (st.http_bind, st.http_port) == ("0.0.0.0", 9480)
    xml.write_text(
        "<configuration><property><name>dfs.journalnode.edits.dir</name><value>rel/dir</value></property>"
        "</configuration>"
    )
    with pytest.raises(ConfigError, match=r"hdfs-site.xml: dfs.journalnode.edits.dir: .*absolute"):
        gather("journalnode", hadoop_conf=str(xml))


def test_hadoop_client_keys(tmp_path: Path) -> None:
    xml = tmp_path / "hdfs-site.xml"
    xml.write_text(
        "<configuration>"
        "<property><name>dfs.namenode.shared.edits.dir.ns1</name><value>qjournal://a:1;b:1;c:1/ns1</value></property>"
        "<property><name>dfs.qjournal.start-segment.timeout.ms</name><value>1500</value></property>"
        "</configuration>"
    )
    st = client_settings(gather("client", hadoop_conf=str(xml), env={"QJM_WRITE_TXNS_TIMEOUT": "3"}))
    assert st.uri == "qjournal://a:1;b:1;c:1/ns1"
    assert st.config.timeouts.start_segment == 1.5 and st.config.timeouts.write_txns == 3.0
    xml.write_text(
        "<configuration>"
        "<property><name>dfs.namenode.shared.edits.dir.ns1</name><value>qjournal://a:1/x</value></property>"
        "<property><name>dfs.namenode.shared.edits.dir.ns2</name><value>qjournal://a:1/y</value></property>"
        "</configuration>"
    )
    with pytest.raises(ConfigError, match="name different journals"):
        gather("client", hadoop_conf=str(xml))


def test_env_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="environment variable QJM_BATCH_DELAY: batch_bytes must be"):
        client_settings(gather("client", env={"QJM_BATCH_DELAY": "-1"}))


def _node(state: str, written: int = 10, committed: int = 10, writer: int = 1) -> dict[str, object]:
    if state in ("unreachable", "error"):
        return {"node": "n", state: "why"}
    return {"node": "n", "formatted": state != "unformatted", "highest_written_txid": written,
            "committed_txid": committed, "writer_epoch": writer,
            "rejoined_without_segments": state == "rejoined"}  # fmt: skip


@pytest.mark.parametrize(
    "answers, state, code",
    [
        ([_node("ok")] * 3, "in-sync", 0),
        ([_node("ok"), _node("ok"), _node("unreachable")], "degraded", 1),
        ([_node("ok"), _node("ok"), _node("ok", written=5)], "degraded", 1),  # lacks committed txns
        ([_node("ok"), _node("ok"), _node("ok", writer=0)], "degraded", 1),  # follows an old writer
        ([_node("ok"), _node("ok"), _node("unformatted")], "degraded", 1),
        ([_node("ok"), _node("unreachable"), _node("error")], "no-quorum", 2),
        ([_node("unreachable")] * 3, "no-quorum", 2),
        ([_node("unformatted")] * 2 + [_node("unreachable")], "not-formatted", 2),
        ([_node("ok"), _node("unformatted"), _node("unformatted")], "no-quorum", 2),
        ([_node("ok"), _node("ok"), _node("rejoined", written=0)], "degraded", 1),
        ([_node("ok"), _node("unreachable"), _node("rejoined", written=0)], "no-quorum", 2),  # no part in recovery
    ],
)
def test_status_verdicts(answers: list[dict[str, object]], state: str, code: int) -> None:
    h = node_health(answers)
    assert (h.state, h.exit_code) == (state, code)


def test_roll_and_retention_settings_come_from_the_environment() -> None:
    st = load_client_settings(env={"QJM_ROLL_INTERVAL": "30", "QJM_ROLL_BYTES": "0", "QJM_MIN_RETAINED_TXIDS": "5"})
    assert (st.config.roll_interval, st.config.roll_bytes, st.config.min_retained_txids) == (30.0, 0, 5)
    with pytest.raises(ConfigError, match="QJM_ROLL_BYTES"):
        load_client_settings(env={"QJM_ROLL_BYTES": "-1"})


def test_catch_up_settings(tmp_path: Path) -> None:
    """peers takes a list or a journal URI; sync_interval and sync_bandwidth are numbers >= 0;
    Hadoop's keys map onto them."""
    st = node_settings(gather("journalnode", flags={"data_dir": "/d"}, env={"QJM_PEERS": "jn1:8485; jn2:8485,[::1]:9"}))
    assert st.peers == ("jn1:8485", "jn2:8485", "[::1]:9")
    assert (st.sync_interval, st.sync_bandwidth) == (120.0, 64 * 1024 * 1024)
    uri = node_settings(
        gather("journalnode", flags={"data_dir": "/d", "peers": "qjournal://a:1;b:2;c:3/j", "sync_interval": "0"})
    )
    assert (uri.peers, uri.sync_interval) == (("a:1", "b:2", "c:3"), 0.0)
    with pytest.raises(ConfigError, match="QJM_SYNC_INTERVAL: must be 0 or more"):
        gather("journalnode", env={"QJM_SYNC_INTERVAL": "-1"})
    with pytest.raises(ConfigError, match="option --sync-bandwidth: expected an integer"):
        gather("journalnode", flags={"sync_bandwidth": "fast"})
    xml = tmp_path / "hdfs-site.xml"
    xml.write_text(
        "<configuration>"
        "<property><name>dfs.namenode.shared.edits.dir</name><value>qjournal://jn1:8485;jn2:8485/ns</value></property>"
        "<property><name>dfs.journalnode.sync.interval</name><value>30000</value></property>"
        "<property><name>dfs.edit.log.transfer.bandwidthPerSec</name><value>1000</value></property>"
        "</configuration>"
    )
    h = node_settings(gather("journalnode", flags={"data_dir": "/d"}, hadoop_conf=str(xml)))
    assert (h.peers, h.sync_interval, h.sync_bandwidth) == (("jn1:8485", "jn2:8485"), 30.0, 1000)


def test_status_table_says_what_catch_up_did() -> None:
    row = {"node": "jn3:8485", "formatted": True, "committed_txid": 9, "highest_written_txid": 9, "writer_epoch": 1}
    quiet = dict(row, sync={"segments_downloaded": 0, "divergences": 0})
    busy = dict(row, node="jn2:8485", sync={"segments_downloaded": 3, "divergences": 1})
    lines = format_status_table(node_health([quiet, busy])).splitlines()
    assert "caught up" not in lines[1]
    assert lines[2].endswith("[caught up 3 segment(s), 1 divergence(s)]")


def test_http_client_auth_setting(tmp_path: Path) -> None:
    """optional (the default) or required, from any layer; required needs the node's TLS, since
    without it the HTTP port is plaintext."""
    tls = {"tls_ca": "/p/ca.pem", "tls_cert": "/p/jn1.pem", "tls_key": "/p/jn1.key"}
    assert node_settings(gather("journalnode", flags={"data_dir": "/d"}, env={})).http_client_auth == "optional"
    st = node_settings(gather("journalnode", flags={"data_dir": "/d", **tls}, env={"QJM_HTTP_CLIENT_AUTH": "Required"}))
    assert st.http_client_auth == "required" and st.tls is not None
    toml = tmp_path / "node.toml"
    toml.write_text('[journalnode]\ndata_dir = "/d"\nhttp_client_auth = "optional"\nmax_http_connections = 8\n')
    st = node_settings(gather("journalnode", flags={"http_client_auth": "required", **tls}, config_path=str(toml)))
    assert st.http_client_auth == "required" and dict(st.limits)["max_http_connections"] == 8
    with pytest.raises(ConfigError, match="option --http-client-auth: expected one of optional, required"):
        gather("journalnode", flags={"http_client_auth": "sometimes"})
    with pytest.raises(ConfigError, match="QJM_HTTP_CLIENT_AUTH: http_client_auth = required needs TLS"):
        node_settings(gather("journalnode", flags={"data_dir": "/d"}, env={"QJM_HTTP_CLIENT_AUTH": "required"}))
