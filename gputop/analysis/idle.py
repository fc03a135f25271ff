"""GPU busy and idle time from NVML's utilisation samples.

NVML keeps a buffer of utilisation samples, one per ~200 ms on current GPUs: each says what
share of that period at least one kernel was running. A sample is treated as covering the time
since the previous one, so a window splits into *slices* whose busy and idle seconds add up
exactly to the time covered. Partial idle counts: a 200 ms sample at 60 % is 80 ms idle.
Copies (memcpy) are not kernels, so time the GPU spends only copying shows up as idle here.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from statistics import median
from typing import Iterable, Sequence

from ..model import GpuSample, IdleInterval, UtilPoint
from .threshold import DERIVED, JUDGEMENT, MEASURED, Threshold

# NVML's utilisation buffer spacing measured on an H100: one sample every 200 ms (facts file).
NOMINAL_PERIOD_S = Threshold(
    0.2, "s", MEASURED,
    "The spacing of NVML's utilisation buffer, measured on an H100: one sample every 200 ms.")
# A gap between two buffer entries longer than this is lost data (buffer overrun, a stalled
# poll), not one long sample: it is left out rather than stretched. Five nominal periods.
MAX_SLICE_S = Threshold(
    1.0, "s", DERIVED,
    "A gap between two buffer entries longer than this is lost data (an overrun, a stalled poll), not one long "
    "sample: five nominal periods (NOMINAL_PERIOD_S).")
# A slice below this utilisation counts as idle when idle *intervals* are reported (the time
# sums use the exact fraction). 10 % of a 200 ms sample is 20 ms of kernels: a GPU that only
# runs a few small kernels in 200 ms is waiting for work.
IDLE_UTIL_PCT = Threshold(
    10.0, "%", JUDGEMENT,
    "A slice below this utilisation is idle in the idle intervals: 10 % of a 200 ms sample is 20 ms of kernels, a "
    "GPU waiting for work.")
# When NVML gives no sample buffer, the poll's own utilisation (mean over its interval) stands in;
# polls further apart than this are gaps. Matches the UI's slowest useful interval.
MAX_POLL_SLICE_S = Threshold(
    5.0, "s", JUDGEMENT,
    "Without NVML's buffer the polls stand in, and polls further apart than this are gaps: the UI's slowest useful"
    " interval.")


@dataclass(frozen=True, slots=True)
class Slice:
    """One utilisation sample as a span of time: ``(start, end]`` at ``util`` percent busy."""

    gpu_index: int
    start: float
    end: float
    util: float

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def busy_s(self) -> float:
        return self.duration * _clamp_pct(self.util) / 100.0

    @property
    def idle_s(self) -> float:
        return self.duration - self.busy_s

    @property
    def idle_fraction(self) -> float:
        return 1.0 - _clamp_pct(self.util) / 100.0

    @property
    def mid(self) -> float:
        return (self.start + self.end) / 2.0


def _clamp_pct(v: float) -> float:
    return min(100.0, max(0.0, v))


def util_slices(
    points: Sequence[UtilPoint],
    t0: float = float("-inf"),
    t1: float = float("inf"),
    nominal: float = NOMINAL_PERIOD_S,
    max_slice: float = MAX_SLICE_S,
) -> list[Slice]:
    """Slices from the 200 ms buffer, clipped to ``[t0, t1]``.

    The first point's period is unknown: it is taken to be the median spacing of the others
    (or ``nominal``), so a window's first sample is not lost.
    """
    pts = sorted(points, key=lambda p: p.ts)
    if not pts:
        return []
    period = _median_spacing([p.ts for p in pts], max_slice) or nominal
    out: list[Slice] = []
    prev_ts: float | None = None
    for p in pts:
        start = p.ts - period if prev_ts is None else prev_ts
        prev_ts = p.ts
        if p.ts - start > max_slice or p.ts <= start:
            continue
        s, e = max(start, t0), min(p.ts, t1)
        if e > s:
            out.append(Slice(p.index, s, e, float(p.util)))
    return out


def median_util_at(slices: Sequence[Slice], times: Iterable[float]) -> tuple[float, int] | None:
    """The median utilisation of the slices covering the given instants (a main thread's samples,
    say), and how many instants a slice covered; None: none did."""
    spans = sorted(slices, key=lambda x: x.start)
    starts = [x.start for x in spans]
    vals = []
    for t in times:
        i = bisect_right(starts, t) - 1
        if i >= 0 and spans[i].start <= t <= spans[i].end:
            vals.append(spans[i].util)
    return (median(vals), len(vals)) if vals else None


def poll_slices(
    samples: Sequence[GpuSample],
    t0: float = float("-inf"),
    t1: float = float("inf"),
    max_slice: float = MAX_POLL_SLICE_S,
) -> list[Slice]:
    """Coarser slices from the polls' utilisation, for GPUs without the sample buffer."""
    pts = [UtilPoint(s.ts, s.index, s.util_gpu) for s in samples if s.util_gpu is not None]
    return util_slices(pts, t0, t1, nominal=1.0, max_slice=max_slice)


def _median_spacing(ts: list[float], max_gap: float) -> float | None:
    gaps = sorted(b - a for a, b in zip(ts, ts[1:]) if 0 < b - a <= max_gap)
    return gaps[len(gaps) // 2] if gaps else None


def totals(slices: Iterable[Slice]) -> tuple[float, float]:
    """(busy seconds, idle seconds)."""
    busy = idle = 0.0
    for s in slices:
        busy += s.busy_s
        idle += s.idle_s
    return busy, idle


def idle_fraction(slices: Sequence[Slice]) -> float | None:
    busy, idle = totals(slices)
    total = busy + idle
    return idle / total if total > 0 else None


def idle_intervals(
    slices: Sequence[Slice], threshold: float = IDLE_UTIL_PCT, min_duration: float = 0.0
) -> list[IdleInterval]:
    """Runs of consecutive slices below ``threshold`` %, merged; gaps in the data split runs."""
    out: list[IdleInterval] = []
    cur: list[float] | None = None  # [start, end]
    gpu = slices[0].gpu_index if slices else 0
    for s in slices:
        if s.util < threshold:
            if cur is not None and abs(s.start - cur[1]) < 1e-6:
                cur[1] = s.end
            else:
                if cur is not None:
                    out.append(IdleInterval(gpu, cur[0], cur[1]))
                cur = [s.start, s.end]
        elif cur is not None:
            out.append(IdleInterval(gpu, cur[0], cur[1]))
            cur = None
    if cur is not None:
        out.append(IdleInterval(gpu, cur[0], cur[1]))
    return [iv for iv in out if iv.duration >= min_duration]


def periodicity(intervals: Sequence[IdleInterval], min_count: int = 3) -> float | None:
    """Median spacing between the starts of idle intervals, when there are enough of them.

    A stall that recurs every N seconds (a checkpoint, an epoch boundary, a logging step) has a
    regular spacing; this number goes into the evidence.
    """
    if len(intervals) < min_count:
        return None
    starts = [iv.start for iv in intervals]
    gaps = sorted(b - a for a, b in zip(starts, starts[1:]))
    return gaps[len(gaps) // 2] if gaps else None
