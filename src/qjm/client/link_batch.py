"""A batch on the native fan-out, counted at its quorum by the thread that waits for it (design §1.3).

``RemoteLogger.deliver_batch`` hands back a ``Delivery`` per node instead of a future: the link the
frame went out on, or why it could not go (or neither yet, while the node's segment is starting).
The node's link is quiet (``Fanout.add_link(report_acks=False)``): the epoll loop runs no Python
per ack, it only bumps ``Fanout.news()`` and wakes the threads in ``Fanout.wait_news``, which waits
without the GIL. ``LinkBatch`` then counts the nodes whose link has acked the batch's last txid.
With a future per node, every ack would cost the loop thread a GIL acquisition, a Python callback
chain and a hand-off to the writer's thread (about 100 µs of a 550 µs sync commit, when measured).

The counting rules are ``QuorumCall``'s: a node counts once it has acked the batch (a link that
failed afterwards still holds it), a node is lost for the batch once its delivery failed or its
link failed before acking it, and a node's ``InvariantViolation`` is raised as soon as it is seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from qjm.client.quorum import majority
from qjm.errors import InvariantViolation, QuorumError

if TYPE_CHECKING:
    from qjm.client.channel import _DataLink

__all__ = ["Delivery", "LinkBatch", "NewsSource"]


class NewsSource(Protocol):
    """What ``LinkBatch`` needs of the engine: ``qjm._native.fanout.Fanout``'s news counter."""

    def news(self) -> int: ...

    def wait_news(self, seen: int, timeout: float) -> bool: ...


class Delivery:
    """Where one node's copy of a batch went: a link, an error, or (both None) a segment still starting."""

    __slots__ = ("error", "link")

    def __init__(self, link: _DataLink | None = None, error: BaseException | None = None) -> None:
        self.link = link
        self.error = error


class LinkBatch:
    """One batch sent to every node; waits like ``QuorumCall`` without a future per node."""

    def __init__(
        self,
        news: NewsSource,
        last_txid: int,
        deliveries: Mapping[str, Delivery],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._news = news
        self.last_txid = last_txid
        self._deliveries = dict(deliveries)
        self._clock = clock

    @property
    def node_count(self) -> int:
        return len(self._deliveries)

    def outcome(self) -> tuple[dict[str, int], dict[str, BaseException]]:
        """(nodes that hold the batch → their acked txid, nodes lost for it → why), as of now."""
        ok: dict[str, int] = {}
        lost: dict[str, BaseException] = {}
        for name, d in self._deliveries.items():
            if d.error is not None:
                lost[name] = d.error
                continue
            link = d.link
            if link is None:
                continue  # the node's segment is still starting; its backlog goes out after
            acked = link.acked_txid()
            if acked >= self.last_txid:
                ok[name] = acked
            elif link.failed is not None:
                lost[name] = link.failed
        return ok, lost

    def _wait(self, need: int, timeout: float, op: str) -> dict[str, int]:
        n = len(self._deliveries)
        deadline = self._clock() + timeout
        while True:
            seen = self._news.news()  # before looking: news that lands meanwhile ends the wait below
            ok, lost = self.outcome()
            for name in sorted(lost):
                if isinstance(lost[name], InvariantViolation):
                    raise lost[name]
            if len(ok) >= need:
                return ok
            if len(lost) > n - need:
                raise QuorumError(f"{op}: {len(ok)} of {n} nodes succeeded, {need} needed", successes=ok, causes=lost)
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise QuorumError(
                    f"{op}: timed out after {timeout:g}s waiting for nodes to respond "
                    f"({len(ok)} succeeded, {len(lost)} failed of {n})",
                    successes=ok,
                    causes=lost,
                )
            self._news.wait_news(seen, remaining)

    def wait_for_write_quorum(self, timeout: float, op: str) -> dict[str, int]:
        """Return once a majority holds the batch; ``QuorumError`` once a majority cannot."""
        if not self._deliveries:
            raise QuorumError(f"{op}: no nodes to ask")
        return self._wait(majority(len(self._deliveries)), timeout, op)

    def wait_for_all(self, timeout: float, op: str) -> dict[str, int]:
        """Every node must hold the batch; fails at the first node lost for it."""
        return self._wait(len(self._deliveries), timeout, op)
