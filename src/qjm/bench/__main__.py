"""``python -m qjm.bench``: the benchmark, or one of its worker processes (``--worker``)."""

from qjm.bench.driver import main

raise SystemExit(main())
