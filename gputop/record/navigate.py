"""Moving around in a recording: its idle periods and its findings, for the replay's jumps
(x/X, f/F), its timeline and `gputop info`.

The idle periods are the analysis's own idle runs (``analysis.idle.idle_intervals`` over the
recorded utilisation), so a jump lands on every stall the charts show. The reader answers
queries; this works out where to go.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..advisor import STATE_IDS
from ..analysis import NOMINAL_PERIOD_S, idle_intervals, poll_slices, util_slices
from ..model import GpuSample, UtilPoint
from . import codec
from .overview import OverviewRow
from .reader import Reader

# Idle periods are found an hour of samples at a time (a day-long file never sits in memory).
IDLE_SCAN_CHUNK_S = 3600.0
# A jump to "the next idle period" lands where the GPU went idle for at least this long, not
# on one of the sub-second data stalls a busy loop is full of.
MIN_IDLE_RUN_S = 2.0

@dataclass(frozen=True)
class IdlePeriod:
    start: float
    end: float
    gpus: tuple[int, ...]

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class FindingMark:
    ts: float
    last_seen: float
    finding_id: str
    severity: str
    title: str
    gpu: int | None


class Navigator:
    """Where to go in one open recording (results cached: a recording does not change)."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self._idle_cache: dict[float, list[IdlePeriod]] = {}
        self._marks: list[FindingMark] | None = None
        self._gpus: set[int] | None = None

    def overview(self) -> list[OverviewRow]:
        return self.reader.overview()

    def idle_periods(self, min_duration: float = MIN_IDLE_RUN_S) -> list[IdlePeriod]:
        """Where some GPU went idle for at least ``min_duration``, within the span (cached).

        The same runs the analysis finds (``analysis.idle.idle_intervals`` over the recorded
        slices), so a jump lands on every stall the charts show; several GPUs idle at once make
        one period. Only the stretches the overview says hold that much idle time are read.
        """
        cache = self._idle_cache.get(min_duration)
        if cache is not None:
            return cache
        runs: list[tuple[float, float, int]] = []
        for w0, w1 in self._idle_windows(min_duration):
            t = w0
            while t < w1:
                e = min(w1, t + IDLE_SCAN_CHUNK_S)
                for g, slices in self._slices(t, e).items():
                    runs += [(iv.start, iv.end, g) for iv in idle_intervals(slices)]
                t = e
        out = merge_idle_runs(runs, min_duration)
        self._idle_cache[min_duration] = out
        return out

    def _idle_windows(self, min_duration: float) -> list[tuple[float, float]]:
        """Stretches that can hold an idle run of ``min_duration``: a run that long puts at
        least half of it into one overview bucket, so buckets with that much idle time, one
        bucket either side, cover every such run whole."""
        out: list[tuple[float, float]] = []
        for r in self.reader.overview():
            if r.low_s >= min_duration / 2.0 - 1e-6:
                a = max(self.reader.start_ts, r.ts - r.span)
                b = min(self.reader.end_ts, r.ts + 2 * r.span)
                if b <= a:
                    continue
                if out and a <= out[-1][1]:
                    out[-1] = (out[-1][0], max(out[-1][1], b))
                else:
                    out.append((a, b))
        return out

    def _slices(self, t0: float, t1: float) -> dict[int, list]:
        """Per-GPU utilisation slices in [t0, t1]: the 200 ms buffer, else the polls."""
        by_gpu: dict[int, list[UtilPoint]] = {}
        for p in self.reader.util_points(t0 - 2.0, t1):
            by_gpu.setdefault(p.index, []).append(p)
        slices = {g: util_slices(ps, t0, t1) for g, ps in by_gpu.items()}
        if self._gpus is None:
            self._gpus = set(self.reader.gpu_indices())
        if self._gpus and self._gpus <= slices.keys():
            # Every GPU has its buffer here: decoding the polls too (as many rows, each 30 fields)
            # was two thirds of a day's idle scan (0.9 of 1.5 s) for nothing.
            return slices
        polls: dict[int, list[GpuSample]] = {}
        for smp in self.reader.gpu_samples(t0 - 5.0, t1):
            if smp.index not in slices:
                polls.setdefault(smp.index, []).append(smp)
        slices.update({g: poll_slices(ss, t0, t1) for g, ss in polls.items()})
        return slices

    def finding_marks(self) -> list[FindingMark]:
        if self._marks is not None:
            return self._marks
        out = []
        for r in self.reader.finding_mark_rows():
            ts = codec.fnum(r[0])
            # "Warming up" is the job's phase, not a finding: no mark to jump to, none counted.
            if ts is None or codec.clean_text(r[2], 128) in STATE_IDS:
                continue
            out.append(
                FindingMark(
                    ts=ts,
                    last_seen=codec.fnum(r[1]) or ts,
                    finding_id=codec.clean_text(r[2], 128),
                    severity=codec.clean_text(r[3], 16),
                    title=codec.clean_text(r[4], 256),
                    gpu=codec.inum(r[5]),
                )
            )
        self._marks = out
        return out

    def exact_idle_start(self, t0: float, t1: float, min_duration: float = MIN_IDLE_RUN_S) -> float | None:
        """Where the first idle run of at least ``min_duration`` in [t0, t1] starts (any GPU)."""
        best = None
        for slices in self._slices(t0, t1).values():
            runs = idle_intervals(slices, min_duration=min_duration)
            if runs:
                best = runs[0].start if best is None else min(best, runs[0].start)
        return best


def merge_idle_runs(runs: Iterable[tuple[float, float, int]], min_duration: float) -> list[IdlePeriod]:
    """(start, end, gpu) idle runs -> periods: a GPU's runs that touch (split by a chunk edge)
    are joined, runs shorter than ``min_duration`` dropped, overlapping runs of several GPUs
    made one period."""
    joined: dict[int, list[list[float]]] = {}
    for a, b, g in sorted(runs):
        cur = joined.setdefault(g, [])
        if cur and a <= cur[-1][1] + 1e-6:
            cur[-1][1] = max(cur[-1][1], b)
        else:
            cur.append([a, b])
    # Half a 200 ms sample of slack: ten samples measure 1.999 s, and they are a 2 s stall.
    slack = NOMINAL_PERIOD_S / 2.0
    flat = sorted((a, b, g) for g, ivs in joined.items() for a, b in ivs if b - a >= min_duration - slack)
    out: list[IdlePeriod] = []
    for a, b, g in flat:
        if out and a <= out[-1].end + 1e-6:
            last = out[-1]
            out[-1] = IdlePeriod(last.start, max(last.end, b), tuple(sorted(set(last.gpus) | {g})))
        else:
            out.append(IdlePeriod(a, b, (g,)))
    return out
