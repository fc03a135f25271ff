"""Mechanics of bench/attach_cost.py that can be checked without a GPU (its statistics, its
window plan, the sampler's clocks standing still while detached)."""

from __future__ import annotations

import importlib.util
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
    s["ci95_pct"] = [0.0, 1.2]
    assert bench.verdict(s) == "NOT met (interval)"
    s["ci95_pct"], s["lost_ci95_pct"] = [0.0, 0.9], [0.0, 1.1]
    assert bench.verdict(s) == "NOT met (lost time)"


def test_window_plan_fits_the_budget(bench):
    n = bench.plan_windows(40.0, 0.037, 1.0)
    assert n == 39
    # A cycle longer than the window, a budget too small: never fewer than D A D.
    assert bench.plan_windows(2.0, 0.6, 1.0) == 3
    ends = bench.target_deadlines(1000.0, 280.0, 5)
    assert len(ends) == 5 and ends[-1] == 1000.0 + 280.0 - bench.CLOSE_MARGIN_S
    assert all(b - a == pytest.approx(56.0) for a, b in zip(ends, ends[1:]))


def test_window_stats_on_cycle_boundaries(bench):
    # 10 steps a cycle, 0.1 s each, the probe losing 1 ms a cycle.
    bounds = [(10 * i, 5.0 + 0.1 * i, 0.001 * i) for i in range(30)]
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
