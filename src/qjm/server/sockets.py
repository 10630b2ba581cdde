"""What the node's two listeners (the data plane, ``qjm.server.data``; the HTTP port,
``qjm.server.http``) do alike with a connection they are done with."""

from __future__ import annotations

import socket
import time

DRAIN_SECONDS = 1.0  # how long a refused peer is given to hang up after its answer
TLS_HANDSHAKE_RECORD = 0x16  # the first byte of every TLS ClientHello: how a TLS port tells plaintext


def drain(sock: socket.socket, deadline: float) -> None:
    """Read and drop what the peer still sends until it hangs up, or until ``deadline``
    (``time.monotonic()``): closing with unread bytes resets the connection, and the peer could
    lose the answer (a refusal, a reply) sent it just before."""
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                return
    except OSError:
        pass
