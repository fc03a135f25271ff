"""Sub-second spans are written as such, not rounded to a zero that reads as 'none'."""

from __future__ import annotations

from gputop.units import fmt_duration, fmt_elapsed, fmt_length, fmt_seconds


def test_length_under_a_second_is_not_zero():
    assert fmt_length(0.4) == "0.4 s"
    assert fmt_length(0.035) == "35 ms"
    assert fmt_length(0.0) == "0:00:00"  # nothing at all stays the clock's zero
    assert fmt_length(1.4) == "0:00:01" and fmt_length(3725) == "1:02:05"


def test_every_duration_format_says_a_sub_second_span():
    for fmt in (fmt_length, fmt_duration, fmt_elapsed, fmt_seconds):
        assert fmt(0.4) == "0.4 s", fmt
        assert fmt(0.05) == "50 ms", fmt


def test_fmt_seconds_whole_from_one_second():
    assert fmt_seconds(14.2) == "14 s" and fmt_seconds(0) == "0 s"
    assert fmt_seconds(None) == "?" and fmt_seconds(float("nan")) == "?" and fmt_seconds(-1) == "?"


def test_a_sub_second_recording_says_its_length_and_idle_time(tmp_path, capsys):
    from gputop.cli import main

    out = tmp_path / "short.gputop"
    assert main(["record", "-o", str(out), "--fake", "1", "--duration", "0.6", "-i", "0.2"]) == 0
    said = capsys.readouterr().err
    assert "for 0.6 s;" in said and "recorded 0:00:00" not in said
    assert main(["report", str(out)]) == 0
    report = capsys.readouterr().out
    idle = next(line for line in report.splitlines() if "measured)" in line)
    assert "0:00:00" not in idle, idle
    assert " s measured)" in idle or " ms measured)" in idle, idle
