"""A new user's small findings on the command line's words:

- `--max-size -1G` (and `-d -5s`) gave argparse's "expected one argument" where `-d -5` says
  "must be greater than 0";
- `gputop stacks --help` showed `[-p PID]` (optional) beside "(required)";
- `advise -d 15` said "watched 15 s", then "where the time went over the last 16 s" unexplained
  (the GPU's buffer from before the session, under the half second that was noted);
- `advise` without --pid said "nothing in this window costs the job a visible share" with no job.
"""

from __future__ import annotations

import pytest

from gputop.analysis import Breakdown, Bucket
from gputop.cli import main
from gputop.present import breakdown_table, findings_text


@pytest.mark.parametrize("argv, value", [
    (["record", "-o", "x.gputop", "--max-size", "-1G"], "-1G"),
    (["record", "-o", "x.gputop", "--max-size=-1G"], "-1G"),
    (["advise", "-d", "-5s"], "-5s"),
    (["record", "-o", "x.gputop", "--duration", "-1h30m"], "-1h30m"),
    (["advise", "-d", "-5"], "-5"),  # as it always said
])
def test_a_negative_value_is_said_to_be_out_of_range(tmp_path, monkeypatch, capsys, argv, value):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert f"must be greater than 0: '{value}'" in err and "expected one argument" not in err, err
    assert not list(tmp_path.iterdir())


def test_replay_start_before_the_end_is_still_a_value(capsys):
    from gputop.cli import _glue_negative_values, _value_options, build_parser

    options = _value_options(build_parser())
    assert _glue_negative_values(["replay", "r.gputop", "--start", "-5m"], options)[-1] == "--start=-5m"
    assert _glue_negative_values(["advise", "-d", "-5s"], options)[-1] == "-d-5s"
    # An option that takes no value, and anything after "--", are left as they are.
    assert _glue_negative_values(["record", "--force", "-5"], options) == ["record", "--force", "-5"]
    assert _glue_negative_values(["--", "-d", "-5s"], options) == ["--", "-d", "-5s"]


def test_stacks_usage_says_pid_is_required(capsys):
    with pytest.raises(SystemExit):
        main(["stacks", "--help"])
    out = capsys.readouterr().out
    usage = out.split("\n\n", 1)[0]
    assert "-p PID" in usage and "[-p PID]" not in usage, usage
    # The usage is written by hand (the PID may come before the command): it lists every option.
    from gputop.cli import build_parser, command_parser

    for action in command_parser(build_parser(), "stacks")._actions:
        assert action.option_strings[0] in usage, action.option_strings
    assert main(["stacks"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--pid" in err, err


def _gpu_window(t0: float, busy: float) -> Breakdown:
    return Breakdown(gpu_index=0, t0=t0, t1=t0 + busy, seconds={Bucket.BUSY: busy}, attributed=True)


def test_a_window_longer_than_the_watch_says_why():
    # The session's first poll at 100.0; NVML's buffer reaches 0.3 s before it; 15.6 s in all,
    # which reads "16 s" beside a watch of 15.3 s ("15 s"): the 0.3 s is said.
    head = breakdown_table([_gpu_window(99.7, 15.6)], session_start=100.0).splitlines()[0]
    assert "over the last 16 s, 0.3 s of it from before the session (the GPU's buffer)" in head, head
    # 0.3 s that does not change the seconds shown is not worth a note (as before).
    head = breakdown_table([_gpu_window(99.7, 15.2)], session_start=100.0).splitlines()[0]
    assert "over the last 15 s" in head and "before the session" not in head, head


def test_no_job_attached_is_said_as_such():
    text = findings_text([], breakdowns=[_gpu_window(100.0, 15.0)], attached=False)
    assert "no job is attached" in text and "costs the job" not in text
    text = findings_text([], attached=False)  # no GPU read either
    assert "no job is attached" in text and "no GPU was read" in text
    # Attached, the words are as they were.
    assert findings_text([], breakdowns=[_gpu_window(100.0, 15.0)]).startswith("No findings: nothing in this window")
