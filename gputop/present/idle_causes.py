"""The idle time of a chart's columns by cause: the advisor's attribution, column by column.

Each column's utilisation slices go through the same ``attribute`` the advisor's breakdown uses,
with the main-thread stacks sampled in (or next to) that column; the column's cause is its
largest idle bucket. A column with no stack sample near it has no cause (``None``): the chart
leaves it uncoloured rather than guess.
"""

from __future__ import annotations

import bisect
from typing import Sequence

from ..analysis import BUCKET_LABELS, IDLE_UTIL_PCT, POLL_JOIN_S, STACK_JOIN_S, Bucket, attribute, poll_slices, util_slices
from ..model import GpuSample, HostSample, StackSample, UtilPoint

# One colour a cause, apart from the busy layers (green utilisation, blue SM, cyan tensor) and
# from red, which stays "idle, cause unknown to gputop" (not attached, or no stack near).
CAUSE_STYLE: dict[Bucket, str] = {
    Bucket.DATA: "yellow",
    Bucket.CPU: "magenta",
    Bucket.SYNC: "bright_red",
    Bucket.H2D: "bright_blue",
    Bucket.IO: "dark_orange",
    Bucket.COLLECTIVE: "bright_magenta",
    Bucket.CHECKPOINT: "bright_white",
    Bucket.UNKNOWN: "grey50",
}
# Short names for the legend (the Advisor tab spells them out).
CAUSE_SHORT: dict[Bucket, str] = {
    Bucket.DATA: "data",
    Bucket.CPU: "CPU work",
    Bucket.SYNC: "sync",
    Bucket.H2D: "H2D copy",
    Bucket.IO: "IO wait",
    Bucket.COLLECTIVE: "collective",
    Bucket.CHECKPOINT: "checkpoint",
    Bucket.UNKNOWN: "other",
}
assert set(CAUSE_STYLE) == set(BUCKET_LABELS) - {Bucket.BUSY}


def column_causes(
    gpu_index: int,
    util: Sequence[UtilPoint],
    samples: Sequence[GpuSample],
    main_stacks: Sequence[StackSample],
    host: Sequence[HostSample],
    t0: float,
    t1: float,
    width: int,
) -> list[Bucket | None]:
    """The cause of each of ``width`` columns' idle time over [t0, t1), or ``None`` where the
    column had no idle time or no stack sample to attribute it with."""
    out: list[Bucket | None] = [None] * max(0, width)
    if width <= 0 or t1 <= t0 or not main_stacks:
        return out
    slices = util_slices(util, t0, t1) if util else poll_slices(samples, t0, t1)
    span = (t1 - t0) / width
    by_col: dict[int, list] = {}
    idle_cols: set[int] = set()
    for s in slices:
        if s.util < 100.0:
            k = min(width - 1, max(0, int((s.mid - t0) / span)))
            by_col.setdefault(k, []).append(s)
            if s.util < IDLE_UTIL_PCT:
                idle_cols.add(k)
    stacks = sorted(main_stacks, key=lambda x: x.ts)
    stack_ts = [x.ts for x in stacks]
    host_ts = [h.ts for h in host]
    sample_ts = [g.ts for g in samples]
    # Only columns the chart draws as idle (a sample under the idle bar) get a cause.
    for k in sorted(idle_cols):
        col = by_col[k]
        a, b = col[0].start - STACK_JOIN_S, col[-1].end + STACK_JOIN_S
        near = stacks[bisect.bisect_left(stack_ts, a):bisect.bisect_right(stack_ts, b)]
        if not near:
            continue  # idle nobody watched: no cause to draw
        ha, hb = bisect.bisect_left(host_ts, a - POLL_JOIN_S), bisect.bisect_right(host_ts, b + POLL_JOIN_S)
        ga, gb = bisect.bisect_left(sample_ts, a - POLL_JOIN_S), bisect.bisect_right(sample_ts, b + POLL_JOIN_S)
        bd = attribute(gpu_index, col, near, host[ha:hb], samples[ga:gb])
        idle = [(v, bk) for bk, v in bd.seconds.items() if bk is not Bucket.BUSY and v > 0]
        if idle:
            out[k] = max(idle, key=lambda x: (x[0], -list(Bucket).index(x[1])))[1]
    return out
