"""``python -m qjm`` is the ``qjm`` command."""

from qjm.cli import main

raise SystemExit(main())
