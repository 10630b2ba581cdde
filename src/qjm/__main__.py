"""The ``qjm`` command (also ``python -m qjm``): the operator's commands and the test harness's.

``qjm.cli`` registers the commands that work on real nodes and journals, ``qjm.testing.cli`` the
ones that start clusters or simulations of their own; this entry point is the one place that puts
the two together (see ``qjm.cli`` for why the boundary runs there).
"""

from collections.abc import Sequence

from qjm import cli
from qjm.testing import cli as harness


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(argv, groups=(cli.register, harness.register))


if __name__ == "__main__":
    raise SystemExit(main())
