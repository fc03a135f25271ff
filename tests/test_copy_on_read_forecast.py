"""The host forecast for the workers' copy-on-read: bounded by what the workers still share with
the main process (RSS - USS), its rate falling in proportion to what is left (an exponential
approach), not a straight line; a main-process leak stays a line. Synthetic series through
memory_view, and the memory-growth rule's words on synthetic jobs (tests/synth.py)."""

from __future__ import annotations

import math

import pytest

from gputop.analysis import COPY_ON_READ, MAIN_LEAK, memory_view
from gputop.analysis.memory_growth import GROWING, Growth, bounded, bounded_eta
from gputop.model import HostSample, ProcSample, Severity

from synth import GiB, T0, TARGET, Job, rule_findings

MiB = 2**20
WORKERS = 4
RSS = 1 * GiB  # each worker's, flat: the parent's pages it shares are counted from the fork
USS0 = 20 * MiB
TAU = 300.0  # s: the copying's time constant
BASE = 3 * GiB  # the group's use when the copying starts


def _uss(t: float) -> float:
    """A worker's private memory copying what it shares at a rate in proportion to what is left."""
    return USS0 + (RSS - USS0) * (1 - math.exp(-t / TAU))


def _copied(t: float) -> float:
    return WORKERS * (_uss(t) - USS0)


def _until(room: float, since: float) -> float:
    """When, after ``since``, the workers' copying has added ``room`` to the group: the truth."""
    return -TAU * math.log(1 - room / (WORKERS * (RSS - USS0))) - since


def _view(seconds: int, room: float, cgroup: bool = True, main_rate: float = 0.0, uss=_uss,
          early_since: float | None = None):
    procs: dict[int, list[ProcSample]] = {}
    for w in range(WORKERS):
        pid = TARGET + 1 + w
        # USS read every 12 s (spread over the workers), RSS every second, as the sources do
        procs[pid] = [ProcSample(ts=T0 + k, pid=pid, ppid=TARGET, role="worker", rss=RSS,
                                 uss=int(uss(k)) if k % 12 == w * 3 else None) for k in range(seconds + 1)]
    procs[TARGET] = [ProcSample(ts=T0 + k, pid=TARGET, rss=int(2 * GiB + main_rate * k)) for k in range(seconds + 1)]
    grown = (lambda k: WORKERS * (uss(k) - USS0) + main_rate * k)
    if cgroup:
        host = [HostSample(ts=T0 + k, cpu_percent=10.0, mem_total=64 * GiB, mem_available=40 * GiB,
                           cgroup_limit=int(BASE + room), cgroup_used=int(BASE + grown(k))) for k in range(seconds + 1)]
    else:
        # the host's total: its free memory is the room, the job's own growth its workers' USS
        host = [HostSample(ts=T0 + k, cpu_percent=10.0, mem_total=int(BASE + room),
                           mem_available=int(room - grown(k))) for k in range(seconds + 1)]
    workers = set(procs) - {TARGET}
    return memory_view((), {}, [], host, procs, {TARGET} | workers, workers, early_since=early_since)


@pytest.mark.parametrize("cgroup", [True, False])
def test_copy_on_read_forecast_follows_the_exponential_approach(cgroup):
    seconds, room = 120, 2.5 * GiB
    v = _view(seconds, room, cgroup)
    assert v.host_cause == COPY_ON_READ
    g = v.host
    assert g is not None and g.growing and g.ceiling is not None
    # What the workers still share, read from their samples: RSS - USS each, summed
    last_read = [max(k for k in range(seconds + 1) if k % 12 == w * 3) for w in range(WORKERS)]
    assert g.ceiling == pytest.approx(sum(RSS - int(_uss(k)) for k in last_read))
    true = _until(room, seconds)
    assert g.eta_s == pytest.approx(true, rel=0.10), (g.eta_s, true)
    # ... where a line at the measured rate is more than 10 % early: the test tells the models apart
    line = (g.limit - g.used) / g.rate
    assert line < 0.9 * true
    # the interval stays around the point, its ends the rate interval's
    assert g.eta_low_s is not None and g.eta_high_s is not None
    assert g.eta_low_s <= g.eta_s <= g.eta_high_s


@pytest.mark.parametrize("cgroup", [True, False])
def test_a_fast_copy_named_early_is_bounded_on_the_workers_first_reads(cgroup):
    # 30 s into the training loop: each worker's USS read 2-3 times, too few to judge, yet the
    # growth is urgent enough to be named; their reads account for it, so it is bounded
    seconds, room = 30, 2 * GiB
    v = _view(seconds, room, cgroup, early_since=T0)
    assert v.host_cause is None and not v.uss_read  # nothing judged on the workers yet
    g = v.host
    assert g.growing and g.early and g.ceiling is not None
    assert v.early_copy == pytest.approx(WORKERS * (RSS - USS0) / TAU, rel=0.1)
    true = _until(room, seconds)
    assert g.eta_s == pytest.approx(true, rel=0.10), (g.eta_s, true)
    assert (g.limit - g.used) / g.rate < 0.9 * true


@pytest.mark.parametrize("cgroup", [True, False])
def test_a_main_process_leak_named_early_stays_a_line(cgroup):
    # The workers' USS rises a little as they start (their own pages), the main process's RSS
    # takes the growth: not the workers' copying
    rate = 20 * MiB
    v = _view(30, 2 * GiB, cgroup, main_rate=rate, uss=lambda t: USS0 + 0.5 * MiB * t, early_since=T0)
    g = v.host
    assert g.growing and g.ceiling is None and v.early_copy is None
    assert g.eta_s == pytest.approx((g.limit - g.used) / g.rate, rel=1e-9)


def test_the_main_process_drifting_beside_the_copying_keeps_it_copy_on_read():
    # The main process's RSS creeping 1 KB/s beside the workers' 13 MB/s is not "both grow": the
    # copying stays bounded (the drift a line beside it), as it levels off
    v = _view(120, 2.5 * GiB, main_rate=1024.0)
    assert v.main.growing and v.host_cause == COPY_ON_READ
    assert v.host.ceiling is not None
    assert v.host.eta_s == pytest.approx(_until(2.5 * GiB, 120), rel=0.10)
    # ... a main process growing as fast as the workers is no longer their copying alone
    v = _view(120, 2.5 * GiB, main_rate=15 * MiB)
    assert v.host_cause is None and v.host.ceiling is None


def test_a_ceiling_below_the_limit_forecasts_no_oom():
    # 4 workers can copy at most ~4 GiB - what they copied; the group has 6 GiB of room
    v = _view(120, 6 * GiB)
    g = v.host
    assert v.host_cause == COPY_ON_READ and g.growing
    assert g.eta_s is None and g.eta_low_s is None and g.eta_high_s is None
    assert g.ceiling < g.limit - g.used


def test_a_main_process_leak_is_still_a_line():
    rate = 10 * MiB
    v = _view(120, 2.5 * GiB, main_rate=rate, uss=lambda t: USS0)
    g = v.host
    assert v.host_cause == MAIN_LEAK and g.growing
    assert g.ceiling is None
    assert g.eta_s == pytest.approx((g.limit - g.used) / g.rate, rel=1e-9)
    assert g.rate == pytest.approx(rate, rel=0.02)


def test_workers_that_allocate_are_not_bounded_by_what_they_share():
    # Their RSS grows with their USS: new memory (a cache filled in each worker), no ceiling
    procs = {}
    for w in range(WORKERS):
        pid = TARGET + 1 + w
        procs[pid] = [ProcSample(ts=T0 + k, pid=pid, ppid=TARGET, role="worker", rss=int(RSS + 3 * MiB * k),
                                 uss=int(USS0 + 3 * MiB * k) if k % 12 == w * 3 else None) for k in range(121)]
    procs[TARGET] = [ProcSample(ts=T0 + k, pid=TARGET, rss=2 * GiB) for k in range(121)]
    host = [HostSample(ts=T0 + k, cpu_percent=10.0, mem_total=64 * GiB, mem_available=40 * GiB,
                       cgroup_limit=8 * GiB, cgroup_used=int(BASE + WORKERS * 3 * MiB * k)) for k in range(121)]
    workers = set(procs) - {TARGET}
    v = memory_view((), {}, [], host, procs, {TARGET} | workers, workers)
    assert v.host_cause == COPY_ON_READ and v.host.growing
    assert v.host.ceiling is None and v.host.eta_s == pytest.approx((v.host.limit - v.host.used) / v.host.rate)


def test_bounded_eta():
    # small growth against a large ceiling: the line's time; half the ceiling: ln 2 of its time constant
    assert bounded_eta(1 * MiB, 10 * GiB, 1 * MiB) == pytest.approx(1.0, rel=1e-3)
    assert bounded_eta(5 * GiB, 10 * GiB, 10 * GiB / TAU) == pytest.approx(TAU * math.log(2))
    assert bounded_eta(10 * GiB, 10 * GiB, 1 * MiB) is None  # reaches it only in the limit
    assert bounded_eta(11 * GiB, 10 * GiB, 1 * MiB) is None
    assert bounded_eta(1 * MiB, 10 * GiB, 0.0) is None
    # a line beside the copying: past the ceiling, when the two together have added the room ...
    t = bounded_eta(11 * GiB, 10 * GiB, 10 * GiB / TAU, 1 * MiB)
    assert 1 * MiB * t + 10 * GiB * (1 - math.exp(-t / TAU)) == pytest.approx(11 * GiB, rel=1e-6)
    assert 1024 < t < 11 * 1024
    # ... and within it, sooner than either alone
    both = bounded_eta(5 * GiB, 10 * GiB, 10 * GiB / TAU, 10 * MiB)
    assert both < min(TAU * math.log(2), 5 * GiB / (10 * MiB))
    assert bounded_eta(1 * GiB, 10 * GiB, 0.0, 1 * MiB) == pytest.approx(1024)


# --------------------------------------------------------------------------- the rule


def _job(room: float) -> Job:
    return Job(seconds=120, workers=WORKERS, host_mem_total=64 * GiB, host_available=lambda t: 40 * GiB,
               cgroup_limit=int(BASE + room), cgroup_used=lambda t: BASE + _copied(t),
               worker_rss=lambda t: RSS, worker_uss=_uss, target_rss=lambda t: 2 * GiB)


def test_the_rule_says_the_forecast_slows():
    f = rule_findings(_job(2.5 * GiB))[0]["memory-growth"]
    assert "out of memory in" in f.title
    assert any(e.startswith("slowing as the workers copy what they still share with the main process (at most ")
               and "the group reaches its limit (memory.max) in" in e for e in f.evidence), f.evidence
    assert not any("at this rate" in e for e in f.evidence)


def test_the_rule_says_the_ceiling_short_of_the_limit():
    f = rule_findings(_job(6 * GiB))[0]["memory-growth"]
    assert f.severity is Severity.INFO
    assert "out of memory" not in f.title and "short of the limit" in f.title, f.title
    assert any("can grow by at most" in e and "short of the group's limit (memory.max) by" in e
               and "does not run it out of memory" in e for e in f.evidence), f.evidence
    assert "numpy array or an Arrow table" in f.action


def test_the_steady_part_of_a_bounded_growth_stays_a_line():
    # 20 MiB/s, half of it a line beside the copying: past the copying's ceiling the line still
    # reaches the limit; all of it copying never does
    g = Growth(GROWING, rate=20 * MiB, rate_low=18 * MiB, rate_high=22 * MiB, used=0.0, limit=12 * GiB,
               span_s=120.0)
    half = bounded(g, 10 * GiB, lag_s=0.0, steady=10 * MiB)
    assert half.eta_s is not None and half.eta_low_s < half.eta_s < half.eta_high_s
    t = half.eta_s
    assert 10 * MiB * t + 10 * GiB * (1 - math.exp(-t * 10 * MiB / (10 * GiB))) == pytest.approx(12 * GiB, rel=1e-6)
    assert bounded(g, 10 * GiB, lag_s=0.0).eta_s is None
