"""Every numeric option of the ``qjm`` commands refuses a bad value with one usage line naming the
option (exit code 2), before anything starts: no traceback, and no run on a silent default."""

from __future__ import annotations

import argparse

import pytest

from qjm.__main__ import main
from qjm.argtypes import duration, non_negative_int, positive_int, positive_seconds, seed_range


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["faultsim", "--local", "--seeds", "abc"], "--seeds"),
        (["faultsim", "--local", "--seeds", "5:2"], "--seeds"),
        (["faultsim", "--local", "--seeds", "-3:2"], "--seeds"),
        (["faultsim", "--local", "--seeds", "0:1", "--processes", "0"], "--processes"),
        (["faultsim", "--local", "--seeds", "0:1", "--processes", "-3"], "--processes"),
        (["faultsim", "--local", "--seeds", "0:1", "--batch", "0"], "--batch"),
        (["faultsim", "--local", "--seeds", "0:1", "--steps", "-1"], "--steps"),
        (["sim", "--seed", "1", "--steps", "-5"], "--steps"),
        (["sim", "--explore", "--time-limit", "-1"], "--time-limit"),
        (["sim", "--explore", "--time-limit", "inf"], "--time-limit"),
        (["chaos", "--duration", "xyz"], "--duration"),
        (["chaos", "--duration", "0s"], "--duration"),
        (["chaos", "--duration", "1s", "--writers", "0"], "--writers"),
        (["chaos", "--duration", "1s", "--nodes", "0"], "--nodes"),
        (["demo", "--records", "-1"], "--records"),
        (["cluster", "up", "--nodes", "0"], "--nodes"),
        (["tail", "qjournal://127.0.0.1:1/j", "--from", "0"], "--from"),
        (["tail", "qjournal://127.0.0.1:1/j", "--from", "x"], "--from"),
        (["certs", "init", "/nonexistent/ca", "--days", "0"], "--days"),
    ],
)
def test_a_bad_option_value_is_one_usage_line(argv: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    out = capsys.readouterr()
    assert f"error: argument {option}" in out.err and "Traceback" not in out.err
    assert out.out == ""  # refused before anything ran


def test_the_types_accept_what_their_help_promises() -> None:
    assert seed_range("0:100000") == range(0, 100000)
    assert seed_range(":3") == range(0, 3)
    assert seed_range("7") == range(7, 8)
    assert (positive_int("3"), non_negative_int("0"), positive_seconds("0.5")) == (3, 0, 0.5)
    assert [duration(t) for t in ("90", "60s", "10m", "1h", " 2M ")] == [90.0, 60.0, 600.0, 3600.0, 120.0]


@pytest.mark.parametrize("text", ["", ":", "1:1", "2:1", "a:b", "1.5", "-1"])
def test_seed_range_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        seed_range(text)


@pytest.mark.parametrize("text", ["", "s", "-1", "0", "nan", "infs", "1d"])
def test_duration_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)
