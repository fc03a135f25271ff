"""`gputop attach PID` wiring (the live UI itself is tested in test_ui.py)."""

import pytest

import gputop.commands.live as live_cmd
from gputop.commands import options
from gputop.cli import build_parser, main


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def fake_run_live(args):
        seen.append(args)
        return 0

    monkeypatch.setattr(live_cmd, "run_live", fake_run_live)
    # The UI is a stand-in: it needs no terminal (the refusal without one is in test_cli_e2e.py).
    monkeypatch.setattr(options, "terminal_problem", lambda: None)
    return seen


def test_attach_runs_the_live_ui_with_the_pid(calls):
    assert main(["attach", "1234", "--stuck-after", "5", "-i", "0.5"]) == 0
    (args,) = calls
    assert args.pid == 1234 and args.stuck_after == 5.0 and args.interval == 0.5 and args.fake is None


def test_attach_keeps_top_level_options_and_defaults(calls):
    main(["--stuck-after", "7", "--record", "run.gtop", "attach", "99"])
    main(["attach", "98"])
    assert (calls[0].pid, calls[0].stuck_after, calls[0].record) == (99, 7.0, "run.gtop")
    assert (calls[1].pid, calls[1].stuck_after, calls[1].record) == (98, 30.0, None)


def test_attach_rejects_a_bad_pid(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["attach", "abc"])
    assert exc.value.code == 2
    assert "not a process id: 'abc'" in capsys.readouterr().err


def test_stacks_takes_the_top_level_pid_too():
    args = build_parser().parse_args(["--pid", "55", "stacks", "--json"])
    assert args.pid == 55 and args.json
    args = build_parser().parse_args(["stacks", "-p", "56"])
    assert args.pid == 56 and not args.native
