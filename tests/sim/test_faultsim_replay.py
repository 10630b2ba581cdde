"""A failing seed's replay command, as ``qjm faultsim`` prints it, reproduces the failure exactly."""

from __future__ import annotations

import io
import logging
import shlex

import pytest

from qjm.__main__ import main
from qjm.testing.bugs import BUG_NAMES, ProtocolBugs
from qjm.testing.faultsim import replay_command, run_faultsim

pytestmark = pytest.mark.sim


def test_the_printed_replay_command_reproduces_the_violation(capsys: pytest.CaptureFixture[str]) -> None:
    bugs = ProtocolBugs(ack_before_fsync=True, pick_shortest_log=True)
    rep = run_faultsim(range(0, 4), steps=150, bugs=bugs, use_spark=False, processes=1, out=io.StringIO())
    assert rep.failures, "the switches break invariant 4 at once: every seed fails"
    seed, violation, _trace = sorted(rep.failures)[0]
    lines = [ln.strip() for ln in rep.summary().splitlines() if ln.strip().startswith("replay: ")]
    argv = shlex.split(lines[0].removeprefix("replay: "))
    assert argv[0] == "qjm"
    assert argv[argv.index("--seed") + 1] == str(seed)
    assert argv[argv.index("--steps") + 1] == "150"
    assert ProtocolBugs.parse(argv[argv.index("--bugs") + 1]) == bugs
    capsys.readouterr()
    assert main(argv[1:]) == 1
    out = capsys.readouterr().out
    assert f"seed {seed}: VIOLATION: {violation}" in out.splitlines()
    # the options matter: without them the same seed holds every invariant
    assert main(["sim", "--seed", str(seed)]) == 0


def test_the_replay_command_of_the_correct_protocol_has_no_bugs_option() -> None:
    assert replay_command(7, steps=400, bugs=None) == "qjm sim --seed 7 --steps 400 --trace"


@pytest.mark.parametrize("cmd", [["sim", "--seed", "1"], ["faultsim", "--seeds", "0:1", "--local"]])
def test_an_unknown_bug_name_is_a_clear_error(cmd: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*cmd, "--bugs", "pick_shortest_log,no_such_bug"]) == 1
    err = capsys.readouterr().err
    assert "ConfigError: unknown protocol bug 'no_such_bug'" in err
    assert "Traceback" not in err
    for name in BUG_NAMES:
        assert name in err


def test_qjm_sim_in_process_leaves_the_callers_logging_as_it_was() -> None:
    """``qjm sim`` quiets qjm's loggers to errors while it runs (torn tails are expected there),
    then gives the caller's level back: in one process, later work still logs its warnings."""
    qjm_log = logging.getLogger("qjm")
    before = qjm_log.level
    qjm_log.setLevel(logging.INFO)
    try:
        assert main(["sim", "--seed", "1", "--steps", "50"]) == 0
        assert qjm_log.level == logging.INFO
    finally:
        qjm_log.setLevel(before)
