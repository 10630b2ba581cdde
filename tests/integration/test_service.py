"""Running qjm as a service, on real nodes: bind and advertised addresses, IPv6, settings from a
TOML file, hdfs-site.xml and the environment, refusals that name the file, key and reason, and
``qjm status``'s exit codes."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import qjm
from qjm.errors import BindError, ConfigError, NodeUnavailableError, QuorumError
from qjm.server.node import JournalNode
from qjm.settings import load_client_settings
from qjm.testing.minicluster import MiniJournalCluster
from qjm.testing.netns import NodeProcess
from qjm.testing.util import eventually, read_all

HAS_IPV6 = socket.has_ipv6 and os.path.exists("/proc/net/if_inet6")


KEEP_ENV = ("QJM_NO_EXTENSIONS", "QJM_REQUIRE_NATIVE", "QJM_IO_URING")


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without QJM_* settings (the backend switches kept), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QJM_") or k in KEEP_ENV}
    env.update(extra or {})
    return env


def qjm_cmd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qjm", *args], capture_output=True, text=True, timeout=120, env=clean_env(env)
    )


def assert_clean_error(r: subprocess.CompletedProcess[str], *needles: str, code: int = 1) -> None:
    """Refused with ``code``, one line naming every needle, and no traceback."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[NodeProcess]]:
    started: list[NodeProcess] = []
    yield started
    for n in started:
        n.stop()


def free_port(host: str = "127.0.0.1") -> int:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# -- addresses -------------------------------------------------------------------------------------


def test_a_wildcard_bind_is_never_advertised_and_clients_still_reach_the_data_plane(
    tmp_path: Path, nodes: list[NodeProcess]
) -> None:
    """Bound to 0.0.0.0, a node advertises its data port alone (never 0.0.0.0:<port>, which a
    client on another host would dial as itself) and the writer dials the host it reached the
    control plane at."""
    for i in range(3):
        args = ["--data-dir", str(tmp_path / f"n{i}"), "--bind", "0.0.0.0", "--insecure"]
        args += ["--rpc-port", "0", "--data-port", "0"]
        args += ["--http-port", "0"]  # three nodes on one host: not all on the default 8480
        nodes.append(NodeProcess(args, log=tmp_path / f"n{i}.log", env=clean_env()))
    for n in nodes:
        assert n.ready["rpc_bind"].startswith("0.0.0.0:")
        assert n.ready["data"].startswith(":") and "0.0.0.0" not in n.ready["data"]
        assert "0.0.0.0" not in n.ready["rpc"]
    uri = "qjournal://" + ";".join("127.0.0.1:" + n.ready["rpc_bind"].rsplit(":", 1)[1] for n in nodes) + "/j"
    w = qjm.open_writer(uri, create=True)
    w.append(b"through a wildcard bind")
    w.sync()
    w.close()
    assert read_all(uri) == [(1, b"through a wildcard bind")]


def test_advertised_addresses_are_what_clients_dial(tmp_path: Path) -> None:
    """The data plane advertised at another port (a forward in front of it) is where the writer
    connects: with the forward missing, the writer cannot reach the data plane."""
    node = JournalNode(str(tmp_path / "n"), host="127.0.0.1", data_advertise="127.0.0.1:1").start()
    try:
        assert node.data_address == "127.0.0.1:1" and node.data_bind_address != node.data_address
        with pytest.raises(ConfigError, match="wildcard"):
            JournalNode(str(tmp_path / "m"), host="127.0.0.1", rpc_advertise="0.0.0.0")
        with pytest.raises(ConfigError, match="wildcard"):
            JournalNode(str(tmp_path / "m"), host="127.0.0.1", data_advertise="[::]:8486")
    finally:
        node.stop()


@pytest.mark.skipif(not HAS_IPV6, reason="this machine has no IPv6 stack")
@pytest.mark.parametrize("bind", ["::1", "::"])
def test_ipv6_nodes_and_bracketed_uri(tmp_path: Path, bind: str) -> None:
    """Nodes bound to an IPv6 address serve writers and readers that name them as ``[::1]:port``."""
    ns = [JournalNode(str(tmp_path / f"n{i}"), host=bind, insecure=bind == "::").start() for i in range(3)]
    try:
        uri = "qjournal://" + ";".join(f"[::1]:{n.rpc_port}" for n in ns) + "/v6"
        w = qjm.open_writer(uri, create=True)
        for i in range(50):
            w.append(b"v6-%d" % i)
        w.sync()
        w.close()
        assert [r for _, r in read_all(uri)] == [b"v6-%d" % i for i in range(50)]
        st = qjm_cmd("status", uri, "--json")
        assert st.returncode == 0, st.stdout + st.stderr
        assert [r["node"] for r in json.loads(st.stdout)["nodes"]] == [f"[::1]:{n.rpc_port}" for n in ns]
    finally:
        for n in ns:
            n.stop()


def test_a_taken_port_is_refused_with_its_reason(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(BindError) as info:
            JournalNode(str(tmp_path / "n"), host="127.0.0.1", rpc_port=port)
        assert "in use" in str(info.value)
        r = qjm_cmd("journalnode", "--data-dir", str(tmp_path / "c"), "--rpc-port", "0", "--data-port", str(port))
        assert_clean_error(r, "BindError", f"127.0.0.1:{port}", "Address already in use")


# -- settings --------------------------------------------------------------------------------------


def test_a_node_configured_by_file_env_and_flags_in_that_precedence(tmp_path: Path, nodes: list[NodeProcess]) -> None:
    """hdfs-site.xml < TOML < QJM_* < flags, each for a different key, and each overriding the one below."""
    ports = [free_port() for _ in range(4)]
    xml = tmp_path / "hdfs-site.xml"
    xml.write_text(
        "<configuration>"
        f"<property><name>dfs.journalnode.edits.dir</name><value>{tmp_path / 'from-xml'}</value></property>"
        f"<property><name>dfs.journalnode.rpc-address</name><value>127.0.0.1:{ports[0]}</value></property>"
        "</configuration>"
    )
    toml = tmp_path / "qjm.toml"
    toml.write_text(f'[journalnode]\ndata_dir = "{tmp_path / "from-toml"}"\ndata_port = {ports[1]}\n')
    n = NodeProcess(
        ["--hadoop-conf", str(xml), "--config", str(toml), "--data-port", str(ports[3]), "--http-port", "0"],
        env=clean_env({"QJM_DATA_PORT": str(ports[2]), "QJM_RPC_ADVERTISE": "localhost"}),
        log=tmp_path / "n.log",
    )
    nodes.append(n)
    assert n.ready["rpc_bind"] == f"127.0.0.1:{ports[0]}"  # from the XML: nothing above sets it
    assert n.ready["data_bind"] == f"127.0.0.1:{ports[3]}"  # the flag beat env, TOML
    assert n.ready["rpc"] == f"localhost:{ports[0]}"  # env
    assert (tmp_path / "from-toml").is_dir() and not (tmp_path / "from-xml").exists()  # TOML beat XML


def test_a_client_configured_by_file_and_hadoop_xml(cluster: MiniJournalCluster, tmp_path: Path) -> None:
    xml = tmp_path / "hdfs-site.xml"
    xml.write_text(
        "<configuration>"
        f"<property><name>dfs.namenode.shared.edits.dir.ns1</name><value>{cluster.uri}</value></property>"
        "<property><name>dfs.qjournal.write-txns.timeout.ms</name><value>7000</value></property>"
        "</configuration>"
    )
    assert qjm_cmd("format", "--hadoop-conf", str(xml)).returncode == 0
    w = qjm.open_writer(cluster.uri)
    w.append(b"configured")
    w.sync()
    w.close()
    toml = tmp_path / "client.toml"
    toml.write_text(f'[client]\nuri = "{cluster.uri}"\n')
    t = qjm_cmd("tail", "--config", str(toml))
    assert t.returncode == 0 and t.stdout.splitlines() == ["1\tconfigured"], t.stdout + t.stderr
    env_t = qjm_cmd("tail", env={"QJM_URI": cluster.uri})
    assert env_t.stdout.splitlines() == ["1\tconfigured"], env_t.stderr


@pytest.mark.parametrize(
    "text, needles",
    [
        ("[journalnode]\nrpc_prt = 5\n", ["[journalnode] rpc_prt", "unknown key", "rpc_port"]),
        ('[journalnode]\ndata_port = "eighty"\n', ["[journalnode] data_port", "not a number"]),
        ("[journalnode]\ndata_port = 70000\n", ["[journalnode] data_port", "outside 0-65535"]),
        ('[journalnode]\nadvertise = "0.0.0.0"\n', ["[journalnode] advertise", "wildcard"]),
        ('[journalnode]\nbind = "10.0.0.1:8485"\n', ["[journalnode] bind", "carries a port"]),
        ("[jounralnode]\n", ["unknown table [jounralnode]"]),
        ("[journalnode\n", ["not valid TOML", "line 1"]),
        ('[client]\nwrite_txns_timeout = "soon"\n', ["[client] write_txns_timeout", "expected a number"]),
        ("[client]\nbatch_bytes = 0\n", ["[client] batch_bytes", "batch_bytes must be > 0"]),
        ('[client]\nuri = "qjournal://a:1,b:2/x"\n', ["[client] uri", "use ';'"]),
    ],
)
def test_a_bad_config_file_fails_naming_file_key_and_why(tmp_path: Path, text: str, needles: list[str]) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text(text)
    r = qjm_cmd("journalnode", "--config", str(toml), "--data-dir", str(tmp_path / "d"))
    assert_clean_error(r, str(toml), *needles)
    assert not (tmp_path / "d").exists()  # refused before anything was created or bound


def test_bad_environment_flags_and_hadoop_keys_are_named(tmp_path: Path) -> None:
    d = str(tmp_path / "d")
    r = qjm_cmd("journalnode", "--data-dir", d, env={"QJM_RPC_PORT": "x"})
    assert_clean_error(r, "environment variable QJM_RPC_PORT", "not a number")
    assert_clean_error(qjm_cmd("journalnode", "--data-dir", d, "--data-port", "-1"), "option --data-port", "outside")
    xml = tmp_path / "hdfs-site.xml"
    xml.write_text(
        "<configuration><property><name>dfs.journalnode.rpc-address</name><value>0.0.0.0:x</value>"
        "</property></configuration>"
    )
    r = qjm_cmd("journalnode", "--hadoop-conf", str(xml), "--data-dir", d)
    assert_clean_error(r, str(xml), "dfs.journalnode.rpc-address", "not a number")
    xml.write_text("<configuration><property>")
    assert_clean_error(qjm_cmd("journalnode", "--hadoop-conf", str(xml)), str(xml), "not valid XML")
    assert_clean_error(qjm_cmd("journalnode", "--config", str(tmp_path / "none.toml")), "none.toml", "cannot read")
    assert_clean_error(qjm_cmd("journalnode"), "no data directory")
    assert not os.path.exists(d)


# -- CLI -------------------------------------------------------------------------------------------


def test_version() -> None:
    r = qjm_cmd("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"qjm {qjm.__version__}"


def test_user_errors_get_no_traceback(tmp_path: Path) -> None:
    assert_clean_error(qjm_cmd("dump", str(tmp_path / "missing")), "cannot read", "No such file")
    (tmp_path / "file").write_text("")
    r = qjm_cmd("journalnode", "--data-dir", str(tmp_path / "file" / "sub"))
    assert_clean_error(r, "cannot use data directory", "Not a directory")
    r = qjm_cmd("journalnode", "--data-dir", str(tmp_path / "file"))
    assert_clean_error(r, "cannot use data directory", "it exists and is not a directory")
    r = qjm_cmd("cluster", "up", "--dir", str(tmp_path / "file" / "sub"))
    assert_clean_error(r, "Not a directory", str(tmp_path / "file"))
    r = qjm_cmd("status", "qjournal://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/j")
    assert_clean_error(r, "use ';'", code=3)  # not one host name
    assert_clean_error(qjm_cmd("status", "--no-such-flag"), "unrecognized arguments", code=3)
    assert_clean_error(qjm_cmd("status"), "no journal URI", code=3)


def test_every_option_has_help() -> None:
    from qjm import cli
    from qjm.testing import cli as harness

    def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        found = [parser]
        for action in parser._actions:  # argparse has no public list of a parser's options
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    found += parsers(sub)
        return found

    for parser in parsers(cli.build_parser(cli.register, harness.register)):
        for action in parser._actions:
            if action.help != argparse.SUPPRESS and not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{parser.prog} {action.option_strings or action.dest} has no help"
    assert "qjournal://HOST:PORT;HOST:PORT;HOST:PORT/JOURNAL_ID" in qjm_cmd("status", "--help").stdout
    assert "qjournal://HOST:PORT;HOST:PORT;HOST:PORT/JOURNAL_ID" in qjm_cmd("--help").stdout


def test_status_exit_codes_follow_the_nodes(cluster: MiniJournalCluster) -> None:
    """0 all in sync; 1 one node down (a quorum left, the node named unreachable); 2 two down; 2 for
    a journal formatted nowhere, with a format hint that is safe to paste into a shell."""
    fresh = cluster.uri_for("fresh")
    r = qjm_cmd("status", fresh)
    assert r.returncode == 2 and "not formatted" in r.stdout, r.stdout + r.stderr
    assert f"run: qjm format '{fresh}'" in r.stdout
    w = qjm.open_writer(cluster.uri, create=True)
    w.append(b"a")
    w.sync()
    ok = qjm_cmd("status", cluster.uri)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert [line.split()[1:3] for line in ok.stdout.splitlines()[1:4]] == [["in", "sync"]] * 3
    assert ok.stdout.splitlines()[0].split()[2] == "formatted"
    cluster.kill(2)
    one = qjm_cmd("status", cluster.uri, "--json")
    assert one.returncode == 1, one.stdout + one.stderr
    assert [n["state"] for n in json.loads(one.stdout)["nodes"]] == ["in sync", "in sync", "unreachable"]
    cluster.kill(1)
    two = qjm_cmd("status", cluster.uri)
    assert two.returncode == 2 and "no quorum" in two.stdout, two.stdout
    w.abort()


def test_a_node_that_stopped_answering_is_reported_unreachable_not_out_of_sync(cluster: MiniJournalCluster) -> None:
    """A writer whose majority was killed names the dead nodes unreachable in its quorum error,
    not "out of sync until the next segment"."""
    w = qjm.open_writer(cluster.uri, create=True)
    w.append(b"before")
    w.sync()
    cluster.kill(1)
    cluster.kill(2)
    loggers = w.qjm.loggers.loggers
    eventually(lambda: loggers[1].out_of_sync and loggers[2].out_of_sync, timeout=30, what="the links to fail")
    w.append(b"after")
    with pytest.raises(QuorumError) as info:
        w.sync()
    causes = info.value.causes
    assert set(causes) == {cluster.name(1), cluster.name(2)}, causes
    for c in causes.values():
        assert isinstance(c, NodeUnavailableError) and "unreachable" in str(c), repr(c)
    w.abort()


def test_the_format_hint_is_safe_to_paste_into_a_shell(icluster: MiniJournalCluster) -> None:
    """The hint quotes the URI: unquoted, `qjm format qjournal://a;b;c/x` pasted into a shell runs
    three commands."""
    uri = icluster.uri_for("unformatted")
    with pytest.raises(qjm.NotFormattedError) as info:
        qjm.open_writer(uri)
    hint = str(info.value).split("run: ", 1)[1].split(" (or", 1)[0]
    assert shlex.split(hint) == ["qjm", "format", uri]


def test_load_client_settings_for_an_application(icluster: MiniJournalCluster, tmp_path: Path) -> None:
    toml = tmp_path / "client.toml"
    toml.write_text(f'[client]\nuri = "{icluster.uri}"\nbatch_bytes = 4096\n')
    st = load_client_settings(config_path=str(toml), env={"QJM_BATCH_DELAY": "0.01"})
    assert st.uri == icluster.uri and st.config.batch_bytes == 4096 and st.config.batch_delay == 0.01
    w = qjm.open_writer(st.uri, create=True, config=st.config)
    w.append(b"x")
    w.sync()
    w.close()
    assert read_all(icluster.uri) == [(1, b"x")]
