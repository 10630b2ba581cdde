"""Settings for a JournalNode and for clients, gathered from four layers.

Each setting is taken from the first layer that has it: command-line flags, then ``QJM_*``
environment variables, then files (the TOML file of ``--config``, then Hadoop's hdfs-site.xml of
``--hadoop-conf``), then defaults. Every value remembers where it came from, so a bad one is
refused at start naming the file (or variable, or flag), the key and what is wrong with it.

The TOML file has a ``[journalnode]`` table and a ``[client]`` table; their keys are the names in
``NODE_KEYS`` and ``CLIENT_KEYS``, and ``QJM_<KEY>`` (upper case) sets the same key from the
environment. Unknown tables and keys in the TOML file are errors (a typo must not fall back to a
default silently); an hdfs-site.xml holds many keys for other daemons, so only the ones
``hadoop_node`` and ``hadoop_client`` know are read from it.
"""

from __future__ import annotations

import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from qjm.addresses import is_wildcard, join_host_port, parse_port, split_host_port
from qjm.config import QJMConfig, Timeouts, config_from, parse_uri
from qjm.errors import ConfigError
from qjm.security.authz import Authorizer, authorizer_from
from qjm.security.tls import TlsConfig, tls_config

DEFAULT_BIND = "127.0.0.1"
DEFAULT_RPC_PORT = 8485
DEFAULT_DATA_PORT = 8486
DEFAULT_HTTP_PORT = 8480  # Hadoop's JournalNode HTTP port
DEFAULT_SYNC_INTERVAL = 120.0  # Hadoop's dfs.journalnode.sync.interval
DEFAULT_SYNC_BANDWIDTH = 64 * 1024 * 1024
CONFIG_ENV = "QJM_CONFIG"
HADOOP_CONF_ENV = "QJM_HADOOP_CONF"


@dataclass(frozen=True, slots=True)
class Value:
    """A setting's value and where it came from (for error messages)."""

    value: Any
    origin: str


# -- converters: (raw value, where) -> checked value ----------------------------------------------


def _text(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(f"{where}: expected a non-empty string, got {v!r}")
    return v.strip()


def _host(v: Any, where: str) -> str:
    """A host alone (its port is a key of its own): ``0.0.0.0``, ``::``, ``[::1]``, ``jn1``."""
    host, port = split_host_port(_text(v, where), -1, what="host")
    if port != -1:
        raise ConfigError(f"{where}: {v!r} carries a port; give the host alone (the port has its own key)")
    return host


def _advertise(v: Any, where: str) -> str:
    """``host`` or ``host:port`` that clients can reach: never a wildcard."""
    text = _text(v, where)
    host, _ = split_host_port(text, 0, what="advertised address")
    if is_wildcard(host):
        raise ConfigError(f"{where}: {text!r} is a wildcard; advertise a name or address clients can reach")
    return text


def _advertise_host(v: Any, where: str) -> str:
    """The advertised host of both ports: a host alone, never a wildcard."""
    return _advertise(_host(v, where), where)


def _host_port(v: Any, where: str) -> str:
    host, port = split_host_port(_text(v, where), what="address")
    return join_host_port(host, port)


def _port(v: Any, where: str) -> int:
    return parse_port(v)


def _uri(v: Any, where: str) -> str:
    text = _text(v, where)
    parse_uri(text)
    return text


def _flag(v: Any, where: str) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return v.strip().lower() in ("1", "true", "yes", "on")
    raise ConfigError(f"{where}: expected true or false, got {v!r}")


def _number(kind: type) -> Callable[[Any, str], Any]:
    def convert(v: Any, where: str) -> Any:
        if isinstance(v, bool):
            raise ConfigError(f"{where}: expected a number, got {v!r}")
        if isinstance(v, int | float) and (kind is float or isinstance(v, int)):
            return kind(v)
        if isinstance(v, str):
            try:
                return kind(v.strip())
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected {'an integer' if kind is int else 'a number'}, got {v!r}")

    return convert


def _peers(v: Any, where: str) -> tuple[str, ...]:
    """Other nodes' control planes: a TOML list of ``HOST:PORT``, or them separated by commas or
    semicolons, or a journal URI (``qjournal://h:p;h:p/id``, Hadoop's dfs.namenode.shared.edits.dir),
    whose hosts are taken. The node's own address may be among them (one list for every node)."""
    if isinstance(v, list):
        v = ",".join(_text(item, where) for item in v)
    text = _text(v, where)
    if text.startswith("qjournal://"):
        parse_uri(text)
        text = text[len("qjournal://") :].split("/", 1)[0]
    out = []
    for part in text.replace(";", ",").split(","):
        if part.strip():
            host, port = split_host_port(part.strip(), what="peer address")
            out.append(join_host_port(host, port))
    if not out:
        raise ConfigError(f"{where}: no peer address in {v!r}")
    return tuple(out)


def _choice(*allowed: str) -> Converter:
    def convert(v: Any, where: str) -> str:
        text = _text(v, where).lower()
        if text not in allowed:
            raise ConfigError(f"{where}: expected one of {', '.join(allowed)}, got {v!r}")
        return text

    return convert


def _non_negative(kind: type) -> Callable[[Any, str], Any]:
    number = _number(kind)

    def convert(v: Any, where: str) -> Any:
        x = number(v, where)
        if x < 0:
            raise ConfigError(f"{where}: must be 0 or more, got {v!r}")
        return x

    return convert


Converter = Callable[[Any, str], Any]

# -- the keys --------------------------------------------------------------------------------------

NODE_KEYS: dict[str, tuple[Converter, str]] = {
    "data_dir": (_text, "directory holding the journals (created if missing)"),
    "bind": (_host, f"host both ports listen on (default {DEFAULT_BIND}; 0.0.0.0 or :: for every interface)"),
    "rpc_bind": (_host, "host the control-plane port listens on (default: bind)"),
    "data_bind": (_host, "host the data-plane port listens on (default: bind, else rpc_bind)"),
    "rpc_port": (_port, f"control-plane (gRPC) port (default {DEFAULT_RPC_PORT}; 0 picks a free one)"),
    "data_port": (_port, f"data-plane (framed TCP) port (default {DEFAULT_DATA_PORT}; 0 picks a free one)"),
    "advertise": (_advertise_host, "host clients are told for both ports (default: the bind host)"),
    "rpc_advertise": (_advertise, "HOST[:PORT] clients are told for the control plane (default: advertise)"),
    "data_advertise": (
        _advertise,
        "HOST[:PORT] clients are told for the data plane (default: advertise, else rpc_advertise's host)",
    ),
    "http_bind": (_host, "host the HTTP port (/metrics, /health, /status) listens on (default: bind, else rpc_bind)"),
    "http_port": (
        _port,
        f"HTTP port for /metrics, /health and /status (default {DEFAULT_HTTP_PORT}; 0 picks a free one)",
    ),
    "http_address": (
        _host_port,
        "HOST:PORT of the HTTP port (Hadoop's dfs.journalnode.http-address); http_bind and http_port win over it",
    ),
    "max_open_journals": (_number(int), "journals open at once; idle ones are closed first (default 64)"),
    "max_data_connections": (_number(int), "data-plane connections at once; more are refused (default 256)"),
    "max_http_connections": (_number(int), "HTTP-port connections at once; more are closed (default 32)"),
    "frame_memory_mb": (_number(int), "MiB all connections may hold for unfinished frames (default 256)"),
    "idle_timeout": (
        _number(float),
        "seconds after which a data-plane connection that sends nothing is closed (default 0: never; "
        "TCP keepalive notices a vanished peer)",
    ),
    "sync_interval": (
        _non_negative(float),
        f"seconds between catch-up rounds (Hadoop's dfs.journalnode.sync.interval; default {DEFAULT_SYNC_INTERVAL:g}; "
        "0: off)",
    ),
    "sync_bandwidth": (
        _non_negative(int),
        "bytes a second catch-up downloads may take (Hadoop's dfs.edit.log.transfer.bandwidthPerSec; "
        f"default {DEFAULT_SYNC_BANDWIDTH}; 0: no limit)",
    ),
}
TLS_KEYS: dict[str, tuple[Converter, str]] = {
    "tls_ca": (_text, "PEM file of the CA certificate(s) trusted for peers (mutual TLS; design §9)"),
    "tls_cert": (_text, "PEM file of this end's certificate, signed by the CA (`qjm certs`)"),
    "tls_key": (_text, "PEM file of this end's private key"),
}
NODE_KEYS.update(TLS_KEYS)
HTTP_CLIENT_AUTH = ("optional", "required")
NODE_KEYS["http_client_auth"] = (
    _choice(*HTTP_CLIENT_AUTH),
    "with TLS the HTTP port serves HTTPS; optional (default): a client without a certificate is served, one "
    "presenting a certificate the CA did not sign is refused; required: only clients with a certificate of the CA",
)
NODE_KEYS["insecure"] = (
    _flag,
    "serve without TLS on a non-loopback address (refused otherwise): anyone who can reach the ports "
    "may read, write, fence or format any journal",
)
NODE_KEYS["peers"] = (
    _peers,
    "the control addresses of the journal's nodes, as writers name them: a TOML list, HOST:PORT,HOST:PORT "
    "or a qjournal:// URI (Hadoop's dfs.namenode.shared.edits.dir); the node's own address is skipped. "
    "Recovery downloads only from these, and catch-up copies missed segments from them (default: none; "
    "recovery from any node whose certificate the CA signed with TLS, anywhere without; no catch-up)",
)
LIMIT_KEYS = ("max_open_journals", "max_data_connections", "max_http_connections", "frame_memory_mb", "idle_timeout")
"""The node's resource bounds among ``NODE_KEYS`` (``qjm.server.limits.NodeLimits``)."""

_BY_TYPE: dict[str, Converter] = {"int": _number(int), "float": _number(float), "str": _text}


def _client_keys() -> dict[str, tuple[Converter, str]]:
    """``uri``, every timeout as ``<name>_timeout`` in seconds, and QJMConfig's other fields."""
    keys: dict[str, tuple[Converter, str]] = {
        "uri": (_uri, "the journal: qjournal://HOST:PORT;HOST:PORT;HOST:PORT/JOURNAL_ID")
    }
    for f in fields(Timeouts):
        keys[f"{f.name}_timeout"] = (_number(float), f"seconds to wait for {f.name.replace('_', ' ')}")
    for f in fields(QJMConfig):
        if f.name not in ("timeouts", "tls"):  # tls: the three TLS_KEYS
            keys[f.name] = (_BY_TYPE[str(f.type)], f"client setting {f.name} (qjm.config.QJMConfig)")
    keys.update(TLS_KEYS)
    return keys


CLIENT_KEYS = _client_keys()

SECTIONS = {"journalnode": NODE_KEYS, "client": CLIENT_KEYS}
AUTHZ_TABLE = "authz"
"""The node's grants: identity -> {role -> [journal ids]} (qjm.security.authz, design §9.2)."""


def env_name(key: str) -> str:
    return "QJM_" + key.upper()


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


# -- the layers ------------------------------------------------------------------------------------


def _check(keys: Mapping[str, tuple[Converter, str]], key: str, raw: Any, where: str) -> Any:
    convert, _ = keys[key]
    try:
        return convert(raw, where)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(where) else f"{where}: {msg}") from None


def from_toml(path: str, section: str) -> dict[str, Value]:
    """The ``[section]`` table of a TOML file; every table and key in the file must be known."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the configuration file: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    tables: dict[str, dict[str, Value]] = {}
    for table, body in doc.items():  # every table checked, so a file is refused by any of its users
        if table == AUTHZ_TABLE:
            authorizer_from(body, f"{path}: [{AUTHZ_TABLE}]")
            continue
        if table not in SECTIONS:
            known = [*SECTIONS, AUTHZ_TABLE]
            raise ConfigError(f"{path}: unknown table [{table}] (known: {', '.join(f'[{s}]' for s in known)})")
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: {table} must be a table ([{table}]), not a value")
        keys = SECTIONS[table]
        tables[table] = {}
        for key, raw in body.items():
            where = f"{path}: [{table}] {key}"
            if key not in keys:
                raise ConfigError(f"{where}: unknown key (known: {', '.join(keys)})")
            tables[table][key] = Value(_check(keys, key, raw, where), where)
            if table == "client":
                _check_option(key, tables[table][key])
    return tables.get(section, {})


def from_env(env: Mapping[str, str], section: str) -> dict[str, Value]:
    """``QJM_<KEY>`` for every key of ``section``; other variables are not looked at."""
    keys = SECTIONS[section]
    out: dict[str, Value] = {}
    for key in keys:
        name = env_name(key)
        if name in env and env[name] != "":
            where = f"environment variable {name}"
            out[key] = Value(_check(keys, key, env[name], where), where)
    return out


def from_flags(flags: Mapping[str, Any], section: str) -> dict[str, Value]:
    """Flags given on the command line (None: not given), as text, checked like every other layer."""
    keys = SECTIONS[section]
    out: dict[str, Value] = {}
    for key, raw in flags.items():
        if raw is not None:
            where = "the URI argument" if key == "uri" else f"option {flag_name(key)}"
            out[key] = Value(_check(keys, key, raw, where), where)
    return out


# Hadoop's client keys (reference §5.2) → client keys here; values are milliseconds.
HADOOP_TIMEOUT_KEYS = {
    "dfs.qjournal.get-journal-state.timeout.ms": "get_journal_state_timeout",
    "dfs.qjournal.new-epoch.timeout.ms": "new_epoch_timeout",
    "dfs.qjournal.prepare-recovery.timeout.ms": "prepare_recovery_timeout",
    "dfs.qjournal.accept-recovery.timeout.ms": "accept_recovery_timeout",
    "dfs.qjournal.finalize-segment.timeout.ms": "finalize_segment_timeout",
    "dfs.qjournal.start-segment.timeout.ms": "start_segment_timeout",
    "dfs.qjournal.write-txns.timeout.ms": "write_txns_timeout",
    "dfs.qjournal.select-input-streams.timeout.ms": "select_input_streams_timeout",
}
SHARED_EDITS_KEY = "dfs.namenode.shared.edits.dir"


def read_hadoop_xml(path: str) -> dict[str, str]:
    """Every ``<property>`` of a Hadoop configuration file, name → value (the last one wins, as in Hadoop)."""
    try:
        root = ET.parse(path).getroot()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the Hadoop configuration: {e.strerror}") from None
    except ET.ParseError as e:
        raise ConfigError(f"{path}: not valid XML: {e}") from None
    props: dict[str, str] = {}
    for prop in root.iter("property"):
        name = (prop.findtext("name") or "").strip()
        if name:
            props[name] = (prop.findtext("value") or "").strip()
    return props


def _hadoop_duration(value: str) -> float:
    """Hadoop time durations: a plain number is milliseconds; suffixes ms, s, m, h."""
    for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if value.endswith(suffix) and value[: -len(suffix)].strip().isdigit():
            return int(value[: -len(suffix)]) * scale
    return int(value) / 1000.0


def _hadoop_address(props: Mapping[str, str], path: str, key: str) -> tuple[str, int] | None:
    if key not in props:
        return None
    try:
        return split_host_port(props[key], what="address")
    except ConfigError as e:
        raise ConfigError(f"{path}: {key}: {e}") from None


def hadoop_node(path: str) -> dict[str, Value]:
    """A JournalNode's keys from an hdfs-site.xml. As in Hadoop, ``*-bind-host`` replaces the host
    a port listens on, and the ``*-address`` host then is the one other hosts use: advertised."""
    props = read_hadoop_xml(path)
    keys = NODE_KEYS
    out: dict[str, Value] = {}

    def put(key: str, raw: Any, hkey: str) -> None:
        where = f"{path}: {hkey}"
        out[key] = Value(_check(keys, key, raw, where), where)

    if "dfs.journalnode.edits.dir" in props:
        d = props["dfs.journalnode.edits.dir"]
        if not d.startswith("/"):
            raise ConfigError(f"{path}: dfs.journalnode.edits.dir: {d!r} is not an absolute path (Hadoop requires one)")
        put("data_dir", d, "dfs.journalnode.edits.dir")
    rpc = _hadoop_address(props, path, "dfs.journalnode.rpc-address")
    bind_host = props.get("dfs.journalnode.rpc-bind-host")
    if rpc is not None:
        put("rpc_port", rpc[1], "dfs.journalnode.rpc-address")
        if bind_host is None:
            put("rpc_bind", rpc[0] or "0.0.0.0", "dfs.journalnode.rpc-address")
        elif not is_wildcard(rpc[0]):
            put("rpc_advertise", rpc[0], "dfs.journalnode.rpc-address")
    if bind_host is not None:
        put("rpc_bind", bind_host, "dfs.journalnode.rpc-bind-host")
    if props.get("dfs.journalnode.enable.sync", "true").strip().lower() == "false":
        put("sync_interval", 0, "dfs.journalnode.enable.sync")
    elif "dfs.journalnode.sync.interval" in props:
        key = "dfs.journalnode.sync.interval"
        put("sync_interval", _number(float)(props[key], f"{path}: {key}") / 1000, key)  # milliseconds
    if SHARED_EDITS_KEY in props:
        put("peers", props[SHARED_EDITS_KEY], SHARED_EDITS_KEY)
    if "dfs.edit.log.transfer.bandwidthPerSec" in props:
        put("sync_bandwidth", props["dfs.edit.log.transfer.bandwidthPerSec"], "dfs.edit.log.transfer.bandwidthPerSec")
    http = _hadoop_address(props, path, "dfs.journalnode.http-address")
    if http is not None:
        host = props.get("dfs.journalnode.http-bind-host", http[0])
        put("http_address", join_host_port(host.strip("[]"), http[1]), "dfs.journalnode.http-address")
    return out


def hadoop_client(path: str) -> dict[str, Value]:
    """A client's keys from an hdfs-site.xml: the journal URI of ``dfs.namenode.shared.edits.dir``
    (or its only ``.<nameservice>``/``.<namenode>`` form) and the ``dfs.qjournal.*`` settings."""
    props = read_hadoop_xml(path)
    keys = CLIENT_KEYS
    out: dict[str, Value] = {}
    for hkey, value in props.items():
        where = f"{path}: {hkey}"
        try:
            if hkey in HADOOP_TIMEOUT_KEYS:
                key, raw = HADOOP_TIMEOUT_KEYS[hkey], int(value) / 1000.0
            elif hkey == "dfs.qjournal.queued-edits.limit.mb":
                key, raw = "queued_edits_limit_bytes", int(value) * 1024 * 1024
            elif hkey == "dfs.qjm.operations.timeout":
                key, raw = "operations_timeout", _hadoop_duration(value)
            else:
                continue
        except ValueError:
            raise ConfigError(f"{where}: {value!r} is not a number") from None
        out[key] = Value(_check(keys, key, raw, where), where)
    shared = {k: v for k, v in props.items() if k == SHARED_EDITS_KEY or k.startswith(SHARED_EDITS_KEY + ".")}
    shared = {k: v for k, v in shared.items() if v.startswith("qjournal://")}
    if len(set(shared.values())) > 1:
        raise ConfigError(
            f"{path}: {', '.join(sorted(shared))} name different journals; give the URI on the command line"
        )
    if shared:
        hkey = sorted(shared)[0]
        out["uri"] = Value(_check(keys, "uri", shared[hkey], f"{path}: {hkey}"), f"{path}: {hkey}")
    return out


def config_from_hadoop_xml(path: str) -> QJMConfig:
    """The client settings of an hdfs-site.xml, so operators keep their ``dfs.qjournal.*`` values."""
    return client_config({k: v for k, v in hadoop_client(path).items() if k != "uri"})


# -- merging ---------------------------------------------------------------------------------------


# A shared key stands for its per-port keys within its own layer, so that a flag --bind beats a
# file's rpc_bind, while a file's rpc_bind beats the same file's bind.
SHARED_KEYS = {"bind": ("rpc_bind", "data_bind", "http_bind"), "advertise": ("rpc_advertise", "data_advertise")}


def _expand(layer: Mapping[str, Value]) -> dict[str, Value]:
    out = dict(layer)
    for shared, per_port in SHARED_KEYS.items():
        if shared in out:
            v = out.pop(shared)
            for key in per_port:
                out.setdefault(key, v)
    return out


def merge(*layers: Mapping[str, Value]) -> dict[str, Value]:
    """Layers from the lowest precedence to the highest: a later layer's key wins."""
    out: dict[str, Value] = {}
    for layer in layers:
        out.update(_expand(layer))
    return out


def gather(
    section: str,
    *,
    flags: Mapping[str, Any] | None = None,
    config_path: str | None = None,
    hadoop_conf: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Value]:
    """Every layer of ``section`` merged: flags > environment > TOML file > hdfs-site.xml > defaults
    (defaults are applied by the caller). ``QJM_CONFIG``/``QJM_HADOOP_CONF`` name the files when
    the flags do not."""
    env = {} if env is None else env
    config_path = config_path or env.get(CONFIG_ENV) or None
    hadoop_conf = hadoop_conf or env.get(HADOOP_CONF_ENV) or None
    hadoop: dict[str, Value] = {}
    if hadoop_conf:
        hadoop = hadoop_node(hadoop_conf) if section == "journalnode" else hadoop_client(hadoop_conf)
    toml = from_toml(config_path, section) if config_path else {}
    out = merge(hadoop, toml, from_env(env, section), from_flags(flags or {}, section))
    if section == "journalnode" and config_path:
        authz = authz_from_toml(config_path)
        if authz is not None:
            out[AUTHZ_TABLE] = authz
    return out


def authz_from_toml(path: str) -> Value | None:
    """The ``[authz]`` table of a TOML file as an ``Authorizer``, or None if the file has none."""
    with open(path, "rb") as f:  # from_toml has read and checked it
        doc = tomllib.load(f)
    if AUTHZ_TABLE not in doc:
        return None
    where = f"{path}: [{AUTHZ_TABLE}]"
    return Value(authorizer_from(doc[AUTHZ_TABLE], where), where)


def _check_option(key: str, v: Value) -> None:
    """A client option's range, checked alone so that its error names where it came from."""
    if key == "uri" or key in TLS_KEYS:
        return
    try:
        config_from({key: v.value})
    except ConfigError as e:
        raise ConfigError(f"{v.origin}: {e}") from None


def client_config(values: Mapping[str, Value]) -> QJMConfig:
    """The QJMConfig of gathered client values (the URI aside)."""
    for key, v in values.items():
        _check_option(key, v)
    return config_from({k: v.value for k, v in values.items() if k != "uri" and k not in TLS_KEYS})


def tls_from(values: Mapping[str, Value]) -> TlsConfig | None:
    """The TLS paths among gathered values (node or client): all three, or none."""

    def get(key: str) -> str | None:
        return values[key].value if key in values else None

    origins = sorted({values[k].origin for k in TLS_KEYS if k in values})
    return tls_config(get("tls_ca"), get("tls_cert"), get("tls_key"), where=", ".join(origins) or "TLS settings")


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """Where a JournalNode keeps its data, listens, and what it tells clients."""

    data_dir: str
    rpc_bind: str = DEFAULT_BIND
    data_bind: str = DEFAULT_BIND
    rpc_port: int = DEFAULT_RPC_PORT
    data_port: int = DEFAULT_DATA_PORT
    rpc_advertise: str | None = None
    data_advertise: str | None = None
    http_bind: str = DEFAULT_BIND
    http_port: int = DEFAULT_HTTP_PORT
    http_client_auth: str = "optional"  # with tls: whether HTTPS clients need a certificate of the CA
    limits: tuple[tuple[str, Any], ...] = ()  # the LIMIT_KEYS that were set, for NodeLimits
    tls: TlsConfig | None = None
    insecure: bool = False
    authz: Authorizer | None = None  # the [authz] table of --config; None: none given
    peers: tuple[str, ...] | None = None
    sync_interval: float = DEFAULT_SYNC_INTERVAL
    sync_bandwidth: int = DEFAULT_SYNC_BANDWIDTH
    origins: tuple[tuple[str, str], ...] = ()  # key → where its value came from, for the start log


def node_settings(values: Mapping[str, Value]) -> NodeSettings:
    """The node's settings from merged values (shared keys already expanded by ``merge``)."""

    def get(key: str, fallback: Any = None) -> Any:
        return values[key].value if key in values else fallback

    if "data_dir" not in values:
        raise ConfigError(
            "no data directory: give --data-dir, QJM_DATA_DIR, data_dir in the [journalnode] table of "
            "--config, or dfs.journalnode.edits.dir in --hadoop-conf"
        )
    rpc_bind = get("rpc_bind", DEFAULT_BIND)
    rpc_advertise = get("rpc_advertise")
    http_host, http_port = (
        split_host_port(get("http_address"), what="http_address") if "http_address" in values else (None, None)
    )
    tls = tls_from(values)
    if tls is None and get("http_client_auth", "optional") != "optional":
        raise ConfigError(
            f"{values['http_client_auth'].origin}: http_client_auth = required needs TLS (tls_ca, tls_cert and "
            "tls_key): without it the HTTP port is plaintext and asks for no certificate"
        )
    return NodeSettings(
        data_dir=get("data_dir"),
        rpc_bind=rpc_bind,
        data_bind=get("data_bind", rpc_bind),  # the data plane follows the control plane unless told
        rpc_port=get("rpc_port", DEFAULT_RPC_PORT),
        data_port=get("data_port", DEFAULT_DATA_PORT),
        rpc_advertise=rpc_advertise,
        data_advertise=get("data_advertise", split_host_port(rpc_advertise, 0)[0] if rpc_advertise else None),
        http_bind=get("http_bind", http_host if http_host is not None else rpc_bind),
        http_port=get("http_port", http_port if http_port is not None else DEFAULT_HTTP_PORT),
        http_client_auth=get("http_client_auth", "optional"),
        limits=tuple((k, values[k].value) for k in LIMIT_KEYS if k in values),
        tls=tls,
        insecure=get("insecure", False),
        authz=get(AUTHZ_TABLE),
        peers=get("peers"),
        sync_interval=get("sync_interval", DEFAULT_SYNC_INTERVAL),
        sync_bandwidth=get("sync_bandwidth", DEFAULT_SYNC_BANDWIDTH),
        origins=tuple((k, v.origin) for k, v in sorted(values.items())),
    )


@dataclass(frozen=True, slots=True)
class ClientSettings:
    uri: str | None
    config: QJMConfig
    tls: TlsConfig | None = None


def client_settings(values: Mapping[str, Value]) -> ClientSettings:
    uri = values["uri"].value if "uri" in values else None
    tls = tls_from(values)
    return ClientSettings(uri, replace(client_config(values), tls=tls), tls)


def load_client_settings(
    *, config_path: str | None = None, hadoop_conf: str | None = None, env: Mapping[str, str] | None = None
) -> ClientSettings:
    """The client settings an application would use (no flags): files and environment."""
    return client_settings(gather("client", config_path=config_path, hadoop_conf=hadoop_conf, env=env))


def metavar(key: str) -> str:
    """How a key's value is shown in ``--help``."""
    convert = NODE_KEYS[key][0] if key in NODE_KEYS else CLIENT_KEYS[key][0]
    names: dict[Converter, str] = {
        _host: "HOST", _advertise_host: "HOST", _advertise: "HOST[:PORT]", _host_port: "HOST:PORT",
        _port: "PORT", _uri: "URI", _peers: "HOST:PORT,...",
    }  # fmt: skip
    if key in TLS_KEYS:
        return "FILE"
    if key == "http_client_auth":
        return "|".join(HTTP_CLIENT_AUTH)
    return names.get(convert, "DIR" if key.endswith("_dir") else "VALUE")
