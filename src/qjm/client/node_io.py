"""What ``RemoteLogger`` does that leaves the process, as one injected object (design §5.4).

``RemoteLogger`` decides (serials, sync state, the start backlog, retries, refusals); a ``NodeIO``
carries: it runs the logger's control calls on an executor in submission order, sends one control
request and returns the node's reply or raises its typed error, answers a reconnect ping, opens the
data link of a segment, and reads the clock the retry rule looks at. Production uses
``qjm.client.grpc_io.GrpcNodeIO`` (gRPC, the shared executors, the native or threaded link); the
fault simulation supplies one that delivers each request to a simulated node when its scheduler
says so, so the simulation runs ``RemoteLogger`` itself.

``TransportBugs`` declares the switches of ``qjm.testing.bugs.ProtocolBugs`` the transport reads,
so that this package never imports the testing one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from qjm.client.data_link import DataLink, LatencySink, LinkFailed
from qjm.errors import NodeUnavailableError

__all__ = ["FollowStream", "NoReply", "NodeIO", "TransportBugs"]

T = TypeVar("T")


class NoReply(NodeUnavailableError):
    """A control call got no reply: refused, cut, or its reply lost (the node may have done it).

    The only failure ``RemoteLogger`` retries, with a fresh serial, once the node answers a ping."""


class FollowStream(Protocol):
    """A node's push of committed frames (``RemoteLogger.follow``)."""

    node: str

    def __iter__(self) -> Iterator[tuple[bytes, int, int, int]]: ...

    def cancel(self) -> None: ...


class TransportBugs(Protocol):
    """Test-only switches of the client transport (``qjm.testing.bugs.ProtocolBugs``)."""

    @property
    def retry_reuses_serial(self) -> bool: ...

    @property
    def failed_start_never_cleared(self) -> bool: ...

    @property
    def fenced_refusal_counts_as_ack(self) -> bool: ...


class NodeIO(Protocol):
    """The I/O of one writer's (or reader's) channel to one node."""

    name: str
    """The node as errors and recovery sources name it (its control address)."""
    quiet_links: bool
    """Links count acks without a future per batch (the native engine: ``RemoteLogger.native_acks``)."""
    times_acks: bool
    """Links time each batch from its send to its ack themselves and hand the latencies to
    ``open_link``'s ``on_latencies`` (the native engine); else the writer times them (``AckTimer``)."""

    def submit(self, what: str, fn: Callable[[], T], *, parallel: bool = False) -> Future[T]:
        """Run ``fn`` after the calls submitted before it (``parallel``: beside them, for reads).
        ``what`` names the call with its arguments. Raises ``RuntimeError`` once shut down."""
        ...

    def beside(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` alongside the call running now (a link connects while its start is sent)."""
        ...

    def call(self, op: str, request: Any, timeout: float) -> Any:
        """Send control request ``request`` (a ``qjournal_pb2`` message) of operation ``op``; the
        node's reply. Raises the node's typed error, or ``NoReply`` when no reply came."""
        ...

    def ping(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the node to answer at all; False if it did not."""
        ...

    def monotonic(self) -> float: ...

    def open_link(
        self, data_address: str, on_fail: LinkFailed, *, report_acks: bool, on_latencies: LatencySink | None = None
    ) -> DataLink:
        """A data link to the node for one segment; ``NodeUnavailableError`` if it cannot connect."""
        ...

    def wake_counters(self) -> None:
        """Batches held for a starting segment went out or failed outside the engine: threads
        counting a batch's quorum over quiet links (``qjm.client.link_batch``) look again."""
        ...

    def read_segment(self, journal_id: str, segment: int) -> Iterator[bytes]:
        """A segment's bytes, verified against the sender's length and checksum at the end."""
        ...

    def follow(self, journal_id: str, since: int, heartbeat: float) -> FollowStream: ...

    def shutdown(self) -> None:
        """Refuse new calls and cancel the queued ones (a running one finishes); release the node."""
        ...
