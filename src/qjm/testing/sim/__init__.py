"""Deterministic fault simulation of the real protocol code (design §7.3, Hadoop TestQJMWithFaults).

What runs is the production code: ``Journal`` on ``MemoryStorage`` behind its gRPC servicer for
every node, and for every writer ``QuorumJournalManager`` with its ``QuorumCall`` waits, the pure
recovery choice and one ``RemoteLogger`` per node. Only the network under the loggers is simulated:

* ``SimNodeIO`` is the ``NodeIO`` each ``RemoteLogger`` runs on (``qjm.client.node_io``). A control
  call is queued on the (writer, node) channel as the logger's own closure and run inline, on the
  scheduler's thread, when the scheduler delivers it: the logger stamps the request, the node's
  servicer answers it in the same step unless a fault strikes, and the logger's retry and
  refusal handling run as in production. Batches travel on a ``SimLink`` in the same FIFO queue,
  are applied with the node's ``apply_run`` and answered with ``wire`` replies.
* Each writer runs in its own greenlet in the scheduler's thread, so only one ever runs at a time:
  a writer runs until its ``QuorumCall`` has to wait, then hands control back to the scheduler (a
  baton passed by switching greenlets). The scheduler, driven by one ``Chooser`` (one seeded
  ``random.Random``), decides everything else: which channel delivers next, which writer resumes,
  where faults strike. So one seed is one execution, and replaying it gives the same trace.

``QuorumCall`` waits in ``threading.Condition.wait``; the simulation gives each of its calls a
condition whose ``wait`` yields to the scheduler, and a virtual clock, so no real time passes and
no timeout fires (see ``SimQuorumCall``). The manager, the quorum logic and the Journal are not
changed in any way.

Faults, all drawn from the chooser: a call lost before delivery; a call executed whose reply is
lost (the data link then breaks, as a TCP connection would); the client's retry of a call that got
no reply, when the node answers its ping; a control request duplicated, or delayed past the
client's retry and later calls; a data and a control message swapped; a run of batches cut into a
txid gap; a node crash that keeps only what was fsynced (``MemoryStorage.crash``, torn tails
included), also from inside a call at the paxos commit point or before an append, and a restart
over the same storage; a failed segment download; a writer that dies while sending, or while
waiting between any two phases; several writers that take over one after the other or interleave.

Each seed draws a profile (calm, mixed storms, recovery-heavy, or ``shapes``: a chain of writers
given roles that leave one of the rarest recovery shapes behind), so rare paths are reached
within a few hundred seeds.

After every step the invariants of design §2.7 are checked (``Checker``); a violation raises
``SimViolation`` (an ``InvariantViolation``) carrying the seed and the trace of every call. A
node's own ``InvariantViolation`` reply is a violation too, even one no writer waits for.

The package, one module per part: ``choice`` (decisions, fault rates, workloads), ``nodes``,
``transport`` (the simulated network under ``RemoteLogger``, and the quorum waits), ``writers``, ``checker`` (the
invariants), ``deadline`` (each execution's wall-clock bound: a writer stuck outside the simulation
becomes a harness failure, not a hang) and ``simulation`` (the scheduler, ``run_seed`` and the seed
searches).
"""

from qjm.testing.sim.checker import Checker, SimViolation
from qjm.testing.sim.choice import NO_FAULTS, Chooser, FaultRates, RandomChooser, Workload, WriterPlan
from qjm.testing.sim.deadline import DEFAULT_DEADLINE, STACK_HEADING, DeadlineExceeded
from qjm.testing.sim.nodes import JOURNAL_ID, NS
from qjm.testing.sim.simulation import SimResult, Simulation, caused_by, run_seed, search_seeds, violation_category
from qjm.testing.sim.transport import SimLoggerSet, SimManager, SimNodeIO, SimQuorumCall

__all__ = [
    "DEFAULT_DEADLINE",
    "JOURNAL_ID",
    "NO_FAULTS",
    "NS",
    "STACK_HEADING",
    "Checker",
    "Chooser",
    "DeadlineExceeded",
    "FaultRates",
    "RandomChooser",
    "SimLoggerSet",
    "SimManager",
    "SimNodeIO",
    "SimQuorumCall",
    "SimResult",
    "SimViolation",
    "Simulation",
    "Workload",
    "WriterPlan",
    "caused_by",
    "run_seed",
    "search_seeds",
    "violation_category",
]
