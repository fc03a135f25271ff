"""Small inline SVG charts for the HTML report. Pure: numbers in, SVG text out.

No scripts, no external references; every label goes through ``html.escape``. Sizes are in
user units and the SVG scales to the page (``viewBox`` + width 100 %).
"""

from __future__ import annotations

import html
import time
from typing import Sequence

from ..units import fmt_si

W = 960  # drawing width
PAD_L = 44
PAD_R = 8
PAD_T = 8
PAD_B = 20

COLORS = {
    "busy": "#2e7d32",
    "idle": "#d32f2f",
    "min": "#81c784",
    "line": "#1565c0",
    "line2": "#6a1b9a",
    "grid": "#e0e0e0",
    "text": "#555",
    "critical": "#b71c1c",
    "warning": "#f9a825",
    "info": "#0277bd",
}


def esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def _x(t: float, t0: float, t1: float) -> float:
    return PAD_L + (t - t0) / max(1e-9, t1 - t0) * (W - PAD_L - PAD_R)


def _y(v: float, lo: float, hi: float, h: int) -> float:
    f = (v - lo) / max(1e-9, hi - lo)
    return PAD_T + (1 - min(1.0, max(0.0, f))) * (h - PAD_T - PAD_B)


def _time_axis(t0: float, t1: float, h: int) -> list[str]:
    out = []
    span = max(1.0, t1 - t0)
    fmt = "%H:%M" if span > 600 else "%H:%M:%S"
    for k in range(7):
        t = t0 + span * k / 6
        x = _x(t, t0, t1)
        out.append(f'<line x1="{x:.1f}" y1="{PAD_T}" x2="{x:.1f}" y2="{h - PAD_B}" stroke="{COLORS["grid"]}"/>')
        anchor = "start" if k == 0 else "end" if k == 6 else "middle"
        out.append(f'<text x="{x:.1f}" y="{h - 5}" font-size="11" fill="{COLORS["text"]}" text-anchor="{anchor}">'
                   f'{esc(time.strftime(fmt, time.localtime(t)))}</text>')
    return out


def _y_axis(lo: float, hi: float, h: int, unit: str) -> list[str]:
    out = []
    for k in range(3):
        v = lo + (hi - lo) * k / 2
        y = _y(v, lo, hi, h)
        out.append(f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" stroke="{COLORS["grid"]}"/>')
        out.append(f'<text x="{PAD_L - 4}" y="{y + 4:.1f}" font-size="11" fill="{COLORS["text"]}" '
                   f'text-anchor="end">{esc(fmt_si(v))}{esc(unit)}</text>')
    return out


def _path(
    points: Sequence[tuple[float, float | None]], t0: float, t1: float, lo: float, hi: float, h: int,
    max_gap: float | None = None,
) -> str:
    """A polyline path. ``max_gap``: points at most this many seconds apart are joined even
    across empty (None) buckets between them; further apart is a real gap and breaks the line.
    Without it every None breaks the line. A point with no neighbour gets a short tick, so a
    lone sample still shows."""
    d = []
    prev: float | None = None  # time of the last point drawn; None after a break
    run = 0
    for t, v in points:
        if v is None:
            if max_gap is None:
                prev = None
            continue
        join = prev is not None and (max_gap is None or t - prev <= max_gap)
        if not join and run == 1:
            d.append("h1.5")
        d.append(f"{'L' if join else 'M'}{_x(t, t0, t1):.1f},{_y(v, lo, hi, h):.1f}")
        run = run + 1 if join else 1
        prev = t
    if run == 1:
        d.append("h1.5")
    return " ".join(d)


def svg_open(h: int, title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {h}" width="100%" role="img" '
            f'aria-label="{esc(title)}"><title>{esc(title)}</title>')


def util_chart(
    t0: float,
    t1: float,
    util: Sequence[tuple[float, float | None]],
    util_min: Sequence[tuple[float, float | None]] = (),
    idle: Sequence[tuple[float, float, str] | tuple[float, float, str, str]] = (),
    marks: Sequence[tuple[float, str, str]] = (),
    h: int = 170,
    title: str = "GPU utilisation",
    max_gap: float | None = None,
) -> str:
    """Mean utilisation (filled), its minimum (thin), idle periods as bands coloured by their
    cause (red where none is known; an optional fourth item is the band's colour) with the cause
    on hover, findings as triangles on top with their title on hover."""
    parts = [svg_open(h, title)]
    parts += _y_axis(0, 100, h, "%")
    parts += _time_axis(t0, t1, h)
    for a, b, cause, *colour in idle:
        x0, x1 = _x(a, t0, t1), _x(b, t0, t1)
        fill, opacity = (colour[0], 0.35) if colour else (COLORS["idle"], 0.18)
        parts.append(f'<rect x="{x0:.1f}" y="{PAD_T}" width="{max(1.0, x1 - x0):.1f}" height="{h - PAD_T - PAD_B}" '
                     f'fill="{fill}" fill-opacity="{opacity}"><title>{esc(cause)}</title></rect>')
    line = _path(util, t0, t1, 0, 100, h, max_gap)
    if line:
        base = h - PAD_B
        first = next((t for t, v in util if v is not None), t0)
        last = next((t for t, v in reversed(util) if v is not None), t1)
        parts.append(f'<path d="{line} L{_x(last, t0, t1):.1f},{base} L{_x(first, t0, t1):.1f},{base} Z" '
                     f'fill="{COLORS["busy"]}" fill-opacity="0.35" stroke="{COLORS["busy"]}" stroke-width="1"/>')
    low = _path(util_min, t0, t1, 0, 100, h, max_gap)
    if low:
        parts.append(f'<path d="{low}" fill="none" stroke="{COLORS["idle"]}" stroke-width="0.7" stroke-opacity="0.6"/>')
    for t, sev, label in marks:
        x = _x(t, t0, t1)
        color = COLORS.get(sev, COLORS["info"])
        parts.append(f'<path d="M{x - 5:.1f},{PAD_T} L{x + 5:.1f},{PAD_T} L{x:.1f},{PAD_T + 9}" fill="{color}">'
                     f'<title>{esc(label)}</title></path>')
    parts.append("</svg>")
    return "".join(parts)


def line_chart(
    t0: float,
    t1: float,
    series: Sequence[tuple[str, Sequence[tuple[float, float | None]], str]],
    lo: float = 0.0,
    hi: float | None = None,
    unit: str = "",
    h: int = 120,
    title: str = "",
    max_gap: float | None = None,
) -> str:
    """One or more lines: (label, points, colour key); ``max_gap`` as for ``_path``."""
    vals = [v for _, pts, _ in series for _, v in pts if v is not None]
    if hi is None:
        hi = max(vals) * 1.1 if vals else 1.0
    hi = max(hi, lo + 1e-9)
    parts = [svg_open(h, title)]
    parts += _y_axis(lo, hi, h, unit)
    parts += _time_axis(t0, t1, h)
    for i, (label, pts, color) in enumerate(series):
        d = _path(pts, t0, t1, lo, hi, h, max_gap)
        if d:
            parts.append(f'<path d="{d}" fill="none" stroke="{COLORS.get(color, color)}" stroke-width="1.2">'
                         f'<title>{esc(label)}</title></path>')
        parts.append(f'<text x="{PAD_L + 6 + 150 * i}" y="{PAD_T + 12}" font-size="11" '
                     f'fill="{COLORS.get(color, color)}">{esc(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def stacked_bar(segments: Sequence[tuple[str, float, str]], h: int = 34, title: str = "") -> str:
    """A horizontal bar split into (label, share 0..1, colour) segments, labels on hover."""
    parts = [svg_open(h, title)]
    x = 0.0
    for label, share, color in segments:
        w = share * W
        if w <= 0:
            continue
        parts.append(f'<rect x="{x:.1f}" y="2" width="{w:.1f}" height="{h - 4}" fill="{esc(color)}">'
                     f'<title>{esc(label)} {100 * share:.1f}%</title></rect>')
        if w > 70:
            parts.append(f'<text x="{x + 4:.1f}" y="{h / 2 + 4:.1f}" font-size="12" fill="#fff">'
                         f'{esc(label)} {100 * share:.0f}%</text>')
        x += w
    parts.append("</svg>")
    return "".join(parts)
