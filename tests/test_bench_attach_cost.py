"""Mechanics of bench/attach_cost.py that can be checked without a GPU (its statistics and
verdicts, its window plan, budget split, warm-up and CPU plan, the probe's blind time, the
sampler's clocks standing still while detached)."""

from __future__ import annotations

import importlib.util
import math
import os
import random
import statistics
import sys
import threading
import time
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


# --------------------------------------------------------------------------- at the polls


def _job(t0, t1, stalls=(), dt=0.005, jitter=0.0, seed=0):
    """A synthetic job's progress records (steps, t): a step every ``dt`` of the job's own time,
    the job standing still through each stall ``(start, length)`` (wall time); ``jitter``: each
    record's time off by up to that much (the steps' own noise)."""
    rng = random.Random(seed)
    recs, k, off, stalls = [], 0, 0.0, sorted(stalls)
    si = 0
    while True:
        r = t0 + k * dt + off
        while si < len(stalls) and stalls[si][0] < r:
            off += stalls[si][1]
            si += 1
            r = t0 + k * dt + off
        if r > t1 + 0.1:
            return recs
        recs.append((k, r + (rng.uniform(-jitter, jitter) if 0 < k else 0.0)))
        k += 1


# A 4 s window, a poll (3 ms) every 0.8 s: far enough apart for the wide span's 0.3 s.
_T = 4.0
_STARTS = [0.3 + 0.8 * i for i in range(5)]
_POLLS = [(s, s + 0.003) for s in _STARTS]


def test_progress_at_interpolates_between_records_and_clamps(bench):
    bounds = [(0, 1.0, 0.0, 0.0, 0.0), (10, 2.0, 0.0, 0.0, 0.0), (30, 3.0, 0.0, 0.0, 0.0)]
    assert bench.progress_at(bounds, 0.5) == 0.0  # before the first: the first
    assert bench.progress_at(bounds, 1.0) == 0.0
    assert bench.progress_at(bounds, 1.5) == pytest.approx(5.0)
    assert bench.progress_at(bounds, 2.0) == pytest.approx(10.0)
    assert bench.progress_at(bounds, 2.25) == pytest.approx(15.0)
    assert bench.progress_at(bounds, 3.0) == 30.0
    assert bench.progress_at(bounds, 99.0) == 30.0  # after the last: the last
    assert isinstance(bench.progress_at(bounds, 0.0), float)
    # The per-step records (steps, t) work as well as the boundary ones; two records at the
    # same time do not divide by zero.
    assert bench.progress_at([(0, 1.0), (5, 2.0), (10, 2.0), (20, 3.0)], 2.0) == 10.0
    assert bench.progress_at([(0, 1.0), (5, 2.0), (10, 2.0), (20, 3.0)], 2.5) == pytest.approx(15.0)


def test_near_spans_merge_clip_and_snap_to_records(bench):
    ns = bench.near_spans
    assert ns([(1.0, 1.1)], 0.0, 10.0, 0.05, 0.25) == [pytest.approx((0.95, 1.35))]
    # Overlapping spans merge, whatever order the polls come in; a poll far off stands alone.
    got = ns([(5.0, 5.1), (1.3, 1.4), (1.0, 1.1)], 0.0, 10.0, 0.05, 0.25)
    assert got == [pytest.approx((0.95, 1.65)), pytest.approx((4.95, 5.35))]
    # A span inside a longer one's reach (a long poll first) does not cut it short.
    assert ns([(1.0, 2.0), (1.1, 1.2)], 0.0, 10.0, 0.0, 0.0) == [(1.0, 2.0)]
    # Clipped to the window; a poll wholly outside it gives nothing.
    assert ns([(0.01, 0.02)], 0.0, 10.0, 0.05, 0.25) == [pytest.approx((0.0, 0.27))]
    assert ns([(9.9, 10.5)], 0.0, 10.0, 0.05, 0.25) == [pytest.approx((9.85, 10.0))]
    assert ns([(20.0, 20.1), (-5.0, -4.0)], 0.0, 10.0, 0.05, 0.25) == []
    assert ns([], 0.0, 10.0) == []
    # With the step records' times: out to ``around`` records beyond [start - pre, end + post].
    times = [float(i) for i in range(21)]
    assert ns([(10.0, 10.5)], 0.0, 20.0, 0.5, 0.5, times) == [(8.0, 13.0)]  # 9.5 -> 8, 11 -> 13
    assert ns([(10.0, 10.5)], 0.0, 20.0, 0.5, 0.5, times, around=1) == [(9.0, 12.0)]
    assert ns([(10.0, 10.5)], 0.0, 20.0, 0.0, 0.0, times) == [(8.0, 12.0)]  # on a record: 2 beyond it
    # Every span then starts and ends on a record (unless clipped by the window).
    for lo, hi in ns([(3.3, 3.4), (12.2, 12.9)], 0.0, 20.0, 0.02, 0.02, times):
        assert lo in times and hi in times
    # Near the ends of the records: the first / last record, then the window's clip.
    assert ns([(0.5, 0.6)], 0.0, 20.0, 0.0, 0.0, times) == [(0.0, 2.0)]
    assert ns([(19.5, 19.6)], 0.0, 19.8, 0.0, 0.0, times) == [(18.0, 19.8)]
    # Widening can merge spans that would otherwise be apart.
    assert len(ns([(5.0, 5.1), (7.0, 7.1)], 0.0, 20.0, 0.0, 0.0)) == 2
    assert ns([(5.0, 5.1), (7.0, 7.1)], 0.0, 20.0, 0.0, 0.0, times) == [(3.0, 9.0)]
    # Records are only ever added time: never a span narrower than [start - pre, end + post].
    sparse = [0.0, 10.0, 20.0]
    assert ns([(4.0, 5.0)], 0.0, 20.0, 0.5, 0.5, sparse, around=0) == [(3.5, 5.5)]


def test_at_polls_finds_a_stall_at_each_poll(bench):
    L = 0.008
    stalls = [(s + 0.001, L) for s in _STARTS]  # stopped 8 ms, from inside each poll
    lost_pct = 100.0 * len(stalls) * L / _T  # 1 %: what the job lost over the window
    recs = _job(0.0, _T, stalls)
    snap = bench.at_polls(recs, 0.0, _T, _POLLS, 0.02, 0.02, snap=True)
    wide = bench.at_polls(recs, 0.0, _T, _POLLS, bench.NEAR_PRE_S, bench.WIDE_POST_S)
    assert snap["slowdown_pct"] == pytest.approx(lost_pct, abs=0.01)
    assert wide["slowdown_pct"] == pytest.approx(lost_pct, abs=0.01)
    # The near share: 5 x (40 ms + 3 ms + 4 records of 5 ms + the stall's record gap) of 4 s
    # snapped; 5 x 303 ms of 4 s wide.
    assert 5 < snap["near_share_pct"] < 10
    assert wide["near_share_pct"] == pytest.approx(100 * 5 * 0.303 / _T)
    # A window whose edges fall between records, and steps with 1 ms of jitter: still ~L/T.
    recs = _job(0.0, _T + 0.5, stalls, jitter=0.001, seed=5)
    got = bench.at_polls(recs, 0.0123, _T, _POLLS, 0.02, 0.02, snap=True)
    assert got["slowdown_pct"] == pytest.approx(100.0 * len(stalls) * L / (_T - 0.0123), abs=0.1)
    # Bigger stalls, 20 ms at each poll (2.5 %): the same.
    stalls = [(s + 0.002, 0.02) for s in _STARTS]
    recs = _job(0.0, _T, stalls)
    for kw in ({"pre": 0.02, "post": 0.02, "snap": True}, {}):
        assert bench.at_polls(recs, 0.0, _T, _POLLS, **kw)["slowdown_pct"] == pytest.approx(2.5, abs=0.01)


def test_at_polls_without_a_cost_gives_zero(bench):
    recs = _job(0.0, _T)
    for kw in ({"pre": 0.02, "post": 0.02, "snap": True}, {"pre": bench.NEAR_PRE_S, "post": bench.WIDE_POST_S}):
        got = bench.at_polls(recs, 0.0, _T, _POLLS, **kw)
        assert got["slowdown_pct"] == pytest.approx(0.0, abs=1e-9)
    # No polls at all: nothing near, nothing measured.
    assert bench.at_polls(recs, 0.0, _T, []) == {"slowdown_pct": pytest.approx(0.0, abs=1e-9), "near_share_pct": 0.0}


def test_at_polls_puts_a_stall_away_from_the_polls_in_the_away_part(bench):
    # Stalls 0.4 s after each poll: outside both spans. The window's rate and the away rate both
    # lose them, the away rate by more (over less time): the result is slightly negative,
    # -L N / (T (A - L)) for near time N and away time A = T - N, not the 1 % the job lost.
    # (What the method cannot see: the windows' slowdown is what catches a cost away from polls.)
    L = 0.008
    stalls = [(s + 0.4, L) for s in _STARTS]
    recs = _job(0.0, _T, stalls)
    lost = len(stalls) * L
    for kw in ({"pre": 0.02, "post": 0.02, "snap": True}, {"pre": bench.NEAR_PRE_S, "post": bench.WIDE_POST_S}):
        got = bench.at_polls(recs, 0.0, _T, _POLLS, **kw)
        near = got["near_share_pct"] / 100 * _T
        away = _T - near
        assert got["slowdown_pct"] == pytest.approx(-100 * lost * near / (_T * (away - lost)), abs=1e-6)
        assert -1.0 < got["slowdown_pct"] <= 0.0


def test_at_polls_snaps_a_slow_jobs_steps_whole(bench):
    # A step every 50 ms: a poll's 8 ms stop makes a record gap wider than 20 ms before and after;
    # interpolated, part of the stop lands away and the cost is underestimated; snapped to the
    # records, the slowed step is inside whole.
    stalls = [(s + 0.001, 0.008) for s in _STARTS]
    recs = _job(0.0, _T, stalls, dt=0.05)
    snapped = bench.at_polls(recs, 0.0, _T, _POLLS, 0.02, 0.02, snap=True)["slowdown_pct"]
    interp = bench.at_polls(recs, 0.0, _T, _POLLS, 0.02, 0.02, snap=False)["slowdown_pct"]
    assert snapped == pytest.approx(1.0, abs=0.01)
    assert interp < 0.8


def test_at_polls_needs_time_away(bench):
    recs = _job(0.0, _T)
    dense = [(0.1 * i, 0.1 * i + 0.003) for i in range(40)]  # a poll every 0.1 s, 0.3 s wide spans
    got = bench.at_polls(recs, 0.0, _T, dense, bench.NEAR_PRE_S, bench.WIDE_POST_S)
    assert math.isnan(got["slowdown_pct"])
    assert got["near_share_pct"] > 90
    # Just over 10 % away: measured. Just under: not.
    span = [(0.0, 3.55)]
    assert not math.isnan(bench.at_polls(recs, 0.0, _T, span, 0.0, 0.0)["slowdown_pct"])
    span = [(0.0, 3.65)]
    assert math.isnan(bench.at_polls(recs, 0.0, _T, span, 0.0, 0.0)["slowdown_pct"])
    # An empty window: nan, and no share either.
    got = bench.at_polls(recs, 1.0, 1.0, _POLLS)
    assert math.isnan(got["slowdown_pct"]) and math.isnan(got["near_share_pct"])


def test_virtual_polls_copy_the_adjacent_attached_offsets(bench):
    a1 = [[1.1, 1.15], [1.6, 1.62]]
    a3 = [[3.3, 3.31]]
    wins = [
        {"attached": False, "t0": 0.0},
        {"attached": True, "t0": 1.0, "polls": a1},
        {"attached": False, "t0": 2.05},
        {"attached": True, "t0": 3.0, "polls": a3},
        {"attached": False, "t0": 4.2},
    ]
    v = bench.virtual_polls(wins)
    assert len(v) == 5
    assert v[1] == [(1.1, 1.15), (1.6, 1.62)] and all(isinstance(p, tuple) for p in v[1])
    assert v[3] == [(3.3, 3.31)]
    # The first D: the A after it; every other D: the A before it.
    assert v[0] == [pytest.approx((0.1, 0.15)), pytest.approx((0.6, 0.62))]
    assert v[2] == [pytest.approx((2.15, 2.2)), pytest.approx((2.65, 2.67))]
    assert v[4] == [pytest.approx((4.5, 4.51))]
    # A lone D window has none; an A with no polls gives its D neighbours none.
    assert bench.virtual_polls([{"attached": False, "t0": 0.0}]) == [[]]
    assert bench.virtual_polls([{"attached": False, "t0": 0.0}, {"attached": True, "t0": 1.0, "polls": []},
                                {"attached": False, "t0": 2.0}]) == [[], [], []]


def test_summarize_pairs_the_at_polls_slowdowns(bench):
    rates = [100.0, 99.0, 100.0, 99.0, 100.0]
    lost = [0.0] * 5
    polls = [0.1, 1.1, 0.3, 1.3, 0.1]  # controls 0.1 / 0.3 / 0.1: the As 0.9 and 1.1 above them
    s = bench.summarize(rates, lost, polls)
    assert s["per_window_polls_pct"] == [pytest.approx(0.9), pytest.approx(1.1)]
    assert s["polls_slowdown_pct"] == pytest.approx(1.0)
    assert s["polls_ci95_pct"] == bench.union(s["polls_ci95_boot_pct"], s["polls_ci95_t_pct"])
    assert s["polls_ci95_pct"][0] <= 1.0 <= s["polls_ci95_pct"][1]
    assert s["polls_ci95_halfwidth_pct"] == pytest.approx((s["polls_ci95_pct"][1] - s["polls_ci95_pct"][0]) / 2)
    assert s["polls_control_sd_pct"] == pytest.approx(statistics.stdev([0.1, 0.3, 0.1]))
    # The windows' own measures are unchanged by it.
    plain = bench.summarize(rates, lost)
    assert not any(k.startswith("polls_") for k in plain) and "per_window_polls_pct" not in plain
    assert {k: v for k, v in s.items() if k in plain} == plain
    # A window without an at-polls value (too little time away) drops its pair, not the rest.
    s = bench.summarize(rates + [99.0, 100.0], lost + [0.0, 0.0], polls + [float("nan"), 0.2])
    assert math.isnan(s["per_window_polls_pct"][2])
    assert s["polls_slowdown_pct"] == pytest.approx(1.0)
    s = bench.summarize(rates, lost, [0.1, 1.1, float("nan"), 1.3, 0.1])
    assert all(math.isnan(x) for x in s["per_window_polls_pct"])
    assert math.isnan(s["polls_slowdown_pct"])
    assert s["polls_control_sd_pct"] == pytest.approx(0.0)
    # Many pairs: the at-polls interval narrows around the paired mean.
    rng = random.Random(7)
    n = 41
    polls = [rng.gauss(0, 0.1) + (0.5 if w % 2 else 0.0) for w in range(n)]
    s = bench.summarize([100.0] * n, [0.0] * n, polls)
    assert s["polls_ci95_pct"][0] < 0.5 < s["polls_ci95_pct"][1]
    assert s["polls_ci95_halfwidth_pct"] < 0.15


def test_interval_is_the_union_of_bootstrap_and_t(bench):
    xs = [0.1, 0.5, -0.2, 0.3, 0.4, 0.0, 0.2]
    got = bench.interval(xs)
    assert got["mean_pct"] == pytest.approx(statistics.fmean(xs))
    assert got["ci95_pct"] == bench.union(bench.bootstrap_ci(xs), bench.t_ci(xs))
    assert got["per_pair_pct"] == xs
    one = bench.interval([0.4])
    assert one["mean_pct"] == 0.4 and all(math.isnan(x) for x in one["ci95_pct"])


# --------------------------------------------------------------------------- the speed reference


def test_adjusted_takes_out_the_shared_noise(bench):
    # (A 95 % interval: about 1 seed in 20 misses 0.3; over 300 seeds this one covered 94 %.)
    rng = random.Random(3)
    n = 40
    xs = [rng.gauss(0, 1.0) for _ in range(n)]  # the reference's paired slowdowns: the host's noise
    s = [0.3 + 0.9 * x + rng.gauss(0, 0.05) for x in xs]
    adj = bench.adjusted(s, xs)
    plain = bench.union(bench.bootstrap_ci(s), bench.t_ci(s))
    assert adj["usable"] is True
    assert adj["theta"] == pytest.approx(0.9, abs=0.05)
    assert adj["r"] > 0.99
    assert adj["ci95_pct"][0] <= 0.3 <= adj["ci95_pct"][1]
    assert adj["slowdown_pct"] == pytest.approx(0.3, abs=0.05)
    assert (adj["ci95_pct"][1] - adj["ci95_pct"][0]) * 5 < plain[1] - plain[0]
    assert adj["ci95_pct"] == bench.union(adj["ci95_boot_pct"], adj["ci95_t_pct"])
    assert len(adj["per_window_pct"]) == n
    # The adjusted values are s - theta x: their mean moves by theta times the reference's mean.
    assert adj["slowdown_pct"] == pytest.approx(statistics.fmean(s) - adj["theta"] * statistics.fmean(xs))
    assert adj["ref_slowdown_pct"] == pytest.approx(statistics.fmean(xs))
    # The sampler slowing the reference as well (its slowdowns clearly above 0): not usable.
    shifted = [x * 0.2 + 1.0 for x in xs]
    bad = bench.adjusted([0.3 + 0.9 * x for x in shifted], shifted)
    assert bad["ref_ci95_pct"][0] > 0 and bad["usable"] is False
    # Too few pairs (nan pairs left out): None.
    assert bench.adjusted([0.1, 0.2, 0.3], [0.0, 0.1, -0.1]) is None
    assert bench.adjusted([0.1, 0.2, 0.3, float("nan")], [0.0, 0.1, -0.1, 0.2]) is None
    assert bench.adjusted([0.1, 0.2, 0.3, 0.4], [0.0, 0.1, -0.1, float("nan")]) is None
    assert bench.adjusted([0.1, 0.2, 0.3, 0.4], [0.0, 0.1, -0.1, 0.05]) is not None
    # A reference that did not move at all: theta 0, the plain values.
    flat = bench.adjusted([0.1, 0.2, 0.3, 0.4], [0.0] * 4)
    assert flat["theta"] == 0.0 and flat["per_window_pct"] == [0.1, 0.2, 0.3, 0.4]


# --------------------------------------------------------------------------- calibration


def test_calibration_names(bench):
    assert bench.calibration_ms("cpu-loading@stop4ms") == 4.0
    assert bench.calibration_ms("launch-bound@stop2.5ms") == 2.5
    assert bench.calibration_ms("cpu-loading") is None
    assert bench.base_target("cpu-loading@stop4ms") == "cpu-loading"
    assert bench.base_target("healthy-bf16") == "healthy-bf16"
    for bad in ("cpu-loading@stopXms", "cpu-loading@stopms", "nosuch@stop4ms", "cpu-loading@stop0ms",
                "cpu-loading@stop-1ms", "cpu-loading@stop101ms", "cpu-loading@stopnanms", "cpu-loading@stopinfms",
                "@stop4ms"):
        with pytest.raises(ValueError):
            bench.calibration_ms(bad)
    assert bench.calibration_ms("cpu-loading@stop100ms") == 100.0  # the edge is in


def test_found_tells_what_a_measure_made_of_an_injected_cost(bench):
    assert bench.found(1.0, [0.7, 1.3], 1.1) == "found"
    assert bench.found(1.0, [0.7, 1.3], 0.7) == "found"  # the edges are in
    assert bench.found(0.4, [0.2, 0.6], 1.1) == "seen, off"  # above 0, but short of it
    assert bench.found(2.0, [1.5, 2.5], 1.1) == "seen, off"  # above 0, past it
    assert bench.found(1.0, [-0.5, 2.5], 1.1) == "missed"  # not above 0
    assert bench.found(1.0, [0.0, 2.5], 1.1) == "missed"
    nan = float("nan")
    assert bench.found(nan, [0.7, 1.3], 1.0) == "missed"
    assert bench.found(1.0, [nan, nan], 1.0) == "missed"


def _meets():
    return {"slowdown_pct": 0.1, "ci95_pct": [-0.3, 0.5], "polls_slowdown_pct": 0.05, "polls_ci95_pct": [-0.2, 0.3],
            "lost_pct": 0.01, "lost_ci95_pct": [-0.05, 0.07], "sampler_cpu_pct": 1.0}


def test_verdict_with_the_slowdown_at_the_polls(bench):
    t = _meets()
    assert bench.verdict(t) == "met"
    # The windows cannot tell; at the polls and the probe meet it.
    t.update(slowdown_pct=0.3, ci95_pct=[-1.5, 2.1])
    assert bench.verdict(t) == "met at the polls (slowdown over windows: not resolved)"
    # ... with the probe not applicable, at the polls alone.
    assert bench.verdict(dict(t, probe_seen_pct=10.0)) == "met at the polls (slowdown over windows: not resolved)"
    # ... but not when the probe cannot tell either, nor without an at-polls measure.
    assert bench.verdict(dict(t, lost_ci95_pct=[-1.5, 1.6])) == "not resolved (slowdown, lost time)"
    assert bench.verdict({k: v for k, v in t.items() if not k.startswith("polls_")}) == "not resolved (slowdown)"
    assert bench.verdict(dict(t, polls_ci95_pct=[float("nan")] * 2)) == "not resolved (slowdown, slowdown at the polls)"
    # Nor with the sampler's CPU over its target.
    assert bench.verdict(dict(t, sampler_cpu_pct=3.0)) == "NOT met (sampler CPU); not resolved (slowdown)"
    # A cost measured at the polls above the target.
    t = _meets()
    t.update(polls_slowdown_pct=0.8, polls_ci95_pct=[0.5, 1.1])
    assert bench.verdict(t) == "NOT met (slowdown at the polls)"
    t.update(ci95_pct=[-1.5, 2.1])
    assert bench.verdict(t) == "NOT met (slowdown at the polls); not resolved (slowdown)"
    # At the polls unresolved while the windows meet: not resolved.
    t = _meets()
    t["polls_ci95_pct"] = [-1.4, 1.5]
    assert bench.verdict(t) == "not resolved (slowdown at the polls)"


def test_verdict_uses_the_adjusted_interval_over_windows(bench):
    t = _meets()
    t.update(slowdown_pct=0.3, ci95_pct=[-1.5, 2.1], slowdown_adj_pct=0.3, adj_ci95_pct=[0.0, 0.6])
    assert bench.verdict(t) == "met"  # the adjusted interval resolves it
    # The adjusted interval is judged, not the plain one, either way.
    t.update(ci95_pct=[-0.3, 0.5], slowdown_pct=0.1, slowdown_adj_pct=0.9, adj_ci95_pct=[0.6, 1.2])
    assert bench.verdict(t) == "NOT met (slowdown)"
    t.update(adj_ci95_pct=[-1.5, 3.3])
    assert bench.verdict(t) == "met at the polls (slowdown over windows: not resolved)"
    # Not there (no reference, or not usable): the plain interval.
    t = _meets()
    t.update(slowdown_pct=0.9, ci95_pct=[0.6, 1.2], adj_ci95_pct=None)
    assert bench.verdict(t) == "NOT met (slowdown)"


def test_verdict_of_a_calibration(bench):
    t = _meets()
    t.update(injected_pct=1.0, polls_slowdown_pct=0.95, polls_ci95_pct=[0.7, 1.2], slowdown_pct=0.9,
             ci95_pct=[-2.0, 4.0], lost_pct=0.4, lost_ci95_pct=[0.3, 0.5], sampler_cpu_pct=5.0)
    assert bench.verdict(t) == "calibration (1.00 % injected): at the polls found, windows missed, probe seen, off"
    # The probe left out where it sees too little of the time.
    t["probe_seen_pct"] = 10.0
    assert bench.verdict(t) == "calibration (1.00 % injected): at the polls found, windows missed"
    t.update(injected_pct=0.25, polls_ci95_pct=[-0.1, 0.3], ci95_pct=[0.1, 0.3], probe_seen_pct=100.0,
             lost_ci95_pct=[0.05, 0.3])
    assert bench.verdict(t) == "calibration (0.25 % injected): at the polls missed, windows found, probe found"


# --------------------------------------------------------------------------- the job's records


def test_record_carries_every_step_and_marks_the_boundaries(bench):
    assert bench.RECORD.size == 8 + 4 * 8 + 1
    rec = bench.RECORD.unpack(bench.RECORD.pack(7, 1.5, 0.01, 0.02, 0.03, True))
    assert rec == (7, 1.5, 0.01, 0.02, 0.03, True)


def test_job_reader_keeps_every_step_and_the_boundaries_apart(bench):
    job = bench.Job.__new__(bench.Job)
    job.name = "fake"
    job.bounds, job.steps = [], []
    job.cond = threading.Condition()
    job.eof = False
    job.proc = SimpleNamespace(poll=lambda: 0)
    rfd, wfd = os.pipe()
    reader = threading.Thread(target=job._read, args=(rfd,), daemon=True)
    reader.start()
    n = 3000  # ~120 KB: more than one read, more than the pipe holds
    recs = [(k, 10.0 + 0.001 * k, 1e-4 * k, 2e-4 * k, 3e-4 * k, k % 10 == 0) for k in range(1, n + 1)]
    data = b"".join(bench.RECORD.pack(*r) for r in recs)
    # A record split over two writes, the reader woken between them.
    cut = 5 * bench.RECORD.size + 17
    os.write(wfd, data[:cut])
    time.sleep(0.02)
    view = memoryview(data)[cut:]
    while view:
        view = view[os.write(wfd, view):]
    os.close(wfd)
    reader.join(5)
    assert not reader.is_alive()
    assert job.eof
    assert job.steps == [(r[0], r[1]) for r in recs]
    assert job.bounds == [r[:5] for r in recs if r[5]]
    assert len(job.bounds) == n // 10 and all(len(b) == 5 for b in job.bounds)
    with pytest.raises(OSError):
        os.fstat(rfd)  # the reader closed its end
    # The harness's waits run on the boundaries; with the job gone they stop waiting.
    assert job.first_after(10.0505) == 5  # the boundary of step 60
    with pytest.raises(RuntimeError):
        job.first_after(99.0)
    # A record cut short at the end (the job killed mid-write) is dropped, not misread.
    job2 = bench.Job.__new__(bench.Job)
    job2.bounds, job2.steps, job2.cond, job2.eof = [], [], threading.Condition(), False
    rfd, wfd = os.pipe()
    whole, cut_short = bench.RECORD.pack(10, 1.0, 0.0, 0.0, 0.0, True), bench.RECORD.pack(11, 1.1, 0.0, 0.0, 0.0, False)
    os.write(wfd, whole + cut_short[:20])
    os.close(wfd)
    job2._read(rfd)
    assert job2.steps == [(10, 1.0)] and job2.bounds == [(10, 1.0, 0.0, 0.0, 0.0)] and job2.eof


def test_the_json_headline_is_the_simplest_measure_that_resolves(bench):
    base = {"slowdown_pct": 0.2, "ci95_pct": [-0.3, 0.7], "polls_slowdown_pct": 0.1, "polls_ci95_pct": [-0.2, 0.4],
            "windows": [{"t0": 0.0, "polls": [[0.1, 0.2]]}], "raw": {"steps": []}}
    # The windows resolve it: they are the headline.
    assert bench.headline(base) == (0.2, [-0.3, 0.7], "windows")
    # Too wide over windows: the polls' measure, if it resolves.
    wide = dict(base, slowdown_pct=1.4, ci95_pct=[-2.0, 4.8])
    assert bench.headline(wide) == (0.1, [-0.2, 0.4], "at the polls")
    # The speed reference comes before the polls when it resolves.
    adj = dict(wide, slowdown_adj_pct=0.3, adj_ci95_pct=[-0.4, 0.9])
    assert bench.headline(adj)[2] == "windows, with the speed reference"
    # Nothing resolves: the windows' own, unresolved.
    none = dict(wide, polls_ci95_pct=[-1.5, 1.7])
    assert bench.headline(none) == (1.4, [-2.0, 4.8], "windows")
    # A measured cost above the target is a resolution too (it is not hidden behind the polls).
    above = dict(base, slowdown_pct=1.2, ci95_pct=[0.4, 2.0])
    assert bench.headline(above)[2] == "windows"
    # A calibration is read at the polls.
    assert bench.headline(dict(base, injected_pct=0.5))[2] == "at the polls"
    out = bench.slim(wide)
    assert "raw" not in out and out["windows"] == [{"t0": 0.0, "polls": 1}]
    assert (out["slowdown_pct"], out["slowdown_measure"]) == (0.1, "at the polls")
    assert (out["windows_slowdown_pct"], out["windows_ci95_pct"]) == (1.4, [-2.0, 4.8])
