"""Settings: the ``qjournal://`` URI, journal-id rules and the client's timeouts (Hadoop defaults)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from qjm.addresses import join_host_port, split_host_port
from qjm.errors import ConfigError, JournalIdError
from qjm.security.tls import TlsConfig

DEFAULT_RPC_PORT = 8485
_JID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


def validate_journal_id(jid: str) -> str:
    """Refuse ids that could leave the data directory or confuse the layout (reference §1.3).

    Stricter than Hadoop on purpose: letters, digits, ``_ . -``; no leading dot, at most 128 chars.
    """
    if not isinstance(jid, str) or not _JID.fullmatch(jid) or jid in (".", ".."):
        raise JournalIdError(f"bad journal id {jid!r}: use 1-128 of [A-Za-z0-9_.-], not starting with '.' or '-'")
    return jid


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """A JournalNode's control-plane address; its data-plane port is learnt from the node."""

    host: str
    port: int

    def __str__(self) -> str:
        return join_host_port(self.host, self.port)


@dataclass(frozen=True, slots=True)
class JournalURI:
    nodes: tuple[NodeAddress, ...]
    journal_id: str

    def __str__(self) -> str:
        return "qjournal://" + ";".join(map(str, self.nodes)) + "/" + self.journal_id


URI_SYNTAX = (
    "qjournal://HOST:PORT;HOST:PORT;HOST:PORT/JOURNAL_ID -- nodes separated by ';' (quote the URI in a "
    "shell), an IPv6 host in brackets ([::1]:8485), the port 8485 when left out; the journal id is 1-128 "
    "of A-Z a-z 0-9 _ . -"
)


def parse_uri(uri: str) -> JournalURI:
    """``qjournal://h1:p1;h2:p2;h3:p3/journal-id`` → nodes and journal id (reference §3.1)."""
    prefix = "qjournal://"
    if not isinstance(uri, str) or not uri.startswith(prefix):
        raise ConfigError(f"not a qjournal URI: {uri!r} (expected {URI_SYNTAX})")
    rest = uri[len(prefix) :]
    if "/" not in rest:
        raise ConfigError(f"qjournal URI {uri!r} names no journal id after the node list")
    authority, jid = rest.split("/", 1)
    if "," in authority:
        raise ConfigError(f"qjournal URI {uri!r} separates nodes with ',': use ';' (qjournal://a:8485;b:8485/id)")
    nodes: list[NodeAddress] = []
    for part in authority.split(";"):
        part = part.strip()
        if not part:
            raise ConfigError(f"empty node address in {uri!r}")
        try:
            host, port = split_host_port(part, DEFAULT_RPC_PORT, what="node address")
        except ConfigError as e:
            raise ConfigError(f"{e}, in {uri!r}") from None
        if not host or not 0 < port < 65536:
            raise ConfigError(f"bad node address {part!r} in {uri!r}")
        nodes.append(NodeAddress(host, port))
    if len(set(nodes)) != len(nodes):
        raise ConfigError(f"a node is listed twice in {uri!r}")
    return JournalURI(tuple(nodes), validate_journal_id(jid))


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Quorum waits in seconds; defaults are Hadoop's (reference §5.2)."""

    get_journal_state: float = 120.0
    new_epoch: float = 120.0
    prepare_recovery: float = 120.0
    accept_recovery: float = 120.0
    finalize_segment: float = 120.0
    start_segment: float = 20.0
    write_txns: float = 20.0
    select_input_streams: float = 20.0
    operations: float = 60.0
    connect: float = 5.0
    reconnect: float = 1.5


@dataclass(frozen=True, slots=True)
class QJMConfig:
    """Client settings. ``batch_bytes``/``batch_delay`` close a batch by size or by time."""

    timeouts: Timeouts = field(default_factory=Timeouts)
    queued_edits_limit_bytes: int = 10 * 1024 * 1024
    batch_bytes: int = 64 * 1024
    batch_delay: float = 0.002
    max_inflight_batches: int = 64
    close_grace: float = 2.0
    epoch_attempts: int = 5  # open_writer retries a lost epoch race (writers proposing at once)
    # After a quorum promised the new epoch with identical copies of the open segment, how long
    # fencing waits for the other nodes' answers: if every node holds that copy, recovery needs no
    # accept round (qjm.client.recovery.in_sync_copy). 0 turns the shortcut off.
    in_sync_wait: float = 0.003
    # A node queued_edits_limit_bytes behind is waited for while it keeps acknowledging; one that
    # acknowledges nothing for this long is dropped until the next segment (0: Hadoop, drop at once).
    lag_wait: float = 0.5
    # The writer finalizes its segment and starts the next once the segment holds roll_bytes of
    # frames or is roll_interval seconds old (0 turns either off; docs/configuration.md says why
    # these values).
    roll_bytes: int = 128 * 1024 * 1024
    roll_interval: float = 120.0
    # Retention the writer applies after each roll (0: off): keep at least the newest retain_txids
    # txids; keep segments finalized less than retain_age seconds ago. Never below the floor:
    # purges (the writer's and ``qjm purge``) keep the newest min_retained_txids committed txids
    # (Hadoop's dfs.namenode.num.extra.edits.retained) and the newest segment.
    retain_txids: int = 0
    retain_age: float = 0.0
    min_retained_txids: int = 1_000_000
    namespace_id: int = 0x514A4D  # "QJM"
    cluster_id: str = "qjm"
    # Mutual TLS to the nodes (design §9.1); None: plaintext, as to a node serving without TLS.
    tls: TlsConfig | None = None

    def with_timeouts(self, **kw: float) -> QJMConfig:
        return replace(self, timeouts=replace(self.timeouts, **kw))

    def validate(self) -> QJMConfig:
        if self.tls is not None and not isinstance(self.tls, TlsConfig):
            raise TypeError(f"tls: expected a TlsConfig (qjm.security.tls), got {type(self.tls).__name__}")
        if self.batch_bytes <= 0 or self.batch_delay < 0 or self.max_inflight_batches < 1:
            raise ConfigError("batch_bytes must be > 0, batch_delay >= 0 and max_inflight_batches >= 1")
        if self.queued_edits_limit_bytes < 0:
            raise ConfigError("queued_edits_limit_bytes must be >= 0")
        if self.in_sync_wait < 0 or self.lag_wait < 0:
            raise ConfigError("in_sync_wait and lag_wait must be >= 0")
        if min(self.roll_bytes, self.roll_interval, self.retain_txids, self.retain_age, self.min_retained_txids) < 0:
            raise ConfigError(
                "roll_bytes, roll_interval, retain_txids, retain_age and min_retained_txids must be >= 0 (0: off)"
            )
        if 0 < self.retain_txids < self.min_retained_txids:
            raise ConfigError(
                f"retain_txids {self.retain_txids} is below min_retained_txids {self.min_retained_txids}: "
                "the writer would purge txids the floor keeps for readers; raise retain_txids or lower the floor"
            )
        for name in Timeouts.__dataclass_fields__:
            if getattr(self.timeouts, name) <= 0:
                raise ConfigError(f"timeout {name} must be > 0")
        return self


def as_config(config: object) -> QJMConfig:
    """``config``, or the defaults for None; a TypeError naming what was passed in its place (a dict
    of options belongs in ``config_from`` or in the keywords of ``open_writer``)."""
    if config is None:
        return QJMConfig()
    if not isinstance(config, QJMConfig):
        raise TypeError(f"config: expected a QJMConfig (qjm.config), got {type(config).__name__}")
    return config


def config_from(options: dict[str, Any] | None = None, base: QJMConfig | None = None) -> QJMConfig:
    """Build a config from flat keyword options (``write_txns_timeout=5`` sets a timeout), over
    ``base`` (default: the defaults)."""
    cfg = base if base is not None else QJMConfig()
    if not options:
        return cfg
    tkw: dict[str, float] = {}
    kw: dict[str, Any] = {}
    for k, v in options.items():
        if k.endswith("_timeout") and k[: -len("_timeout")] in Timeouts.__dataclass_fields__:
            tkw[k[: -len("_timeout")]] = _typed(k, v, 1.0)
        elif k in QJMConfig.__dataclass_fields__ and k != "timeouts":
            kw[k] = v if k == "tls" else _typed(k, v, getattr(cfg, k))
        else:
            raise ConfigError(f"unknown option {k!r}")
    return replace(cfg, timeouts=replace(cfg.timeouts, **tkw), **kw).validate()


def _typed(name: str, v: object, default: object) -> Any:
    """``v`` as the type of the option's default, or a ConfigError naming the option: a string or
    a bool where a number belongs, or a number that is not finite, would otherwise fail later and
    far from the caller (``'<=' not supported``), or pass the range checks (NaN compares false)."""
    if isinstance(default, int) and not isinstance(default, bool):
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        raise ConfigError(f"option {name!r}: expected an integer, got {v!r}")
    if isinstance(default, float):
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
        raise ConfigError(f"option {name!r}: expected a finite number, got {v!r}")
    if isinstance(default, str) and not isinstance(v, str):
        raise ConfigError(f"option {name!r}: expected a string, got {v!r}")
    return v
