"""The multi-rank bench grades a held-out job by its measured fix, not by what its author expected."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import multi_rank  # noqa: E402


def _row(speedup, timeline, ok=False):
    return {"mode": "m", "fresh": True, "ok": ok, "correct": ok, "first_seen_s": 4.0 if ok else None,
            "false_warnings": 0, "false_warning_ids": [], "fix": {"speedup": speedup}, "top_timeline": timeline}


def test_a_fix_gaining_under_ten_percent_makes_a_silent_verdict_right():
    row = multi_rank.measured_grade(_row(1.07, [{"t_s": 0.0, "top": None, "severity": None}]))
    assert row["ok"] and row["measured_truth"] == "healthy" and row["written_ok"] is False
    assert row["false_warnings"] == 0


def test_every_warning_shown_on_a_measured_healthy_job_is_false():
    tl = [{"t_s": 0.0, "top": None, "severity": None}, {"t_s": 3.0, "top": "launch-bound", "severity": "warning"},
          {"t_s": 9.0, "top": "memory-headroom", "severity": "info"}]
    row = multi_rank.measured_grade(_row(0.90, tl))
    assert row["ok"]  # nothing standing at the end
    assert row["false_warning_ids"] == ["launch-bound"] and row["false_warnings"] == 1
    standing = multi_rank.measured_grade(_row(0.90, tl[:2]))
    assert not standing["ok"]


def test_a_fix_that_pays_keeps_the_written_grade():
    row = _row(1.27, [{"t_s": 0.0, "top": "launch-bound", "severity": "warning"}], ok=True)
    assert multi_rank.measured_grade(row) == row
    assert "(< 1.10x: healthy)" in multi_rank.markdown({"machine": "m", "duration_s": 20, "results": [
        multi_rank.measured_grade(_row(1.05, [{"t_s": 0.0, "top": None, "severity": None}]))]})


def test_every_held_out_mode_names_one_job():
    # The truths are keyed by mode across every fresh script: a later set reusing a name (the ninth
    # set's "code_lm" beside the seventh's) would silently take over the earlier job's truth.
    from collections import Counter

    import multi_rank

    seen = Counter(mode for s in multi_rank.FRESH_SCRIPTS for mode in multi_rank._truths_of(s))
    assert seen and not [m for m, n in seen.items() if n > 1]
