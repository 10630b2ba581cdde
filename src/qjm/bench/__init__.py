"""``qjm bench``: qjm against the disk's floor, native against pure, in one run on one disk.

Three measurements, side by side, each in its own process and all under one base directory:

- **floor** (``floor``): three concurrent local appenders doing exactly the node's write pattern,
  with no network and no protocol; and, from a source checkout with a C compiler, the C floors of
  ``bench/netfloor/netfloor.c``, locally and over loopback, each run followed by the same networked
  round in Python processes (``pyfloor``: with no protocol, and over qjm's wire).
- **qjm native** (``workers``): a writer and three JournalNodes (``MiniJournalCluster``
  subprocesses) on loopback.
- **qjm pure**: the same with ``QJM_NO_EXTENSIONS=1`` in the writer and the nodes.

Figures: sync-commit latency p50/p99 of a 1 KiB batch with one batch outstanding; pipelined
throughput (records/s, payload MB/s) for 100-byte and 1 KiB records (``workload``); failover time
p50 (fence + recover + first commit: ``open_writer`` while another writer holds an open segment,
then one synced record), measured on a settled disk three ways: by another process that has read
the open segment first, as a standby that follows the journal does; by a cold process (its code
imported, nothing else); and by a new writer in the old writer's own process. Each figure is also
given as a ratio to the floor (``report``).

``--peers`` then measures ZooKeeper, etcd and NATS JetStream (``peers``: three servers each on
loopback, each peer in its own worker process) on the same two workloads and prints a second
table: floor, qjm native and each peer, with qjm native's ratio to each and the project's goals
(``goals``). ``python -m qjm.bench [--smoke] [--json] [--plot out.png] [--peers]``; ``qjm bench``
calls ``run``.
"""

from qjm.bench.driver import main, run

__all__ = ["main", "run"]
