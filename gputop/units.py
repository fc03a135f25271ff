"""Pure text formatting: units, bars, sparklines. No Textual, no I/O."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

SPARK = "▁▂▃▄▅▆▇█"
NA = "n/a"


def fmt_bytes(n: float | None, digits: int = 1) -> str:
    """Binary units, short: 61.0G, 512M, 3.2K."""
    if n is None:
        return NA
    n = float(n)
    for unit in ("B", "K", "M", "G", "T", "P"):
        if abs(n) < 1024 or unit == "P":
            if unit == "B":
                return f"{int(n)}B"
            return f"{n:.{digits}f}{unit}"
        n /= 1024
    return f"{n:.{digits}f}P"  # pragma: no cover


def fmt_rate(bps: float | None) -> str:
    return NA if bps is None else f"{fmt_bytes(bps)}/s"


def fmt_pct(v: float | None, width: int = 0) -> str:
    s = NA if v is None else f"{v:.0f}%"
    return s.rjust(width) if width else s


def fmt_duration(seconds: float | None) -> str:
    """Elapsed time like ps: 59s, 12:03, 3:04:05, 2d03h."""
    if seconds is None or seconds < 0:
        return NA
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m}:{s:02d}"


def bar(fraction: float | None, width: int, fill: str = "█", empty: str = "░") -> str:
    """A horizontal bar with eighth-block resolution; ``None`` draws an empty track."""
    if width <= 0:
        return ""
    if fraction is None or math.isnan(fraction):
        return empty * width
    f = min(1.0, max(0.0, fraction))
    eighths = round(f * width * 8)
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part and full < width else ""
    s = fill * full + partial
    return s + empty * (width - len(s))


def bucket(
    points: Sequence[tuple[float, float]], t0: float, t1: float, width: int
) -> list[tuple[float | None, float | None]]:
    """Split (ts, value) points into ``width`` equal time buckets over [t0, t1).

    Returns (mean, min) per bucket, ``(None, None)`` where a bucket is empty: the mean draws the
    line, the min reveals short idle gaps the mean would hide.
    """
    if width <= 0 or t1 <= t0:
        return []
    sums = [0.0] * width
    counts = [0] * width
    mins: list[float | None] = [None] * width
    span = (t1 - t0) / width
    for ts, v in points:
        if ts < t0 or ts >= t1 or v is None:
            continue
        k = min(width - 1, int((ts - t0) / span))
        sums[k] += v
        counts[k] += 1
        m = mins[k]
        mins[k] = v if m is None else min(m, v)
    return [(sums[k] / counts[k], mins[k]) if counts[k] else (None, None) for k in range(width)]


def bridge_gaps(
    cells: Sequence[tuple[float | None, float | None]], points: Sequence[tuple[float, float]], t0: float, t1: float
) -> list[tuple[float | None, float | None]]:
    """Fill the empty buckets between two samples that are at most a missed poll apart.

    A metric read every 2 s drawn in 1 s buckets would otherwise alternate value and blank,
    which reads as a dotted, idle-looking line. The previous value is held across the empty
    buckets; a longer silence (lost GPU, a paused source) stays a gap."""
    if len(points) < 2 or not cells:
        return list(cells)
    ts = sorted(p[0] for p in points)
    steps = sorted(b - a for a, b in zip(ts, ts[1:]) if b > a)
    if not steps:
        return list(cells)
    max_gap = 2.0 * steps[len(steps) // 2]  # one missed poll at the series' own rate
    span = (t1 - t0) / len(cells)
    max_cells = int(max_gap / span)
    out = list(cells)
    last = None  # index of the last non-empty cell
    for k, c in enumerate(cells):
        if c[0] is None:
            continue
        if last is not None and 0 < k - last - 1 <= max_cells:
            for j in range(last + 1, k):
                out[j] = cells[last]
        last = k
    return out


def sparkline(values: Iterable[float | None], lo: float = 0.0, hi: float = 100.0, gap: str = " ") -> str:
    """One character per value; ``None`` (no data) is a gap, never a fake zero."""
    out = []
    rng = (hi - lo) or 1.0
    for v in values:
        if v is None:
            out.append(gap)
            continue
        f = min(1.0, max(0.0, (v - lo) / rng))
        out.append(SPARK[min(len(SPARK) - 1, int(f * len(SPARK)))])
    return "".join(out)


def truncate(text: str, width: int) -> str:
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def short_gpu_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100 80GB HBM3' for compact panels."""
    for prefix in ("NVIDIA ", "Tesla ", "GeForce "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


def fmt_length(seconds: float) -> str:
    """h:mm:ss, rounded to the second: every place a recording's or a session's length is shown
    (`info`, `report`, `record --list`, the recorder's last line, the replay's timeline)."""
    s = max(0, int(round(seconds)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}"
