"""Conventions both ends of the gRPC control plane share: channel options and error metadata keys."""

from __future__ import annotations

from typing import Final

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
