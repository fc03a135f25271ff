"""gputop's own options typed before a command (`gputop --pid 1234 advise`) were dropped without a
word: the command's parser wrote its defaults over them, and advise watched the machine without
attaching, exit 0. They now reach a command that has the same option, unless typed after it too;
before a command without it they are one line and status 2."""

from __future__ import annotations

import pytest

import gputop.commands.advise as advise_cmd
import gputop.commands.export as export_cmd
from gputop.cli import main


@pytest.fixture
def seen(monkeypatch):
    got = []
    for mod in (advise_cmd, export_cmd):
        monkeypatch.setattr(mod, "run", lambda args: got.append(args) or 0)
    return got


def test_options_before_the_command_reach_it(seen):
    assert main(["--pid", "4321", "-i", "0.5", "--sample-rate", "2", "--stuck-after", "9", "--fake", "3",
                 "--record", "r.gputop", "advise", "-d", "5"]) == 0
    a = seen[-1]
    assert (a.pid, a.interval, a.sample_rate, a.stuck_after, a.fake, a.record) == (4321, 0.5, 2.0, 9.0, 3, "r.gputop")
    assert main(["-i", "1", "export"]) == 0
    assert seen[-1].interval == 1.0  # not export's own default (5 s)


def test_the_value_typed_after_the_command_wins(seen):
    assert main(["-i", "0.5", "advise", "-i", "3"]) == 0
    assert seen[-1].interval == 3.0
    assert main(["advise"]) == 0
    assert (seen[-1].pid, seen[-1].interval) == (None, 2.0)


@pytest.mark.parametrize("argv, option", [
    (["--pid", "5", "report", "run.gputop"], "-p/--pid"),
    (["-i", "5", "info", "run.gputop"], "-i/--interval"),
    (["--pid", "5", "demo"], "-p/--pid"),
    (["--record", "x.gputop", "record", "-o", "y.gputop"], "--record"),
])
def test_an_option_the_command_does_not_have_is_refused(capsys, argv, option):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{option} given before '{argv[2]}' does not apply to it" in err, err


def test_advise_with_the_pid_before_it_attaches(capsys):
    # The new user's command: it printed "no job is attached" and exited 0.
    assert main(["--pid", "999999999", "advise", "-d", "1"]) == 2
    assert "no process with PID 999999999" in capsys.readouterr().err
