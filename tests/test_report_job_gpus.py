"""A report of a job that used one GPU of two: the other GPU is measured, not explained by the
job's stacks (a new user's report put GPU 1's 100 % idle down to the job's `Trainer.fit` CPU work,
with an idle period of the whole recording "CPU work in main process", though NVML never listed the
job on it). A multi-rank job's ranks each hold a GPU: every one of them is the job's."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputop.analysis import BUCKET_LABELS, Bucket
from gputop.record import Reader
from gputop.report import render_html, render_text, summary_dict
from gputop.report.collect import collect

FIXTURES = Path(__file__).parent / "fixtures"
JOB_CAUSES = {BUCKET_LABELS[b] for b in Bucket} - {BUCKET_LABELS[Bucket.BUSY], BUCKET_LABELS[Bucket.UNKNOWN]}


def _summary(path: Path):
    with Reader(path) as r:
        return collect(r)


@pytest.mark.parametrize("name", ["h200-lightning-cudnn-benchmark", "h200-timm-ema-on-cpu"])
def test_a_gpu_the_job_never_used_is_not_charged_with_its_stalls(name):
    s = _summary(FIXTURES / "recordings" / f"{name}.gputop")
    text = render_text(s, 100)
    gpu1 = text.split("GPU 1  NVIDIA H200")[1].split("\nhost")[0]
    # GPU 1: measured (all of it idle), no cause of the job's, no idle period put down to its stacks.
    assert "busy 0.0%   idle 100.0%" in gpu1 and "not used by the attached job" in gpu1, gpu1
    assert "where the idle time went" not in gpu1 and "idle periods" not in gpu1
    assert not any(label in gpu1 for label in JOB_CAUSES), gpu1
    # GPU 0, the job's: today's breakdown.
    assert "where the idle time went" in text.split("GPU 1  NVIDIA H200")[0]

    doc = summary_dict(s)
    j0, j1 = doc["gpus"]
    assert set(j1["seconds"]) <= {"busy", "other/unknown"} and j1["idle_periods"] == [], j1
    assert JOB_CAUSES & set(j0["seconds"])
    assert j0["used_by_job"] is True and j1["used_by_job"] is False

    html = render_html(s)
    part1 = html.split("<h2>GPU 1")[1]
    assert "Where the time went" not in part1 and "Longest idle periods" not in part1
    assert "not used by the attached job" in part1
    assert "Where the time went" in html.split("<h2>GPU 1")[0]

    g0, g1 = s.gpus
    assert g0.job_used and not g1.job_used
    assert g1.busy_fraction == 0.0 and g1.breakdown.total_s > 10 and g1.idle_period_count == 0

def test_each_ranks_gpu_is_the_jobs():
    s = _summary(FIXTURES / "nccl" / "straggler-h100x2.gputop")
    assert [g.job_used for g in s.gpus] == [True, True]
    assert "not used by the attached job" not in render_text(s, 100)
    # Rank 1's GPU keeps its breakdown and its idle period (the straggler's).
    assert s.gpus[1].breakdown.attributed and s.gpus[1].idle_periods


def test_job_gpus_rules():
    from gputop.report.collect import job_gpus

    # The GPUs the job's processes were listed on; others' GPUs are not the job's.
    assert job_gpus({0: {10}, 1: {99}}, {10, 11}) == {0}
    assert job_gpus({0: {10}, 1: {11}}, {10, 11}) == {0, 1}
    # None of its PIDs listed (another PID namespace): those with any process, as the live view.
    assert job_gpus({0: {500}, 1: set()}, {10}) == {0}
    # Nothing listed: nothing tells (None: every GPU taken for the job's, as before).
    assert job_gpus({}, {10}) is None
