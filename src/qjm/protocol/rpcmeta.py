"""Conventions both ends of the gRPC control plane share: channel options and error metadata keys."""

from __future__ import annotations

from typing import Any, Final

import grpc

from qjm.security.certs import identity_of_pem
from qjm.security.tls import TlsConfig

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


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """gRPC server credentials requiring a client certificate signed by the CA (design §9.1)."""
    tls.check()
    return grpc.ssl_server_credentials(
        [(tls.key_pem(), tls.cert_pem())], root_certificates=tls.ca_pem(), require_client_auth=True
    )


def channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    """gRPC channel credentials presenting ``tls``'s certificate and verifying the server's."""
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca_pem(), private_key=tls.key_pem(), certificate_chain=tls.cert_pem()
    )


def open_channel(address: str, options: list[tuple[str, Any]], tls: TlsConfig | None) -> grpc.Channel:
    """A new channel to ``address``: mutual TLS with ``tls`` (the node's certificate checked against
    the CA and the host dialled, design §9.1), plaintext without."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, channel_credentials(tls), options=options)


def peer_identity(context: grpc.ServicerContext) -> str | None:
    """The verified identity of a call's client, or None on a plaintext server (no identity).
    gRPC has checked the certificate against the CA before the call reaches the servicer."""
    pems = context.auth_context().get("x509_pem_cert")
    if not pems:
        return None
    return identity_of_pem(pems[0])


def make_stub(channel: grpc.Channel) -> Any:
    """The generated stub (its module has no type stubs, so it is typed ``Any`` in one place)."""
    from qjm.protocol import qjournal_pb2_grpc as pbg

    return pbg.QJournalStub(channel)  # type: ignore[no-untyped-call]


def add_servicer(servicer: object, server: grpc.Server) -> None:
    from qjm.protocol import qjournal_pb2_grpc as pbg

    pbg.add_QJournalServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


def rpc_code(e: BaseException) -> grpc.StatusCode | None:
    """The status of a failed call (grpc's errors are both RpcError and Call at run time)."""
    code = getattr(e, "code", None)
    return code() if callable(code) else None
