from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NamespaceInfoProto(_message.Message):
    __slots__ = ("namespace_id", "cluster_id", "ctime")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CTIME_FIELD_NUMBER: _ClassVar[int]
    namespace_id: int
    cluster_id: str
    ctime: int
    def __init__(self, namespace_id: _Optional[int] = ..., cluster_id: _Optional[str] = ..., ctime: _Optional[int] = ...) -> None: ...

class RequestInfoProto(_message.Message):
    __slots__ = ("journal_id", "epoch", "serial", "committed_txid")
    JOURNAL_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_TXID_FIELD_NUMBER: _ClassVar[int]
    journal_id: str
    epoch: int
    serial: int
    committed_txid: int
    def __init__(self, journal_id: _Optional[str] = ..., epoch: _Optional[int] = ..., serial: _Optional[int] = ..., committed_txid: _Optional[int] = ...) -> None: ...

class SegmentStateProto(_message.Message):
    __slots__ = ("start_txid", "end_txid", "in_progress", "epoch")
    START_TXID_FIELD_NUMBER: _ClassVar[int]
    END_TXID_FIELD_NUMBER: _ClassVar[int]
    IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    start_txid: int
    end_txid: int
    in_progress: bool
    epoch: int
    def __init__(self, start_txid: _Optional[int] = ..., end_txid: _Optional[int] = ..., in_progress: _Optional[bool] = ..., epoch: _Optional[int] = ...) -> None: ...

class JournalIdRequest(_message.Message):
    __slots__ = ("journal_id",)
    JOURNAL_ID_FIELD_NUMBER: _ClassVar[int]
    journal_id: str
    def __init__(self, journal_id: _Optional[str] = ...) -> None: ...

class FormatRequest(_message.Message):
    __slots__ = ("journal_id", "ns", "force", "promised_epoch")
    JOURNAL_ID_FIELD_NUMBER: _ClassVar[int]
    NS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    PROMISED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    journal_id: str
    ns: NamespaceInfoProto
    force: bool
    promised_epoch: int
    def __init__(self, journal_id: _Optional[str] = ..., ns: _Optional[_Union[NamespaceInfoProto, _Mapping]] = ..., force: _Optional[bool] = ..., promised_epoch: _Optional[int] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IsFormattedResponse(_message.Message):
    __slots__ = ("formatted",)
    FORMATTED_FIELD_NUMBER: _ClassVar[int]
    formatted: bool
    def __init__(self, formatted: _Optional[bool] = ...) -> None: ...

class JournalStateResponse(_message.Message):
    __slots__ = ("last_promised_epoch", "last_writer_epoch", "committed_txid", "highest_written_txid", "open_segment_txid", "data_address")
    LAST_PROMISED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_WRITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_TXID_FIELD_NUMBER: _ClassVar[int]
    HIGHEST_WRITTEN_TXID_FIELD_NUMBER: _ClassVar[int]
    OPEN_SEGMENT_TXID_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    last_promised_epoch: int
    last_writer_epoch: int
    committed_txid: int
    highest_written_txid: int
    open_segment_txid: int
    data_address: str
    def __init__(self, last_promised_epoch: _Optional[int] = ..., last_writer_epoch: _Optional[int] = ..., committed_txid: _Optional[int] = ..., highest_written_txid: _Optional[int] = ..., open_segment_txid: _Optional[int] = ..., data_address: _Optional[str] = ...) -> None: ...

class NewEpochRequest(_message.Message):
    __slots__ = ("journal_id", "ns", "epoch")
    JOURNAL_ID_FIELD_NUMBER: _ClassVar[int]
    NS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    journal_id: str
    ns: NamespaceInfoProto
    epoch: int
    def __init__(self, journal_id: _Optional[str] = ..., ns: _Optional[_Union[NamespaceInfoProto, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class NewEpochResponse(_message.Message):
    __slots__ = ("has_segment", "last_segment_txid", "recovery", "data_address")
    HAS_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEGMENT_TXID_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    has_segment: bool
    last_segment_txid: int
    recovery: PrepareRecoveryResponse
    data_address: str
    def __init__(self, has_segment: _Optional[bool] = ..., last_segment_txid: _Optional[int] = ..., recovery: _Optional[_Union[PrepareRecoveryResponse, _Mapping]] = ..., data_address: _Optional[str] = ...) -> None: ...

class StartLogSegmentRequest(_message.Message):
    __slots__ = ("req", "txid")
    REQ_FIELD_NUMBER: _ClassVar[int]
    TXID_FIELD_NUMBER: _ClassVar[int]
    req: RequestInfoProto
    txid: int
    def __init__(self, req: _Optional[_Union[RequestInfoProto, _Mapping]] = ..., txid: _Optional[int] = ...) -> None: ...

class FinalizeLogSegmentRequest(_message.Message):
    __slots__ = ("req", "start_txid", "end_txid", "copy_epoch")
    REQ_FIELD_NUMBER: _ClassVar[int]
    START_TXID_FIELD_NUMBER: _ClassVar[int]
    END_TXID_FIELD_NUMBER: _ClassVar[int]
    COPY_EPOCH_FIELD_NUMBER: _ClassVar[int]
    req: RequestInfoProto
    start_txid: int
    end_txid: int
    copy_epoch: int
    def __init__(self, req: _Optional[_Union[RequestInfoProto, _Mapping]] = ..., start_txid: _Optional[int] = ..., end_txid: _Optional[int] = ..., copy_epoch: _Optional[int] = ...) -> None: ...

class PurgeLogsRequest(_message.Message):
    __slots__ = ("req", "min_txid_to_keep", "admin")
    REQ_FIELD_NUMBER: _ClassVar[int]
    MIN_TXID_TO_KEEP_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    req: RequestInfoProto
    min_txid_to_keep: int
    admin: bool
    def __init__(self, req: _Optional[_Union[RequestInfoProto, _Mapping]] = ..., min_txid_to_keep: _Optional[int] = ..., admin: _Optional[bool] = ...) -> None: ...

class PrepareRecoveryRequest(_message.Message):
    __slots__ = ("req", "segment_txid")
    REQ_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_TXID_FIELD_NUMBER: _ClassVar[int]
    req: RequestInfoProto
    segment_txid: int
    def __init__(self, req: _Optional[_Union[RequestInfoProto, _Mapping]] = ..., segment_txid: _Optional[int] = ...) -> None: ...

class PrepareRecoveryResponse(_message.Message):
    __slots__ = ("segment_state", "has_accepted", "accepted_in_epoch", "last_writer_epoch", "last_committed_txid")
    SEGMENT_STATE_FIELD_NUMBER: _ClassVar[int]
    HAS_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_IN_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_WRITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMITTED_TXID_FIELD_NUMBER: _ClassVar[int]
    segment_state: SegmentStateProto
    has_accepted: bool
    accepted_in_epoch: int
    last_writer_epoch: int
    last_committed_txid: int
    def __init__(self, segment_state: _Optional[_Union[SegmentStateProto, _Mapping]] = ..., has_accepted: _Optional[bool] = ..., accepted_in_epoch: _Optional[int] = ..., last_writer_epoch: _Optional[int] = ..., last_committed_txid: _Optional[int] = ...) -> None: ...

class AcceptRecoveryRequest(_message.Message):
    __slots__ = ("req", "state_to_accept", "from_url")
    REQ_FIELD_NUMBER: _ClassVar[int]
    STATE_TO_ACCEPT_FIELD_NUMBER: _ClassVar[int]
    FROM_URL_FIELD_NUMBER: _ClassVar[int]
    req: RequestInfoProto
    state_to_accept: SegmentStateProto
    from_url: str
    def __init__(self, req: _Optional[_Union[RequestInfoProto, _Mapping]] = ..., state_to_accept: _Optional[_Union[SegmentStateProto, _Mapping]] = ..., from_url: _Optional[str] = ...) -> None: ...

class ManifestRequest(_message.Message):
    __slots__ = ("journal_id", "since_txid", "in_progress_ok")
    JOURNAL_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_TXID_FIELD_NUMBER: _ClassVar[int]
    IN_PROGRESS_OK_FIELD_NUMBER: _ClassVar[int]
    journal_id: str
    since_txid: int
    in_progress_ok: bool
    def __init__(self, journal_id: _Optional[str] = ..., since_txid: _Optional[int] = ..., in_progress_ok: _Optional[bool] = ...) -> None: ...

class RemoteEditLogProto(_message.Message):
    __slots__ = ("start_txid", "end_txid", "in_progress", "finalized_at")
    START_TXID_FIELD_NUMBER: _ClassVar[int]
    END_TXID_FIELD_NUMBER: _ClassVar[int]
    IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FINALIZED_AT_FIELD_NUMBER: _ClassVar[int]
    start_txid: int
    end_txid: int
    in_progress: bool
    finalized_at: float
    def __init__(self, start_txid: _Optional[int] = ..., end_txid: _Optional[int] = ..., in_progress: _Optional[bool] = ..., finalized_at: _Optional[float] = ...) -> None: ...

class ManifestResponse(_message.Message):
    __slots__ = ("logs", "committed_txid")
    LOGS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_TXID_FIELD_NUMBER: _ClassVar[int]
    logs: _containers.RepeatedCompositeFieldContainer[RemoteEditLogProto]
    committed_txid: int
    def __init__(self, logs: _Optional[_Iterable[_Union[RemoteEditLogProto, _Mapping]]] = ..., committed_txid: _Optional[int] = ...) -> None: ...

class JournaledEditsRequest(_message.Message):
    __slots__ = ("journal_id", "since_txid", "max_txns")
    JOURNAL_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_TXID_FIELD_NUMBER: _ClassVar[int]
    MAX_TXNS_FIELD_NUMBER: _ClassVar[int]
    journal_id: str
    since_txid: int
    max_txns: int
    def __init__(self, journal_id: _Optional[str] = ..., since_txid: _Optional[int] = ..., max_txns: _Optional[int] = ...) -> None: ...

class JournaledEditsResponse(_message.Message):
    __slots__ = ("txn_count", "frames")
    TXN_COUNT_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    txn_count: int
    frames: bytes
    def __init__(self, txn_count: _Optional[int] = ..., frames: _Optional[bytes] = ...) -> None: ...

class SegmentRequest(_message.Message):
    __slots__ = ("journal_id", "segment_txid")
    JOURNAL_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_TXID_FIELD_NUMBER: _ClassVar[int]
    journal_id: str
    segment_txid: int
    def __init__(self, journal_id: _Optional[str] = ..., segment_txid: _Optional[int] = ...) -> None: ...

class SegmentChunk(_message.Message):
    __slots__ = ("data", "last", "end_txid", "in_progress", "total_bytes", "xxh3")
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    END_TXID_FIELD_NUMBER: _ClassVar[int]
    IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    XXH3_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    last: bool
    end_txid: int
    in_progress: bool
    total_bytes: int
    xxh3: int
    def __init__(self, data: _Optional[bytes] = ..., last: _Optional[bool] = ..., end_txid: _Optional[int] = ..., in_progress: _Optional[bool] = ..., total_bytes: _Optional[int] = ..., xxh3: _Optional[int] = ...) -> None: ...

class NodeStatusResponse(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class FollowRequest(_message.Message):
    __slots__ = ("journal_id", "from_txid", "heartbeat_ms")
    JOURNAL_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_TXID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    journal_id: str
    from_txid: int
    heartbeat_ms: int
    def __init__(self, journal_id: _Optional[str] = ..., from_txid: _Optional[int] = ..., heartbeat_ms: _Optional[int] = ...) -> None: ...

class FollowChunk(_message.Message):
    __slots__ = ("frames", "first_txid", "last_txid", "committed_txid")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    FIRST_TXID_FIELD_NUMBER: _ClassVar[int]
    LAST_TXID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_TXID_FIELD_NUMBER: _ClassVar[int]
    frames: bytes
    first_txid: int
    last_txid: int
    committed_txid: int
    def __init__(self, frames: _Optional[bytes] = ..., first_txid: _Optional[int] = ..., last_txid: _Optional[int] = ..., committed_txid: _Optional[int] = ...) -> None: ...
