"""Pure text formatting: units, bars, sparklines. No Textual, no I/O.

The one home of how a number is written for people: percents, sizes, durations, times of day.
Where two places write one kind of number differently (a panel's compact ``61.0G`` and a
listing's ``61.0 GB``), both styles are here, each named for where it is used.
"""

from __future__ import annotations

import math
import time
from typing import Iterable, Sequence

SPARK = "▁▂▃▄▅▆▇█"
NA = "n/a"
# The duration syntax every time-like option and position takes (``90s``, ``1h30m``, ``2d``).
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


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


def fmt_growth(bytes_per_s: float) -> str:
    """Memory growth where room is short (a table cell, a panel's line), per minute with its sign:
    '+40M/min', '+4.5M/min', '+1.2G/min' (one decimal below ten of the unit, as ``fmt_bytes``)."""
    per_min = abs(bytes_per_s) * 60.0
    s = fmt_bytes(per_min)
    if not s.endswith("B") and float(s[:-1]) >= 10:
        s = fmt_bytes(per_min, 0)
    return ("-" if bytes_per_s < 0 else "+") + s + "/min"


def fmt_size(n: float | None) -> str:
    """Sizes in sentences and listings (files, recordings): '512 B', '1.5 KB', '2.0 GB' (binary
    multiples, a space before the unit; '?' when unknown)."""
    return "?" if n is None else _size(n, ".1f")


def fmt_size_limit(n: float) -> str:
    """A size limit as it was given (``--max-size``): up to four significant digits, '100 MB'."""
    return _size(n, ".4g")


def _size(n: float, spec: str) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:{spec}} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def fmt_si(v: float) -> str:
    """A chart axis's number: whole, in SI multiples (12, 9500, 15k, 3M, 2G)."""
    if abs(v) >= 1e9:
        return f"{v / 1e9:.0f}G"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.0f}M"
    if abs(v) >= 1e3 and abs(v) >= 10_000:
        return f"{v / 1e3:.0f}k"
    return f"{v:.0f}"


def fmt_pct(v: float | None, width: int = 0, digits: int = 0) -> str:
    """A percentage (0-100): '97%', 'n/a'; ``digits`` after the point, right-aligned to ``width``."""
    s = NA if v is None else f"{v:.{digits}f}%"
    return s.rjust(width) if width else s


def fmt_share(fraction: float) -> str:
    """A fraction (0-1) as a whole percentage: 0.423 -> '42%'."""
    return f"{100 * fraction:.0f}%"


def _sub_second(seconds: float) -> str:
    """A span under a second, which every whole-second format writes as zero ('0s', '0:00:00'):
    '0.4 s', or '35 ms' below a tenth, where one decimal of a second would round to '0.0 s'."""
    if seconds < 0.1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s"


def fmt_seconds(seconds: float | None) -> str:
    """A measured span in a sentence: '14 s', '0.4 s', '35 ms' ('?' when unknown). Whole seconds
    from one up: the spans it states (a watch, a window, a step) are not timed to a tenth."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    if 0 < seconds < 1:
        return _sub_second(seconds)
    return f"{seconds:.0f} s"


def fmt_duration(seconds: float | None) -> str:
    """Elapsed time like ps: 59s, 12:03, 3:04:05, 2d03h; under a second '0.4 s'."""
    if seconds is None or seconds < 0:
        return NA
    if 0 < seconds < 1:
        return _sub_second(seconds)
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


# Separators a cut line does not end on before its ellipsis ("restricted, …" reads as a list).
_CUT_TRAILERS = " ·,;:–—-("
# A cut at a word boundary keeps at least this share of the room; a longer last word (a path, a
# command line) is cut inside rather than losing most of the line to reach its start.
_WORD_CUT_MIN_SHARE = 0.6


def word_cut(text: str, width: int) -> int:
    """How much of ``text`` to keep before an ellipsis so the whole fits ``width``: up to the
    last word that fits (``len(text)`` when it fits whole)."""
    if len(text) <= width:
        return len(text)
    room = width - 1  # the ellipsis takes a column
    if room <= 0:
        return 0
    k = text.rfind(" ", 0, room + 1)
    if k < room * _WORD_CUT_MIN_SHARE:
        return room  # inside the long last word: its characters are all text
    while k > 0 and text[k - 1] in _CUT_TRAILERS:
        k -= 1
    return k


def truncate_words(text: str, width: int) -> str:
    """``text`` fitted to ``width``, cut at a word boundary with an ellipsis that says it was cut
    ('ptrace is restricted…' rather than 'ptrace is restricted (kernel.yama.')."""
    if width <= 0:
        return ""
    k = word_cut(text, width)
    return text if k == len(text) else text[:k] + "…"


def short_gpu_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100 80GB HBM3' for compact panels."""
    for prefix in ("NVIDIA ", "Tesla ", "GeForce "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


def fmt_elapsed(seconds: float | None) -> str:
    """A running time on a status line: '4:05', '1:02:03' (whole seconds; '?' when unknown;
    under a second '0.4 s', so a sub-second ``--duration`` is not written as '0:00')."""
    if seconds is None:
        return "?"
    if 0 < seconds < 1:
        return _sub_second(seconds)
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def fmt_limit(seconds: float) -> str:
    """A limit for people: '0.01 s', '45 s', '1h (3,600 s)', '366d (31,622,400 s)': the largest
    unit of the duration syntax that divides it, and the plain seconds (never '3.16224e+07 s')."""
    if seconds < 60 or seconds != int(seconds):
        return f"{seconds:,.10g} s"
    for unit in ("d", "h", "m"):
        if seconds % DURATION_UNITS[unit] == 0:
            return f"{int(seconds) // DURATION_UNITS[unit]:,}{unit} ({int(seconds):,} s)"
    return f"{int(seconds):,} s"


def fmt_clock(ts: float) -> str:
    """A moment as the local time of day: '14:03:12'."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def fmt_time(ts: float | None) -> str:
    """A moment as the local date and time: '2026-11-22 14:03:12' ('?' when unknown)."""
    if ts is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def fmt_length(seconds: float) -> str:
    """h:mm:ss, rounded to the second: every place a recording's or a session's length is shown
    (`info`, `report`, `record --list`, the recorder's last line, the replay's timeline). Under a
    second it is '0.4 s': rounded to '0:00:00' a short idle time or recording reads as none."""
    if 0 < seconds < 1:
        return _sub_second(seconds)
    s = max(0, int(round(seconds)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}"
