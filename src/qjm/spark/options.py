"""Parsing of the ``qjm`` format's options: every mistake becomes a ``ConfigError`` naming the option.

Spark hands options over as strings in a case-insensitive dict; they are parsed once, in the
``DataSource`` constructor, so a bad option fails the ``load()``/``save()``/``start()`` call
instead of a task. Unknown options are refused too: a typo must not silently change what is read.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from qjm.config import QJMConfig, Timeouts, config_from, parse_uri
from qjm.errors import ConfigError
from qjm.security.tls import tls_config

# Options Spark itself may add (``load(path)``, a streaming sink's checkpoint and query name): not ours.
_SPARK_KEYS = frozenset({"path", "checkpointlocation", "queryname"})
CLIENT_PREFIX = "qjm."
TEST_PREFIX = "_test."

_READ_KEYS = frozenset(
    {
        "uri",
        "starttxid",
        "endtxid",
        "includeinprogress",
        "showmarkers",
        "maxrecordsperpartition",
        "maxrecordspertrigger",
        "readtimeout",
        "isolation",
        "majoritylosstimeout",
    }
)
ISOLATIONS = ("read_committed", "read_uncommitted")
_WRITE_KEYS = frozenset({"uri", "create", "serializer", "segmentrecords", "reportpath", "markers"})
# tlsCa, tlsCert, tlsKey: mutual TLS to the nodes (all three or none), on the driver and executors.
_TLS_KEYS = ("tlsca", "tlscert", "tlskey")
_READ_KEYS |= frozenset(_TLS_KEYS)
_WRITE_KEYS |= frozenset(_TLS_KEYS)
_TEST_KEYS = frozenset({"failafterrecords", "failbatch", "failoncefile", "failincommit"})
SERIALIZERS = ("none", "json")


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _int(opts: Mapping[str, str], key: str, name: str, default: int | None, minimum: int) -> int | None:
    raw = opts.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"option {name!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"option {name!r} must be >= {minimum}, got {value}")
    return value


def _float(opts: Mapping[str, str], key: str, name: str, default: float) -> float:
    raw = opts.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"option {name!r} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"option {name!r} must be a finite number > 0, got {raw!r}")
    return value


def _bool(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name!r} must be true or false, got {raw!r}")


def _uri(opts: Mapping[str, str]) -> str:
    uri = opts.get("uri") or opts.get("path")
    if not uri:
        raise ConfigError(
            "option 'uri' is required: .option('uri', 'qjournal://host:port;host:port;host:port/journal')"
        )
    try:
        parse_uri(uri)
    except ConfigError as e:
        raise ConfigError(f"option 'uri': {e}") from None
    return uri


def _client_config(opts: Mapping[str, str]) -> QJMConfig:
    """``qjm.batch_bytes=1048576`` or ``qjm.write_txns_timeout=5`` set client settings (``QJMConfig``)."""
    fields = {f.name: f for f in dataclasses.fields(QJMConfig)}
    typed: dict[str, Any] = {}
    for key, raw in opts.items():
        if not key.startswith(CLIENT_PREFIX):
            continue
        name = key[len(CLIENT_PREFIX) :]
        if name.endswith("_timeout") and name[: -len("_timeout")] in Timeouts.__dataclass_fields__:
            kind: type = float
        elif name in fields and name not in ("timeouts", "tls"):
            kind = type(getattr(QJMConfig(), name))
        else:
            raise ConfigError(f"unknown client option {key!r} (qjm.<QJMConfig field> or qjm.<timeout>_timeout)")
        try:
            typed[name] = kind(raw)
        except ValueError:
            raise ConfigError(f"option {key!r} must be a {kind.__name__}, got {raw!r}") from None
    try:
        config = config_from(typed)
    except ConfigError as e:
        raise ConfigError(f"client options: {e}") from None
    tls = tls_config(*(opts.get(k) for k in _TLS_KEYS), where="options tlsCa, tlsCert, tlsKey")
    return dataclasses.replace(config, tls=tls)


def _check_known(opts: Mapping[str, str], known: frozenset[str], what: str) -> None:
    for key in opts:
        if key in known or key in _SPARK_KEYS or key.startswith(CLIENT_PREFIX):
            continue
        if key.startswith(TEST_PREFIX) and key[len(TEST_PREFIX) :] in _TEST_KEYS:
            continue
        raise ConfigError(f"unknown option {key!r} for {what}; known: {', '.join(sorted(known))}, qjm.*")


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What a batch or streaming read takes; ``end_txid=None`` means "as far as is committed"."""

    uri: str
    start_txid: int = 1
    start_latest: bool = False
    end_txid: int | None = None
    include_in_progress: bool = False
    show_markers: bool = False
    max_records_per_partition: int = 250_000
    max_records_per_trigger: int | None = None
    read_timeout: float = 120.0
    read_committed: bool = True
    # None: a read whose majority is gone waits for it; else it fails after this many seconds
    majority_loss_timeout: float | None = None
    config: QJMConfig = field(default_factory=QJMConfig)

    @property
    def partition_wait(self) -> float:
        """How long a partition waits for committed txids no live majority serves yet."""
        if self.majority_loss_timeout is None:
            return self.read_timeout
        return min(self.read_timeout, self.majority_loss_timeout)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        opts = _lower(options)
        _check_known(opts, _READ_KEYS, "reading a journal")
        start_raw = opts.get("starttxid", "").strip().lower()
        latest = start_raw == "latest"
        if start_raw in ("earliest", "latest"):
            opts.pop("starttxid")
        start = _int(opts, "starttxid", "startTxid", 1, 1)
        end = _int(opts, "endtxid", "endTxid", None, 0)
        assert start is not None
        if end is not None and end < start - 1:
            raise ConfigError(f"option 'endTxid' ({end}) is before option 'startTxid' ({start})")
        per_part = _int(opts, "maxrecordsperpartition", "maxRecordsPerPartition", 250_000, 1)
        assert per_part is not None
        isolation = opts.get("isolation", ISOLATIONS[0]).strip().lower()
        if isolation not in ISOLATIONS:
            raise ConfigError(f"option 'isolation' must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        config = _client_config(opts)
        loss: float | None = None
        if opts.get("majoritylosstimeout", "").strip():
            loss = _float(opts, "majoritylosstimeout", "majorityLossTimeout", 0.0)
            t = config.timeouts
            # a planning call to a silent majority then gives up within the bound too
            config = config.with_timeouts(
                select_input_streams=min(t.select_input_streams, loss),
                get_journal_state=min(t.get_journal_state, loss),
            )
        return cls(
            uri=_uri(opts),
            start_txid=start,
            start_latest=latest,
            end_txid=end,
            include_in_progress=_bool(opts, "includeinprogress", "includeInProgress", False),
            show_markers=_bool(opts, "showmarkers", "showMarkers", False),
            max_records_per_partition=per_part,
            max_records_per_trigger=_int(opts, "maxrecordspertrigger", "maxRecordsPerTrigger", None, 1),
            read_timeout=_float(opts, "readtimeout", "readTimeout", 120.0),
            read_committed=isolation == "read_committed",
            majority_loss_timeout=loss,
            config=config,
        )


@dataclass(frozen=True, slots=True)
class FailureInjection:
    """Test-only (``_test.*`` options): crash a write after N records, once, to exercise recovery."""

    after_records: int | None = None
    batch: int | None = None
    once_file: str | None = None
    in_commit: bool = False


@dataclass(frozen=True, slots=True)
class WriteOptions:
    uri: str
    create: bool = False
    serializer: str = "none"
    segment_records: int = 250_000
    report_path: str | None = None
    markers: bool = True
    config: QJMConfig = field(default_factory=QJMConfig)
    fail: FailureInjection = field(default_factory=FailureInjection)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        opts = _lower(options)
        _check_known(opts, _WRITE_KEYS, "writing a journal")
        serializer = opts.get("serializer", "none").strip().lower()
        if serializer not in SERIALIZERS:
            raise ConfigError(f"option 'serializer' must be one of {', '.join(SERIALIZERS)}, got {serializer!r}")
        seg = _int(opts, "segmentrecords", "segmentRecords", 250_000, 1)
        assert seg is not None
        fail = FailureInjection(
            after_records=_int(opts, TEST_PREFIX + "failafterrecords", "_test.failAfterRecords", None, 0),
            batch=_int(opts, TEST_PREFIX + "failbatch", "_test.failBatch", None, 0),
            once_file=opts.get(TEST_PREFIX + "failoncefile"),
            in_commit=_bool(opts, TEST_PREFIX + "failincommit", "_test.failInCommit", False),
        )
        return cls(
            uri=_uri(opts),
            create=_bool(opts, "create", "create", False),
            serializer=serializer,
            segment_records=seg,
            report_path=opts.get("reportpath") or None,
            markers=_bool(opts, "markers", "markers", True),
            config=_client_config(opts),
            fail=fail,
        )
