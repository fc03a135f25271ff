"""Stated bounds from shares of stack samples: taken at the share's upper confidence limit
(Clopper-Pearson's exact limit, one-sided 95 %), so a share read from few samples does not state a bound below the gain;
and nothing but the stated bound moves (whether a rule fires, its cost, confidence, ranking and
the "is this change worth naming" tests keep the share itself)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gputop.advisor.context import AnalysisContext
from gputop.advisor.rules import RULES_BY_ID
from gputop.advisor.rules import base
from gputop.advisor.rules.base import WORTHWHILE_GAIN, ShareLimit, bounded, gain, share_lower, share_upper, wait_bound
from gputop.advisor.rules.optimizer import unfused_step
from gputop.analysis.ranks import rank_view
from gputop.model import Category as C
from gputop.model import Frame, StackSample

from synth import Job, periodic, phases, rule_findings
from test_optimizer_rule import job as optimizer_job

HEALTHY_GPM = {"sm_active": 85.0, "sm_occupancy": 40.0, "tensor_active": 45.0, "fp32_active": 5.0, "fp16_active": 30.0}

# --------------------------------------------------------------------------- the limit itself


def test_exact_upper_limit_known_values():
    # one-sided 95 % (z = 1.6449): Clopper-Pearson's limits; 0 of 10 by hand: 1 - 0.05 ** (1 / 10)
    assert share_upper(15, 40) == pytest.approx(0.5173, abs=5e-4)
    assert share_upper(18, 40) == pytest.approx(0.5912, abs=5e-4)
    assert share_upper(0, 10) == pytest.approx(1 - 0.05 ** 0.1, abs=5e-4)  # nothing seen still leaves room
    assert share_upper(10, 10) == 1.0
    assert share_upper(0, 0) == 1.0  # no samples: no information
    # 90 % one-sided, for comparison with the level not chosen
    assert share_upper(15, 40, z=1.2816) == pytest.approx(0.4886, abs=5e-4)


@pytest.mark.parametrize("k,n", [(1, 12), (15, 40), (18, 40), (23, 60), (50, 100), (99, 100), (3, 1000), (80, 84)])
def test_exact_upper_limit_is_where_seeing_k_or_fewer_becomes_the_tail(k, n):
    # independent of the bisection: at the limit u, P(X <= k; n, u) is the one-sided 5 % tail
    u = share_upper(k, n)
    tail = sum(math.comb(n, i) * u**i * (1 - u) ** (n - i) for i in range(k + 1))
    assert tail == pytest.approx(0.5 * math.erfc(base.SHARE_UPPER_Z / math.sqrt(2)), abs=1e-6)


def test_the_upper_limit_shrinks_to_the_share_and_stays_in_range():
    for p in (0.0, 0.1, 0.375, 0.5, 0.9, 1.0):
        uppers = [share_upper(p * n, n) for n in (10, 20, 40, 100, 400, 2000, 10**6)]
        assert all(p <= u <= 1.0 for u in uppers)
        assert all(a >= b for a, b in zip(uppers, uppers[1:]))  # never wider with more samples
        if 0 < p < 1:
            assert all(a > b for a, b in zip(uppers, uppers[1:]))
        assert uppers[-1] == pytest.approx(p, abs=2e-3)


def test_the_bound_and_its_text_use_the_limit_and_leave_the_changes_own_limit_alone():
    u = ShareLimit(share_upper(18, 40), 40)
    assert bounded(0.45, upper=u) == pytest.approx(wait_bound(0.5912), rel=1e-3)  # 2.45x, not 1.82x
    assert gain(0.45, upper=u) == ("at most 2.4x steps/s (an upper bound: if the 45 % of the time this costs, "
                                   "up to 59 % at 95 % confidence from 40 stack samples, came back in full)")
    # the change's own limit binds as before, and is not moved
    assert bounded(0.45, 1.5, u) == 1.5
    assert gain(0.45, 1.5, "two workers", upper=u).startswith("at most 1.5x steps/s (an upper bound), limited by two workers; "
                                                            "the 45 % of the time this costs, up to 59 %")
    # a limit that reads the same as the share says nothing more; no upper: the text as before
    same = ShareLimit(0.452, 5000)
    assert gain(0.45, upper=same) == gain(0.452)
    assert "confidence" not in gain(0.45) and bounded(0.45) == wait_bound(0.45)
    # the GPU's own share (no samples behind it) states no interval
    assert "confidence" not in gain(0.45, upper=ShareLimit(0.45, 0))
    # a full window's count is stated to two figures: a sample more or less keeps the words
    # (a recording starts a new finding row when they change)
    texts = {gain(0.45, upper=ShareLimit(share_upper(0.45 * n, n), n)) for n in (297, 298, 300, 302)}
    assert texts == {"at most 2.0x steps/s (an upper bound: if the 45 % of the time this costs, up to 50 % at "
                     "95 % confidence from about 300 stack samples, came back in full)"}


# --------------------------------------------------------------------------- each rule

def loader_job(**kw):
    kw.setdefault("workers", 2)
    return Job(util=periodic(1.0, 0.6), main=phases(1.0, 0.6, C.FORWARD, C.DATA_WAIT), gpu=HEALTHY_GPM, **kw)


# rule id, the job (any stack rate), the main-thread categories its share counts
LOOP_WAITS = [
    ("data-starved", lambda **kw: Job(util=periodic(1.0, 0.4), main=phases(1.0, 0.4, C.FORWARD, C.DATA_FETCH),
                                      gpu=HEALTHY_GPM, **kw), (C.DATA_FETCH, C.DATA_WAIT)),
    ("workers-saturated", lambda **kw: loader_job(worker_cpu=99.0, host_cpu=lambda t: 15.0, **kw), (C.DATA_WAIT,)),
    ("io-bound", lambda **kw: loader_job(worker_cpu=5.0, iowait=lambda t: 12.5, disk_read=300e6, **kw), (C.DATA_WAIT,)),
    ("checkpoint-stall", lambda **kw: Job(util=periodic(5.0, 3.0), main=phases(5.0, 3.0, C.FORWARD, C.CHECKPOINT_IO),
                                          gpu=HEALTHY_GPM, **kw), (C.CHECKPOINT_IO,)),
]


def _loop_wait_bounds(rule, make, cats, rate):
    found, ctx = rule_findings(make(stack_rate=rate))
    f = found[rule]
    n = len(ctx.main_stacks)
    share = sum(ctx.main_shares().get(c, 0.0) for c in cats)
    gpu = f.cost_s / ctx.gpus[0].breakdown.total_s
    return f, n, wait_bound(max(gpu, share)), wait_bound(max(gpu, share_upper(share * n, n)))


@pytest.mark.parametrize("rule,make,cats", LOOP_WAITS, ids=[r for r, _, _ in LOOP_WAITS])
def test_loop_wait_bounds_use_the_upper_limit_with_few_samples_and_the_share_with_many(rule, make, cats):
    f, n, point, upper = _loop_wait_bounds(rule, make, cats, 2.5)  # 50 samples over 20 s
    assert n == 50
    assert upper > point * 1.1  # the limit is well above the share from 50 samples...
    assert f.gain_predicted == pytest.approx(upper, abs=0.01)  # ...and the bound is the limit's
    assert f"from {n} stack samples" in f.expected_gain and "at 95 % confidence" in f.expected_gain
    many, m, point_m, upper_m = _loop_wait_bounds(rule, make, cats, 100.0)  # 2,000 samples
    assert m == 2000 and point_m == pytest.approx(point, rel=0.02)
    assert many.gain_predicted == pytest.approx(upper_m, abs=0.01)
    assert abs(many.gain_predicted - point_m) < (f.gain_predicted - point) / 3  # tending to the share's bound
    assert many.gain_predicted == pytest.approx(point_m, rel=0.06)


def test_unfused_optimizer_bound_uses_the_upper_limit_of_the_steps_share():
    # every other sample in the step at the job's 5 Hz: 50 samples over 10 s, 2,000 over 400 s
    for seconds, rel in ((10.0, None), (400.0, 0.06)):
        found, ctx = rule_findings(replace(optimizer_job(), seconds=seconds), window_s=seconds)
        f = found["unfused-optimizer"]
        step = unfused_step(ctx)
        n = len(ctx.main_stacks)
        gpu = f.cost_s / ctx.gpus[0].breakdown.total_s
        assert step.share > gpu  # the samples' share is what the bound rests on here
        assert f.gain_predicted == pytest.approx(wait_bound(max(gpu, share_upper(step.samples, n))), abs=0.01)
        if rel is None:
            assert f.gain_predicted > wait_bound(step.share) * 1.1
            assert f"from {n} stack samples" in f.expected_gain
        else:
            assert f.gain_predicted == pytest.approx(wait_bound(step.share), rel=rel)


DIST = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"
COLL = (Frame("all_reduce", DIST, 10), Frame("main", "/p/train.py", 50))
WORK = (Frame("forward", "/p/model.py", 10), Frame("main", "/p/train.py", 48))


def _ranks_ctx(*counts):
    env = {"WORLD_SIZE": str(len(counts)), "LOCAL_WORLD_SIZE": str(len(counts)), "NCCL_P2P_DISABLE": "1"}
    views = []
    for r, n in enumerate(counts):
        xs = [StackSample(ts=float(i), pid=100 + r, thread_id=100 + r, frames=COLL if i % 2 == 0 else WORK, is_main=True,
                          category=C.COLLECTIVE if i % 2 == 0 else C.FORWARD) for i in range(n)]
        views.append(replace(rank_view(r, 100 + r, xs), env=tuple(sorted(dict(env, RANK=str(r)).items()))))
    return AnalysisContext(now=60.0, t0=0.0, t1=60.0, gpus=(), target_pid=100, env=dict(views[0].env), ranks=tuple(views))


def test_nccl_env_bound_uses_the_upper_limit_of_the_ranks_mean_share():
    rule = RULES_BY_ID["nccl-env"]
    few = rule.evaluate(_ranks_ctx(20, 20))
    assert few.gain_predicted == pytest.approx(wait_bound(share_upper(20, 40)), abs=0.01)  # 2.7x, not 2.0x
    assert "from 40 stack samples" in few.expected_gain
    # ranks with unequal samples: the mean varies as one share of 4 / (1/10 + 1/30) = 30 samples
    uneven = rule.evaluate(_ranks_ctx(10, 30))
    assert uneven.gain_predicted == pytest.approx(wait_bound(share_upper(15, 30)), abs=0.01)
    many = rule.evaluate(_ranks_ctx(2000, 2000))
    assert many.gain_predicted == pytest.approx(2.0, rel=0.05)
    # what it costs and how it is weighed do not move
    for f in (few, uneven, many):
        assert f.severity is few.severity and f.confidence == few.confidence
        assert f.cost_s == pytest.approx(0.5 * 60 * 2)


# --------------------------------------------------------------------------- decisions unchanged


def _as_point_estimates(monkeypatch):
    """The rules as they were: the stated bound from the share itself (a limit with z = 0)."""
    real = base.share_upper
    monkeypatch.setattr(base, "share_upper", lambda k, n, z=0.0: real(k, n, 0.0))


# 2.5 samples/s: 50 over 20 s, on a 0.2 s grid of each period (no aliasing with the phases)
DECISION_JOBS = [make(stack_rate=2.5) for _, make, _ in LOOP_WAITS] + [
    replace(optimizer_job(), seconds=10.0),
    # a job whose data wait (8 %) is below the bar a cause must clear: silent either way
    Job(util=periodic(5.0, 4.6), main=phases(5.0, 4.6, C.FORWARD, C.DATA_FETCH), gpu=HEALTHY_GPM, stack_rate=2.5),
]


@pytest.mark.parametrize("job", DECISION_JOBS, ids=[r for r, _, _ in LOOP_WAITS] + ["unfused-optimizer", "healthy"])
def test_only_the_stated_bound_moves(job, monkeypatch):
    now, _ = rule_findings(job)
    with monkeypatch.context() as m:
        _as_point_estimates(m)
        before, _ = rule_findings(job)
    assert list(now) == list(before)  # the same rules fire, in the same order
    for rid, f in now.items():
        b = before[rid]
        assert (f.title, f.severity, f.confidence, f.cost_s, f.action, f.evidence, f.gpu_index) == \
               (b.title, b.severity, b.confidence, b.cost_s, b.action, b.evidence, b.gpu_index)
        if f.gain_predicted is not None:
            assert f.gain_predicted >= b.gain_predicted  # a bound may only loosen


def test_the_healthy_job_stays_silent_though_its_limit_would_clear_the_bar():
    # 8 % of the time in the loop's own loading: its upper limit from 50 samples is above the
    # 10 % cost bar, but whether to report is the cost's, not the bound's
    job = DECISION_JOBS[-1]
    found, ctx = rule_findings(job)
    share = ctx.main_shares()[C.DATA_FETCH]
    n = len(ctx.main_stacks)
    assert n == 50 and share == pytest.approx(0.08)
    assert share < base.MIN_COST_FRACTION < share_upper(share * n, n)
    assert not found


def test_worth_naming_workers_is_decided_on_the_share_near_the_threshold():
    # One core per GPU: one worker loads at once, so workers bound the rate at 1 / share. The
    # loop loads 88 % of its 50 samples: 1 / 0.88 = 1.14x clears WORTHWHILE_GAIN, and workers are
    # named; at the share's upper limit (95 %) it would be 1.05x and they would not be.
    job = Job(gpus=8, cores=8, util=periodic(5.0, 0.6), main=phases(5.0, 0.6, C.FORWARD, C.DATA_FETCH),
              gpu=HEALTHY_GPM, stack_rate=2.5)
    found, ctx = rule_findings(job)
    f = found["data-starved"]
    share = ctx.main_shares()[C.DATA_FETCH]
    n = len(ctx.main_stacks)
    assert n == 50 and share == pytest.approx(0.88)
    assert 1 / share >= WORTHWHILE_GAIN > 1 / share_upper(share * n, n)
    assert "num_workers=" in f.action and "DALI" not in f.action
    # the stated bound: the workers' own limit, 1 / share, taken where the share is lowest (its
    # lower confidence limit, or the GPU's own idle share from NVML if that is larger): a limit
    # that falls as the share rises is an upper bound only from the share's low end
    low = max(share_lower(share * n, n), 0.86)  # the GPU's data-wait share of this window: ~0.86
    assert 1 / share < f.gain_predicted <= 1 / low + 0.01
    assert "limited by 2 workers on 1 cores, 1 loading at once" in f.expected_gain
    assert "the 88 % of the time this costs, up to 95 % at 95 % confidence from 50 stack samples" in f.expected_gain
