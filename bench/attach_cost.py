#!/usr/bin/env python
"""What attaching gputop's stack sampler costs a running training job, to a fraction of a percent.

    python bench/attach_cost.py --out OUT [--device auto|cuda|cpu] [--budget-s 280] [--pin auto|off]
                                [--window 1.0] [--targets many-threads,cpu-loading,...]

One run measures every target inside ``--budget-s`` seconds of wall time, start-up and warm-up
included. Each target's share is set when it starts: what is left of the run, split by weight
over the targets still to run (``WEIGHTS``: the CPU-bound targets, whose own speed is noisiest,
get more than the quiet GPU-bound ones; what a target leaves unused goes to those after it).

CPUs (``--pin auto``, where the machine has them): the job's main thread runs alone on one core
(its hyperthread sibling left idle), the job's other threads (intra-op pool, DataLoader workers,
pin-memory, CUDA's, the probe) on cores of their own, the harness (window timing, the pipe
reader) on another. gputop's sampler thread and its py-spy processes are NOT pinned: gputop
sets no affinity, so in real use they go wherever the scheduler puts them, the job's cores
included, and here too. The pinning takes the job's own migrations and the harness off the
step rate (noise); it does not keep the sampler away from the job. On a machine with fewer
than 3 cores the job's other threads share the harness's core ("degraded"), on one CPU nothing
is pinned ("off"); the JSON says which (``environment.cpu_plan``). Intra-op threads: 1 in the
targets whose CPU work is the loop itself (their ops are too small for the pool; its spinning
threads would only contend), 64 in many-threads (the point of it).

Method, per target (one job, started once, then left running):
- The job reports its progress at fixed points of its loop ("cycle boundaries"): on CUDA after
  every ``loss.item()`` (each 10 steps: the CPU may run ahead of the GPU between them, so a step
  count read at an arbitrary moment is off by up to 10 steps), on the CPU after every step; in
  ``checkpoint`` only after each checkpoint, so that every window holds whole checkpoint
  periods. Each boundary carries its step count, the job's monotonic clock and the lost-time
  probe's totals (below), written down a pipe the harness reads.
- Attach as a user does: the sampler's first (blocking) look at the running job, then
  ``--settle`` seconds attached, spending its start-up burst; the sampler's CPU per main stack
  there gives its steady rate (its CPU budget over that cost).
- Warm-up, detached, until the step rate is steady: rates over 0.5 s chunks of whole cycles,
  the last six of them with no trend (their halves' means within 1 % or two standard errors)
  and a CV under 5 %; at least ``--warmup`` s, at most ``--warmup-max`` s or a quarter of the
  share (the JSON says whether it got steady, and in how long).
- Windows alternate D A D A ... A D: D detached, A with gputop's sampler (PySpySource with the
  session's defaults, polled the way the pipeline polls it) attached. A window starts on a
  boundary and ends on the first boundary after its length, so it holds whole cycles and its
  step rate carries no counting error. The sampler is switched on at a boundary; an A window
  ends at the first boundary after the sampler's last poll has returned, so what a dump costs
  is counted in the A window that made it. The length: ``--window`` s, at least 5 cycles
  (checkpoint periods), and long enough for 2 main-thread stacks at the steady rate, so each A
  window sees the rate a long attach runs at (the JSON reports stacks per A window), unless
  that leaves fewer than 8 pairs in the share. The settle's estimate sizes the first windows;
  from the second A window on, the rate the A windows saw sizes the pairs to come.
- Each A is compared with the mean of the two D around it, so a linear drift of the job's speed
  cancels; ``slowdown = 1 - steps/s(A) / mean(steps/s(D before), steps/s(D after))``. The
  slowdown is the mean over the A windows. Its 95 % interval is the union of two: a moving-block
  bootstrap over the pairs (blocks of 2: neighbouring pairs share a D window, so they are not
  independent) and a t interval whose variance adds the lag-1 covariance. A 20 % trimmed mean
  is given as a check on outliers (not what the verdict uses: it would hide a rare long stop).
- A lost-time probe inside the job, the co-primary measure: a thread that sleeps 2 ms at a time
  and adds up how late it wakes. A job stopped by py-spy wakes it late by the stop; sampling's
  lost time is A minus its D neighbours, in % of the time the probe could see, with the same
  intervals. The probe is blind inside a checkpoint: the job marks each save (staging copy and
  torch.save), which holds the GIL, so the probe wakes late for the save's own reason; a sleep
  that overlaps a save is left out (its time reported as the probe's blind share) instead of
  counted as lost. The step rate covers the saves.
- The sampler's own CPU (its thread and its py-spy processes) over the A windows, % of one core,
  and what gputop itself shows (``SamplingCost.job_cost_pct``). Per window, the job's main
  thread's time on a CPU and waiting for one (/proc schedstat), the host's steal time on its
  CPU and, on CUDA, the GPU's SM clock and busy share (NVML, 10 Hz, where pynvml is installed),
  to tell a sampler taking the job's core from the job's own noise; the JSON and the md give
  each one's correlation with the windows' step rates.
- The verdict, per measure: "met" (mean <= 0.5 %, the interval's upper end <= 1 % and its
  half-width <= 1 %), "NOT met" (a cost measured above the target: mean > 0.5 % and the
  interval's lower end above 0), else "not resolved" (the interval is too wide to say).
The sampler is attached once (its first look) before the windows, its start-up burst spent;
between A windows its clocks stand still, so the A windows put end to end are one steady attach
(the CPU budget's refill, the worker round robin and the cost window all see attached time
only), not a fresh attach each window.

Targets (``--device cuda`` sizes; ``cpu`` runs the same code smaller). Every job does the same
work at every step (learning rate 0: the weights never drift toward denormals or a different
state), and its own stalls are kept out of the step rate:
- many-threads: 64-thread intra-op pools (started by CPU ops), 8 DataLoader workers with
  pin-memory and a deep prefetch (token-id batches, far ahead of the loop), an embedding + bf16
  MLP large enough that the step is GPU time; the pools and workers start as an unpinned job's
  (sized by every CPU) before they are moved to the job's CPUs. ``cpu`` computes with a thread
  per CPU of the job (so it has fewer threads: libgomp ends the rest of the pool).
- cpu-loading: DataLoader(num_workers=0) with a per-sample CPU transform in the main process.
- checkpoint: a bf16 MLP (17M parameters on the GPU: 67 MB) that checkpoints every 20 steps:
  the weights staged into preallocated (pinned) host buffers, then torch.save over the same
  file in place (in /dev/shm where it has room: the disk's writeback is not what is measured;
  the JSON says where it went), as checkpointing libraries arrange it. It was 270 MB every 40
  steps, each save copying the CUDA tensors into fresh host pages and a truncated file: about
  two 0.55 s periods per 1 s window, and a speed that drifted 93 -> 49 steps/s over the run
  (fresh pages are one suspect, not a proven cause). Shorter periods put more of them in a
  window. The share of the time inside saves is the probe's blind share in the JSON.
- launch-bound: a small deep MLP, tiny batches: the step is kernel-launch overhead.
- healthy-bf16: a large bf16 MLP, batches already on the device.

Writes OUT/attach_cost.json ({"targets": [{name, threads, slowdown_pct, ci95_pct,
sampler_cpu_pct, device, ...}]}) and OUT/attach_cost.md, after each target.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import math
import os
import platform
import random
import resource
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TARGETS = ("many-threads", "cpu-loading", "checkpoint", "launch-bound", "healthy-bf16")
# Shares of the run's budget: the CPU-bound targets' own speed is the noisiest (per-window CV
# 12-14 % on the H100 before pinning), the GPU-bound ones' under 1 %.
WEIGHTS = {"many-threads": 1.1, "cpu-loading": 1.2, "checkpoint": 1.2, "launch-bound": 1.2, "healthy-bf16": 0.7}
TARGET_SLOWDOWN_PCT = 0.5  # the target: the job loses at most this
TARGET_WORST_PCT = 1.0  # worst slowdown + its interval
RESOLUTION_PCT = 1.0  # a measure resolves the target when its 95 % interval is within +-1 %
TARGET_CPU_PCT = 2.0  # the sampler's own CPU, % of one core
# steps, monotonic time, probe's lost s, probe's blind s, s in the garbage collector, and whether
# it is a cycle boundary: one record per step (the steps between boundaries place the polls'
# cost to a step; the windows use the boundaries only).
RECORD = struct.Struct("=qdddd?")
PROBE_SLEEP_S = 0.002
PROBE_SLACK_S = 0.001  # a wake-up later than this (timer slack, GIL hand-over) counts as lost
PROBE_MIN_SEEN_PCT = 25.0  # below this share of the time seen, the probe is not applicable
SYNC_EVERY = 10  # the job's loss.item(), as real loops log
CHECKPOINT_EVERY = 20
DEFAULT_BUDGET_S = 280.0
CLOSE_MARGIN_S = 1.0  # stopping a job (and its workers), and the statistics, at the end of a share
TRIM = 0.2  # the trimmed mean's cut, each side
SHM_ROOM_BYTES = 1 << 30  # the checkpoint (67 MB on CUDA) goes to /dev/shm only with this free
# Windows: at least this many cycles, and this many main stacks at the sampler's steady rate,
# unless that leaves fewer than MIN_PAIRS pairs.
MIN_CYCLES_PER_WINDOW = 5
STACKS_PER_WINDOW = 2.0
MIN_PAIRS = 8
# Warm-up: rates over chunks of whole cycles; steady when the last WARM_CHUNKS show no trend.
WARM_CHUNK_S = 0.5
WARM_CHUNKS = 6
WARM_TREND_PCT = 1.0  # halves' means within this, or within 2 standard errors if the job is noisier
WARM_CV_PCT = 5.0
WARM_MAX_SHARE = 0.25  # of the target's share
INTRA_OP_MANY = 64  # many-threads' pool; the other targets run 1 intra-op thread
# At the polls: "near" a poll is from two of the job's steps (and NEAR_SLACK_S) before its start
# to two steps and NEAR_SLACK_S after its end: the job's progress is known per step, so a cost
# inside the poll shows whole in the steps around it; the slack covers what a dump leaves behind
# (caches refilled in microseconds, not tens of milliseconds). The rest of an attached window is
# "away". The estimate's variance grows with the near share p as p / (1 - p): the first H100
# run, with 50 ms before and 250 ms after (p 40 %), could not resolve ±1 %. WIDE_POST_S is that
# run's span after a poll, still reported as the check on a cost that lingers.
NEAR_STEPS = 2
NEAR_SLACK_S = 0.02
NEAR_PRE_S = 0.05  # the defaults of the functions below, and the wide check's span before
WIDE_POST_S = 0.25
NEAR_POST_S = WIDE_POST_S
# A calibration target: "<target>@stop<ms>ms" runs <target> with the sampler also stopping the
# job (SIGSTOP ... SIGCONT) for that long after each poll that dumped: a known cost the method
# must find.
CALIBRATION_SEP = "@stop"


# --------------------------------------------------------------------------- statistics


def paired_slowdowns(rates: list[float]) -> list[float]:
    """``rates``: steps/s of windows D A D A ... A D. Each A against the mean of its two D
    neighbours: 1 - A / mean(D), in %. A linear drift cancels."""
    if len(rates) < 3 or len(rates) % 2 == 0:
        raise ValueError("need D A D ... A D: an odd number of windows, at least 3")
    out = []
    for i in range(1, len(rates), 2):
        base = (rates[i - 1] + rates[i + 1]) / 2
        out.append(100.0 * (1.0 - rates[i] / base) if base > 0 else float("nan"))
    return out


def paired_differences(values: list[float]) -> list[float]:
    """Like paired_slowdowns for a quantity in % already (lost time): A minus mean(D)."""
    if len(values) < 3 or len(values) % 2 == 0:
        raise ValueError("need D A D ... A D: an odd number of windows, at least 3")
    return [values[i] - (values[i - 1] + values[i + 1]) / 2 for i in range(1, len(values), 2)]


def progress_at(bounds: list[tuple], t: float) -> float:
    """The job's step count at monotonic ``t``, linear between its boundary records (``bounds``:
    (steps, t, ...) in time order; clamped to the first and last)."""
    i = bisect.bisect_right(bounds, t, key=lambda r: r[1])
    if i == 0:
        return float(bounds[0][0])
    if i == len(bounds):
        return float(bounds[-1][0])
    (s0, t0), (s1, t1) = bounds[i - 1][:2], bounds[i][:2]
    return s0 + (s1 - s0) * (t - t0) / (t1 - t0) if t1 > t0 else float(s1)


def near_spans(polls: list[tuple[float, float]], t0: float, t1: float, pre: float = NEAR_PRE_S,
               post: float = NEAR_POST_S, times: list[float] | None = None,
               around: int = NEAR_STEPS) -> list[tuple[float, float]]:
    """The time near the polls, merged where they overlap and clipped to the window
    ``[t0, t1]``. Each poll ``(start, end)``: ``[start - pre, end + post]``; with the job's
    step ``times`` (sorted), widened out to ``around`` step records beyond that on each side,
    so that every span starts and ends on a record: the steps in it are counted, not
    interpolated, and a step the poll slowed is inside whole."""
    spans: list[list[float]] = []
    for a, b in sorted(polls):
        lo, hi = a - pre, b + post
        if times:
            i = max(0, bisect.bisect_left(times, lo) - around)
            j = min(len(times) - 1, bisect.bisect_right(times, hi) + around - 1)
            lo, hi = min(lo, times[i]), max(hi, times[j])
        lo, hi = max(t0, lo), min(t1, hi)
        if hi <= lo:
            continue
        if spans and lo <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], hi)
        else:
            spans.append([lo, hi])
    return [(a, b) for a, b in spans]


def at_polls(bounds: list[tuple], t0: float, t1: float, polls: list[tuple[float, float]],
             pre: float = NEAR_PRE_S, post: float = NEAR_POST_S, snap: bool = False) -> dict:
    """One window's slowdown at the polls: ``1 - rate over the window / rate away from the
    polls``, in %. If sampling costs the job L seconds near its polls and nothing away from
    them, the window's rate is ``away * (1 - L / T)``: this is ``L / T``, the same quantity the
    windows' slowdown measures, but against the job's speed in the same second instead of in the
    windows before and after, so the job's slow drifts cancel. With ``polls`` at the same
    offsets in a detached window ("virtual" polls) it measures nothing but the method's bias and
    the job's noise at that scale: the control. ``bounds``: the job's progress records (steps,
    t, ...); ``snap``: spans end on records (see ``near_spans``)."""
    times = [r[1] for r in bounds] if snap else None
    spans = near_spans(polls, t0, t1, pre, post, times)
    total_s = t1 - t0
    total_steps = progress_at(bounds, t1) - progress_at(bounds, t0)
    near_s = sum(b - a for a, b in spans)
    near_steps = sum(progress_at(bounds, b) - progress_at(bounds, a) for a, b in spans)
    away_s, away_steps = total_s - near_s, total_steps - near_steps
    if total_s <= 0 or away_s <= 0.1 * total_s or away_steps <= 0:
        return {"slowdown_pct": float("nan"), "near_share_pct": 100.0 * near_s / total_s if total_s > 0 else float("nan")}
    return {"slowdown_pct": 100.0 * (1.0 - (total_steps / total_s) / (away_steps / away_s)),
            "near_share_pct": 100.0 * near_s / total_s}


def virtual_polls(windows: list[dict]) -> list[list[tuple[float, float]]]:
    """Each window's polls: an attached window's own; a detached one's at the offsets (from the
    window's start) of the attached window before it (the first: the one after), so the control
    sees the same pattern of near and away time."""
    out: list[list[tuple[float, float]]] = []
    for i, w in enumerate(windows):
        if w["attached"]:
            out.append([tuple(p) for p in w["polls"]])
            continue
        src = windows[i - 1] if i > 0 and windows[i - 1]["attached"] else (
            windows[i + 1] if i + 1 < len(windows) and windows[i + 1]["attached"] else None)
        if src is None:
            out.append([])
            continue
        d = w["t0"] - src["t0"]
        out.append([(a + d, b + d) for a, b in src["polls"]])
    return out


def _finite(xs: list[float]) -> list[float]:
    return [x for x in xs if not math.isnan(x)]


def nanmean(xs: list[float]) -> float:
    xs = _finite(xs)
    return statistics.fmean(xs) if xs else float("nan")


def trimmed_mean(xs: list[float], cut: float = TRIM) -> float:
    xs = sorted(_finite(xs))
    if not xs:
        return float("nan")
    k = int(cut * len(xs))
    return statistics.fmean(xs[k:len(xs) - k] or xs)


def bootstrap_ci(xs: list[float], level: float = 0.95, n: int = 4000, seed: int = 1, block: int = 2,
                 stat=statistics.fmean) -> tuple[float, float]:
    """Percentile interval of ``stat`` by a moving-block bootstrap: blocks of ``block``
    consecutive values, so a dependence between neighbours (pairs sharing a D window) is kept.
    ``block=1`` is the plain bootstrap."""
    xs = _finite(xs)
    k = len(xs)
    if not xs:
        return (float("nan"), float("nan"))
    block = max(1, min(block, k))
    starts = k - block + 1
    rng = random.Random(seed)
    per = -(-k // block)
    vals = []
    for _ in range(n):
        sample: list[float] = []
        for _ in range(per):
            s = rng.randrange(starts)
            sample.extend(xs[s:s + block])
        vals.append(stat(sample[:k]))
    vals.sort()
    return (vals[int((1 - level) / 2 * n)], vals[min(n - 1, int((1 + level) / 2 * n))])


# Two-sided 97.5 % quantiles of Student's t, for the t interval (dof 1-30; above, the normal's).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042]


def t_ci(xs: list[float], lag1: bool = True) -> tuple[float, float]:
    """t interval of the mean. With ``lag1`` its variance adds the neighbours' covariance in full
    (the paired slowdowns are MA(1) by construction: neighbouring pairs share a D window), never
    less than without it: ``(g0 + 2 max(g1, 0)) / n``."""
    xs = _finite(xs)
    k = len(xs)
    if k < 2:
        return (float("nan"), float("nan"))
    m = statistics.fmean(xs)
    g0 = sum((x - m) ** 2 for x in xs) / (k - 1)
    g1 = sum((xs[i] - m) * (xs[i + 1] - m) for i in range(k - 1)) / (k - 1) if lag1 else 0.0
    var = g0 + 2 * max(g1, 0.0)
    q = _T975[k - 2] if k - 1 <= len(_T975) else 1.96
    h = q * math.sqrt(var / k)
    return (m - h, m + h)


def union(a: tuple[float, float], b: tuple[float, float]) -> list[float]:
    """The smallest interval holding both; unknown (nan) if either is (a t interval of one pair)."""
    if any(math.isnan(x) for x in (*a, *b)):
        return [float("nan"), float("nan")]
    return [min(a[0], b[0]), max(a[1], b[1])]


def interval(xs: list[float]) -> dict:
    """The mean of per-pair values with the union interval (as ``summarize`` gives each measure)."""
    ci = union(bootstrap_ci(xs), t_ci(xs))
    return {"mean_pct": nanmean(xs), "ci95_pct": ci, "per_pair_pct": xs}


def cv_pct(xs: list[float]) -> float:
    xs = _finite(xs)
    if len(xs) < 2 or statistics.fmean(xs) == 0:
        return float("nan")
    return 100.0 * statistics.stdev(xs) / statistics.fmean(xs)


def summarize(rates: list[float], lost_pct: list[float], polls_pct: list[float] | None = None) -> dict:
    """Slowdown with its intervals from the windows' step rates and probe lost time, and (given
    each window's ``at_polls`` slowdown, attached against their detached controls) the slowdown
    at the polls. Each ``*ci95_pct`` is the union of the block bootstrap's and the t interval
    (both kept apart)."""
    slow = paired_slowdowns(rates)
    lost = paired_differences(lost_pct)
    boot, t = bootstrap_ci(slow), t_ci(slow)
    lboot, lt = bootstrap_ci(lost), t_ci(lost)
    ci = union(boot, t)
    extra = {}
    if polls_pct is not None:
        near = paired_differences(polls_pct)
        nboot, nt = bootstrap_ci(near), t_ci(near)
        nci = union(nboot, nt)
        extra = {
            "polls_slowdown_pct": nanmean(near),
            "polls_ci95_pct": nci,
            "polls_ci95_boot_pct": list(nboot),
            "polls_ci95_t_pct": list(nt),
            "polls_ci95_halfwidth_pct": (nci[1] - nci[0]) / 2,
            "polls_control_sd_pct": statistics.stdev(_finite(polls_pct[0::2])) if len(_finite(polls_pct[0::2])) > 1 else float("nan"),
            "per_window_polls_pct": near,
        }
    return extra | {
        "slowdown_pct": statistics.fmean(slow),
        "ci95_pct": ci,
        "ci95_halfwidth_pct": (ci[1] - ci[0]) / 2,
        "ci95_boot_pct": list(boot),
        "ci95_t_pct": list(t),
        "slowdown_trimmed_pct": trimmed_mean(slow),
        "trimmed_ci95_pct": list(bootstrap_ci(slow, stat=trimmed_mean)),
        "pairs": len(slow),
        "lost_pct": nanmean(lost),
        "lost_ci95_pct": union(lboot, lt),
        "lost_ci95_boot_pct": list(lboot),
        "lost_ci95_t_pct": list(lt),
        "detached_cv_pct": cv_pct(rates[0::2]),
        "pair_sd_pct": statistics.stdev(slow) if len(slow) > 1 else float("nan"),
        "per_window_slowdown_pct": slow,
    }


def judge(mean: float, ci: list[float], target: float = TARGET_SLOWDOWN_PCT, worst: float = TARGET_WORST_PCT,
          resolution: float = RESOLUTION_PCT) -> str:
    """One measure against the target: "above" (a cost is measured, the interval's lower end
    above 0, and the mean is over the target), "met" (the interval resolves it, half-width <=
    ``resolution``, with the mean <= target and the upper end <= worst), else "unresolved" (the
    interval cannot tell: the job's own noise is too large for the pairs there were)."""
    if mean > target and ci[0] > 0:
        return "above"
    if mean <= target and ci[1] <= worst and (ci[1] - ci[0]) / 2 <= resolution:
        return "met"
    return "unresolved"


def probe_applies(t: dict) -> bool:
    seen = t.get("probe_seen_pct")
    return seen is None or not seen < PROBE_MIN_SEEN_PCT


def calibration_ms(name: str) -> float | None:
    """The stop a calibration target injects after each poll, ms; None for a plain target."""
    if CALIBRATION_SEP not in name:
        return None
    base, _, rest = name.partition(CALIBRATION_SEP)
    try:
        if not rest.endswith("ms") or rest != rest.strip():
            raise ValueError
        ms = float(rest[:-2])
    except ValueError:
        raise ValueError(f"calibration target {name!r}: want <target>{CALIBRATION_SEP}<ms>ms") from None
    if base not in TARGETS or not 0 < ms <= 100:
        raise ValueError(f"calibration target {name!r}: unknown target or a stop outside (0, 100] ms")
    return ms


def base_target(name: str) -> str:
    return name.partition(CALIBRATION_SEP)[0]


def found(mean: float, ci: list[float], injected: float) -> str:
    """What a measure made of a known, injected cost: "found" (its interval holds the injected
    cost and is above 0), "seen, off" (above 0, but the interval misses it), "missed"."""
    if any(math.isnan(x) for x in (mean, *ci)) or ci[0] <= 0:
        return "missed"
    return "found" if ci[0] <= injected <= ci[1] else "seen, off"


def verdict(t: dict) -> str:
    """"met"; "NOT met (what)": a cost measured above the target; "not resolved (what)": an
    interval too wide to say. Both can show: "NOT met (sampler CPU); not resolved (slowdown)".
    "met at the polls (...)": the windows' slowdown could not tell, but the slowdown at the
    polls and the probe (where it applies) both meet the target, and nothing is above it. A
    calibration target is judged on whether its measures found the cost injected."""
    if t.get("injected_pct") is not None:
        inj = t["injected_pct"]
        parts = [f"at the polls {found(t['polls_slowdown_pct'], t['polls_ci95_pct'], inj)}",
                 f"windows {found(t['slowdown_pct'], t['ci95_pct'], inj)}"]
        if probe_applies(t):
            parts.append(f"probe {found(t['lost_pct'], t['lost_ci95_pct'], inj)}")
        return f"calibration ({inj:.2f} % injected): " + ", ".join(parts)
    above, unresolved = [], []
    # Over windows: the interval with the speed reference as a control variate where there is one
    # (the same mean; only the host's shared noise taken out).
    if t.get("adj_ci95_pct"):
        measures = [("slowdown", t["slowdown_adj_pct"], t["adj_ci95_pct"])]
    else:
        measures = [("slowdown", t["slowdown_pct"], t["ci95_pct"])]
    if t.get("polls_ci95_pct") is not None:
        measures.append(("slowdown at the polls", t["polls_slowdown_pct"], t["polls_ci95_pct"]))
    if probe_applies(t):
        measures.append(("lost time", t["lost_pct"], t["lost_ci95_pct"]))
    for label, mean, ci in measures:
        j = judge(mean, ci)
        if j == "above":
            above.append(label)
        elif j == "unresolved":
            unresolved.append(label)
    if not t["sampler_cpu_pct"] <= TARGET_CPU_PCT:
        above.append("sampler CPU")
    parts = []
    if above:
        parts.append(f"NOT met ({', '.join(above)})")
    if unresolved == ["slowdown"] and not above and len(measures) > 1 and measures[1][0] == "slowdown at the polls":
        return "met at the polls (slowdown over windows: not resolved)"
    if unresolved:
        parts.append(f"not resolved ({', '.join(unresolved)})")
    return "; ".join(parts) or "met"


# --------------------------------------------------------------------------- planning


# The window loop starts another pair only if it ends 10 % of a pair before the deadline.
PAIR_RESERVE = 1.1


def plan_windows(remaining_s: float, cycle_s: float, window_s: float) -> int:
    """How many windows (odd, at least 3) fit in ``remaining_s``: each ends on the first cycle
    boundary after ``window_s``, so it runs half a cycle over on average, and the last pair
    leaves PAIR_RESERVE - 1 of a pair spare."""
    n = int(remaining_s / (window_s + cycle_s / 2) - 2 * (PAIR_RESERVE - 1))
    return max(3, n if n % 2 == 1 else n - 1)


def window_length(remaining_s: float, cycle_s: float, base_s: float, stacks_per_s: float | None,
                  pairs_done: int | None = None) -> float:
    """A window's length: ``base_s``, at least MIN_CYCLES_PER_WINDOW cycles (a checkpoint's
    period is its cycle), and long enough for STACKS_PER_WINDOW main stacks at the sampler's
    steady rate. The stacks give way (down to the cycles' floor) where they would leave fewer
    than MIN_PAIRS pairs; the floor does not. ``pairs_done``: None before the first window (the
    plan is D A D ... A D in ``remaining_s``), else the pairs already measured (the plan is the
    pairs A D still to come)."""
    floor = max(base_s, MIN_CYCLES_PER_WINDOW * cycle_s)
    w = floor
    if stacks_per_s and stacks_per_s > 0:
        w = max(w, STACKS_PER_WINDOW / stacks_per_s)
    need = 2 * MIN_PAIRS + 1 if pairs_done is None else 2 * (MIN_PAIRS - pairs_done)
    spare = 2 * (PAIR_RESERVE - 1)  # the window loop's reserve, in windows
    if need > 0 and remaining_s / (w + cycle_s / 2) - spare < need:
        fit = remaining_s / (need + spare + 0.5) - cycle_s / 2  # and half a window spare
        w = max(floor, min(w, fit))
    return w


def target_deadline(now: float, run_end: float, weights_left: list[float]) -> float:
    """This target's end: its weight's share of what is left of the run (``weights_left``: its
    own first, then those still to run), less the time to stop its job. What it leaves unused
    goes to the ones after it."""
    share = (run_end - now) * weights_left[0] / sum(weights_left)
    return now + share - CLOSE_MARGIN_S


def chunk_rates(bounds: list[tuple], since: float, chunk_s: float = WARM_CHUNK_S) -> list[float]:
    """Steps/s over consecutive chunks of whole cycles (each at least ``chunk_s``) from the first
    boundary after monotonic ``since``; a last, shorter chunk is left out."""
    i = bisect.bisect_right(bounds, since, key=lambda r: r[1])
    out = []
    j = i
    for k in range(i + 1, len(bounds)):
        if bounds[k][1] - bounds[j][1] >= chunk_s:
            out.append((bounds[k][0] - bounds[j][0]) / (bounds[k][1] - bounds[j][1]))
            j = k
    return out


def warmed(rates: list[float], k: int = WARM_CHUNKS, trend_pct: float = WARM_TREND_PCT,
           max_cv_pct: float = WARM_CV_PCT) -> bool:
    """The last ``k`` chunk rates are steady: the means of their two halves within
    ``trend_pct`` % (or within two standard errors of their difference, where the job's own
    noise is larger), and their spread around each half's mean under ``max_cv_pct``."""
    if len(rates) < k or k < 4:
        return False
    last = rates[-k:]
    a, b = last[:k // 2], last[k // 2:]
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    if ma <= 0 or mb <= 0:
        return False
    pooled = math.sqrt((sum((x - ma) ** 2 for x in a) + sum((x - mb) ** 2 for x in b)) / (k - 2))
    cv = 100.0 * pooled / ((ma + mb) / 2)
    se = cv * math.sqrt(1 / len(a) + 1 / len(b))
    return cv <= max_cv_pct and 100.0 * abs(mb / ma - 1) <= max(trend_pct, 2 * se)


def steady_rate(cpu_s: float, stacks: int, budget: float, max_rate: float) -> float | None:
    """Main stacks/s the sampler settles to: its CPU budget (cores) over its CPU per main stack
    (worker dumps and process details included), at most ``max_rate``."""
    if stacks <= 0 or cpu_s <= 0:
        return None
    return min(max_rate, budget * stacks / cpu_s)


def parse_cpu_list(text: str) -> list[int]:
    """"0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


def cpu_cores(allowed: list[int]) -> list[list[int]]:
    """The allowed CPUs grouped by physical core (hyperthread siblings together)."""
    seen: set[int] = set()
    cores = []
    for c in sorted(allowed):
        if c in seen:
            continue
        try:
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") as f:
                sib = parse_cpu_list(f.read())
        except (OSError, ValueError):
            sib = [c]
        group = sorted(x for x in sib if x in allowed and x not in seen) or [c]
        seen.update(group)
        cores.append(group)
    return cores


def plan_cpus(cores: list[list[int]]) -> dict:
    """Where each part runs. ``cores``: CPUs by physical core. The harness gets the first core,
    the job's main thread one CPU of the second (its siblings left idle), the job's other
    threads half of the remaining cores; the rest stay free. The sampler and py-spy are not
    pinned (gputop pins nothing): ``sampler`` is every CPU."""
    every = sorted(c for core in cores for c in core)
    plan = {"harness": None, "job_main": None, "job_other": None, "free": [], "sampler": every}
    if len(every) < 2:
        return dict(plan, mode="off", note="one CPU: nothing pinned")
    if len(cores) >= 3:
        rest = cores[2:]
        k = max(1, len(rest) // 2)
        return dict(plan, mode="full", harness=cores[0], job_main=[cores[1][0]],
                    job_other=[c for core in rest[:k] for c in core],
                    free=sorted(cores[1][1:] + [c for core in rest[k:] for c in core]),
                    note="job main thread alone on its core; sampler and py-spy unpinned")
    # Two cores (or one with siblings): the job's main thread gets one CPU to itself; its other
    # threads share the harness's.
    return dict(plan, mode="degraded", harness=[every[0]], job_main=[every[-1]], job_other=[every[0]],
                free=every[1:-1],
                note=f"{len(every)} CPUs: the job's other threads share the harness's CPU; sampler and py-spy unpinned")


# --------------------------------------------------------------------------- the targets


def pin_job(main_cpus: list[int], other_cpus: list[int]) -> int:
    """Every thread of this process and of its children (DataLoader workers) onto
    ``other_cpus``, then this (the main) thread alone onto ``main_cpus``. Threads started later
    inherit their starter's. Returns how many threads were moved."""
    import psutil

    me = threading.get_native_id()
    procs = [psutil.Process()]
    try:
        procs += psutil.Process().children(recursive=True)
    except psutil.Error:
        pass
    moved = 0
    for p in procs:
        try:
            tids = [t.id for t in p.threads()]
        except psutil.Error:
            continue
        for tid in tids:
            if tid == me:
                continue
            try:
                os.sched_setaffinity(tid, other_cpus)
                moved += 1
            except OSError:
                pass  # a thread that ended meanwhile
    os.sched_setaffinity(0, main_cpus)
    return moved


def probe_account(state: dict, t: float, t1: float, saving: bool, saves: int) -> None:
    """One sleep of the lost-time probe, from ``t`` to ``t1``, begun with ``saving`` (a checkpoint
    in progress) and ``saves`` (checkpoints finished) as read before it. Lateness beyond the
    slack is lost time, unless a checkpoint overlapped the sleep: it holds the GIL, so the probe
    wakes late for the save's own reason, and the sleep counts as blind time instead."""
    if saving or state["saving"] or state["saves"] != saves:
        state["blind"] += t1 - t
        return
    late = t1 - t - PROBE_SLEEP_S
    if late > PROBE_SLACK_S:
        state["lost"] += late - PROBE_SLACK_S


def run_target(name: str, fd: int, device: str, ckpt: str | None, cpus: dict | None) -> None:
    """The training job: writes a record at each cycle boundary, with the probe thread."""
    if cpus:
        # Start as an unpinned job does (the harness's own CPU is what it inherited): its pools
        # and workers are sized by every CPU. pin_job moves them before the windows.
        os.sched_setaffinity(0, cpus["all"])
    import torch

    cuda = device == "cuda"
    dev = torch.device(device)
    # saving: a checkpoint in progress; saves: finished ones (counted at the end, so a save that
    # starts and ends inside one probe sleep still shows).
    state = {"lost": 0.0, "blind": 0.0, "saving": False, "saves": 0, "gc": 0.0, "gc_t0": 0.0}

    def gc_time(phase: str, info: dict) -> None:
        if phase == "start":
            state["gc_t0"] = time.perf_counter()
        else:
            state["gc"] += time.perf_counter() - state["gc_t0"]

    def probe() -> None:
        while True:
            saving, saves = state["saving"], state["saves"]
            t = time.perf_counter()
            time.sleep(PROBE_SLEEP_S)
            probe_account(state, t, time.perf_counter(), saving, saves)

    big = cuda  # GPU sizes; the CPU run is for checking the bench
    if not cuda:
        torch.set_flush_denormal(True)
    job_cpus = len(set(cpus["job_main"]) | set(cpus["job_other"])) if cpus else (os.cpu_count() or 1)
    if name != "many-threads":
        # One intra-op thread: these targets' CPU ops are too small for the pool, whose spinning
        # threads would only contend. (Set before any other: a pool started at 1 thread stays
        # smaller than one started at 64, so many-threads sets its size first.)
        torch.set_num_threads(1)

    def mlp(width: int, depth: int, head: list | None = None) -> torch.nn.Module:
        layers: list[torch.nn.Module] = list(head or [])
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
        return torch.nn.Sequential(*layers).to(dev)

    def amp():
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)

    batches = None
    x_fixed = None
    if name == "many-threads":
        torch.set_num_threads(INTRA_OP_MANY)
        # Start the intra-op pools (BLAS's and ATen's parallel_for): their threads exist from the
        # first parallel CPU op on, and stay.
        torch.ones(512, 512) @ torch.ones(512, 512)
        torch.ones(1 << 22).mul_(2)
        if not cuda:
            # The GPU's work runs on the CPU here, with a thread per CPU of the job (libgomp then
            # ends the rest of the pool: the CPU run has fewer threads than the CUDA one).
            torch.set_num_threads(job_cpus)
        vocab, seq = (8192, 256) if big else (1024, 32)
        width = 4096 if big else 128
        model = mlp(width, 3, head=[torch.nn.Embedding(vocab, width)])

        class Tokens(torch.utils.data.Dataset):
            def __len__(self) -> int:
                return 1 << 30

            def __getitem__(self, i: int) -> torch.Tensor:
                return (torch.arange(seq) * 7 + i) % vocab

        # Workers far ahead of the loop (8 x 8 batches): the step waits on the GPU, not on them.
        loader = torch.utils.data.DataLoader(Tokens(), batch_size=16 if big else 4, num_workers=8,
                                             pin_memory=cuda, persistent_workers=True, prefetch_factor=8)
        batches = iter(loader)
    elif name == "cpu-loading":
        width = 1024 if big else 128
        model = mlp(width, 2)

        class Images(torch.utils.data.Dataset):
            def __init__(self) -> None:
                self.base = torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(0))

            def __len__(self) -> int:
                return 1 << 30

            def __getitem__(self, i: int) -> torch.Tensor:
                x = self.base + (i % 13)
                x = (x - x.mean()) / (x.std() + 1e-6)
                return torch.flip(x, (2,)).reshape(-1)[:width]

        loader = torch.utils.data.DataLoader(Images(), batch_size=64, num_workers=0)
        batches = iter(loader)
    elif name == "checkpoint":
        width = 2048 if big else 512
        model = mlp(width, 4)  # ~17M parameters on the GPU: a 67 MB checkpoint
    elif name == "launch-bound":
        width = 256 if big else 64
        model = mlp(width, 16)
    elif name == "healthy-bf16":
        width = 4096 if big else 512
        model = mlp(width, 4)
    else:
        raise SystemExit(f"unknown target {name}")
    # Learning rate 0: the optimizer runs every kernel, the weights stay where they are.
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    if batches is None:
        batch = {"launch-bound": 32, "healthy-bf16": 4096 if big else 256, "checkpoint": 1024 if big else 128}[name]
        x_fixed = torch.randn(batch, width, device=dev, generator=None)
    record_every = SYNC_EVERY if cuda else 1  # on the CPU every step is synchronous
    if name == "checkpoint":
        record_every = CHECKPOINT_EVERY
    staging = None
    out = None
    if ckpt is not None:
        # Preallocated host buffers (pinned on CUDA) and one file rewritten in place: every save
        # does the same work, as checkpointing libraries arrange it.
        staging = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=cuda) for k, v in model.state_dict().items()}
        out = open(ckpt, "r+b")

    def save() -> None:
        state["saving"] = True
        for k, v in model.state_dict().items():
            staging[k].copy_(v, non_blocking=cuda)
        if cuda:
            torch.cuda.current_stream().synchronize()
        out.seek(0)
        torch.save(staging, out)
        out.flush()
        state["saves"] += 1
        state["saving"] = False

    def step(steps: int) -> None:
        x = x_fixed if batches is None else next(batches).to(dev, non_blocking=cuda)
        with amp():
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if steps % SYNC_EVERY == 0:
            loss.item()  # logging, as real loops do: bounds how far the queue runs ahead
        if out is not None and steps % CHECKPOINT_EVERY == 0:
            save()

    for i in range(1, 41):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    # The time the job spends in its garbage collector goes into each record: a full pass over
    # the objects torch made would be the job's own noise (on these loops it measured ~0).
    gc.callbacks.append(gc_time)
    threading.Thread(target=probe, name="lost-time-probe", daemon=True).start()
    pinned = pin_job(cpus["job_main"], cpus["job_other"]) if cpus else 0
    desc = torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores)"
    print(json.dumps({"ready": True, "device": desc, "torch": torch.__version__, "record_every": record_every,
                      "intra_op_threads": torch.get_num_threads(),
                      "main_cpus": sorted(os.sched_getaffinity(0)), "pinned_tasks": pinned,
                      "ckpt_bytes": os.path.getsize(ckpt) if ckpt else None}), flush=True)
    steps = 0
    while True:
        steps += 1
        step(steps)
        os.write(fd, RECORD.pack(steps, time.monotonic(), state["lost"], state["blind"], state["gc"],
                                 steps % record_every == 0))


# --------------------------------------------------------------------------- the harness


def shm_room() -> int:
    """Bytes free in /dev/shm, 0 where there is none (a container's default is 64 MB)."""
    try:
        if not os.access("/dev/shm", os.W_OK):
            return 0
        st = os.statvfs("/dev/shm")
        return st.f_bavail * st.f_frsize
    except OSError:
        return 0


def read_records(rfd: int, rec: struct.Struct, take) -> None:
    """Fixed-size records off a pipe until its writer closes it, handed to ``take`` a read's worth
    at a time (a record split across two reads waits for its rest); then the pipe is closed."""
    buf = b""
    while True:
        try:
            chunk = os.read(rfd, 1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            break
        buf += chunk
        n = len(buf) // rec.size
        take([rec.unpack_from(buf, i * rec.size) for i in range(n)])
        buf = buf[n * rec.size:]
    os.close(rfd)


class Job:
    """The target process; a thread reads its boundary records off the pipe."""

    def __init__(self, name: str, device: str, cpus: dict | None = None) -> None:
        self.name = name
        self.ckpt = None
        if name == "checkpoint":
            where = "/dev/shm" if shm_room() >= SHM_ROOM_BYTES else None
            fd, self.ckpt = tempfile.mkstemp(prefix="attach-cost-", suffix=".pt", dir=where)
            os.close(fd)
        rfd, wfd = os.pipe()
        argv = [sys.executable, __file__, "--run-target", name, "--fd", str(wfd), "--device", device]
        if self.ckpt:
            argv += ["--ckpt", self.ckpt]
        if cpus:
            argv += ["--cpus", json.dumps({"all": cpus["sampler"], "job_main": cpus["job_main"],
                                           "job_other": cpus["job_other"]})]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, pass_fds=(wfd,))
        os.close(wfd)
        self.pid = self.proc.pid
        self.bounds: list[tuple[int, float, float, float, float]] = []  # (steps, monotonic s, lost s, blind s, gc s)
        self.steps: list[tuple[int, float]] = []  # (steps, monotonic s) after every step
        self.cond = threading.Condition()
        self.eof = False
        self.reader = threading.Thread(target=self._read, args=(rfd,), daemon=True)
        self.reader.start()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"target {name} exited with {self.proc.wait()}")
        self.info = json.loads(line)

    def _read(self, rfd: int) -> None:
        def take(recs: list[tuple]) -> None:
            with self.cond:
                self.steps.extend((r[0], r[1]) for r in recs)
                self.bounds.extend(r[:5] for r in recs if r[5])
                self.cond.notify_all()

        read_records(rfd, RECORD, take)
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait(self, pred, timeout: float = 60.0):
        """Wait until ``pred(bounds)`` is not None, and return it."""
        with self.cond:
            end = time.monotonic() + timeout
            while True:
                got = pred(self.bounds)
                if got is not None:
                    return got
                left = end - time.monotonic()
                if self.eof or left <= 0:
                    raise RuntimeError(f"target {self.name}: no progress (exit {self.proc.poll()})")
                self.cond.wait(min(left, 1.0))

    def first_after(self, t: float, at_least: int = 0) -> int:
        """Wait for the first boundary later than monotonic ``t`` (and at index ``at_least`` or on)."""
        def pred(b):
            i = max(at_least, bisect.bisect_right(b, t, key=lambda r: r[1]))
            return i if i < len(b) else None
        return self.wait(pred)

    def threads(self) -> tuple[int, int]:
        """Threads of the job's main process, and of it with its children."""
        import psutil

        p = psutil.Process(self.pid)
        own = p.num_threads()
        return own, own + sum(c.num_threads() for c in p.children(recursive=True))

    def close(self) -> None:
        import psutil

        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        for k in kids:
            try:
                k.kill()
            except psutil.Error:
                pass
        self.proc.kill()
        self.proc.wait(30)
        self.reader.join(5)
        if self.ckpt:
            try:
                os.unlink(self.ckpt)
            except OSError:
                pass


# Times in PySpySource's state, moved on by the time spent detached, so that its clocks stand
# still between attached windows (see the module's docstring). Missing ones are skipped.
_MONO_FIELDS = ("_next_cost", "_started", "_main_since", "_confirmed_at")
_WALL_FIELDS = ("_next_proc", "_next_worker", "_retry_at")
_BUCKETS = ("_cpu", "_pause")


def shift_clocks(src, dt: float) -> None:
    for name in _BUCKETS:
        b = getattr(src, name, None)
        if b is not None and hasattr(b, "t"):
            b.t += dt
    for name in _MONO_FIELDS + _WALL_FIELDS:
        v = getattr(src, name, None)
        if isinstance(v, float) and math.isfinite(v):
            setattr(src, name, v + dt)
    hist = getattr(src, "_history", None)
    if hist is not None:
        moved = [(t + dt, tot) for t, tot in hist]
        hist.clear()
        hist.extend(moved)


class Sampler:
    """gputop's sampler on the job, polled on its own thread as the pipeline polls it, only while
    attached; its clocks stand still while detached. Its CPU (thread + py-spy processes) is
    metered per attached window. Its thread (and so the py-spy processes it starts) runs on
    ``cpus``: every CPU, as gputop, which sets no affinity, runs."""

    def __init__(self, pid: int, cpus: list[int] | None = None, inject_stop_s: float = 0.0) -> None:
        from gputop.session import stack_sampler
        from gputop.store import Store

        self.src = stack_sampler(pid)
        self.store = Store()
        self.cpus = cpus
        # Each poll that dumped, (start, end) on the monotonic clock, the job's clock too; and
        # for a calibration, the job stopped that long after each of them (what was applied).
        self.poll_log: list[tuple[float, float]] = []
        self.inject_stop_s = inject_stop_s
        self.stopped_s = 0.0
        self.on = threading.Event()
        self.gate = threading.Lock()  # held for a whole poll: detach waits on it
        self.quit = False
        self.cpu = 0.0
        self.stacks = 0
        self.polls = 0
        self.off_total = 0.0
        self.off_since = time.monotonic()
        self.next_poll = 0.0  # on the attached-time clock
        self.thread = threading.Thread(target=self._run, name="gputop-sampler", daemon=True)
        self.thread.start()

    def vnow(self) -> float:
        return time.monotonic() - self.off_total

    def _poll(self) -> None:
        from gputop.model import StackSample

        t0 = time.thread_time()
        tot = getattr(self.src, "_totals", None)
        dumps0 = tot.dumps if tot is not None else 0
        w0 = time.monotonic()
        out = self.src.poll()
        self.cpu += time.thread_time() - t0
        w1 = time.monotonic()
        if (tot.dumps if tot is not None else 0) != dumps0 or w1 - w0 >= 0.002:
            if self.inject_stop_s > 0:
                # The known cost of a calibration: the job stopped outright, after the dump.
                os.kill(self.src.pid, signal.SIGSTOP)
                s0 = time.monotonic()
                time.sleep(self.inject_stop_s)
                os.kill(self.src.pid, signal.SIGCONT)
                w1 = time.monotonic()
                self.stopped_s += w1 - s0
            self.poll_log.append((w0, w1))
        self.stacks += sum(1 for s in out if isinstance(s, StackSample) and s.is_main and s.pid == self.src.pid)
        self.store.add(out)
        self.polls += 1
        self.next_poll = self.vnow() + self.src.interval

    def _run(self) -> None:
        if self.cpus:
            try:
                os.sched_setaffinity(0, self.cpus)  # this thread, not the harness's
            except OSError:
                pass
        while not self.quit:
            if not self.on.wait(0.05):
                continue
            wait = self.next_poll - self.vnow()
            if wait > 0:
                time.sleep(min(wait, 0.02))
                continue
            with self.gate:
                if self.on.is_set():
                    self._poll()

    def spent(self) -> float:
        """The sampler's CPU seconds so far: its thread and its (finished) py-spy processes."""
        return self.cpu + children_cpu()

    def first_look(self, settle_s: float) -> dict:
        """Attach as a user does (the first, blocking look, on the sampler's thread), then spend
        the start-up burst and stay attached ``settle_s``: the windows see the steady rate a long
        attach settles to, which the settle's CPU per main stack estimates."""
        self.attach()
        end = time.monotonic() + 30.0
        while self.polls < 1 and time.monotonic() < end:
            time.sleep(0.005)
        with self.gate:
            cpu = getattr(self.src, "_cpu", None)
            if cpu is not None and hasattr(cpu, "level"):
                cpu.level = min(cpu.level, 0.0)
            c0, s0 = self.spent(), self.stacks
        time.sleep(settle_s)
        self.detach()
        budget = getattr(getattr(self.src, "_cpu", None), "rate", None)
        cpu_s, stacks = self.spent() - c0, self.stacks - s0
        rate = steady_rate(cpu_s, stacks, budget, self.src.rate) if budget else None
        return {"settle_s": settle_s, "cpu_s": cpu_s, "stacks": stacks, "stacks_per_s_steady": rate}

    def attach(self) -> None:
        now = time.monotonic()
        dt = now - self.off_since
        self.off_total += dt
        shift_clocks(self.src, dt)
        self.on.set()

    def detach(self) -> None:
        self.on.clear()
        with self.gate:  # a poll in flight finishes first
            pass
        self.off_since = time.monotonic()

    def close(self) -> None:
        self.on.clear()
        self.quit = True
        self.thread.join(10)


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def sched_snapshot(pid: int, cpu: int | None) -> dict:
    """The job's main thread's time on a CPU and waiting for one (ns, /proc schedstat), and the
    host's steal time (s) on ``cpu`` (all CPUs where None). Missing ones are left out."""
    out: dict = {"t": time.monotonic()}
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            run, wait = f.read().split()[:2]
        out["run_ns"], out["wait_ns"] = int(run), int(wait)
    except (OSError, ValueError):
        pass
    key = "cpu" if cpu is None else f"cpu{cpu}"
    try:
        with open("/proc/stat") as f:
            for line in f:
                parts = line.split()
                if parts and parts[0] == key and len(parts) > 8:
                    out["steal_s"] = int(parts[8]) / _TICK
                    break
    except (OSError, ValueError):
        pass
    return out


def sched_delta(a: dict, b: dict, ncpu: int = 1) -> dict:
    """% of the window between two snapshots: the main thread on a CPU, waiting for one, and the
    host's steal (per CPU)."""
    dur = b["t"] - a["t"]
    out = {}
    if dur <= 0:
        return out
    if "run_ns" in a and "run_ns" in b:
        out["main_run_pct"] = (b["run_ns"] - a["run_ns"]) / 1e7 / dur
        out["main_wait_pct"] = (b["wait_ns"] - a["wait_ns"]) / 1e7 / dur
    if "steal_s" in a and "steal_s" in b:
        out["steal_pct"] = 100.0 * (b["steal_s"] - a["steal_s"]) / dur / max(1, ncpu)
    return out


# The speed reference: a pure-Python loop on a free CPU of its own, counting its work per second
# of its own CPU time (so that being preempted does not slow it, only a slower CPU does).
SPEED_REF_PERIOD_S = 0.05
SPEED_REF = struct.Struct("=ddq")  # monotonic s, the loop's CPU s, iterations
_SPEED_REF_CODE = """
import os, struct, sys, time
fd, cpu, period = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
os.sched_setaffinity(0, [cpu])
rec = struct.Struct("=ddq")
table = list(range(4096))
n = 0
nxt = time.monotonic()
while True:
    acc = 0
    for i in range(2000):
        acc += table[(i * 7 + n) & 4095] ^ i
    n += 1
    now = time.monotonic()
    if now >= nxt:
        os.write(fd, rec.pack(now, time.thread_time(), n))
        nxt = now + period
"""


class SpeedRef:
    """How fast a CPU of this machine runs right now, beside the job: the host's own slow and
    fast spells (other tenants, frequency) are what the CPU-bound targets' step rates vary
    with, and what the sampler does not cause. Its windows' speeds are a covariate of the step
    rates (see ``adjusted``); the sampler could also slow it (a shared cache), which the
    reference's own attached-minus-detached change shows."""

    def __init__(self, cpu: int) -> None:
        rfd, wfd = os.pipe()
        self.cpu = cpu
        self.proc = subprocess.Popen([sys.executable, "-c", _SPEED_REF_CODE, str(wfd), str(cpu), str(SPEED_REF_PERIOD_S)],
                                     pass_fds=(wfd,))
        os.close(wfd)
        self.recs: list[tuple[float, float, int]] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, args=(rfd,), daemon=True)
        self.reader.start()

    @classmethod
    def start(cls, plan: dict) -> SpeedRef | None:
        free = plan.get("free") or []
        return cls(free[-1]) if free else None

    def _read(self, rfd: int) -> None:
        def take(recs: list[tuple]) -> None:
            with self.lock:
                self.recs.extend(recs)

        read_records(rfd, SPEED_REF, take)

    def window(self, t0: float, t1: float) -> dict:
        """Iterations per CPU second between the records nearest ``t0`` and ``t1``."""
        with self.lock:
            recs = self.recs
            i = bisect.bisect_left(recs, t0, key=lambda r: r[0])
            j = bisect.bisect_right(recs, t1, key=lambda r: r[0]) - 1
            if i >= len(recs) or j <= i:
                return {}
            (_, c0, n0), (_, c1, n1) = recs[i][:3], recs[j][:3]
        return {"ref_speed": (n1 - n0) / (c1 - c0)} if c1 > c0 else {}

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.reader.join(5)


def adjusted(slowdowns: list[float], ref_slowdowns: list[float]) -> dict | None:
    """The paired slowdowns with the reference's own paired slowdowns as a control variate:
    ``s - theta x``, theta the least-squares slope of s on x. With the sampler leaving the
    reference alone, x has mean 0 and this takes out only the noise the two share (by r²);
    ``ref_ci95_pct`` is the check: an interval of x above 0 says the sampler slowed the
    reference too (a shared cache), and then the adjusted mean would hide part of a real cost
    (``usable`` is False: the verdict keeps the plain interval). None without 4 pairs."""
    pts = [(a, b) for a, b in zip(slowdowns, ref_slowdowns) if not (math.isnan(a) or math.isnan(b))]
    if len(pts) < 4:
        return None
    xs, ys = [b for _, b in pts], [a for a, _ in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    theta = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    adj = [y - theta * x for x, y in zip(xs, ys)]
    boot, t = bootstrap_ci(adj), t_ci(adj)
    ref_ci = union(bootstrap_ci(xs), t_ci(xs))
    return {"slowdown_pct": statistics.fmean(adj), "ci95_pct": union(boot, t), "ci95_boot_pct": list(boot),
            "ci95_t_pct": list(t), "theta": theta, "r": correlation(xs, ys), "per_window_pct": adj,
            "ref_slowdown_pct": mx, "ref_ci95_pct": ref_ci, "usable": not ref_ci[0] > 0}


class GpuClock:
    """The GPU's SM clock and utilization (NVML), ten times a second on a thread of the
    harness, for the windows' diagnostics: a job that leaves the GPU idle much of the time
    (launch-bound, cpu-loading) runs at whatever clock the GPU's power management picks. None of
    it where NVML is missing."""

    def __init__(self, index: int = 0, period_s: float = 0.1) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.period_s = period_s
        self.samples: list[tuple[float, float, float]] = []  # (monotonic s, SM MHz, GPU busy %)
        self.quit = False
        self.thread = threading.Thread(target=self._run, name="gpu-clock", daemon=True)
        self.thread.start()

    @classmethod
    def start(cls) -> GpuClock | None:
        try:
            return cls()
        except Exception:  # no pynvml, no driver: the diagnostics are left out
            return None

    def _run(self) -> None:
        nv = self.nvml
        while not self.quit:
            try:
                mhz = nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM)
                util = nv.nvmlDeviceGetUtilizationRates(self.handle).gpu
                self.samples.append((time.monotonic(), float(mhz), float(util)))
            except Exception:
                return
            time.sleep(self.period_s)

    def window(self, t0: float, t1: float) -> dict:
        got = [s for s in self.samples[-2000:] if t0 <= s[0] <= t1]
        if not got:
            return {}
        return {"sm_mhz": statistics.fmean(s[1] for s in got), "gpu_util_pct": statistics.fmean(s[2] for s in got)}

    def close(self) -> None:
        self.quit = True
        self.thread.join(1)


def correlation(xs: list[float | None], ys: list[float | None]) -> float | None:
    """Pearson's r over the pairs where both are known (None with fewer than 5, or no spread)."""
    pts = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None and not math.isnan(x) and not math.isnan(y)]
    if len(pts) < 5:
        return None
    mx, my = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
    sxy = sum((x - mx) * (y - my) for x, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    syy = sum((y - my) ** 2 for _, y in pts)
    if sxx <= 0 or syy <= 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def window_stats(bounds: list[tuple], i0: int, i1: int) -> dict:
    """Steps/s between boundaries ``i0`` and ``i1`` on the job's clock, and the probe's lost time
    in % of the time it could see (its blind time, inside checkpoints, left out)."""
    b0, b1 = bounds[i0], bounds[i1]
    s0, t0, l0 = b0[:3]
    s1, t1, l1 = b1[:3]
    blind = (b1[3] - b0[3]) if len(b0) > 3 else 0.0
    gc_s = (b1[4] - b0[4]) if len(b0) > 4 else 0.0
    dur = t1 - t0
    seen = max(0.0, dur - blind)
    cyc = [bounds[i + 1][1] - bounds[i][1] for i in range(i0, i1)]
    per = (s1 - s0) / max(1, i1 - i0)
    return {
        "t0": t0, "dur_s": dur, "steps": s1 - s0, "rate": (s1 - s0) / dur,
        "rate_median_cycle": per / statistics.median(cyc),
        "lost_pct": 100.0 * (l1 - l0) / seen if seen > 0 else float("nan"),
        "probe_seen_pct": 100.0 * seen / dur, "cycles": i1 - i0, "gc_pct": 100.0 * gc_s / dur if dur > 0 else float("nan"),
    }


def _mean_of(wins: list[dict], key: str, attached: bool) -> float | None:
    xs = [w[key] for w in wins if w["attached"] == attached and w.get(key) is not None]
    return statistics.fmean(xs) if xs else None


def measure(name: str, device: str, args: argparse.Namespace, deadline: float, cpus: dict | None, log,
            gpu: GpuClock | None = None, ref: SpeedRef | None = None) -> dict:
    started = time.monotonic()
    stop_ms = calibration_ms(name)
    job = Job(base_target(name), device, cpus)
    try:
        ready = time.monotonic()
        sampler = Sampler(job.pid, cpus["sampler"] if cpus else None, (stop_ms or 0.0) / 1000.0)
        look = sampler.first_look(args.settle)
        # Warm-up, detached, until the step rate is steady (capped).
        since = time.monotonic()
        cap = max(args.warmup, min(args.warmup_max, WARM_MAX_SHARE * (deadline - since)))
        while True:
            time.sleep(0.25)
            with job.cond:
                rates = chunk_rates(job.bounds, since)
            took = time.monotonic() - since
            steady = took >= args.warmup and warmed(rates)
            if steady or took >= cap:
                break
        last = rates[-WARM_CHUNKS:]
        warm = {"s": took, "steady": steady, "chunks": len(rates),
                "last_rates": last, "last_cv_pct": cv_pct(last)}

        def recent(b):
            got = b[bisect.bisect_right(b, time.monotonic() - max(2.0, took / 2), key=lambda r: r[1]):]
            return got if len(got) >= 3 else None

        recent = job.wait(recent)
        cycle_s = statistics.median(recent[i + 1][1] - recent[i][1] for i in range(len(recent) - 1))
        window = window_length(deadline - time.monotonic(), cycle_s, args.window, look["stacks_per_s_steady"])
        nwin = plan_windows(deadline - time.monotonic(), cycle_s, window)
        if args.pairs:
            nwin = min(nwin, 2 * args.pairs + 1)
        rate_txt = "?" if look["stacks_per_s_steady"] is None else f"{look['stacks_per_s_steady']:.2f}"
        log(f"{name}: ready after {ready - started:.1f} s, warm-up {took:.1f} s ({'steady' if steady else 'NOT steady, capped'}, "
            f"last chunks CV {warm['last_cv_pct']:.2f} %), cycle {cycle_s * 1000:.1f} ms, sampler's steady rate "
            f"{rate_txt} stacks/s, windows of {window:.2f} s, about {nwin}")
        main_cpu = cpus["job_main"][0] if cpus else None
        ncpu = 1 if cpus else (os.cpu_count() or 1)
        wins: list[dict] = []
        i0 = job.first_after(time.monotonic())
        snap = sched_snapshot(job.pid, main_cpu)
        w = 0
        while True:
            attached = w % 2 == 1
            if attached:
                cpu0, st0 = sampler.spent(), sampler.stacks
                tot = getattr(sampler.src, "_totals", None)
                dumps0, pause0, block0 = (tot.dumps, tot.pause, tot.blocking) if tot is not None else (0, 0.0, 0)
                polls0, stopped0 = len(sampler.poll_log), sampler.stopped_s
                sampler.attach()
                time.sleep(max(0.0, job.bounds[i0][1] + window - time.monotonic()))
                sampler.detach()
                i1 = job.first_after(sampler.off_since, i0 + 1)
            else:
                i1 = job.first_after(job.bounds[i0][1] + window, i0 + 1)
            snap1 = sched_snapshot(job.pid, main_cpu)
            with job.cond:
                win = window_stats(job.bounds, i0, i1)
            win["attached"] = attached
            win["planned_s"] = window
            win.update(sched_delta(snap, snap1, ncpu))
            if gpu is not None:
                win.update(gpu.window(win["t0"], win["t0"] + win["dur_s"]))
            if ref is not None:
                win.update(ref.window(win["t0"], win["t0"] + win["dur_s"]))
            snap = snap1
            if attached:
                win["polls"] = sampler.poll_log[polls0:]
                win["injected_s"] = sampler.stopped_s - stopped0
                win["sampler_cpu_s"] = sampler.spent() - cpu0
                win["stacks"] = sampler.stacks - st0
                if tot is not None:
                    win["dumps"], win["pause_s"] = tot.dumps - dumps0, tot.pause - pause0
                    win["blocking"] = tot.blocking - block0
                cost = sampler.src.cost
                win["shown_pct"] = cost.job_cost_pct if cost is not None else None
            wins.append(win)
            log(f"{name} w{w:02d} {'A' if attached else 'D'} {win['dur_s']:.2f} s {win['rate']:.2f} steps/s "
                f"lost {win['lost_pct']:.3f} %"
                + (f" (probe sees {win['probe_seen_pct']:.0f} %)" if win["probe_seen_pct"] < 99.5 else "")
                + (f" main waits {win['main_wait_pct']:.2f} %" if "main_wait_pct" in win else "")
                + (f" SM {win['sm_mhz']:.0f} MHz" if "sm_mhz" in win else "")
                + (f" sampler {100 * win['sampler_cpu_s'] / win['dur_s']:.2f} %, {win['stacks']} stacks"
                   + (f" ({win['blocking']} blocking)" if win.get("blocking") else "") if attached else ""))
            i0 = i1
            w += 1
            if not attached and w >= 3:
                pairs = (w - 1) // 2
                pair_s = wins[-1]["dur_s"] + wins[-2]["dur_s"]
                if (args.pairs and pairs >= args.pairs) or time.monotonic() + PAIR_RESERVE * pair_s > deadline:
                    break
                # The sampler's rate as the A windows so far saw it (the settle's few stacks miss
                # the worker dumps and process reads that come every few seconds): the pairs to
                # come are sized by it.
                a_wins = [x for x in wins if x["attached"]]
                if len(a_wins) >= 2:
                    seen = sum(x["stacks"] for x in a_wins) / sum(x["dur_s"] for x in a_wins)
                    window = window_length(deadline - time.monotonic(), cycle_s, args.window, seen or None, pairs)
        own, total = job.threads()
        sampler.close()
        with job.cond:
            steps = list(job.steps)
        for win, polls in zip(wins, virtual_polls(wins)):
            t0, t1 = win["t0"], win["t0"] + win["dur_s"]
            near = at_polls(steps, t0, t1, polls, NEAR_SLACK_S, NEAR_SLACK_S, snap=True)
            wide = at_polls(steps, t0, t1, polls, NEAR_PRE_S, WIDE_POST_S)
            win.update(at_polls_pct=near["slowdown_pct"], near_share_pct=near["near_share_pct"],
                       wide_pct=wide["slowdown_pct"], wide_share_pct=wide["near_share_pct"])
        info = job.info
        ckpt_dir = os.path.dirname(job.ckpt) if job.ckpt else None
    finally:
        job.close()
    rates = [x["rate"] for x in wins]
    res = summarize(rates, [x["lost_pct"] for x in wins], [x["at_polls_pct"] for x in wins])
    speeds = [x.get("ref_speed") for x in wins]
    adj = adjusted(res["per_window_slowdown_pct"], paired_slowdowns(speeds)) if all(speeds) else None
    res["ref_adjusted"] = adj
    if adj is not None and adj["usable"]:
        res["slowdown_adj_pct"] = adj["slowdown_pct"]
        res["adj_ci95_pct"] = adj["ci95_pct"]
    med = paired_slowdowns([x["rate_median_cycle"] for x in wins])
    a = [x for x in wins if x["attached"]]
    a_s = sum(x["dur_s"] for x in a)
    shown = [x["shown_pct"] for x in a if x.get("shown_pct") is not None]
    stacks = [x["stacks"] for x in a]
    res.update(
        name=name,
        raw={"steps": [[n, round(t, 6)] for n, t in steps], "polls": [x.get("polls", []) for x in wins],
             "windows": [[x["t0"], x["dur_s"], x["attached"]] for x in wins]},
        threads=own,
        threads_with_children=total,
        sampler_cpu_pct=100.0 * sum(x["sampler_cpu_s"] for x in a) / a_s,
        injected_pct=100.0 * sum(x["injected_s"] for x in a) / a_s if stop_ms else None,
        injected_stop_ms=stop_ms,
        polls_per_s=sum(len(x["polls"]) for x in a) / a_s,
        near_share_pct=statistics.fmean(x["near_share_pct"] for x in a),
        near_span={"steps_around": NEAR_STEPS, "slack_s": NEAR_SLACK_S, "wide_s": [NEAR_PRE_S, WIDE_POST_S]},
        poll_s_median=statistics.median([b - a for x in a for a, b in x["polls"]] or [float("nan")]),
        wide=interval(paired_differences([x["wide_pct"] for x in wins])),
        wide_share_pct=statistics.fmean(x["wide_share_pct"] for x in a),
        shown_cost_pct=statistics.fmean(shown) if shown else None,
        stacks_per_s=sum(stacks) / a_s,
        stacks_per_a_window={"mean": statistics.fmean(stacks), "min": min(stacks),
                             "none": sum(1 for s in stacks if s == 0)},
        blocking_dumps=sum(x.get("blocking", 0) for x in a),
        pause_pct=100.0 * sum(x.get("pause_s", 0.0) for x in a) / a_s,
        slowdown_median_cycle_pct=statistics.fmean(med),
        steps_per_s_detached=statistics.fmean(rates[0::2]),
        probe_seen_pct=statistics.fmean(x["probe_seen_pct"] for x in wins),
        main_run_pct={"detached": _mean_of(wins, "main_run_pct", False), "attached": _mean_of(wins, "main_run_pct", True)},
        main_wait_pct={"detached": _mean_of(wins, "main_wait_pct", False), "attached": _mean_of(wins, "main_wait_pct", True)},
        steal_pct={"detached": _mean_of(wins, "steal_pct", False), "attached": _mean_of(wins, "steal_pct", True)},
        sm_mhz={"detached": _mean_of(wins, "sm_mhz", False), "attached": _mean_of(wins, "sm_mhz", True)},
        # What the step rate's own noise follows, over every window (r; None where unknown).
        rate_correlation={k: correlation(rates, [x.get(k) for x in wins])
                          for k in ("main_run_pct", "main_wait_pct", "steal_pct", "sm_mhz", "gpu_util_pct", "gc_pct",
                                    "ref_speed")},
        gc_pct={"detached": _mean_of(wins, "gc_pct", False), "attached": _mean_of(wins, "gc_pct", True)},
        device=info["device"],
        torch=info.get("torch"),
        intra_op_threads=info.get("intra_op_threads"),
        job_cpus={"main": info.get("main_cpus"), "other": cpus["job_other"] if cpus else None},
        checkpoint_dir=ckpt_dir,
        checkpoint_bytes=info.get("ckpt_bytes"),
        window_s=statistics.fmean(x["dur_s"] for x in wins),
        window_planned_s=wins[0]["planned_s"],  # from the settle's estimate; later pairs by the rate seen
        cycle_s=cycle_s,
        first_look=look,
        warmup=warm,
        target_wall_s=time.monotonic() - started,
        share_s=deadline + CLOSE_MARGIN_S - started,
        startup_s=ready - started,
        rates=rates,
        lost_pct_windows=[x["lost_pct"] for x in wins],
        windows=wins,
    )
    res["verdict"] = verdict(res)
    return res


def _fmt_pct(v: float | None, d: int = 2) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.{d}f} %"


def _fmt_ci(lo_hi: list[float], d: int = 2) -> str:
    return f"[{_fmt_pct(lo_hi[0], d)}, {_fmt_pct(lo_hi[1], d)}]"


def _md_row(t: dict) -> str:
    p, ci = _fmt_pct, _fmt_ci
    spw = t["stacks_per_a_window"]
    lost = f"{p(t['lost_pct'], 3)} {ci(t['lost_ci95_pct'], 3)}"
    if t["probe_seen_pct"] < 99.5:
        lost += f", sees {t['probe_seen_pct']:.0f} %" if probe_applies(t) else f" (n/a: sees {t['probe_seen_pct']:.0f} %)"
    wait = t["main_wait_pct"]
    waits = ("n/a" if wait["detached"] is None or wait["attached"] is None
             else f"{wait['detached']:.2f} / {wait['attached']:.2f} %")
    return (
        f"| {t['name']} | {t['threads']} ({t['threads_with_children']}) | {t['pairs']} × {t['window_s']:.2f} s | "
        f"{t['steps_per_s_detached']:.1f} | {t['detached_cv_pct']:.2f} % | "
        f"{p(t['slowdown_pct'])} {ci(t['ci95_pct'])}"
        + (f"; with the reference {p(t['slowdown_adj_pct'])} {ci(t['adj_ci95_pct'])} (r {t['ref_adjusted']['r']:+.2f})"
           if t.get("adj_ci95_pct") and t["ref_adjusted"].get("r") is not None else "")
        + " | "
        f"{p(t.get('polls_slowdown_pct'))} {ci(t.get('polls_ci95_pct') or [None, None])} "
        f"({t.get('polls_per_s', 0):.2f} polls/s of {1000 * t.get('poll_s_median', float('nan')):.0f} ms, near {t.get('near_share_pct', float('nan')):.0f} %"
        + (f"; wide: {p(t['wide']['mean_pct'])} {ci(t['wide']['ci95_pct'])}" if t.get("wide") else "") + ") | "
        f"{'—' if t.get('injected_pct') is None else format(t['injected_pct'], '.2f') + ' %'} | "
        f"{p(t['slowdown_trimmed_pct'])} {ci(t['trimmed_ci95_pct'])} | {lost} | "
        f"{t['sampler_cpu_pct']:.2f} % | {t['stacks_per_s']:.2f} ({spw['mean']:.1f}, min {spw['min']}) | {waits} | "
        f"{'n/a' if t['shown_cost_pct'] is None else format(t['shown_cost_pct'], '.2f') + ' %'} | {verdict(t)} |"
    )


def write_md(path: str, env: dict, targets: list[dict]) -> None:
    plan = env.get("cpu_plan") or {}
    mode = plan.get("mode", "off")
    if mode == "off":
        pin = f"nothing pinned ({plan.get('note', '--pin off')})"
    else:
        pin = (f"{mode}: the job's main thread on CPU {plan['job_main']}, its other threads on {plan['job_other']}, "
               f"the harness on {plan['harness']}, free {plan['free']}; gputop's sampler thread and its py-spy "
               f"processes unpinned (any of CPUs {plan['sampler'][0]}-{plan['sampler'][-1]}), as gputop runs")
    warm = "; ".join(f"{t['name']} {t['warmup']['s']:.1f} s{'' if t['warmup']['steady'] else ' (not steady: capped)'}"
                     for t in targets)
    intra = ", ".join(f"{t['name']} {t['intra_op_threads']}" for t in targets)
    counts = {}
    for t in targets:
        v = verdict(t)
        if v.startswith("calibration"):
            continue
        key = ("met" if v == "met" else "met at the polls" if v.startswith("met at the polls")
               else "NOT met" if v.startswith("NOT met") else "not resolved")
        counts[key] = counts.get(key, 0) + 1
    text = f"""# What attaching gputop's stack sampler costs the job

Run: {env['when']} on {env['host']}: {env['cpus']} CPUs, {targets[0]['device'] if targets else '?'}, Python
{env['python']}, torch {env.get('torch')}, py-spy {env['pyspy']}. The whole run in {env['wall_s']:.0f} s of a
{env['budget_s']:g} s budget, split by weight ({', '.join(f'{k} {v:g}' for k, v in WEIGHTS.items())});
detached and attached windows alternating on one running job per target. Produced by
`python bench/attach_cost.py {env['argv']}`.

| target | threads (with workers) | pairs × window | steps/s detached | detached CV | slowdown over windows, mean [95 % CI] | slowdown at the polls [95 % CI] | injected | trimmed mean [95 % CI] | lost time, probe [95 % CI] | sampler CPU, % of a core | stacks/s (per A window: mean, min) | job's main thread waiting for a CPU, D / A | gputop shows | verdict |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(_md_row(t) for t in targets)}

Verdicts: {', '.join(f'{v} {k}' for k, v in counts.items())}.

- *Setup*: CPUs {pin}.
  gputop sets no CPU affinity, so in real use its sampler and py-spy run wherever the scheduler
  puts them, the job's cores included, as here; a user's job is usually not pinned at all:
  pinning its main thread takes its own migrations and the harness off the step rate, not the
  sampler's competition.
  Intra-op threads: {intra} (1 where the target's CPU work is its loop: its ops are too small
  for the pool).
  Warm-up (detached, until the step rate is steady): {warm}.
- *window*: whole cycles of the job (10 steps between `loss.item()` calls on CUDA, one step on
  the CPU, one {CHECKPOINT_EVERY}-step checkpoint period in `checkpoint`), measured on the job's own
  clock at the cycle boundaries; at least {MIN_CYCLES_PER_WINDOW} cycles and {STACKS_PER_WINDOW:g} main stacks at the
  sampler's steady rate (fewer where that would leave under {MIN_PAIRS} pairs). *detached CV*: the
  detached windows' step rates, standard deviation over mean: the job's own noise at this
  window length.
- *slowdown*: 1 - steps/s attached ÷ mean of the detached windows before and after, averaged
  over the attached windows. The interval is the union of a moving-block bootstrap (blocks of 2
  pairs, as neighbouring pairs share a detached window) and a t interval with the lag-1
  covariance added (both are in the JSON). *trimmed mean*: {int(TRIM * 100)} % cut each side, a check on outliers only (it would
  hide a rare long stop).
- *with the reference*: a pure-Python loop on a free CPU of its own ({env.get('speed_ref_cpu')}) counts its work per second
  of its own CPU time: how fast this machine's CPUs run in each window (other tenants,
  frequency), which the sampler does not cause and the CPU-bound loops' step rates follow.
  Its paired slowdowns are a control variate: each pair's slowdown minus theta × the
  reference's paired slowdown, theta the least-squares slope; the noise the two share goes,
  by r². That holds while the sampler leaves the reference alone (its own slowdown then has
  mean 0): where the reference's interval lies above 0 (a cost on a shared cache, say, that
  the adjustment would take off the job's) the verdict keeps the plain interval; otherwise
  it uses this one. The reference's own change is in the JSON (`ref_adjusted.ref_ci95_pct`).
- *slowdown at the polls*: gputop's sampler does its work in polls (a py-spy process reading
  the job, /proc reads); between them its thread sleeps. Each attached window's polls are
  logged (start, end) and the job reports every step, and the window's rate is compared with
  its rate *away* from the polls, in the same window: `1 - steps/s over the window ÷ steps/s
  away from the polls`. "Near" a poll runs from {NEAR_STEPS} of the job's steps and {NEAR_SLACK_S * 1000:.0f} ms before it
  starts to {NEAR_STEPS} steps and {NEAR_SLACK_S * 1000:.0f} ms after it ends, on step records, so a step the poll slowed
  is inside whole and the steps are counted, not interpolated. A sampler that costs the job L
  s near its polls makes this L ÷ the window's length, the windows' slowdown, but measured
  against the job's speed in the same second, so its slow drifts and the machine's spells
  cancel. The detached windows are the control: the same computation with "virtual" polls at
  the offsets of the attached window's beside them (it finds the method's bias and the job's
  noise at that scale); the slowdown is attached minus the mean of the two controls beside it,
  with the intervals as above. Its variance grows with the near share p as p ÷ (1 − p): the
  first H100 run of it, with a fixed {NEAR_PRE_S * 1000:.0f} ms before and {WIDE_POST_S * 1000:.0f} ms after each poll (p about 40 %),
  could not resolve ±1 %; that span is still computed (*wide*), the check on a cost that
  lingers after a poll. What it cannot see: a cost spread evenly over the time away from the
  polls (the windows' slowdown can). The *calibration* rows check it sees what it must: the
  same target, with the sampler also stopping the job (SIGSTOP … SIGCONT) for a fixed time
  after each poll; *injected* is the time stopped over the attached time, what a right method
  reports.
- *lost time*: a probe thread in the job sleeps 2 ms at a time and adds up how late it wakes;
  attached minus detached, % of the time the probe sees. A job stopped by py-spy shows here
  first. In `checkpoint` the probe is blind inside each save (the job marks it; torch.save holds
  the GIL, so the probe would wake late for the save's own reason): *sees* is the share of the
  time it covers; the step rate covers the saves. Below {PROBE_MIN_SEEN_PCT:g} % seen it is not applicable.
- *sampler CPU*: gputop's sampling thread and its py-spy processes over the attached windows.
  *stacks/s*: main-thread stacks over the attached time, and per attached window.
- *waiting for a CPU*: the job's main thread's run-queue wait (/proc schedstat), % of the
  window, detached / attached: a sampler taking the job's core shows as a larger A.
- *gputop shows*: the cost the sampler estimates for itself (the status line, `advise`).
- *verdict*, for each slowdown and the lost time: *met*: mean ≤ {TARGET_SLOWDOWN_PCT} %, the
  interval's upper end ≤ {TARGET_WORST_PCT} % and its half-width ≤ {RESOLUTION_PCT} %; *NOT met*: a cost measured
  above the target (mean > {TARGET_SLOWDOWN_PCT} %, the interval's lower end above 0); *not resolved*: neither,
  the interval is too wide to say (the job's own noise, not a measured cost). The sampler's
  CPU: ≤ {TARGET_CPU_PCT} % of a core, else NOT met. *met at the polls*: every measure met but
  the slowdown over windows, which could not tell. A calibration: *found* where the interval
  is above 0 and holds the injected cost, *seen, off* above 0 but missing it, else *missed*.
"""
    labels = {"main_run_pct": "main thread on a CPU", "main_wait_pct": "main thread waiting for one",
              "steal_pct": "host steal", "sm_mhz": "GPU SM clock", "gpu_util_pct": "GPU busy",
              "gc_pct": "job's time in the garbage collector", "ref_speed": "the speed reference"}
    noise = []
    for t in targets:
        r = {k: v for k, v in (t.get("rate_correlation") or {}).items() if v is not None}
        if r:
            noise.append(f"{t['name']}: " + ", ".join(f"{labels[k]} {v:+.2f}" for k, v in r.items()))
    if noise:
        text += ("- *What the step rate follows* (Pearson r over all windows, to tell the job's own noise apart: the\n"
                 "  host, the GPU's clock, its main thread's CPU): " + "; ".join(noise) + ".\n")
    plain = [t for t in targets if t.get("injected_pct") is None]
    if plain:
        worst = max(plain, key=lambda t: t["ci95_pct"][1])
        text += (f"\nWorst upper bound over windows: `{worst['name']}`, "
                 f"{_fmt_pct(worst['ci95_pct'][1])} (slowdown {_fmt_pct(worst['slowdown_pct'])}).\n")
        near = [t for t in plain if t.get("polls_ci95_pct")]
        if near:
            w = max(near, key=lambda t: t["polls_ci95_pct"][1])
            text += (f"Worst upper bound at the polls: `{w['name']}`, "
                     f"{_fmt_pct(w['polls_ci95_pct'][1])} (slowdown {_fmt_pct(w['polls_slowdown_pct'])}).\n")
    with open(path, "w") as f:
        f.write(text)


def headline(t: dict) -> tuple[float, list[float], str]:
    """The slowdown a target's verdict rests on, the simplest that resolves it (met or above):
    over windows; over windows with the speed reference (where usable); at the polls; else the
    windows' own (unresolved). A calibration's: at the polls."""
    win = (t["slowdown_pct"], t["ci95_pct"], "windows")
    polls = (t.get("polls_slowdown_pct"), t.get("polls_ci95_pct"), "at the polls")
    if t.get("injected_pct") is not None and polls[1] is not None:
        return polls
    tries = [win]
    if t.get("adj_ci95_pct"):
        tries.append((t["slowdown_adj_pct"], t["adj_ci95_pct"], "windows, with the speed reference"))
    if polls[1] is not None:
        tries.append(polls)
    return next((m for m in tries if judge(m[0], m[1]) != "unresolved"), win)


def slim(t: dict) -> dict:
    """A target's result for attach_cost.json: ``slowdown_pct``/``ci95_pct`` are the measure
    its verdict rests on (``slowdown_measure`` names it; the windows' own are
    ``windows_slowdown_pct``/``windows_ci95_pct``), without the raw steps and the polls' times
    (attach_cost_raw.json has them)."""
    out = {k: v for k, v in t.items() if k != "raw"}
    mean, ci, measure = headline(t)
    out.update(windows_slowdown_pct=t["slowdown_pct"], windows_ci95_pct=t["ci95_pct"],
               slowdown_pct=mean, ci95_pct=ci, slowdown_measure=measure)
    out["windows"] = [{k: v for k, v in w.items() if k != "polls"} | {"polls": len(w.get("polls", []))}
                      for w in t["windows"]]
    return out


def environment(args: argparse.Namespace, plan: dict) -> dict:
    from gputop.sources.stacks import find_pyspy

    try:
        pv = subprocess.run([find_pyspy() or "py-spy", "--version"], capture_output=True, text=True).stdout.split()[-1]
    except (OSError, IndexError):
        pv = None
    return {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": None,  # the jobs' (the harness does not import it)
        "pyspy": pv,
        "budget_s": args.budget_s,
        "window_s": args.window,
        "warmup_s": [args.warmup, args.warmup_max],
        "settle_s": args.settle,
        "weights": WEIGHTS,
        "cpu_plan": plan,
        "argv": " ".join(sys.argv[1:]),
    }


def main() -> int:
    run_start = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="directory for attach_cost.json/.md")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help="wall time for the whole run, every target's start-up and warm-up included")
    ap.add_argument("--window", type=float, default=1.0, help="shortest window, seconds (whole cycles)")
    ap.add_argument("--warmup", type=float, default=3.0, help="least seconds of detached warm-up")
    ap.add_argument("--warmup-max", type=float, default=15.0, help="most seconds of detached warm-up")
    ap.add_argument("--settle", type=float, default=2.5, help="seconds attached after the first look")
    ap.add_argument("--pairs", type=int, default=None, help="at most this many attached windows per target")
    ap.add_argument("--pin", default="auto", choices=("auto", "off"),
                    help="pin the job and the harness to CPUs of their own (the sampler stays unpinned)")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--run-target", help=argparse.SUPPRESS)
    ap.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    ap.add_argument("--cpus", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_target:
        run_target(args.run_target, args.fd, args.device, args.ckpt, json.loads(args.cpus) if args.cpus else None)
        return 0
    names = [n for n in args.targets.split(",") if n]
    unknown = [n for n in names if base_target(n) not in TARGETS]
    if unknown:
        ap.error(f"unknown targets: {', '.join(unknown)}")
    for n in names:
        try:
            calibration_ms(n)
        except ValueError as e:
            ap.error(str(e))
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    if args.pin == "auto":
        plan = plan_cpus(cpu_cores(allowed))
    else:
        plan = {"mode": "off", "note": "--pin off", "harness": None, "job_main": None, "job_other": None,
                "free": [], "sampler": allowed}
    cpus = None
    if plan["mode"] != "off":
        os.sched_setaffinity(0, plan["harness"])  # this thread, and the threads it starts from now on
        cpus = plan
    env = environment(args, plan)
    run_end = run_start + args.budget_s
    results = []

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - run_start:6.1f} s] {msg}", flush=True)

    log(f"CPUs: {plan['mode']}: {plan.get('note', '')}"
        + (f" (harness {plan['harness']}, job main {plan['job_main']}, job other {plan['job_other']})" if cpus else ""))
    gpu = GpuClock.start() if args.device == "cuda" else None
    ref = SpeedRef.start(plan) if cpus else None
    env["speed_ref_cpu"] = ref.cpu if ref else None
    if ref is not None and cpus is not None:
        # Its CPU is no longer free for the job or the harness (the sampler may still go there).
        plan["free"] = [c for c in plan["free"] if c != ref.cpu]
    env["gpu_clock_diagnostics"] = gpu is not None
    for k, name in enumerate(names):
        deadline = target_deadline(time.monotonic(), run_end, [WEIGHTS[base_target(n)] for n in names[k:]])
        t = measure(name, args.device, args, deadline, cpus, log, gpu, ref)
        log(f"== {name}: slowdown {t['slowdown_pct']:+.2f} % [{t['ci95_pct'][0]:+.2f}, {t['ci95_pct'][1]:+.2f}] "
            f"(t {t['ci95_t_pct'][0]:+.2f}, {t['ci95_t_pct'][1]:+.2f}), trimmed {t['slowdown_trimmed_pct']:+.2f} %, "
            f"at the polls {t['polls_slowdown_pct']:+.2f} % [{t['polls_ci95_pct'][0]:+.2f}, {t['polls_ci95_pct'][1]:+.2f}]"
            + (f" (injected {t['injected_pct']:.2f} %)" if t.get("injected_pct") is not None else "") + ", "
            + (f"with the speed reference {t['slowdown_adj_pct']:+.2f} % [{t['adj_ci95_pct'][0]:+.2f}, {t['adj_ci95_pct'][1]:+.2f}] "
               f"(r {t['ref_adjusted']['r'] if t['ref_adjusted']['r'] is not None else float('nan'):+.2f}), " if t.get("adj_ci95_pct") else "")
            + f"lost {t['lost_pct']:+.3f} % [{t['lost_ci95_pct'][0]:+.3f}, {t['lost_ci95_pct'][1]:+.3f}], "
            f"detached CV {t['detached_cv_pct']:.2f} %, sampler {t['sampler_cpu_pct']:.2f} % of a core, "
            f"{t['stacks_per_a_window']['mean']:.1f} stacks per A window, "
            f"{t['threads']} threads, {t['pairs']} pairs, {t['verdict']}")
        results.append(t)
        env["torch"] = env["torch"] or t.get("torch")
        env["wall_s"] = time.monotonic() - run_start
        if args.out:  # after each target: a run cut short keeps what it measured
            os.makedirs(args.out, exist_ok=True)
            # The steps and polls themselves apart (large): what every figure can be recomputed from.
            with open(os.path.join(args.out, "attach_cost_raw.json"), "w") as f:
                json.dump({t["name"]: t["raw"] for t in results}, f)
            with open(os.path.join(args.out, "attach_cost.json"), "w") as f:
                json.dump({"environment": env, "targets": [slim(t) for t in results]}, f, indent=1)
            write_md(os.path.join(args.out, "attach_cost.md"), env, results)
    if gpu is not None:
        gpu.close()
    if ref is not None:
        ref.close()
    log(f"done in {time.monotonic() - run_start:.1f} s (budget {args.budget_s:g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
