"""The real-jobs benchmark's own logic: how a job's truth follows from its measured changes, how
a verdict is judged against it, and how a change rewrites a job's arguments. No job is run."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))

import real_jobs as R  # noqa: E402


def report(timeline, findings=()):
    return {"top_timeline": timeline, "findings": list(findings)}


def finding(fid, severity="warning"):
    return {"id": fid, "severity": severity, "action": "x", "evidence": [], "gain_predicted": 2.0}


def test_a_right_verdict_and_when_it_first_came():
    r = report([{"t_s": 0.0, "top": None, "severity": None},
                {"t_s": 3.0, "top": "launch-bound", "severity": "warning"},
                {"t_s": 5.0, "top": "workers-saturated", "severity": "warning"}],
               [finding("workers-saturated"), finding("launch-bound")])
    out = R.judge("data", r)
    assert out["correct"] and out["top_finding"] == "workers-saturated" and out["t_correct_s"] == 5.0
    assert out["t_fired_s"] is None  # an older report without the rules' first firings
    r["first_fired_s"] = {"launch-bound": 2.0, "workers-saturated": 3.5, "host-sync": 1.0}
    assert R.judge("data", r)["t_fired_s"] == 3.5


def test_a_wrong_final_top_is_wrong_whatever_came_before():
    r = report([{"t_s": 2.0, "top": "data-starved", "severity": "warning"},
                {"t_s": 6.0, "top": "launch-bound", "severity": "warning"}],
               [finding("launch-bound"), finding("data-starved")])
    out = R.judge("data", r)
    assert not out["correct"] and out["t_correct_s"] is None


def test_a_healthy_job_is_wrong_if_warned_at_any_time():
    quiet = report([{"t_s": 0.0, "top": None, "severity": None}, {"t_s": 2.0, "top": "warming-up", "severity": "info"}],
                   [finding("warming-up", "info")])
    assert R.judge("healthy", quiet)["correct"]
    flicker = report([{"t_s": 2.0, "top": "host-sync", "severity": "warning"}, {"t_s": 4.0, "top": None, "severity": None}])
    out = R.judge("healthy", flicker)
    assert not out["correct"] and out["warned_on_the_way"] == ["host-sync"]
    assert not R.judge("healthy", None)["correct"]


def test_a_change_replaces_options_and_removes_flags():
    job = R.Job("j", "pytorch", False, "gpt.py", ("--batch", "16", "--sync-every-step", "--workers", "2"),
                (R.Change("host-sync", "drop the sync", (), removes=("--sync-every-step",)),
                 R.Change("launch", "batch 64", ("--batch", "64"))))
    plain = job.argv(None, "cpu", False)
    assert plain[-6:] == ["--batch", "16", "--sync-every-step", "--workers", "2", "--device", "cpu"][-6:]
    assert "--sync-every-step" not in job.argv(job.changes[0], "cpu", False)
    changed = job.argv(job.changes[1], "cpu", False)
    assert changed.count("--batch") == 1 and changed[changed.index("--batch") + 1] == "64"


@pytest.mark.parametrize("job", R.JOBS, ids=[j.name for j in R.JOBS])
def test_every_job_is_runnable_and_its_truths_known(job):
    assert os.path.exists(os.path.join(R.JOBS_DIR, job.script))
    assert job.changes and all(c.label in R.TRUTH_FINDINGS for c in job.changes)


def test_enough_jobs_frameworks_and_held_out():
    assert len(R.JOBS) >= 12
    assert len({j.framework for j in R.JOBS}) >= 4
    assert sum(j.held_out for j in R.JOBS) >= 5


def test_the_committed_results_meet_the_targets_they_state():
    import json

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench", "results", "real_jobs.json")
    with open(path) as f:
        res = json.load(f)
    held = [r for r in res["jobs"] if r["held_out"]]
    assert res["summary"]["held_out"]["correct"] == sum(1 for r in held if r["correct"])
    for r in res["jobs"]:  # each truth follows from its measured gains
        best = max(c["gain"] for c in r["changes"] if c.get("gain") is not None)
        assert r["gain_measured"] == best
        assert (r["truth"] == "healthy") == (best < R.HEALTHY_BELOW)


@pytest.mark.parametrize("job", R.JOBS, ids=[j.name for j in R.JOBS])
def test_every_option_a_job_or_change_names_is_one_its_script_takes(job):
    with open(os.path.join(R.JOBS_DIR, job.script)) as f:
        source = f.read()
    for ch in job.changes:
        for opt in (a for a in (*job.args, *ch.args, *ch.removes, *job.tiny_args) if a.startswith("--")):
            assert f'"{opt}"' in source, f"{job.name}: {opt} is not an option of {job.script}"
        if ch.label in R.DECLARED:
            continue  # a truth declared, never run (a hang): there is no change to make
        assert job.argv(ch, "cpu", False) != job.argv(None, "cpu", False), f"{job.name}: {ch.text} changes nothing"


def test_silence_on_a_job_no_finding_names_is_not_right_at_5_s():
    # The fifth set's hand-written attention (3.86x, a class no finding names) was counted "right
    # at 5 s" because nothing was shown: silence is right only for a healthy job.
    import real_jobs as rj

    quiet = [{"t_s": 1.0, "top": None, "severity": None}]
    assert rj.right_at(quiet, (), 5.0, healthy=True)
    assert not rj.right_at(quiet, (), 5.0, healthy=False)
    assert not rj.right_at(quiet, ("host-sync",), 5.0, healthy=False)
    named = [{"t_s": 3.0, "top": "host-sync", "severity": "warning"}]
    assert rj.right_at(named, ("host-sync",), 5.0, healthy=False) and not rj.right_at(named, (), 5.0, healthy=True)
