"""Mechanics of bench/attach_cost.py that can be checked without a GPU (its statistics and
verdicts, its window plan, budget split, warm-up and CPU plan, the probe's blind time, the
sampler's clocks standing still while detached)."""

from __future__ import annotations

import importlib.util
import math
import random
import statistics
import sys
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("attach_cost", ROOT / "bench" / "attach_cost.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["attach_cost"] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("attach_cost", None)


def test_paired_slowdown_cancels_a_linear_drift(bench):
    # The job speeds up by 1 step/s a window; attached windows are 2 % slower than the trend.
    rates = [100.0 + w if w % 2 == 0 else (100.0 + w) * 0.98 for w in range(21)]
    slow = bench.paired_slowdowns(rates)
    assert len(slow) == 10
    assert all(abs(s - 2.0) < 1e-9 for s in slow)
    with pytest.raises(ValueError):
        bench.paired_slowdowns([1.0, 2.0])


def test_the_interval_covers_with_pairs_sharing_windows(bench):
    rng = random.Random(3)
    # Windows with independent noise and a drift, attached ones 0.5 % slower: neighbouring pairs
    # share a D window, so their slowdowns are correlated; the union of the block bootstrap and
    # the lag-1 t interval still covers the true cost about 95 % of the time.
    covered = 0
    trials = 200
    for k in range(trials):
        rates = [100.0 * (1 + rng.gauss(0, 0.01) + 0.0005 * w) * (0.995 if w % 2 else 1.0) for w in range(51)]
        slow = bench.paired_slowdowns(rates)
        lo, hi = bench.union(bench.bootstrap_ci(slow, n=400, seed=k), bench.t_ci(slow))
        covered += lo <= 0.5 <= hi
    assert covered / trials >= 0.9


def test_trimmed_mean_and_cv(bench):
    assert bench.trimmed_mean([0.0, 1.0, 1.0, 1.0, 100.0]) == 1.0
    assert bench.cv_pct([10.0, 10.0, 10.0]) == 0.0
    assert bench.cv_pct([1.0]) != bench.cv_pct([1.0])  # nan


def test_summary_and_verdict(bench):
    rates = [200.0 + (0.3 if w % 4 == 0 else 0.0) - (0.4 if w % 2 else 0.0) for w in range(41)]
    lost = [0.01 + (0.002 if w % 2 else 0.0) for w in range(41)]
    s = bench.summarize(rates, lost)
    assert s["pairs"] == 20
    assert 0 < s["slowdown_pct"] < 0.5
    assert s["ci95_pct"][0] <= s["slowdown_pct"] <= s["ci95_pct"][1]
    assert s["ci95_pct"] == bench.union(s["ci95_boot_pct"], s["ci95_t_pct"])
    assert abs(s["lost_pct"] - 0.002) < 1e-9
    s["sampler_cpu_pct"] = 1.5
    assert bench.verdict(s) == "met"
    s["sampler_cpu_pct"] = 2.5
    assert bench.verdict(s) == "NOT met (sampler CPU)"
    s["sampler_cpu_pct"] = 1.0
    # An interval too wide to tell is "not resolved", not a cost above the target.
    s["ci95_pct"] = [-0.8, 1.2]
    assert bench.verdict(s) == "not resolved (slowdown)"
    s["ci95_pct"], s["lost_ci95_pct"] = [0.0, 0.9], [-0.2, 1.1]
    assert bench.verdict(s) == "not resolved (lost time)"


def test_verdict_tells_a_measured_cost_from_an_unresolved_one(bench):
    assert bench.judge(0.2, [-0.1, 0.5]) == "met"
    assert bench.judge(0.5, [0.0, 1.0]) == "met"  # the targets' edges are in
    assert bench.judge(0.7, [0.2, 1.2]) == "above"  # a cost measured over 0.5 %
    assert bench.judge(0.7, [0.4, 0.95]) == "above"  # the upper end alone does not make it met
    assert bench.judge(2.5, [-2.4, 7.3]) == "unresolved"  # the H100's launch-bound: cannot tell
    assert bench.judge(0.3, [-0.5, 1.1]) == "unresolved"
    # Under 1 % at the top but +-6 % wide: noise, not a resolved cost.
    assert bench.judge(-5.2, [-11.4, 0.9]) == "unresolved"
    assert bench.judge(-0.4, [-1.4, 0.6]) == "met"  # +-1.0 %: resolved
    assert bench.judge(float("nan"), [float("nan")] * 2) == "unresolved"
    # One pair has no t interval: its interval is unknown, whatever the bootstrap says.
    one = bench.summarize([100.0, 98.0, 100.0], [0.0, 0.0, 0.0])
    assert one["pairs"] == 1 and one["slowdown_pct"] == pytest.approx(2.0)
    assert all(math.isnan(x) for x in one["ci95_pct"])
    assert bench.judge(one["slowdown_pct"], one["ci95_pct"]) == "unresolved"
    t = {"slowdown_pct": 2.5, "ci95_pct": [-2.4, 7.3], "lost_pct": 0.9, "lost_ci95_pct": [0.3, 1.5],
         "sampler_cpu_pct": 2.4}
    assert bench.verdict(t) == "NOT met (lost time, sampler CPU); not resolved (slowdown)"
    # A probe that sees too little of the time (blind inside saves) is left out of the verdict.
    t.update(sampler_cpu_pct=1.0, ci95_pct=[-0.2, 0.6], slowdown_pct=0.2, probe_seen_pct=10.0)
    assert bench.verdict(t) == "met"
    t["probe_seen_pct"] = 60.0
    assert bench.verdict(t) == "NOT met (lost time)"


def test_window_plan_fits_the_budget(bench):
    n = bench.plan_windows(40.0, 0.037, 1.0)
    assert n == 39
    # A cycle longer than the window, a budget too small: never fewer than D A D.
    assert bench.plan_windows(2.0, 0.6, 1.0) == 3


def test_window_length_holds_cycles_and_stacks_but_keeps_pairs(bench):
    # Quiet GPU job, 1.5 stacks/s: two stacks need 1.33 s; the budget has room.
    assert bench.window_length(60.0, 0.035, 1.0, 1.5) == pytest.approx(2 / 1.5)
    # No rate known: the base.
    assert bench.window_length(60.0, 0.035, 1.0, None) == 1.0
    # A 0.55 s checkpoint period: at least 5 periods, whatever the stacks want.
    assert bench.window_length(60.0, 0.55, 1.0, 1.5) == pytest.approx(5 * 0.55)
    # many-threads at 0.85 stacks/s wants 2.35 s windows; in 30 s that leaves 5 pairs, so the
    # stacks give way until MIN_PAIRS fit...
    w = bench.window_length(30.0, 0.034, 1.0, 0.85)
    assert 1.0 < w < 2 / 0.85
    assert bench.plan_windows(30.0, 0.034, w) >= 2 * bench.MIN_PAIRS + 1
    # ... but never below the base window or the cycles' floor.
    assert bench.window_length(5.0, 0.034, 1.0, 0.85) == 1.0
    assert bench.window_length(5.0, 0.55, 1.0, 0.85) == pytest.approx(5 * 0.55)
    # Sized again during the run (the rate the A windows saw): with 3 pairs done, 5 more are
    # needed in what is left; with MIN_PAIRS done, the stacks alone decide.
    w = bench.window_length(20.0, 0.034, 1.0, 0.6, pairs_done=3)
    assert 1.0 < w < 2 / 0.6
    assert 20.0 / (w + 0.017) - 2 * (bench.PAIR_RESERVE - 1) >= 2 * (bench.MIN_PAIRS - 3)
    assert bench.window_length(20.0, 0.034, 1.0, 0.6, pairs_done=bench.MIN_PAIRS) == pytest.approx(2 / 0.6)
    assert bench.window_length(20.0, 0.034, 1.0, 0.6, pairs_done=3) < bench.window_length(20.0, 0.034, 1.0, 0.6, pairs_done=6)


def test_budget_split_by_weight_and_leftovers_go_on(bench):
    w = [bench.WEIGHTS[n] for n in bench.TARGETS]
    run_end = 1000.0 + 280.0
    d0 = bench.target_deadline(1000.0, run_end, w)
    assert d0 == pytest.approx(1000.0 + 280.0 * w[0] / sum(w) - bench.CLOSE_MARGIN_S)
    # Equal weights: equal shares.
    assert bench.target_deadline(0.0, 100.0, [1.0] * 4) == pytest.approx(25.0 - bench.CLOSE_MARGIN_S)
    # The last target gets all that is left; one that ends early leaves its rest to the next.
    assert bench.target_deadline(1250.0, run_end, [w[-1]]) == pytest.approx(run_end - bench.CLOSE_MARGIN_S)
    early = bench.target_deadline(1040.0, run_end, w[1:]) - 1040.0
    on_time = bench.target_deadline(d0 + bench.CLOSE_MARGIN_S, run_end, w[1:]) - (d0 + bench.CLOSE_MARGIN_S)
    assert early > on_time
    # The noisy CPU-bound targets get more than the quiet GPU-bound ones.
    wt = bench.WEIGHTS
    assert min(wt["cpu-loading"], wt["launch-bound"], wt["checkpoint"]) > max(wt["healthy-bf16"], 1.0)
    # Shares put end to end fill the run.
    now, ends = 1000.0, []
    for k in range(len(w)):
        ends.append(bench.target_deadline(now, run_end, w[k:]))
        now = ends[-1] + bench.CLOSE_MARGIN_S
    assert ends[-1] == pytest.approx(run_end - bench.CLOSE_MARGIN_S)


def test_warm_up_waits_for_a_steady_rate(bench):
    # Cycles of 10 steps; 50 ms each at first, speeding up by a quarter (as launch-bound did in
    # its first 12 s on the H100), then steady.
    bounds, t, steps = [], 100.0, 0
    for i in range(400):
        t += 0.05 * (1.0 - 0.25 * min(i, 200) / 200)
        steps += 10
        bounds.append((steps, t, 0.0, 0.0))
    rates = bench.chunk_rates(bounds, 100.0)
    assert all(b >= a - 1e-9 for a, b in zip(rates, rates[1:]))  # it speeds up, then holds
    assert rates[0] == pytest.approx(200.0, rel=0.05)
    # Chunks are whole cycles of at least 0.5 s.
    assert len(rates) == pytest.approx((bounds[-1][1] - bounds[0][1]) / 0.5, abs=2)
    assert not bench.warmed(bench.chunk_rates(bounds[:150], 100.0))  # still speeding up
    assert bench.warmed(rates)  # the last chunks are flat
    assert bench.warmed([102.0, 98.0, 102.0, 98.0, 102.0, 98.0])  # noisy (2 %) but flat
    assert not bench.warmed([110.0, 90.0, 110.0, 90.0, 110.0, 90.0])  # too noisy to say (10 %)
    assert not bench.warmed([100.0] * 5)  # too few chunks
    assert not bench.warmed([100.0, 100.0, 100.0, 104.0, 104.0, 104.0])  # a step up of 4 %


def test_steady_rate_from_the_settle(bench):
    # many-threads on the H100: ~17.7 ms of CPU per main stack, 1.5 % of a core: 0.85 stacks/s.
    assert bench.steady_rate(0.0354, 2, 0.015, 5.0) == pytest.approx(0.847, abs=0.01)
    assert bench.steady_rate(0.001, 2, 0.015, 5.0) == 5.0  # the rate's cap
    assert bench.steady_rate(0.0, 0, 0.015, 5.0) is None


def test_cpu_plan(bench):
    assert bench.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    # 8 cores with 2 hyperthreads each (siblings i and i + 8).
    p = bench.plan_cpus([[i, i + 8] for i in range(8)])
    assert p["mode"] == "full"
    assert p["harness"] == [0, 8] and p["job_main"] == [1]
    assert 9 in p["free"]  # the main thread's sibling is left idle
    parts = [set(p["harness"]), set(p["job_main"]), set(p["job_other"]), set(p["free"])]
    assert sum(len(x) for x in parts) == len(set().union(*parts)) == 16  # disjoint, all placed
    assert p["sampler"] == list(range(16))  # gputop pins nothing: the bench does not pin it either
    # 16 single-thread cores.
    p = bench.plan_cpus([[i] for i in range(16)])
    assert p["job_main"] == [1] and len(p["job_other"]) == 7 and len(p["free"]) == 7
    # A small box degrades and says so; one CPU pins nothing.
    p = bench.plan_cpus([[0], [1]])
    assert p["mode"] == "degraded" and p["job_main"] == [1] and p["job_other"] == [0] == p["harness"]
    assert bench.plan_cpus([[0]])["mode"] == "off"


def test_probe_is_blind_inside_saves(bench):
    st = {"lost": 0.0, "blind": 0.0, "saving": False, "saves": 0}
    bench.probe_account(st, 0.0, 0.0025, False, 0)  # 0.5 ms late: timer slack
    assert st["lost"] == 0.0
    bench.probe_account(st, 0.0, 0.010, False, 0)  # 8 ms late, no save: lost
    assert st["lost"] == pytest.approx(0.007)
    st["saving"] = True
    bench.probe_account(st, 0.0, 0.050, False, 0)  # a save began during the sleep
    st["saving"], st["saves"] = False, 1
    bench.probe_account(st, 0.0, 0.030, True, 0)  # one was in progress when it began
    bench.probe_account(st, 0.0, 0.020, False, 0)  # one began and ended inside the sleep
    assert st["lost"] == pytest.approx(0.007)
    assert st["blind"] == pytest.approx(0.100)


def test_window_lost_time_over_what_the_probe_sees(bench):
    # 1 s windows: the probe blind 0.4 s of each (saves), losing 6 ms in the 0.6 s it sees.
    bounds = [(20 * i, 10.0 + i, 0.006 * i, 0.4 * i) for i in range(5)]
    w = bench.window_stats(bounds, 1, 3)
    assert w["probe_seen_pct"] == pytest.approx(60.0)
    assert w["lost_pct"] == pytest.approx(1.0)
    assert w["rate"] == pytest.approx(20.0)


def test_sched_delta(bench):
    a = {"t": 10.0, "run_ns": 0, "wait_ns": 0, "steal_s": 1.0}
    b = {"t": 12.0, "run_ns": int(1.8e9), "wait_ns": int(0.1e9), "steal_s": 1.02}
    d = bench.sched_delta(a, b)
    assert d["main_run_pct"] == pytest.approx(90.0)
    assert d["main_wait_pct"] == pytest.approx(5.0)
    assert d["steal_pct"] == pytest.approx(1.0)
    assert "main_run_pct" not in bench.sched_delta({"t": 0.0}, {"t": 1.0})


def test_window_stats_on_cycle_boundaries(bench):
    # 10 steps a cycle, 0.1 s each, the probe losing 1 ms a cycle.
    bounds = [(10 * i, 5.0 + 0.1 * i, 0.001 * i, 0.0) for i in range(30)]
    w = bench.window_stats(bounds, 3, 13)
    assert w["steps"] == 100 and w["cycles"] == 10
    assert w["rate"] == pytest.approx(100.0)
    assert w["rate_median_cycle"] == pytest.approx(100.0)
    assert w["lost_pct"] == pytest.approx(1.0)


def test_shift_clocks_hides_detached_time(bench):
    from gputop.sources.stacks import _Bucket

    t0 = 100.0
    cpu = _Bucket(0.015, 0.4, t0)
    cpu.level = -0.01  # in debt after a dump
    hist = deque([(t0, "a"), (t0 + 2, "b")])
    src = SimpleNamespace(_cpu=cpu, _pause=_Bucket(0.001, 0.1, t0), _next_worker=50.0, _next_cost=t0 + 2,
                          _main_since=float("-inf"), _history=hist)
    bench.shift_clocks(src, 30.0)
    # 30 s detached refill nothing: the debt is paid off in attached time only.
    assert cpu.allows(t0 + 30.0) is False
    assert cpu.wait(t0 + 30.0) == pytest.approx(0.01 / 0.015)
    assert src._next_worker == 80.0 and src._next_cost == t0 + 32
    assert src._main_since == float("-inf")
    assert [t for t, _ in hist] == [t0 + 30, t0 + 32]


def test_pyspy_source_has_the_shifted_fields():
    # The bench moves these of PySpySource's clocks; a rename there must show here.
    src = (ROOT / "gputop" / "sources" / "stacks.py").read_text()
    for name in ("_next_cost", "_started", "_main_since", "_confirmed_at", "_next_proc", "_next_worker",
                 "_retry_at", "_history", "self._cpu = _Bucket", "self._pause = _Bucket"):
        assert name in src, name
