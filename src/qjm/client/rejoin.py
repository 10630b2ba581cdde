"""Bringing back a node that lost its disk (design §4.5): what it must be formatted with.

A node whose data directory was replaced answers "not formatted". Formatted afresh like a new
journal, it would promise epoch 0 and take requests from any writer, a fenced one included; the
other nodes may still hold that writer's epoch as their promise. So the node rejoins with its
peers' namespace and the highest epoch they promised, written before it is stamped formatted.

That promise must cover every epoch a writer may hold. A writer won its epoch at a majority,
which may have included this node; the rest of that majority is among the others, so the promises
of a majority-sized group of the *other* nodes always include one of them. Fewer answers are
refused: the node stays unformatted and the journal runs on the others, as before.

Pure decisions over what the nodes reported (``plan_rejoin``); ``QuorumJournalManager.rejoin_node``
asks and formats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qjm.client.quorum import majority
from qjm.errors import AlreadyFormattedError, ConfigError, NamespaceMismatchError, NodeUnavailableError, QuorumError
from qjm.protocol.messages import NamespaceInfo

__all__ = ["RejoinPlan", "plan_rejoin"]


@dataclass(frozen=True, slots=True)
class RejoinPlan:
    """How ``node`` is formatted: ``namespace`` and ``promised_epoch``, taken from ``peers``."""

    node: str
    namespace: NamespaceInfo
    promised_epoch: int
    peers: tuple[str, ...]


def plan_rejoin(
    journal_id: str, node: str, nodes: Sequence[str], answers: Mapping[str, Mapping[str, object] | BaseException]
) -> RejoinPlan:
    """The plan for ``node`` from every node's ``status`` answer (or the error that came instead).

    Refused with a clear error when ``node`` is not one of ``nodes``, cannot be reached or still
    holds the journal, when fewer than a majority of the cluster's size among the other nodes
    answered with the journal, or when those disagree on its namespace.
    """
    if node not in nodes:
        raise ConfigError(f"node {node} is not one of the journal's nodes ({', '.join(nodes)})")
    own = answers.get(node, NodeUnavailableError(f"{node} did not answer"))
    if isinstance(own, BaseException):
        raise NodeUnavailableError(f"cannot reach node {node}: {type(own).__name__}: {own}")
    if own.get("formatted"):
        raise AlreadyFormattedError(
            f"node {node} holds journal {journal_id} (promised epoch {own.get('promised_epoch')}, written through "
            f"txid {own.get('highest_written_txid')}): rejoin is for a node whose copy of the journal is gone"
        )
    need = majority(len(nodes))
    peers: dict[str, Mapping[str, object]] = {}
    causes: dict[str, BaseException] = {}
    for name in nodes:
        if name == node:
            continue
        got = answers.get(name, NodeUnavailableError(f"{name} did not answer"))
        if isinstance(got, BaseException):
            causes[name] = got
        elif not got.get("formatted"):
            causes[name] = AlreadyFormattedError(f"{name} does not hold journal {journal_id} either")
        else:
            peers[name] = got
    if len(peers) < need:
        raise QuorumError(
            f"rejoin {node}: {len(peers)} of the other nodes answered with journal {journal_id}, {need} needed: "
            "the promise the node starts with must cover every epoch a writer may hold",
            successes=peers,
            causes=causes,
        )
    spaces = {name: _namespace(name, st) for name, st in peers.items()}
    if len(set(spaces.values())) > 1:
        seen = "; ".join(f"{n}: {ns.namespace_id}/{ns.cluster_id}/{ns.ctime}" for n, ns in sorted(spaces.items()))
        raise NamespaceMismatchError(
            f"rejoin {node}: the other nodes hold journal {journal_id} in different namespaces ({seen})"
        )
    promised = max(_count(name, st, "promised_epoch") for name, st in peers.items())
    return RejoinPlan(node, next(iter(spaces.values())), promised, tuple(sorted(peers)))


def _namespace(name: str, st: Mapping[str, object]) -> NamespaceInfo:
    ns_id, cluster, ctime = st.get("namespace_id"), st.get("cluster_id"), st.get("ctime")
    if not isinstance(ns_id, int) or not isinstance(cluster, str) or not isinstance(ctime, int) or ns_id <= 0:
        raise NamespaceMismatchError(
            f"node {name} does not report the journal's namespace (a qjm older than rejoin?): upgrade it first"
        )
    return NamespaceInfo(ns_id, cluster, ctime)


def _count(name: str, st: Mapping[str, object], key: str) -> int:
    v = st.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise NamespaceMismatchError(f"node {name} reported no usable {key} ({v!r})")
    return v
