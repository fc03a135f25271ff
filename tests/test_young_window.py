"""The first seconds after attaching: a wait that recurs is a pattern before it adds up to a
second; one stall of the same size is not."""

from gputop.advisor.rules.base import MIN_COST_S, MIN_RECURRENCES
from gputop.analysis.breakdown import Breakdown, Bucket
from gputop.model import Category as C

from synth import Job, phases, rule_findings

GPM = {"sm_active": 85.0, "sm_occupancy": 40.0, "tensor_active": 45.0, "fp32_active": 5.0, "fp16_active": 30.0}
ATTACHED_S = 2.0  # seconds of stacks: the sampler's burst at 10 Hz




def young(util, main, **kw) -> Job:
    # 20 s of GPU history (NVML's buffer), stacks only for the last ATTACHED_S
    return Job(seconds=20.0, stack_start=20.0 - ATTACHED_S, stack_rate=10.0, util=util, main=main, gpu=GPM, **kw)


def test_recurrences_count_runs_of_samples_not_samples():
    B = Bucket
    bd = Breakdown(0, 0.0, 1.0, {B.BUSY: 1.0}, True,
                   sequence=(B.BUSY, B.DATA, B.DATA, B.IO, B.BUSY, B.DATA, B.CPU, B.DATA, B.BUSY))
    assert bd.recurrences(B.DATA) == 3
    assert bd.recurrences(B.DATA, B.IO) == 3  # DATA then IO in a row is one wait
    assert bd.recurrences(B.IO) == 1 and bd.recurrences(B.CPU) == 1
    assert bd.recurrences(B.SYNC) == 0
    assert Breakdown(0, 0.0, 1.0, {B.BUSY: 1.0}, True).recurrences(B.DATA) == 0


def test_a_wait_in_every_step_is_reported_before_it_adds_up_to_a_second():
    # 0.4 s steps, the last 0.1 s of each loading in the training thread (samples every 0.1 s:
    # the 4th of each 4); the GPU idles 0.12 s of the 0.2 s before each step's end
    tenth = lambda t: round(t * 10) % 4  # noqa: E731
    main = lambda t: C.DATA_FETCH if tenth(t) in (3, 0) else C.FORWARD  # noqa: E731
    found, ctx = rule_findings(young(lambda t: 40.0 if tenth(t) == 0 else 100.0, main))
    g = ctx.gpus[0]
    wait = g.breakdown.get(Bucket.DATA)
    assert wait < MIN_COST_S and wait / g.breakdown.total_s > 0.2
    assert g.breakdown.recurrences(Bucket.DATA) >= MIN_RECURRENCES
    assert "data-starved" in found


def test_one_stall_of_the_same_size_is_not_a_pattern_yet():
    # the same 0.8 s of loading, in one piece at the end of the window
    stall = lambda t: 20.0 - 0.9 <= t < 20.0 - 0.1  # noqa: E731
    job = young(lambda t: 0.0 if stall(t) else 100.0, lambda t: C.DATA_FETCH if stall(t) else C.FORWARD)
    found, ctx = rule_findings(job)
    g = ctx.gpus[0]
    assert g.breakdown.get(Bucket.DATA) < MIN_COST_S and g.breakdown.get(Bucket.DATA) / g.breakdown.total_s > 0.3
    assert g.breakdown.recurrences(Bucket.DATA) == 1
    assert "data-starved" not in found


def test_a_recurring_wait_under_the_share_bar_stays_silent():
    # waits in every step, but ~4 % of the time: healthy, however often it recurs
    found, ctx = rule_findings(young(lambda t: 92.0, phases(0.4, 0.2, C.FORWARD, C.DATA_FETCH)))
    assert ctx.gpus[0].breakdown.recurrences(Bucket.DATA) >= MIN_RECURRENCES
    assert not {"data-starved", "workers-saturated", "io-bound"} & set(found)
