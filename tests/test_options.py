"""The shared argument types: their limits, said for people (no 3.16224e+07)."""

from __future__ import annotations

import re

import pytest

from gputop.cli import main
from gputop.commands import options
from gputop.units import fmt_limit


@pytest.mark.parametrize("seconds, text", [
    (0.01, "0.01 s"),
    (45, "45 s"),
    (90, "90 s"),
    (3600, "1h (3,600 s)"),
    (options.MAX_DURATION, "366d (31,622,400 s)"),
    (123.5, "123.5 s"),
])
def test_limits_are_written_for_people(seconds, text):
    assert fmt_limit(seconds) == text


@pytest.mark.parametrize("argv, says", [
    (["record", "-o", "x.gputop", "--duration", "400d"], "must be at most 366d (31,622,400 s): '400d'"),
    (["-i", "2h"], "must be at most 1h (3,600 s): '2h'"),
    (["-i", "0.001"], "must be at least 0.1 s: '0.001'"),
    (["record", "-o", "x.gputop", "-i", "0.01"], "must be at least 0.1 s: '0.01' (shorter intervals cost gputop most of a core"),
])
def test_limit_errors_have_no_exponent(argv, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err
    assert not re.search(r"\de[+-]\d", err), err


@pytest.mark.parametrize("argv", [["--force"], ["--force", "attach", "1"], ["--force", "info", "x.gputop"],
                                  ["--force", "--fake"]])
def test_force_without_record_is_refused(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert errors == ["gputop: error: --force only applies with --record FILE (to overwrite an old recording); "
                      "options: gputop --help"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["--force", "--record", "x.gputop"], ["--force", "--record", "x.gputop", "attach", "1"],
                                  ["report", "x.gputop", "--force"], ["record", "-o", "x.gputop", "--force"]])
def test_force_with_something_to_overwrite_parses(argv):
    from gputop.cli import build_parser

    assert options.force_problem(build_parser().parse_args(argv)) is None
