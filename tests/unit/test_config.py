"""URI parsing, journal-id rules and configuration sources."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import qjm
from qjm.config import (
    DEFAULT_RPC_PORT,
    QJMConfig,
    as_config,
    config_from,
    parse_uri,
    validate_journal_id,
)
from qjm.errors import ConfigError, JournalIdError
from qjm.settings import config_from_hadoop_xml

URI = "qjournal://127.0.0.1:1/j"  # nothing listens there: a call that got past its checks would fail to connect


def test_parse_uri() -> None:
    u = parse_uri("qjournal://a:1;b:2; c /my-log")
    assert [str(n) for n in u.nodes] == ["a:1", "b:2", f"c:{DEFAULT_RPC_PORT}"]
    assert u.journal_id == "my-log"
    assert str(parse_uri(str(u))) == str(u)


@pytest.mark.parametrize("uri", ["", "x://a:1/j", "qjournal://a:1", "qjournal://a:1;;b:2/j", "qjournal://a:99999/j"])
def test_parse_uri_refuses(uri: str) -> None:
    with pytest.raises(ConfigError):
        parse_uri(uri)


@pytest.mark.parametrize("jid", ["ok", "a.b-c_d", "x" * 128])
def test_journal_ids_accepted(jid: str) -> None:
    assert validate_journal_id(jid) == jid


@pytest.mark.parametrize("jid", ["", ".", "..", "../x", "a/b", ".hidden", "-x", "x" * 129, "a b", "é"])
def test_journal_ids_refused(jid: str) -> None:
    with pytest.raises(JournalIdError):
        validate_journal_id(jid)


def test_config_from_options() -> None:
    cfg = config_from({"write_txns_timeout": 5, "batch_bytes": 1024})
    assert cfg.timeouts.write_txns == 5.0 and cfg.batch_bytes == 1024
    assert cfg.timeouts.new_epoch == 120.0  # Hadoop's default stays
    with pytest.raises(ConfigError):
        config_from({"no_such_option": 1})
    with pytest.raises(ConfigError):
        config_from({"batch_bytes": 0})
    with pytest.raises(ConfigError):
        QJMConfig().with_timeouts(write_txns=0).validate()
    assert config_from({"lag_wait": 0}).lag_wait == 0  # Hadoop's rule: a lagging node is dropped at once
    for name in ("lag_wait", "in_sync_wait"):
        with pytest.raises(ConfigError, match=name):
            config_from({name: -1})


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("batch_bytes", "x", "expected an integer"),
        ("batch_bytes", 1.5, "expected an integer"),
        ("batch_bytes", True, "expected an integer"),
        ("batch_delay", "0.01", "expected a finite number"),
        ("batch_delay", float("nan"), "expected a finite number"),
        ("roll_interval", float("inf"), "expected a finite number"),
        ("write_txns_timeout", "5", "expected a finite number"),
        ("write_txns_timeout", float("nan"), "expected a finite number"),
        ("cluster_id", 7, "expected a string"),
    ],
)
def test_an_option_of_the_wrong_type_names_itself(option: str, value: object, expected: str) -> None:
    with pytest.raises(ConfigError, match=f"option '{option}': {expected}"):
        config_from({option: value})


def test_an_integer_is_a_number_of_seconds() -> None:
    cfg = config_from({"batch_delay": 0, "write_txns_timeout": 5})
    assert type(cfg.batch_delay) is float and type(cfg.timeouts.write_txns) is float


def test_config_from_hadoop_xml(tmp_path: Path) -> None:
    p = tmp_path / "hdfs-site.xml"
    p.write_text(
        "<configuration>"
        "<property><name>dfs.qjournal.write-txns.timeout.ms</name><value>5000</value></property>"
        "<property><name>dfs.qjournal.queued-edits.limit.mb</name><value>3</value></property>"
        "<property><name>dfs.qjm.operations.timeout</name><value>2m</value></property>"
        "<property><name>dfs.replication</name><value>3</value></property>"
        "</configuration>"
    )
    cfg = config_from_hadoop_xml(str(p))
    assert cfg.timeouts.write_txns == 5.0
    assert cfg.queued_edits_limit_bytes == 3 * 1024 * 1024
    assert cfg.timeouts.operations == 120.0
    p.write_text(
        "<configuration><property><name>dfs.qjournal.write-txns.timeout.ms</name><value>soon</value>"
        "</property></configuration>"
    )
    with pytest.raises(ConfigError):
        config_from_hadoop_xml(str(p))
    with pytest.raises(ConfigError):
        config_from_hadoop_xml(str(tmp_path / "missing.xml"))


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: qjm.open_writer(None), "uri: expected a qjournal:// URI string, got NoneType"),  # type: ignore[arg-type]
        (lambda: qjm.open_reader(123), "uri: expected a qjournal:// URI string, got int"),  # type: ignore[arg-type]
        (lambda: qjm.open_writer(URI, config={"batch_bytes": 1}), "config: expected a QJMConfig, got dict"),  # type: ignore[arg-type]
        (lambda: qjm.open_reader(URI, config={"batch_bytes": 1}), "config: expected a QJMConfig, got dict"),  # type: ignore[arg-type]
        (lambda: qjm.open_writer(URI, tls=("ca", "cert", "key")), "tls: expected a TlsConfig"),  # type: ignore[arg-type]
        (lambda: qjm.open_reader(URI, tls=("ca", "cert", "key")), "tls: expected a TlsConfig"),  # type: ignore[arg-type]
        (lambda: qjm.open_reader(URI, from_txid="5"), "from_txid: expected an integer txid, got str"),  # type: ignore[arg-type]
        (lambda: qjm.open_reader(URI, from_txid=1.0), "from_txid: expected an integer txid, got float"),  # type: ignore[arg-type]
    ],
)
def test_a_wrong_type_at_the_api_is_a_type_error_naming_the_argument(call: Any, needle: str) -> None:
    """Refused before any connection (the URI's node does not exist), naming the argument."""
    with pytest.raises(TypeError) as e:
        call()
    assert needle in str(e.value).replace(" (qjm.config)", "")


def test_keyword_options_apply_over_a_given_config() -> None:
    base = QJMConfig(batch_bytes=4096, lag_wait=0.25)
    cfg = config_from({"batch_bytes": 1024, "write_txns_timeout": 7}, base=base)
    assert (cfg.batch_bytes, cfg.lag_wait, cfg.timeouts.write_txns) == (1024, 0.25, 7.0)
    assert as_config(None) == QJMConfig() and as_config(base) is base
