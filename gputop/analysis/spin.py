"""A GPU that is 'busy' doing nothing: a kernel spinning while it waits. Pure: GPU samples in.

NVML's utilisation is the share of time *some* kernel runs, however little it does. A NCCL
collective is a kernel on the rank's stream that spins until every peer has arrived, so a rank
waiting for a slow or absent peer reads 100 % busy for as long as it waits; so does a kernel that
never ends (one spinning on a flag). What gives it away is what the GPU does while 'busy': few SMs
active (NCCL runs one block per channel), no tensor-core work, power near idle. Measured on two
H100s (NCCL 2.28, a 2-rank DDP job, bench/multi_rank.py): a rank spinning in all_reduce read
utilisation 100 %, SM activity 18.2-18.7 %, tensor 0 %, 131-143 W of 700 W (idle 120 W); the same
GPUs computing read SM 67-69 % at 370-527 W.

A spin is a fact about the GPU, not a cause: a launch-bound loop of tiny kernels can look alike.
The cause is told by what else is seen: a stack that does not move (a hang), a peer rank whose GPU
idles or computes while this one spins (a straggler).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..model import GpuSample, UtilPoint
from .threshold import IntThreshold, JUDGEMENT, MEASURED, Threshold

# Busy by NVML: a kernel is resident at nearly every instant. A spinning kernel never leaves, so
# its GPU reads 100; 90 leaves room for a poll that straddles the wait's start or end.
SPIN_UTIL_MIN = Threshold(
    90.0, "%", JUDGEMENT,
    "Busy by NVML: a spinning kernel never leaves, so its GPU reads 100; 90 leaves room for a poll that straddles "
    "the wait's start or end.")
# GPM SM activity at most this while 'busy': measured 18.2-18.7 % for NCCL's all_reduce spinning
# on an H100 (a computing GPU: 67-69 %); 30 leaves room for more channels (NCCL_MIN_NCHANNELS, more
# ranks) and stays far below any real compute.
SPIN_SM_MAX = Threshold(
    30.0, "%", JUDGEMENT,
    "GPM SM activity at most this while 'busy': NCCL's all_reduce spinning measured 18.2-18.7 % on an H100 "
    "(computing: 67-69 %); 30 leaves room for more channels and ranks.")
# Tensor-core activity at most this: NCCL's kernels use none (measured 0.0 while spinning).
SPIN_TENSOR_MAX = Threshold(
    2.0, "%", JUDGEMENT,
    "Tensor-core activity at most this: NCCL's kernels use none (0.0 measured while spinning).")
# The fp32/fp16 pipes and DRAM at most this (where GPM reads them): a kernel waiting does no math
# and moves almost no memory (measured spinning on the H100s: fp32 ≤ 0.14 %, fp16 0 %, DRAM ≤ 0.44 %);
# a loop of small fp32 kernels that keeps a GPU 'busy' with few SMs active does both.
SPIN_PIPES_MAX = Threshold(
    2.0, "%", JUDGEMENT,
    "The fp32/fp16 pipes at most this: a waiting kernel does no math (measured spinning on H100s: fp32 <= 0.14 %, "
    "fp16 0 %).")
SPIN_DRAM_MAX = Threshold(
    5.0, "%", JUDGEMENT,
    "DRAM activity at most this: a waiting kernel moves almost no memory (measured spinning on H100s: <= 0.44 %).")
# Without GPM (pre-Hopper GPUs), power as a share of the limit at most this while 'busy':
# measured 0.19-0.20 spinning on an H100 (idle 0.17), 0.53-0.75 computing. Weaker evidence than
# GPM: a loop of tiny kernels draws little power too.
SPIN_POWER_FRACTION_MAX = Threshold(
    0.30, "share", JUDGEMENT,
    "Without GPM, power as a share of the limit at most this while 'busy': measured 0.19-0.20 spinning on an H100 "
    "(idle 0.17), 0.53-0.75 computing; weaker evidence than GPM.")
# "Spins now" needs this many polls in the look-back, every one spinning.
SPIN_MIN_POLLS = IntThreshold(
    2, "polls", JUDGEMENT,
    "'Spins now' needs this many polls in the look-back, every one spinning.")
# The SM activity expected of a GPU from its peer must be at least this for a comparison: under
# it the activities are too small to compare.
ACTIVITY_MIN = Threshold(
    10.0, "%", JUDGEMENT,
    "The SM activity expected of a GPU from its peer must be at least this for a comparison: under it the "
    "activities are too small to compare.")
# A peer whose utilisation and SM activity are both under this (%) says nothing of how full its
# kernels keep a GPU: too few of them ran in the poll.
PEER_UTIL_MIN = Threshold(
    5.0, "%", JUDGEMENT,
    "A peer whose utilisation and SM activity are both under this says nothing of how full its kernels keep a GPU:"
    " too few of them ran in the poll.")
# A GPU within this share of its busiest peer's SM activity does the same work: GPM activity moves
# a few points between GPUs running the same kernels. Judgement: a tenth.
ACTIVITY_SAME = Threshold(
    0.90, "share", JUDGEMENT,
    "A GPU within this share of its busiest peer's SM activity does the same work: GPM activity moves a few points"
    " between GPUs running the same kernels.")
# The SM activity of a GPU spinning in a NCCL collective, where the window shows no spin of its own
# to read it from: measured 18.2-18.7 % on H100s (NCCL 2.28, 2 ranks). A GPU that computes part
# of a poll and spins the rest reads between this and its peer's; taken as 0 the wait would be
# under-stated by a third (bench/multi_rank.py's compute straggler: 0.24 against 0.32).
NCCL_SPIN_SM = Threshold(
    18.0, "%", MEASURED,
    "The SM activity of a GPU spinning in a NCCL collective where the window shows no spin of its own to read it "
    "from: measured 18.2-18.7 % on H100s (NCCL 2.28, 2 ranks).",
    "bench/multi_rank.py")


def is_spin(s: GpuSample) -> bool | None:
    """Whether this poll's GPU was 'busy' spinning: None when the sample cannot say."""
    if s.util_gpu is None:
        return None
    if s.util_gpu < SPIN_UTIL_MIN:
        return False
    if s.sm_active is not None:
        return (s.sm_active <= SPIN_SM_MAX and (s.tensor_active or 0.0) <= SPIN_TENSOR_MAX
                and (s.fp32_active or 0.0) <= SPIN_PIPES_MAX and (s.fp16_active or 0.0) <= SPIN_PIPES_MAX
                and (s.dram_active or 0.0) <= SPIN_DRAM_MAX)
    if s.power_w is not None and s.power_limit_w:
        return s.power_w / s.power_limit_w <= SPIN_POWER_FRACTION_MAX
    return None


def spins_now(samples: Sequence[GpuSample], points: Sequence[UtilPoint], now: float, window_s: float) -> bool:
    """The GPU has spun for the whole of the last ``window_s``: every poll in it a spin (at least
    ``SPIN_MIN_POLLS``) and every 200 ms utilisation point in it busy."""
    t0 = now - window_s
    polls = [s for s in samples if t0 <= s.ts <= now and s.error is None]
    if len(polls) < SPIN_MIN_POLLS or not all(is_spin(s) for s in polls):
        return False
    return all(p.util >= SPIN_UTIL_MIN for p in points if t0 <= p.ts <= now)


def spin_share(samples: Sequence[GpuSample], t0: float, t1: float) -> float:
    """The share of ``[t0, t1]`` the GPU spent spinning, each poll standing for the time since the
    previous one."""
    total = spun = 0.0
    prev = None
    for s in sorted(samples, key=lambda x: x.ts):
        if s.ts < t0 or s.ts > t1:
            prev = s.ts if s.ts < t0 else prev
            continue
        start = max(t0, prev if prev is not None else s.ts)
        prev = s.ts
        dt = s.ts - start
        if dt <= 0:
            continue
        total += dt
        if is_spin(s):
            spun += dt
    return spun / total if total > 0 else 0.0


@dataclass(frozen=True)
class WaitPoll:
    """One poll of one GPU: the share of it the GPU waited (spinning, or computing less than its
    busiest peer while 'busy'), and how long the poll stands for."""

    ts: float
    dt: float
    wait: float


def wait_series(samples: Mapping[int, Sequence[GpuSample]], t0: float, t1: float) -> dict[int, tuple[WaitPoll, ...]]:
    """Per GPU of one job (each a rank's), per poll in ``[t0, t1]``: the share of the poll it spent
    waiting for a peer. A spinning poll waits all of it. A GPU 'busy' but computing less than the
    busiest of its peers in the same poll waited, by the activities' ratio, the rest: ranks doing
    the same work compute alike, so one that does less in the same time waits for the one that
    does more (a spin mixed with compute in one poll looks like this); a peer that is busy less
    of the poll is scaled to this GPU's utilisation by how full its kernels keep its SMs while they
    run. The activity is SM activity
    (the same measure whatever the kernels' precision) less the GPU's own spinning level (NCCL's
    blocks are active SMs too): read from the window where it spun, else NCCL_SPIN_SM. Within ACTIVITY_SAME of the peer it is the same work. A GPU
    that idles (utilisation under SPIN_UTIL_MIN) does not wait on its GPU: its host does something
    else."""
    by_gpu = {i: sorted((s for s in ss if t0 <= s.ts <= t1 and s.error is None and s.util_gpu is not None),
                        key=lambda x: x.ts) for i, ss in samples.items()}
    times = {i: [s.ts for s in ss] for i, ss in by_gpu.items()}  # to find a peer's polls by time
    floor = {}
    for i, ss in by_gpu.items():
        spun = [s.sm_active for s in ss if is_spin(s) and s.sm_active is not None]
        floor[i] = sum(spun) / len(spun) if spun else NCCL_SPIN_SM
    out: dict[int, tuple[WaitPoll, ...]] = {}
    for i, ss in by_gpu.items():
        polls = []
        prev = None
        for s in sorted(ss, key=lambda x: x.ts):
            # A poll's GPM rates cover the time since the one before: the window's first poll
            # stands for a span that starts before the window, and is left out.
            dt, prev = (s.ts - prev if prev is not None else 0.0), s.ts
            if dt <= 0:
                continue
            if is_spin(s):
                w = 1.0
            elif (s.util_gpu or 0.0) < SPIN_UTIL_MIN:
                w = 0.0
            else:
                w = 0.0
                mine = s.sm_active
                # What this GPU's SMs would read computing all the time it is 'busy', by each peer
                # that computes: the peer's SM activity per point of its utilisation (how full
                # the same kernels keep the GPU) times this GPU's utilisation. A peer that idles
                # most of the step (its host is the slow part) still shows how full its kernels
                # are while they run.
                expected = [min(1.0, p.sm_active / p.util_gpu) * (s.util_gpu or 0.0)
                            for j in by_gpu if j != i for p in _near(by_gpu[j], times[j], s.ts)
                            if p.sm_active is not None and not is_spin(p)
                            and (p.util_gpu or 0.0) >= PEER_UTIL_MIN and p.sm_active >= PEER_UTIL_MIN]
                if mine is not None and expected and max(expected) >= ACTIVITY_MIN:
                    top = max(expected)
                    base = floor[i]
                    if top > base and mine < ACTIVITY_SAME * top:
                        w = min(1.0, max(0.0, (top - mine) / (top - base)))
            polls.append(WaitPoll(s.ts, dt, w))
        out[i] = tuple(polls)
    return out


# Polls of two GPUs within this many seconds are one poll (NVML reads every GPU in one pass).
SAME_POLL_S = Threshold(
    0.25, "s", JUDGEMENT,
    "Polls of two GPUs within this many seconds are one poll: NVML reads every GPU in one pass.")


def _near(polls: Sequence[GpuSample], times: Sequence[float], ts: float) -> Sequence[GpuSample]:
    """The polls (time order, ``times`` their timestamps) within SAME_POLL_S of ``ts``."""
    return polls[bisect_left(times, ts - SAME_POLL_S):bisect_right(times, ts + SAME_POLL_S)]


def mean_wait(polls: Sequence[WaitPoll]) -> float | None:
    total = sum(p.dt for p in polls)
    return sum(p.wait * p.dt for p in polls) / total if total > 0 else None


def paired_gap(waiting: Sequence[WaitPoll], slow: Sequence[WaitPoll], z: float) -> tuple[float, float, int]:
    """(mean, lower confidence limit, polls) of ``waiting``'s wait minus ``slow``'s, poll by poll
    (the two GPUs polled together). Each poll's share is an average over the whole poll (GPM counts
    every cycle), not a 0/1 draw, so the limit is the paired mean's t-style one: mean − z·sd/√n."""
    pairs = []
    times = [p.ts for p in slow]  # the series is in time order (wait_series)
    for a in waiting:
        near = slow[bisect_left(times, a.ts - SAME_POLL_S):bisect_right(times, a.ts + SAME_POLL_S)]
        b = min(near, key=lambda p: abs(p.ts - a.ts), default=None)
        if b is not None:
            pairs.append(a.wait - b.wait)
    n = len(pairs)
    if n == 0:
        return 0.0, -1.0, 0
    mean = sum(pairs) / n
    if n < 2:
        return mean, -1.0, n
    # A floor on the spread stands in for the polls' own measurement noise (GPM rates over short
    # windows move a few points): ten identical polls do not make a certainty.
    sd = max(math.sqrt(sum((d - mean) ** 2 for d in pairs) / (n - 1)), 0.05)
    return mean, mean - student_t(z, n - 1) * sd / math.sqrt(n), n


def student_t(z: float, df: int) -> float:
    """Student's t quantile at the normal quantile ``z``'s level with ``df`` degrees of freedom
    (the Cornish-Fisher expansion to its third term: 3.16 against the tables' 3.18 at df 3 and
    z 1.96, within 0.2 % from df 5 on)."""
    if df <= 0:
        return math.inf
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))
