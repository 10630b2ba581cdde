"""Translation between the gRPC messages and ``qjm.protocol.messages``, in one place."""

from __future__ import annotations

from qjm.protocol import qjournal_pb2 as pb
from qjm.protocol.messages import (
    EditLogManifest,
    JournalState,
    NamespaceInfo,
    NewEpochResponse,
    PrepareRecoveryResponse,
    RemoteEditLog,
    RequestInfo,
    SegmentState,
)


def ns_to_pb(ns: NamespaceInfo) -> pb.NamespaceInfoProto:
    return pb.NamespaceInfoProto(namespace_id=ns.namespace_id, cluster_id=ns.cluster_id, ctime=ns.ctime)


def ns_from_pb(p: pb.NamespaceInfoProto) -> NamespaceInfo:
    return NamespaceInfo(p.namespace_id, p.cluster_id, p.ctime)


def req_to_pb(r: RequestInfo) -> pb.RequestInfoProto:
    return pb.RequestInfoProto(journal_id=r.journal_id, epoch=r.epoch, serial=r.serial, committed_txid=r.committed_txid)


def req_from_pb(p: pb.RequestInfoProto) -> RequestInfo:
    return RequestInfo(p.journal_id, p.epoch, p.serial, p.committed_txid)


def seg_to_pb(s: SegmentState) -> pb.SegmentStateProto:
    return pb.SegmentStateProto(start_txid=s.start_txid, end_txid=s.end_txid, in_progress=s.in_progress, epoch=s.epoch)


def seg_from_pb(p: pb.SegmentStateProto) -> SegmentState:
    return SegmentState(p.start_txid, p.end_txid, p.in_progress, p.epoch)


def state_to_pb(s: JournalState) -> pb.JournalStateResponse:
    return pb.JournalStateResponse(
        last_promised_epoch=s.last_promised_epoch,
        last_writer_epoch=s.last_writer_epoch,
        committed_txid=s.committed_txid,
        highest_written_txid=s.highest_written_txid,
        open_segment_txid=s.open_segment_txid,
        data_address=s.data_address,
    )


def state_from_pb(p: pb.JournalStateResponse) -> JournalState:
    return JournalState(
        p.last_promised_epoch,
        p.last_writer_epoch,
        p.committed_txid,
        p.highest_written_txid,
        p.open_segment_txid,
        p.data_address,
    )


def new_epoch_to_pb(r: NewEpochResponse) -> pb.NewEpochResponse:
    out = pb.NewEpochResponse(has_segment=r.last_segment_txid is not None, last_segment_txid=r.last_segment_txid or 0)
    if r.recovery is not None:
        out.recovery.CopyFrom(prepare_to_pb(r.recovery))
    return out


def new_epoch_from_pb(p: pb.NewEpochResponse) -> NewEpochResponse:
    return NewEpochResponse(
        p.last_segment_txid if p.has_segment else None,
        prepare_from_pb(p.recovery) if p.HasField("recovery") else None,
    )


def prepare_to_pb(r: PrepareRecoveryResponse) -> pb.PrepareRecoveryResponse:
    out = pb.PrepareRecoveryResponse(
        has_accepted=r.accepted_in_epoch is not None,
        accepted_in_epoch=r.accepted_in_epoch or 0,
        last_writer_epoch=r.last_writer_epoch,
        last_committed_txid=r.last_committed_txid,
    )
    if r.segment_state is not None:
        out.segment_state.CopyFrom(seg_to_pb(r.segment_state))
    return out


def prepare_from_pb(p: pb.PrepareRecoveryResponse) -> PrepareRecoveryResponse:
    return PrepareRecoveryResponse(
        seg_from_pb(p.segment_state) if p.HasField("segment_state") else None,
        p.accepted_in_epoch if p.has_accepted else None,
        p.last_writer_epoch,
        p.last_committed_txid,
    )


def manifest_to_pb(m: EditLogManifest) -> pb.ManifestResponse:
    return pb.ManifestResponse(
        logs=[
            pb.RemoteEditLogProto(
                start_txid=x.start_txid, end_txid=x.end_txid, in_progress=x.in_progress, finalized_at=x.finalized_at
            )
            for x in m.logs
        ],
        committed_txid=m.committed_txid,
    )


def manifest_from_pb(p: pb.ManifestResponse) -> EditLogManifest:
    return EditLogManifest(
        tuple(RemoteEditLog(x.start_txid, x.end_txid, x.in_progress, x.finalized_at) for x in p.logs), p.committed_txid
    )
