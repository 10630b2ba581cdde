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
from qjm.protocol.download import sent_chunks
from qjm.protocol.rpcmeta import ERROR_CODE_KEY
from qjm.server.journal import Journal, unformatted_status
from qjm.server.registry import JournalRegistry

log = logging.getLogger("qjm.rpc")
T = TypeVar("T")

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
    errors.ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def status_for(e: QJMError) -> grpc.StatusCode:
    for cls in type(e).__mro__:
        if cls in _STATUS:
            if isinstance(e, errors.StorageError) and getattr(e, "errno", None) == errno.ENOSPC:
                return grpc.StatusCode.RESOURCE_EXHAUSTED
            return _STATUS[cls]
    return grpc.StatusCode.UNKNOWN


class QJournalServicer(pbg.QJournalServicer):
    """Maps each RPC of ``qjournal.proto`` onto the node's ``Journal`` for the named journal id.

    Each call leases its journal from the registry for the length of the call; only ``Format``
    may create a journal, so a call naming an unknown journal leaves nothing behind.
    """

    def __init__(self, journals: JournalRegistry, data_address: Callable[[], str]) -> None:
        self._journals = journals
        self._data_address = data_address

    def _run(
        self, context: grpc.ServicerContext, journal_id: str, fn: Callable[[Journal], T], *, create: bool = False
    ) -> T:
        try:
            with self._journals.lease(journal_id, create=create) as journal:
                return fn(journal)
        except QJMError as e:
            context.set_trailing_metadata(((ERROR_CODE_KEY, errors.to_code(e)),))
            context.abort(status_for(e), str(e))
        except Exception as e:
            log.exception("unexpected error in RPC")
            context.set_trailing_metadata(((ERROR_CODE_KEY, "QJM_ERROR"),))
            context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")
        raise AssertionError("unreachable")  # context.abort raises

    def _absent(self, journal_id: str) -> bool:
        """True if the journal has no directory here: a read-only call answers without opening it.
        A bad id counts as present, so that the call reports it as the typed error it is."""
        try:
            return not self._journals.exists(journal_id)
        except QJMError:
            return False

    def IsFormatted(self, request: pb.JournalIdRequest, context: grpc.ServicerContext) -> pb.IsFormattedResponse:
        def go(j: Journal) -> pb.IsFormattedResponse:
            return pb.IsFormattedResponse(formatted=j.is_formatted())

        if self._absent(request.journal_id):
            return pb.IsFormattedResponse(formatted=False)
        return self._run(context, request.journal_id, go)

    def Format(self, request: pb.FormatRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go(j: Journal) -> pb.Empty:
            j.format(convert.ns_from_pb(request.ns), request.force)
            return pb.Empty()

        return self._run(context, request.journal_id, go, create=True)

    def GetJournalState(self, request: pb.JournalIdRequest, context: grpc.ServicerContext) -> pb.JournalStateResponse:
        def go(j: Journal) -> pb.JournalStateResponse:
            out = convert.state_to_pb(j.get_journal_state())
            out.data_address = self._data_address()
            return out

        return self._run(context, request.journal_id, go)

    def NewEpoch(self, request: pb.NewEpochRequest, context: grpc.ServicerContext) -> pb.NewEpochResponse:
        def go(j: Journal) -> pb.NewEpochResponse:
            out = convert.new_epoch_to_pb(j.new_epoch(convert.ns_from_pb(request.ns), request.epoch))
            out.data_address = self._data_address()
            return out

        return self._run(context, request.journal_id, go)

    def StartLogSegment(self, request: pb.StartLogSegmentRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go(j: Journal) -> pb.Empty:
            j.start_log_segment(convert.req_from_pb(request.req), request.txid)
            return pb.Empty()

        return self._run(context, request.req.journal_id, go)

    def FinalizeLogSegment(self, request: pb.FinalizeLogSegmentRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go(j: Journal) -> pb.Empty:
            j.finalize_log_segment(
                convert.req_from_pb(request.req), request.start_txid, request.end_txid, request.copy_epoch
            )
            return pb.Empty()

        return self._run(context, request.req.journal_id, go)

    def PurgeLogs(self, request: pb.PurgeLogsRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go(j: Journal) -> pb.Empty:
            j.purge_logs(convert.req_from_pb(request.req), request.min_txid_to_keep)
            return pb.Empty()

        return self._run(context, request.req.journal_id, go)

    def PrepareRecovery(
        self, request: pb.PrepareRecoveryRequest, context: grpc.ServicerContext
    ) -> pb.PrepareRecoveryResponse:
        def go(j: Journal) -> pb.PrepareRecoveryResponse:
            return convert.prepare_to_pb(j.prepare_recovery(convert.req_from_pb(request.req), request.segment_txid))

        return self._run(context, request.req.journal_id, go)

    def AcceptRecovery(self, request: pb.AcceptRecoveryRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go(j: Journal) -> pb.Empty:
            j.accept_recovery(
                convert.req_from_pb(request.req), convert.seg_from_pb(request.state_to_accept), request.from_url
            )
            return pb.Empty()

        return self._run(context, request.req.journal_id, go)

    def GetEditLogManifest(self, request: pb.ManifestRequest, context: grpc.ServicerContext) -> pb.ManifestResponse:
        def go(j: Journal) -> pb.ManifestResponse:
            return convert.manifest_to_pb(j.get_edit_log_manifest(request.since_txid, request.in_progress_ok))

        return self._run(context, request.journal_id, go)

    def GetJournaledEdits(
        self, request: pb.JournaledEditsRequest, context: grpc.ServicerContext
    ) -> pb.JournaledEditsResponse:
        def go(j: Journal) -> pb.JournaledEditsResponse:
            r = j.get_journaled_edits(request.since_txid, request.max_txns or 5000)
            return pb.JournaledEditsResponse(txn_count=r.txn_count, frames=r.frames)

        return self._run(context, request.journal_id, go)

    def DownloadSegment(self, request: pb.SegmentRequest, context: grpc.ServicerContext) -> Iterator[pb.SegmentChunk]:
        # The journal's lease covers finding the file; the open file is read outside it, a chunk
        # at a time, as gRPC's flow control lets the chunks go (design §4.3).
        d = self._run(context, request.journal_id, lambda j: j.open_download(request.segment_txid))
        try:
            yield from sent_chunks(d.chunks(), d.state.end_txid, d.state.in_progress)
        except QJMError as e:
            context.set_trailing_metadata(((ERROR_CODE_KEY, errors.to_code(e)),))
            context.abort(status_for(e), str(e))
        finally:
            d.close()

    def Status(self, request: pb.JournalIdRequest, context: grpc.ServicerContext) -> pb.NodeStatusResponse:
        def go(j: Journal) -> pb.NodeStatusResponse:
            st = j.status()
            st["data_address"] = self._data_address()
            return pb.NodeStatusResponse(json=json.dumps(st))

        if self._absent(request.journal_id):
            st = unformatted_status(request.journal_id)
            st["data_address"] = self._data_address()
            return pb.NodeStatusResponse(json=json.dumps(st))
        return self._run(context, request.journal_id, go)
