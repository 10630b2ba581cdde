"""The one exception hierarchy of qjm, raised alike by pure and native code and by both planes.

Tests assert on types and attributes, never on message text. Every error that crosses the wire
carries a stable ``code`` so the client can rebuild the same type on its side.
"""

from __future__ import annotations

from collections.abc import Mapping


class QJMError(Exception):
    """Base of every qjm error."""

    code = "QJM_ERROR"


class ConfigError(QJMError, ValueError):
    """A URI, option or setting is malformed or out of range."""

    code = "CONFIG"


class JournalIdError(ConfigError):
    """A journal id that could escape its directory or is otherwise unusable (``../x``)."""

    code = "BAD_JOURNAL_ID"


class NotFormattedError(QJMError):
    """The journal has no VERSION on this node: format it first."""

    code = "NOT_FORMATTED"


class AlreadyFormattedError(QJMError):
    """format() without force on a journal that already holds data."""

    code = "ALREADY_FORMATTED"


class NamespaceMismatchError(QJMError):
    """The request names another namespace than the one the journal was formatted with."""

    code = "NAMESPACE_MISMATCH"


class FencedError(QJMError):
    """The node has promised a newer epoch: the caller is no longer the writer (design §2.3)."""

    code = "FENCED"

    def __init__(self, message: str, *, request_epoch: int = -1, promised_epoch: int = -1) -> None:
        super().__init__(message)
        self.request_epoch = request_epoch
        self.promised_epoch = promised_epoch


class EpochError(QJMError):
    """new_epoch proposed an epoch not above the node's promise (a racing writer won)."""

    code = "EPOCH"


class OutOfSyncError(QJMError):
    """The node's log does not continue where the request expects (Hadoop JournalOutOfSync)."""

    code = "OUT_OF_SYNC"


class OutOfOrderError(OutOfSyncError):
    """A frame or RPC arrived with a txid or serial that does not follow the previous one."""

    code = "OUT_OF_ORDER"

    def __init__(self, message: str, *, expected: int = -1, actual: int = -1) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual


class NodeTooFarBehindError(OutOfSyncError):
    """The node's send queue passed its limit; it is dropped until the next segment."""

    code = "TOO_FAR_BEHIND"


class CorruptFrameError(QJMError):
    """Bytes that are not a valid frame: bad magic, checksum, length or record layout."""

    code = "CORRUPT_FRAME"

    def __init__(self, message: str, *, reason: str = "", offset: int = -1) -> None:
        super().__init__(message)
        self.reason = reason
        self.offset = offset


class TornTailError(CorruptFrameError):
    """A segment ends in a partial frame (a crash mid-write)."""

    code = "TORN_TAIL"


class SegmentStateError(QJMError):
    """The request contradicts the node's segments (finalizing to a wrong end, restarting a segment...)."""

    code = "SEGMENT_STATE"


class NotFoundError(QJMError):
    """A segment or txid that the node does not have."""

    code = "NOT_FOUND"


class InvariantViolation(QJMError, AssertionError):
    """A protocol invariant would break (design §2.7): never swallowed, always loud."""

    code = "INVARIANT"


class PurgeRefusedError(QJMError):
    """A purge would remove the open (newest) segment, or txids the retention floor
    (``min_retained_txids``) keeps for readers: nothing was removed."""

    code = "PURGE_REFUSED"


class StorageError(QJMError, OSError):
    """The node's disk refused (full, read-only, locked by another node)."""

    code = "STORAGE"


class InsecureBindError(ConfigError):
    """A node told to listen beyond loopback without TLS and without ``--insecure`` (design §9.1)."""

    code = "INSECURE_BIND"


class BindError(QJMError, OSError):
    """A node cannot listen where it was told to: the port is taken, or the address is not this host's."""

    code = "BIND"


class ResourceExhaustedError(QJMError):
    """The node is at one of its resource bounds (open journals, data-plane connections, frame
    memory); the request is refused whole, and may succeed once load drops."""

    code = "RESOURCE_EXHAUSTED"


class PermissionDeniedError(QJMError):
    """The caller's identity (its TLS certificate) has no role that allows the request on this
    journal (design §9.2); nothing was changed."""

    code = "PERMISSION_DENIED"

    def __init__(self, message: str, *, role: str = "") -> None:
        super().__init__(message)
        self.role = role


class NodeUnavailableError(QJMError):
    """The node did not answer (down, paused past the timeout, or connection refused)."""

    code = "UNAVAILABLE"


class TlsError(NodeUnavailableError):
    """The TLS session with a peer could not be set up or broke: a certificate the other end does
    not trust (another CA, expired, the wrong name), a peer that does not speak TLS, or an alert."""

    code = "TLS"


class WriterCrashedError(QJMError):
    """A test fault declared this writer dead: it sends nothing more."""

    code = "WRITER_CRASHED"


class QuorumError(QJMError):
    """Fewer than a majority of nodes succeeded; ``causes`` maps each failed node to its error."""

    code = "QUORUM"

    def __init__(
        self,
        message: str,
        *,
        successes: Mapping[str, object] | None = None,
        causes: Mapping[str, BaseException] | None = None,
    ) -> None:
        detail = "; ".join(f"{n}: {type(e).__name__}: {e}" for n, e in (causes or {}).items())
        super().__init__(f"{message} [{detail}]" if detail else message)
        self.successes = dict(successes or {})
        self.causes = dict(causes or {})

    @property
    def fenced(self) -> bool:
        """True if any node refused because a newer writer holds the journal."""
        return any(isinstance(e, FencedError) for e in self.causes.values())


def _all_subclasses(cls: type[QJMError]) -> list[type[QJMError]]:
    out: list[type[QJMError]] = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


BY_CODE: dict[str, type[QJMError]] = {c.code: c for c in _all_subclasses(QJMError)}


def to_code(e: QJMError) -> str:
    """The error's wire code; fencing carries its epochs (``FENCED;1;2``) so the client can report them,
    a refusal the role it lacked (``PERMISSION_DENIED;writer``)."""
    if isinstance(e, FencedError):
        return f"{e.code};{e.request_epoch};{e.promised_epoch}"
    if isinstance(e, PermissionDeniedError) and e.role:
        return f"{e.code};{e.role}"
    return e.code


def from_code(code: str, message: str) -> QJMError:
    """Rebuild the typed error a node reported, so client code can ``except FencedError``."""
    name, *extra = code.split(";")
    cls = BY_CODE.get(name, QJMError)
    if cls is QuorumError:
        return QJMError(message)
    if cls is FencedError and len(extra) == 2 and all(x.lstrip("-").isdigit() for x in extra):
        return FencedError(message, request_epoch=int(extra[0]), promised_epoch=int(extra[1]))
    if cls is PermissionDeniedError and len(extra) == 1:
        return PermissionDeniedError(message, role=extra[0])
    return cls(message)
