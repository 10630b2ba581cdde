"""The gRPC servicer: decode → Journal → encode, with typed errors carried as status + metadata."""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from qjm import errors
from qjm.errors import QJMError
from qjm.protocol import convert
from qjm.protocol import qjournal_pb2 as pb
from qjm.protocol import qjournal_pb2_grpc as pbg
from qjm.protocol.rpcmeta import ERROR_CODE_KEY
from qjm.server.journal import Journal

log = logging.getLogger("qjm.rpc")
T = TypeVar("T")

CHUNK = 1 << 20

_STATUS: dict[type[QJMError], grpc.StatusCode] = {
    errors.ConfigError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFormattedError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.AlreadyFormattedError: grpc.StatusCode.ALREADY_EXISTS,
    errors.NamespaceMismatchError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.FencedError: grpc.StatusCode.ABORTED,
    errors.EpochError: grpc.StatusCode.ABORTED,
    errors.OutOfSyncError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.CorruptFrameError: grpc.StatusCode.DATA_LOSS,
    errors.SegmentStateError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.NotFoundError: grpc.StatusCode.NOT_FOUND,
    errors.InvariantViolation: grpc.StatusCode.INTERNAL,
    errors.StorageError: grpc.StatusCode.INTERNAL,
}


def status_for(e: QJMError) -> grpc.StatusCode:
    for cls in type(e).__mro__:
        if cls in _STATUS:
            if isinstance(e, errors.StorageError) and getattr(e, "errno", None) == errno.ENOSPC:
                return grpc.StatusCode.RESOURCE_EXHAUSTED
            return _STATUS[cls]
    return grpc.StatusCode.UNKNOWN


class QJournalServicer(pbg.QJournalServicer):
    """Maps each RPC of ``qjournal.proto`` onto the node's ``Journal`` for the named journal id."""

    def __init__(self, get_journal: Callable[[str], Journal], data_address: Callable[[], str]) -> None:
        self._get = get_journal
        self._data_address = data_address

    def _run(self, context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except QJMError as e:
            context.set_trailing_metadata(((ERROR_CODE_KEY, errors.to_code(e)),))
            context.abort(status_for(e), str(e))
        except Exception as e:
            log.exception("unexpected error in RPC")
            context.set_trailing_metadata(((ERROR_CODE_KEY, "QJM_ERROR"),))
            context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")
        raise AssertionError("unreachable")  # context.abort raises

    def IsFormatted(self, request: pb.JournalIdRequest, context: grpc.ServicerContext) -> pb.IsFormattedResponse:
        return self._run(
            context, lambda: pb.IsFormattedResponse(formatted=self._get(request.journal_id).is_formatted())
        )

    def Format(self, request: pb.FormatRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go() -> pb.Empty:
            self._get(request.journal_id).format(convert.ns_from_pb(request.ns), request.force)
            return pb.Empty()

        return self._run(context, go)

    def GetJournalState(self, request: pb.JournalIdRequest, context: grpc.ServicerContext) -> pb.JournalStateResponse:
        def go() -> pb.JournalStateResponse:
            out = convert.state_to_pb(self._get(request.journal_id).get_journal_state())
            out.data_address = self._data_address()
            return out

        return self._run(context, go)

    def NewEpoch(self, request: pb.NewEpochRequest, context: grpc.ServicerContext) -> pb.NewEpochResponse:
        def go() -> pb.NewEpochResponse:
            out = convert.new_epoch_to_pb(
                self._get(request.journal_id).new_epoch(convert.ns_from_pb(request.ns), request.epoch)
            )
            out.data_address = self._data_address()
            return out

        return self._run(context, go)

    def StartLogSegment(self, request: pb.StartLogSegmentRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go() -> pb.Empty:
            self._get(request.req.journal_id).start_log_segment(convert.req_from_pb(request.req), request.txid)
            return pb.Empty()

        return self._run(context, go)

    def FinalizeLogSegment(self, request: pb.FinalizeLogSegmentRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go() -> pb.Empty:
            j = self._get(request.req.journal_id)
            j.finalize_log_segment(
                convert.req_from_pb(request.req), request.start_txid, request.end_txid, request.copy_epoch
            )
            return pb.Empty()

        return self._run(context, go)

    def PurgeLogs(self, request: pb.PurgeLogsRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go() -> pb.Empty:
            self._get(request.req.journal_id).purge_logs(convert.req_from_pb(request.req), request.min_txid_to_keep)
            return pb.Empty()

        return self._run(context, go)

    def PrepareRecovery(
        self, request: pb.PrepareRecoveryRequest, context: grpc.ServicerContext
    ) -> pb.PrepareRecoveryResponse:
        return self._run(
            context,
            lambda: convert.prepare_to_pb(
                self._get(request.req.journal_id).prepare_recovery(
                    convert.req_from_pb(request.req), request.segment_txid
                )
            ),
        )

    def AcceptRecovery(self, request: pb.AcceptRecoveryRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go() -> pb.Empty:
            self._get(request.req.journal_id).accept_recovery(
                convert.req_from_pb(request.req), convert.seg_from_pb(request.state_to_accept), request.from_url
            )
            return pb.Empty()

        return self._run(context, go)

    def GetEditLogManifest(self, request: pb.ManifestRequest, context: grpc.ServicerContext) -> pb.ManifestResponse:
        return self._run(
            context,
            lambda: convert.manifest_to_pb(
                self._get(request.journal_id).get_edit_log_manifest(request.since_txid, request.in_progress_ok)
            ),
        )

    def GetJournaledEdits(
        self, request: pb.JournaledEditsRequest, context: grpc.ServicerContext
    ) -> pb.JournaledEditsResponse:
        def go() -> pb.JournaledEditsResponse:
            r = self._get(request.journal_id).get_journaled_edits(request.since_txid, request.max_txns or 5000)
            return pb.JournaledEditsResponse(txn_count=r.txn_count, frames=r.frames)

        return self._run(context, go)

    def DownloadSegment(self, request: pb.SegmentRequest, context: grpc.ServicerContext) -> Iterator[pb.SegmentChunk]:
        from qjm._native import framing

        data, state = self._run(context, lambda: self._get(request.journal_id).read_segment_file(request.segment_txid))
        for off in range(0, max(len(data) - CHUNK, 0), CHUNK):
            yield pb.SegmentChunk(data=data[off : off + CHUNK])
        last_off = (max(len(data) - 1, 0) // CHUNK) * CHUNK
        yield pb.SegmentChunk(
            data=data[last_off:],
            last=True,
            end_txid=state.end_txid,
            in_progress=state.in_progress,
            total_bytes=len(data),
            xxh3=framing.xxh3_64(data),
        )

    def Status(self, request: pb.JournalIdRequest, context: grpc.ServicerContext) -> pb.NodeStatusResponse:
        def go() -> pb.NodeStatusResponse:
            st = self._get(request.journal_id).status()
            st["data_address"] = self._data_address()
            return pb.NodeStatusResponse(json=json.dumps(st))

        return self._run(context, go)
