"""A subcommand's bad argument is that subcommand's error: one line naming it and where its options are
listed (not the usage block: the README promises one line), exit 2."""

from __future__ import annotations

import pytest

from gputop.cli import COMMANDS, main


def _fail(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    return exc.value.code, err


def test_export_port_names_export_and_points_at_listen(capsys):
    code, err = _fail(capsys, ["export", "--port"])
    assert code == 2
    assert err == ("gputop export: error: unrecognized arguments: --port (did you mean --listen HOST:PORT?); "
                   "options: gputop export --help\n")
    assert "Traceback" not in err


def test_export_port_with_a_value(capsys):
    code, err = _fail(capsys, ["export", "--port", "abc"])
    assert code == 2
    assert "gputop export: error: unrecognized arguments: --port abc" in err


@pytest.mark.parametrize("name", COMMANDS)
def test_every_subcommand_reports_an_unknown_option_itself(capsys, name):
    # Required arguments given where a command has them, so the unknown option is the only fault.
    needs = {"attach": ["1"], "replay": ["x"], "report": ["x"], "info": ["x"],
             "job": ["--prometheus", "http://h:9090"]}
    code, err = _fail(capsys, [name, *needs.get(name, []), "--no-such-option"])
    assert code == 2
    assert err.count("\n") == 1 and err.rstrip().endswith(f"; options: gputop {name} --help"), err
    assert f"gputop {name}: error: unrecognized arguments: --no-such-option" in err


def test_a_stray_positional_is_the_subcommands_error(capsys):
    code, err = _fail(capsys, ["report", "a.gputop", "b.gputop"])
    assert code == 2
    assert "gputop report: error: unrecognized arguments: b.gputop" in err


def test_an_unknown_option_before_the_command_stays_gputops(capsys):
    code, err = _fail(capsys, ["--no-such-option", "export"])
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("gputop: error: ")
    assert "gputop: error: unrecognized arguments: --no-such-option" in err


def test_a_subcommands_force_without_record_is_its_error(capsys):
    code, err = _fail(capsys, ["advise", "-f"])
    assert code == 2
    assert err.count("\n") == 1
    assert "gputop advise: error: --force only applies with --record FILE" in err


def test_gputops_own_force_before_a_command_stays_gputops(capsys):
    code, err = _fail(capsys, ["--forc", "attach", "1"])
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("gputop: error: ")
    assert "gputop: error: --force only applies with --record FILE" in err
