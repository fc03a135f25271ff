"""A finding's window is not presented as a share of the job's steps when it holds no step's end:
a 48 s step watched for 6 s is "100 % of the last 6 s" of part of one step."""

from __future__ import annotations

from synth import Job, periodic, phases, rule_findings

from gputop.model import Category

ONE_STEP = "no step seen to end in it: it may be part of one longer step"


def _evidence(found):
    return " | ".join(e for f in found.values() for e in f.evidence)


def test_six_seconds_inside_one_slow_step_say_so():
    # The GPU idle all along, the main thread fetching data in every sample: no step ended.
    job = Job(seconds=6.0, util=lambda t: 0.0, main=lambda t: Category.DATA_FETCH)
    found, _ = rule_findings(job)
    assert "data-starved" in found
    line = next(e for e in found["data-starved"].evidence if "idle" in e and "of the last" in e)
    assert f"of the last 6.0 s ({ONE_STEP})" in line, line


def test_steps_that_end_in_the_window_are_a_share_of_steps():
    # 1 s steps, 0.4 s of compute each: steps end in the window, nothing is said of one step.
    job = Job(seconds=20.0, util=periodic(1.0, 0.4), main=phases(1.0, 0.4, Category.FORWARD, Category.DATA_FETCH))
    found, _ = rule_findings(job)
    assert "data-starved" in found
    assert "of the last" in _evidence(found) and ONE_STEP not in _evidence(found)
