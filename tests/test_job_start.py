"""The job view is honest about what it has judged: ranks still starting read as starting (not
"no straggler", not "stuck"), and each host line counts its ranks as the verdict and the rank
lines have them."""

from __future__ import annotations

from gputop.fleet import Memory, build_job, judge, parse_vector
from gputop.present.job import job_lines, plain

from job_series import TS, job_payload


def view(**kw) -> tuple[str, object]:
    job = build_job("exp-42", parse_vector(job_payload(4, per_host=2, **kw)))
    j = judge(job)
    return plain(job_lines(job, j, 100, "now", 5)), j


def host(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(name + " ·"))


def test_ranks_still_importing_are_starting_not_all_clear():
    text, j = view(starting={r: "importing" for r in range(4)})
    assert not j.straggler and not j.stuck and len(j.starting) == 4
    assert "Starting: ranks 0-3 not judged yet (importing)" in text
    assert "No rank holds the others up" not in text
    assert host(text, "node-000") == "node-000 · 2 ranks · 2 starting"
    assert text.count(" start ") == 4


def test_ranks_waiting_for_a_late_starter_wait_they_are_not_stuck():
    # Three ranks in the first all_reduce (their stacks unchanged: their exporters say stuck)
    # while rank 3 still imports: they wait for it.
    text, j = view(stuck=None, waiters_stuck=True, straggler=3, starting={3: "importing"})
    assert j.straggler is None and not j.stuck and not j.never_arrives
    assert "Stuck:" not in text and "STUCK" not in text
    assert "Starting: rank 3 not judged yet (importing)" in text
    assert host(text, "node-000") == "node-000 · 2 ranks · 2 waiting"
    assert host(text, "node-001") == "node-001 · 2 ranks · 1 waiting · 1 starting"


def test_several_start_up_phases_are_named_with_their_ranks():
    text, _ = view(starting={0: "importing", 1: "importing", 2: "joining the process group"})
    assert "Starting: ranks 0-2 not judged yet: importing 0-1 · joining the process group 2" in text


def test_an_exporter_without_the_series_too_few_samples_is_not_judged():
    payload = job_payload(4, per_host=2)
    for item in payload["data"]["result"]:
        if item["metric"]["__name__"] == "gputop_rank_stack_samples" and item["metric"]["rank"] in "01":
            item["value"][1] = "4"
    job = build_job("exp-42", parse_vector(payload))
    text = plain(job_lines(job, judge(job), 100, "now", 5))
    assert "Starting: ranks 0-1 not judged yet (too few stack samples yet)" in text
    assert "No rank holds the others up" not in text


def test_the_host_line_counts_agree_with_the_verdict():
    # The waiters look stuck to their exporters; the verdict names the straggler they wait for.
    text, j = view(straggler=3, waiters_stuck=True)
    assert j.straggler is not None and not j.stuck
    assert host(text, "node-000") == "node-000 · 2 ranks · 2 waiting"  # not "2 stuck"
    assert host(text, "node-001") == "node-001 · 2 ranks · 1 slow · 1 waiting"
    # A hang: the rank that never arrives, its victims waiting.
    text, j = view(stuck=1)
    assert host(text, "node-000") == "node-000 · 2 ranks · 1 never arrives · 1 waiting"
    # With the hold rule: what is only being weighed is counted as weighed, never as named.
    slow = build_job("exp-42", parse_vector(job_payload(4, per_host=2, straggler=3)))
    mem = Memory(step_s=5)
    mem.feed(TS, slow)
    text = plain(job_lines(mem.job, mem.judgement(), 100, "now", 5))
    assert "Straggler:" not in text and host(text, "node-001") == "node-001 · 2 ranks · 1 weighed · 1 waiting"
