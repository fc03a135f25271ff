"""Memory over time: warm-up, steady growth or a saw-tooth, the growth rate with an interval,
and the time left to the limit at that rate.

Pure: series of (timestamp, bytes) in, a ``Growth`` out. The same fit serves a GPU (the job's
NVML memory against the card's total) and the host (used memory against its total).
"""

from __future__ import annotations

import math
from .threshold import DERIVED, IntThreshold, JUDGEMENT, Threshold
from dataclasses import dataclass, replace
from typing import Sequence

# Less history than this says nothing of a trend: an allocator warms up over the first steps,
# and a minute holds hundreds of steps of any job worth forecasting. Judgement.
MIN_SPAN_S = Threshold(
    60.0, "s", JUDGEMENT,
    "Less history than this says nothing of a trend: an allocator warms up over the first steps, and a minute "
    "holds hundreds of steps.")
# A leak that kills within a few minutes must be named before the minute is up: with the job's
# training loop in the stacks (no loading, no compiling: the caller says so) this much steady
# growth is judged, but only when its slow end reaches the limit within EARLY_HORIZON spans. A
# forecast stretched further than that rests on too little. Judgement: a 1 Hz poll gives 20
# points, and an allocator's warm-up is over within the first steps of the loop.
EARLY_SPAN_S = Threshold(
    20.0, "s", JUDGEMENT,
    "With the training loop in the stacks, this much steady growth is judged when it reaches the limit within "
    "EARLY_HORIZON spans: a leak that kills in minutes must be named before the minute is up.")
EARLY_HORIZON = Threshold(
    10.0, "spans", JUDGEMENT,
    "Growth judged on less than MIN_SPAN_S of history is a finding only when its slow end (the interval's) reaches "
    "the limit within this many times the history: a forecast stretched further rests on too little.")
MIN_POINTS = IntThreshold(
    10, "points", JUDGEMENT,
    "Fewer readings than this say nothing of a trend.")
# The fit is O(n^2) in its points: longer series are thinned evenly to this many (48 points are
# 1,128 pairs, ~0.4 ms in Python; a point every 12.5 s over 10 min), several fits a series a
# second, every GPU of the job: 8 GPUs cost the advisor's tick ~11 ms with them (was ~20 at 80).
MAX_POINTS = IntThreshold(
    48, "points", JUDGEMENT,
    "The O(n^2) fit thins longer series to this many: 1,128 pairs, ~0.4 ms in Python; 8 GPUs cost the advisor's "
    "tick ~11 ms with them (~20 at 80).")
# A fall of at least this much between two polls is memory given back (an eval batch freed, a
# cache emptied), not noise: the larger of a floor and a share of the series' range. Judgement:
# the caching allocator returns whole segments (2 MiB or 20 MiB each), and NVML's figure moves
# only when it does.
DROP_MIN_BYTES = IntThreshold(
    64 * 2**20, "bytes", JUDGEMENT,
    "A fall of at least this (or DROP_RANGE_SHARE of the range) between two polls is memory given back, not noise:"
    " the caching allocator returns whole 2 MiB or 20 MiB segments.")
DROP_RANGE_SHARE = Threshold(
    0.10, "share", JUDGEMENT,
    "A fall of at least this share of the series' range (or DROP_MIN_BYTES) is memory given back, not noise.")
# Falls adding up to this share of the rises make a saw-tooth (the memory comes back): judged
# then on its troughs, not its peaks. Judgement.
SAWTOOTH_FALL_SHARE = Threshold(
    0.3, "share", JUDGEMENT,
    "Falls adding up to this share of the rises make a saw-tooth (the memory comes back): judged on its troughs, "
    "not its peaks.")
# Growth whose last quarter runs clearly slower than the quarter before (its rate's interval
# below this share of the other's) is levelling off (an allocator or a cache reaching its size),
# not steady. Judgement: a steady leak's quarters agree within their noise.
DECELERATION = Threshold(
    0.5, "share", JUDGEMENT,
    "Growth whose last quarter's rate interval is below this share of the quarter before's is levelling off, not "
    "steady: a steady leak's quarters agree within their noise.")
# The interval on the rate: 95 % (z of the normal approximation to Kendall's statistic).
Z95 = Threshold(
    1.96, "z", DERIVED,
    "The rate's interval at 95 %: z of the normal approximation to Kendall's statistic.")

GROWING, PLATEAU, SAWTOOTH, FLAT, SHORT = "growing", "plateau", "saw-tooth", "flat", "too short"


@dataclass(frozen=True)
class Fit:
    """A Theil-Sen line: the median of the pairwise slopes, with Sen's rank interval."""

    rate: float  # units per second
    low: float
    high: float
    points: int


@dataclass(frozen=True)
class Growth:
    kind: str  # GROWING, PLATEAU (grew then levelled off: warm-up), SAWTOOTH, FLAT, SHORT
    rate: float = 0.0  # bytes/s over the part the verdict rests on (0 unless growing)
    rate_low: float = 0.0
    rate_high: float = 0.0
    used: float = 0.0  # bytes now (the peak of the last cycle for a saw-tooth)
    limit: float | None = None  # bytes the series may reach (the card, the host)
    span_s: float = 0.0
    eta_s: float | None = None  # seconds to the limit at ``rate``; None unless growing to a known limit
    eta_low_s: float | None = None  # at the interval's fast end
    eta_high_s: float | None = None  # at its slow end
    sawtooth: bool = False  # the memory also rises and falls (a saw-tooth under the trend)
    early: bool = False  # judged on less than MIN_SPAN_S of history, for its urgency (EARLY_SPAN_S)
    # SHORT, in the training loop with EARLY_SPAN_S of history: the rate a provisional fit shows
    # it rising at (bytes/s; 0: not rising), too far from the limit to judge before the minute.
    # What is being weighed, said as such: never a forecast.
    rising: float = 0.0
    # ``rising`` was measured since the training loop began (``early``); False: over the whole
    # short series of a job whose training loop is not known (``weigh``: a CPU job's loop does no
    # forward, backward or optimizer step), which the advisor says as such.
    rising_in_loop: bool = False
    # Bounded growth (``bounded``): the most it can still add, bytes, its rate falling in
    # proportion to what is left, and the forecast made so. None: unbounded, forecast as a line.
    ceiling: float | None = None

    @property
    def growing(self) -> bool:
        return self.kind == GROWING

    @property
    def judged(self) -> bool:
        """History enough for a verdict (not SHORT)."""
        return self.kind != SHORT


def theil_sen(points: Sequence[tuple[float, float]], z: float = Z95) -> Fit | None:
    """The median pairwise slope and its rank interval (Sen 1968): robust to outliers and to
    the allocator's steps, with an interval that is exact on a noiseless line. The interval
    assumes independent errors; memory that wanders makes it too narrow."""
    n = len(points)
    if n < 3:
        return None
    slopes = []
    for i in range(n):
        ti, yi = points[i]
        for j in range(i + 1, n):
            tj, yj = points[j]
            if tj > ti:
                slopes.append((yj - yi) / (tj - ti))
    if not slopes:
        return None
    slopes.sort()
    m = len(slopes)
    mid = slopes[m // 2] if m % 2 else 0.5 * (slopes[m // 2 - 1] + slopes[m // 2])
    c = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    lo = max(0, min(m - 1, int(math.floor((m - c) / 2.0))))
    hi = max(0, min(m - 1, int(math.ceil((m + c) / 2.0))))
    return Fit(mid, slopes[lo], slopes[hi], n)


def _thin(points: Sequence[tuple[float, float]], k: int = MAX_POINTS) -> list[tuple[float, float]]:
    n = len(points)
    if n <= k:
        return list(points)
    return [points[round(i * (n - 1) / (k - 1))] for i in range(k)]


def _since(points: Sequence[tuple[float, float]], t: float) -> list[tuple[float, float]]:
    return [p for p in points if p[0] >= t]


def growth(points: Sequence[tuple[float, float]], limit: float | None = None,
           used_now: float | None = None, early: bool = False, weigh: bool = False) -> Growth:
    """The verdict on one series (time order). ``limit``: what it may reach; ``used_now``: what
    counts against the limit now when more than the series itself does (a card shared with
    other processes: its whole used memory). Only steady growth gets a rate and a forecast.
    ``early``: the job is in its training loop, so EARLY_SPAN_S of history may judge growth that
    reaches the limit soon (see EARLY_HORIZON); anything else that short stays SHORT.
    ``weigh``: no training loop is known, yet EARLY_SPAN_S of steady growth is measured as
    ``rising`` (never judged early: what grew may be loading)."""
    pts = sorted((float(t), float(v)) for t, v in points)
    span = pts[-1][0] - pts[0][0] if pts else 0.0
    short = Growth(SHORT, used=pts[-1][1] if pts else 0.0, limit=limit, span_s=span)
    if len(pts) < MIN_POINTS or span < (EARLY_SPAN_S if (early and limit is not None) or weigh else MIN_SPAN_S):
        return short
    g = _judge(pts, limit, used_now)
    if span >= MIN_SPAN_S:
        return g
    # Early: only urgent, steady growth; the rest waits for the minute.
    if early and g.growing and g.eta_high_s is not None and g.eta_high_s <= EARLY_HORIZON * span:
        return replace(g, early=True)
    return replace(short, rising=g.rate, rising_in_loop=early) if g.growing else short


def _judge(pts: list[tuple[float, float]], limit: float | None, used_now: float | None) -> Growth:
    span = pts[-1][0] - pts[0][0]
    values = [v for _, v in pts]
    drop = max(DROP_MIN_BYTES, DROP_RANGE_SHARE * (max(values) - min(values)))
    steps = [b - a for a, b in zip(values, values[1:])]
    rises = sum(d for d in steps if d > 0)
    falls = [(i, -d) for i, d in enumerate(steps) if -d >= drop]
    saw = bool(falls) and sum(f for _, f in falls) >= SAWTOOTH_FALL_SHARE * max(rises, 1.0)
    if saw:
        # Judged on its troughs (what stays after each release): a saw-tooth over a leak has
        # rising troughs, one over a steady job has level ones. Peaks set the headroom: the OOM
        # comes at a peak.
        troughs = [pts[i + 1] for i, _ in falls]
        fit = theil_sen(troughs) if len(troughs) >= 3 else None
        last_cycle = pts[falls[-1][0] + 1:]
        peak = max(v for _, v in pts[falls[-2][0] + 1:]) if len(falls) >= 2 else max(values)
        peak = max(peak, max(v for _, v in last_cycle))
        if fit is None or fit.low <= 0:
            return Growth(SAWTOOTH, used=peak, limit=limit, span_s=span, sawtooth=True)
        return _forecast(fit, max(peak, used_now or 0.0), limit, span, sawtooth=True)
    # The recent half is what the job does now: an allocator's warm-up is over by then.
    recent = _since(pts, pts[-1][0] - span / 2)
    fit = theil_sen(_thin(recent))
    if fit is None or fit.low <= 0:
        kind = PLATEAU if values[-1] - values[0] >= drop else FLAT
        return Growth(kind, used=values[-1], limit=limit, span_s=span)
    # Steady, or levelling off? The recent half's two quarters compared, each with its interval.
    mid = pts[-1][0] - span / 4
    before = theil_sen(_thin([p for p in recent if p[0] <= mid]))
    last = theil_sen(_thin(_since(pts, mid)))
    if before is not None and last is not None and last.high < DECELERATION * before.low:
        return Growth(PLATEAU, used=values[-1], limit=limit, span_s=span)
    return _forecast(fit, max(values[-1], used_now or 0.0), limit, span)


def _forecast(fit: Fit, used: float, limit: float | None, span: float, sawtooth: bool = False) -> Growth:
    eta = lo = hi = None
    if limit is not None and fit.rate > 0:
        room = max(0.0, limit - used)
        eta = room / fit.rate
        lo = room / fit.high if fit.high > 0 else None
        hi = room / fit.low if fit.low > 0 else None
    return Growth(GROWING, rate=fit.rate, rate_low=fit.low, rate_high=fit.high, used=used, limit=limit,
                  span_s=span, eta_s=eta, eta_low_s=lo, eta_high_s=hi, sawtooth=sawtooth)


def forecast_of(rate: float, low: float, high: float, used: float, limit: float | None, span: float,
                early: bool = False) -> Growth:
    """Steady growth at ``rate`` (its interval ``low``-``high``) from ``used`` towards ``limit``:
    a rate summed from several series (a job's processes) forecast like one fit."""
    return replace(_forecast(Fit(rate, low, high, 0), used, limit, span), early=early)


def fit_lag_s(g: Growth) -> float:
    """How long ago the rate of ``g``'s fit held: a line fit over a stretch of a curve measures
    its slope about the stretch's middle. ``_judge`` fits the recent half (its middle a quarter
    of the span back), a saw-tooth's troughs over all of it (half the span back)."""
    return g.span_s / 2 if g.sawtooth else g.span_s / 4


def bounded_eta(room: float, left: float, rate: float, steady: float = 0.0) -> float | None:
    """Seconds for growth at ``rate`` now, whose rate falls in proportion to what is ``left`` of
    its ceiling (rate = k * left, k = rate / left: an exponential approach), to add ``room``:
    -(left / rate) * ln(1 - room / left); with ``steady`` bytes/s more growing as a line beside
    it (a leak that never slows), the time the two together take. None: it never does (``room``
    at least ``left`` and nothing steady) or nothing grows."""
    rate, steady = max(0.0, rate), max(0.0, steady)
    if room <= 0:
        return 0.0 if rate > 0 or steady > 0 else None
    if steady <= 0:
        if rate <= 0 or room >= left:
            return None
        return -(left / rate) * math.log1p(-room / left)
    if rate <= 0 or left <= 0:
        return room / steady
    k = rate / left

    def added(t: float) -> float:
        return steady * t + left * -math.expm1(-k * t)

    # Either alone gets there by its own time: the two together sooner.
    lo, hi = 0.0, room / steady
    if room < left:
        hi = min(hi, -(left / rate) * math.log1p(-room / left))
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        if added(mid) < room:
            lo = mid
        else:
            hi = mid
    return hi


def bounded(g: Growth, left: float, lag_s: float | None = None, steady: float = 0.0) -> Growth:
    """``g``, steady growth fit as a line, forecast as growth that can add at most ``left``
    bytes more and slows in proportion to what is left of it, but for ``steady`` bytes/s of its
    rate that grow as a line (forecast so beside it). Its fit measured the rate ``lag_s`` ago
    (``fit_lag_s``), when that much more was left: k = rate / that, and the rate now is
    k * ``left``. The interval's ends split as the rate does and keep the same k's reference, so
    their etas stay what the rate interval says. ``rate`` is left as measured: what the finding
    says it grew. Not growing, or no limit to reach: ``g`` with its ceiling only."""
    left = max(0.0, left)
    if not g.growing or g.limit is None or g.rate <= 0:
        return replace(g, ceiling=left)
    lag = fit_lag_s(g) if lag_s is None else lag_s
    steady = min(max(0.0, steady), g.rate)
    line_share = steady / g.rate
    then = left + (g.rate - steady) * lag  # what was left when the fit's rate held
    room = max(0.0, g.limit - g.used)

    def eta(rate: float) -> float | None:
        # This end of the interval, split as the point is: its copying's rate now is k * left, k = its rate / then.
        copying, line = rate * (1 - line_share), rate * line_share
        return bounded_eta(room, left, copying * left / then if then > 0 else 0.0, line)

    return replace(g, ceiling=left, eta_s=eta(g.rate), eta_low_s=eta(g.rate_high) if g.rate_high > 0 else None,
                   eta_high_s=eta(g.rate_low) if g.rate_low > 0 else None)


def rate_text(bytes_per_s: float) -> str:
    """'310 MB/min': the unit people read memory growth in."""
    per_min = bytes_per_s * 60.0
    if abs(per_min) >= 10 * 2**30:
        return f"{per_min / 2**30:.0f} GB/min"
    if abs(per_min) >= 2**30:
        return f"{per_min / 2**30:.1f} GB/min"
    if abs(per_min) >= 10 * 2**20:
        return f"{per_min / 2**20:.0f} MB/min"
    return f"{per_min / 2**20:.1f} MB/min"


def eta_text(g: Growth) -> str:
    """'~14 min (10-20)': the point forecast with its interval, in the unit that reads best."""
    if g.eta_s is None:
        return "unknown"

    def unit(s: float) -> tuple[float, str]:
        if s >= 2 * 3600:
            return 3600.0, "h"
        if s >= 120:
            return 60.0, "min"
        return 1.0, "s"

    div, name = unit(g.eta_s)
    point = f"~{g.eta_s / div:.0f} {name}"
    if g.eta_low_s is None:
        return point
    lo = f"{g.eta_low_s / div:.0f}"
    hi = "?" if g.eta_high_s is None else f"{g.eta_high_s / div:.0f}"
    if lo == hi == f"{g.eta_s / div:.0f}":
        return point  # a line without noise: the interval says nothing more
    return f"{point} ({lo}-{hi})"


__all__ = ["FLAT", "Fit", "GROWING", "Growth", "PLATEAU", "SAWTOOTH", "SHORT", "bounded", "bounded_eta", "eta_text",
           "fit_lag_s", "growth", "rate_text", "theil_sen"]
