"""The gRPC servicer: decode → Journal → encode, with typed errors carried as status + metadata."""

from __future__ import annotations

import errno
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn, TypeVar

import grpc

from qjm import errors
from qjm.config import validate_journal_id
from qjm.errors import QJMError
from qjm.protocol import convert
from qjm.protocol import qjournal_pb2 as pb
from qjm.protocol import qjournal_pb2_grpc as pbg
from qjm.protocol.download import sent_chunks
from qjm.protocol.rpcmeta import ERROR_CODE_KEY, peer_identity
from qjm.security.authz import ADMIN, READER, WRITER, Authorizer
from qjm.security.redact import public_message
from qjm.server.follow import follow
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
    errors.PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
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
    may create a journal, so a call naming an unknown journal leaves nothing behind. Before that,
    the caller's identity (its verified certificate) must hold the call's role on the journal
    (design §9.2): a refusal touches nothing.
    """

    def __init__(
        self,
        journals: JournalRegistry,
        data_address: Callable[[], str],
        authz: Authorizer | None = None,
        max_followers: int = 8,
    ) -> None:
        self._journals = journals
        self._data_address = data_address
        self._authz = authz or Authorizer()
        # Each follower holds an RPC worker thread for as long as it follows: bounded, so that
        # followers cannot take every worker from the writer's calls.
        self._max_followers = max_followers
        self._followers = 0
        self._followers_lock = threading.Lock()

    def _allow(self, context: grpc.ServicerContext, journal_id: str, role: str) -> None:
        """Abort the call unless its caller holds ``role`` on ``journal_id``."""
        if not self._authz.enforcing:
            return
        try:
            validate_journal_id(journal_id)  # a counted refusal names a valid id, never arbitrary bytes
            self._authz.check(peer_identity(context), journal_id, role)
        except QJMError as e:
            self._abort(context, e)

    def _public(self, text: str) -> str:
        return public_message(text, self._journals.data_dir)

    def _abort(self, context: grpc.ServicerContext, e: Exception) -> NoReturn:
        """End the call with ``e``'s status, its wire code in the trailing metadata (``errors.from_code``)
        and its message without local paths (``context.abort`` raises)."""
        if isinstance(e, QJMError):
            if isinstance(e, errors.StorageError | errors.InvariantViolation):
                log.warning("%s: %s", type(e).__name__, e)  # the full message, paths too
            context.set_trailing_metadata(((ERROR_CODE_KEY, errors.to_code(e)),))
            context.abort(status_for(e), self._public(str(e)))
        log.exception("unexpected error in RPC")
        context.set_trailing_metadata(((ERROR_CODE_KEY, "QJM_ERROR"),))
        context.abort(grpc.StatusCode.INTERNAL, self._public(f"{type(e).__name__}: {e}"))
        raise AssertionError("unreachable")

    def _run(
        self,
        context: grpc.ServicerContext,
        journal_id: str,
        role: str,
        fn: Callable[[Journal], T],
        *,
        create: bool = False,
    ) -> T:
        self._allow(context, journal_id, role)
        try:
            with self._journals.lease(journal_id, create=create) as journal:
                return fn(journal)
        except Exception as e:
            self._abort(context, e)

    def Follow(self, request: pb.FollowRequest, context: grpc.ServicerContext) -> Iterator[pb.FollowChunk]:
        self._allow(context, request.journal_id, READER)
        with self._followers_lock:
            full = self._followers >= self._max_followers
            if not full:
                self._followers += 1
        if full:
            self._abort(
                context,
                errors.ResourceExhaustedError(f"this node already serves {self._max_followers} followers"),
            )
        try:
            heartbeat = min(max(request.heartbeat_ms, 10), 10_000) / 1000 if request.heartbeat_ms else 1.0
            with self._journals.lease(request.journal_id) as j:
                context.add_callback(j.wake_followers)  # a follower that leaves stops its wait at once
                for p in follow(j, max(request.from_txid, 1), heartbeat, context.is_active):
                    yield pb.FollowChunk(
                        frames=p.frames, first_txid=p.first_txid, last_txid=p.last_txid, committed_txid=p.committed_txid
                    )
        except Exception as e:
            self._abort(context, e)
        finally:
            with self._followers_lock:
                self._followers -= 1

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

        self._allow(context, request.journal_id, READER)
        if self._absent(request.journal_id):
            return pb.IsFormattedResponse(formatted=False)
        return self._run(context, request.journal_id, READER, go)

    def Format(self, request: pb.FormatRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go(j: Journal) -> pb.Empty:
            j.format(convert.ns_from_pb(request.ns), request.force, request.promised_epoch)
            return pb.Empty()

        return self._run(context, request.journal_id, ADMIN, go, create=True)

    def GetJournalState(self, request: pb.JournalIdRequest, context: grpc.ServicerContext) -> pb.JournalStateResponse:
        def go(j: Journal) -> pb.JournalStateResponse:
            out = convert.state_to_pb(j.get_journal_state())
            out.data_address = self._data_address()
            return out

        return self._run(context, request.journal_id, READER, go)

    def NewEpoch(self, request: pb.NewEpochRequest, context: grpc.ServicerContext) -> pb.NewEpochResponse:
        def go(j: Journal) -> pb.NewEpochResponse:
            out = convert.new_epoch_to_pb(j.new_epoch(convert.ns_from_pb(request.ns), request.epoch))
            out.data_address = self._data_address()
            return out

        return self._run(context, request.journal_id, WRITER, go)

    def StartLogSegment(self, request: pb.StartLogSegmentRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go(j: Journal) -> pb.Empty:
            j.start_log_segment(convert.req_from_pb(request.req), request.txid)
            return pb.Empty()

        return self._run(context, request.req.journal_id, WRITER, go)

    def FinalizeLogSegment(self, request: pb.FinalizeLogSegmentRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go(j: Journal) -> pb.Empty:
            j.finalize_log_segment(
                convert.req_from_pb(request.req), request.start_txid, request.end_txid, request.copy_epoch
            )
            return pb.Empty()

        return self._run(context, request.req.journal_id, WRITER, go)

    def PurgeLogs(self, request: pb.PurgeLogsRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go(j: Journal) -> pb.Empty:
            j.purge_logs(convert.req_from_pb(request.req), request.min_txid_to_keep, admin=request.admin)
            return pb.Empty()

        return self._run(context, request.req.journal_id, ADMIN, go)

    def PrepareRecovery(
        self, request: pb.PrepareRecoveryRequest, context: grpc.ServicerContext
    ) -> pb.PrepareRecoveryResponse:
        def go(j: Journal) -> pb.PrepareRecoveryResponse:
            return convert.prepare_to_pb(j.prepare_recovery(convert.req_from_pb(request.req), request.segment_txid))

        return self._run(context, request.req.journal_id, WRITER, go)

    def AcceptRecovery(self, request: pb.AcceptRecoveryRequest, context: grpc.ServicerContext) -> pb.Empty:
        def go(j: Journal) -> pb.Empty:
            j.accept_recovery(
                convert.req_from_pb(request.req), convert.seg_from_pb(request.state_to_accept), request.from_url
            )
            return pb.Empty()

        return self._run(context, request.req.journal_id, WRITER, go)

    def GetEditLogManifest(self, request: pb.ManifestRequest, context: grpc.ServicerContext) -> pb.ManifestResponse:
        def go(j: Journal) -> pb.ManifestResponse:
            return convert.manifest_to_pb(j.get_edit_log_manifest(request.since_txid, request.in_progress_ok))

        return self._run(context, request.journal_id, READER, go)

    def GetJournaledEdits(
        self, request: pb.JournaledEditsRequest, context: grpc.ServicerContext
    ) -> pb.JournaledEditsResponse:
        def go(j: Journal) -> pb.JournaledEditsResponse:
            r = j.get_journaled_edits(request.since_txid, request.max_txns or 5000)
            return pb.JournaledEditsResponse(txn_count=r.txn_count, frames=r.frames)

        return self._run(context, request.journal_id, READER, go)

    def DownloadSegment(self, request: pb.SegmentRequest, context: grpc.ServicerContext) -> Iterator[pb.SegmentChunk]:
        # The journal's lease covers finding the file; the open file is read outside it, a chunk
        # at a time, as gRPC's flow control lets the chunks go (design §4.3).
        d = self._run(context, request.journal_id, READER, lambda j: j.open_download(request.segment_txid))
        try:
            yield from sent_chunks(d.chunks(), d.state.end_txid, d.state.in_progress)
        except QJMError as e:
            self._abort(context, e)
        finally:
            d.close()

    def Status(self, request: pb.JournalIdRequest, context: grpc.ServicerContext) -> pb.NodeStatusResponse:
        def go(j: Journal) -> pb.NodeStatusResponse:
            st = j.status()
            st["data_address"] = self._data_address()
            return pb.NodeStatusResponse(json=json.dumps(st))

        self._allow(context, request.journal_id, READER)
        if self._absent(request.journal_id):
            st = unformatted_status(request.journal_id)
            st["data_address"] = self._data_address()
            return pb.NodeStatusResponse(json=json.dumps(st))
        return self._run(context, request.journal_id, READER, go)
