"""A coarse summary of a run, built while recording: busy and idle seconds per GPU per bucket.

The replay timeline and the report need "where was the GPU idle" over a whole day; reading a
day of 200 ms samples to draw a scrubber would take seconds, so the writer keeps these sums as
it goes (one row per GPU per ``OVERVIEW_BUCKET_S``). Pure: fed with samples, returns rows.

The slicing follows ``analysis.idle``: each utilisation sample covers the time since the one
before it, gaps longer than ``MAX_SLICE_S`` are missing data, and a slice below
``IDLE_UTIL_PCT`` counts as idle time (``low_s``); ``busy_s`` is the exact busy share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..analysis import IDLE_UTIL_PCT, MAX_POLL_SLICE_S, MAX_SLICE_S, NOMINAL_PERIOD_S
from ..model import GpuSample, UtilPoint
from .schema import OVERVIEW_BUCKET_S

# A bucket is written once no sample for it can still arrive: NVML's buffer is read once per
# poll, so entries can be up to one poll interval (plus a slow poll) behind the newest sample.
SETTLE_S = 5.0


@dataclass
class OverviewRow:
    ts: float  # bucket start
    gpu: int
    span: float
    covered_s: float = 0.0  # seconds with utilisation data
    busy_s: float = 0.0
    low_s: float = 0.0  # seconds in slices below IDLE_UTIL_PCT
    util_max: float | None = None
    mem_used_max: int | None = None
    power_sum: float = 0.0
    polls: int = 0

    @property
    def power_avg(self) -> float | None:
        return self.power_sum / self.polls if self.polls and self.power_sum else None

    @property
    def idle_s(self) -> float:
        return max(0.0, self.covered_s - self.busy_s)

    @property
    def low_fraction(self) -> float | None:
        return self.low_s / self.covered_s if self.covered_s > 0 else None

    @property
    def util_avg(self) -> float | None:
        return 100.0 * self.busy_s / self.covered_s if self.covered_s > 0 else None


@dataclass
class _GpuState:
    last_point: float | None = None
    last_poll: float | None = None
    has_points: bool = False


@dataclass
class OverviewBuilder:
    bucket_s: float = OVERVIEW_BUCKET_S
    _rows: dict[tuple[float, int], OverviewRow] = field(default_factory=dict)
    _gpus: dict[int, _GpuState] = field(default_factory=dict)
    newest: float = 0.0

    def _row(self, t: float, gpu: int) -> OverviewRow:
        start = math.floor(t / self.bucket_s) * self.bucket_s
        key = (start, gpu)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = OverviewRow(ts=start, gpu=gpu, span=self.bucket_s)
        return row

    def add_util(self, p: UtilPoint) -> None:
        st = self._gpus.setdefault(p.index, _GpuState())
        st.has_points = True
        start = p.ts - NOMINAL_PERIOD_S if st.last_point is None else st.last_point
        if st.last_point is not None and p.ts <= st.last_point:
            return  # a buffer entry already seen
        st.last_point = p.ts
        self.newest = max(self.newest, p.ts)
        if p.ts - start <= MAX_SLICE_S:
            self._slice(p.index, start, p.ts, float(p.util))

    def add_gpu(self, s: GpuSample) -> None:
        st = self._gpus.setdefault(s.index, _GpuState())
        self.newest = max(self.newest, s.ts)
        row = self._row(s.ts, s.index)
        row.polls += 1
        if s.power_w is not None:
            row.power_sum += s.power_w
        if s.mem_used is not None:
            row.mem_used_max = s.mem_used if row.mem_used_max is None else max(row.mem_used_max, s.mem_used)
        prev, st.last_poll = st.last_poll, s.ts
        # Without NVML's sample buffer the poll's own utilisation stands in (coarser).
        if not st.has_points and s.util_gpu is not None and prev is not None:
            if 0 < s.ts - prev <= MAX_POLL_SLICE_S:
                self._slice(s.index, prev, s.ts, float(s.util_gpu))

    def _slice(self, gpu: int, start: float, end: float, util: float) -> None:
        busy_frac = min(100.0, max(0.0, util)) / 100.0
        low = util < IDLE_UTIL_PCT
        t = start
        while t < end:
            row = self._row(t, gpu)
            seg_end = min(end, row.ts + row.span)
            if seg_end <= t:  # float edge at a bucket boundary
                seg_end = min(end, row.ts + row.span + 1e-9)
                if seg_end <= t:
                    break
            d = seg_end - t
            row.covered_s += d
            row.busy_s += d * busy_frac
            if low:
                row.low_s += d
            row.util_max = util if row.util_max is None else max(row.util_max, util)
            t = seg_end

    def take_settled(self) -> list[OverviewRow]:
        """Rows whose bucket ended more than ``SETTLE_S`` before the newest sample."""
        cut = self.newest - SETTLE_S
        done = [k for k, r in self._rows.items() if r.ts + r.span <= cut]
        return [self._rows.pop(k) for k in sorted(done)]

    def take_all(self) -> list[OverviewRow]:
        rows = [self._rows[k] for k in sorted(self._rows)]
        self._rows.clear()
        return rows
