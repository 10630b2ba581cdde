"""Conventions both ends of the gRPC control plane share: channel options and error metadata keys."""

from __future__ import annotations

from typing import Any, Final

import grpc

# Imported here, not on the first stub: in a process taking the journal over cold that import
# alone (the generated module and its message classes) would sit inside the failover.
from qjm.protocol import qjournal_pb2_grpc as pbg  # type: ignore[attr-defined,unused-ignore]

GRPC_OPTIONS: Final = [
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]
ERROR_CODE_KEY: Final = "qjm-error-code"
# A restarted node must be reachable again at once, not after gRPC's default backoff of up to
# two minutes: the writer only retries a node at its next segment.
CLIENT_GRPC_OPTIONS: Final = [
    *GRPC_OPTIONS,
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def make_stub(channel: grpc.Channel) -> Any:
    """The generated stub (its module has no type stubs, so it is typed ``Any`` in one place)."""
    return pbg.QJournalStub(channel)  # type: ignore[no-untyped-call]


def add_servicer(servicer: object, server: grpc.Server) -> None:
    pbg.add_QJournalServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


def rpc_code(e: BaseException) -> grpc.StatusCode | None:
    """The status of a failed call (grpc's errors are both RpcError and Call at run time)."""
    code = getattr(e, "code", None)
    return code() if callable(code) else None
