"""Multi-row history charts drawn with eighth blocks: the drawing math, apart from any widget.

A chart is columns of time; each column holds stacked layers (a fraction of the chart's height and
a style each, innermost first), drawn bottom-up in eighths of a cell. Pure: the GPU panels call it
with series from the store, the tests with plain numbers.
"""

from __future__ import annotations

from typing import Sequence

from rich.text import Text

# A cell filled by n eighths from its bottom (0: empty, 8: full).
EIGHTHS = " ▁▂▃▄▅▆▇█"
# What an idle column with a known cause fills its empty cells with: the cause as an area, not
# just a colour on a bar that may be a few eighths tall.
CAUSE_SHADE = "░"

Layer = tuple[float, str]  # (fraction of the chart's height 0..1, style)


def minmax(points: Sequence[tuple[float, float]], t0: float, t1: float, width: int) -> list[tuple[float | None, float | None]]:
    """(max, min) of the (ts, value) points in each of ``width`` equal buckets over [t0, t1);
    ``(None, None)`` where a bucket is empty. Downsampling by the mean would hide a 200 ms
    idle gap in a busy 4 s column; the max draws the column, the min keeps the gap in sight."""
    if width <= 0 or t1 <= t0:
        return []
    hi: list[float | None] = [None] * width
    lo: list[float | None] = [None] * width
    span = (t1 - t0) / width
    for ts, v in points:
        if v is None or ts < t0 or ts >= t1:
            continue
        k = min(width - 1, int((ts - t0) / span))
        h = hi[k]
        if h is None:
            hi[k] = lo[k] = v
        else:
            hi[k] = max(h, v)
            lo[k] = min(lo[k], v)  # type: ignore[type-var]
    return list(zip(hi, lo))


def eighths(fraction: float, rows: int) -> int:
    """A height as whole eighths of ``rows`` cells (rounded, clamped)."""
    return max(0, min(rows * 8, round(max(0.0, min(1.0, fraction)) * rows * 8)))


def column_cells(layers: Sequence[Layer], rows: int, floor: int = 0, shade: str | None = None) -> list[tuple[str, str | None]]:
    """One column as ``rows`` (char, style) cells, bottom first.

    ``layers``: innermost first (a smaller height drawn over a larger one: tensor activity inside
    SM activity inside utilisation); the outermost gives the column its height and the style of
    its partial top cell. ``floor``: the fewest eighths a column with data shows (an idle
    column stays visible as a baseline). ``shade``: a style that fills the cells above the
    column's top with a light shade (the idle column's cause), else they stay blank."""
    if not layers:
        return [(" ", None)] * rows
    tops = [eighths(f, rows) for f, _ in layers]
    top = max(max(tops), floor)
    out: list[tuple[str, str | None]] = []
    for r in range(rows):
        base = 8 * r
        if top >= base + 8:
            # A full cell takes the innermost layer that covers most of it.
            style = next((s for t, (_, s) in zip(tops, layers) if t >= base + 4), layers[-1][1])
            out.append((EIGHTHS[8], style))
        elif top > base:
            out.append((EIGHTHS[top - base], layers[-1][1]))
        elif shade is not None:
            out.append((CAUSE_SHADE, shade))
        else:
            out.append((" ", None))
    return out


def area_rows(columns: Sequence[list[tuple[str, str | None]]], rows: int) -> list[Text]:
    """Columns of cells (bottom first) as ``rows`` lines of text, top line first, one span per
    run of equal style (fewer segments to render every tick)."""
    lines: list[Text] = []
    for r in range(rows - 1, -1, -1):
        t = Text(no_wrap=True)
        run: list[str] = []
        run_style: str | None = None
        for col in columns:
            ch, style = col[r]
            if style != run_style and run:
                t.append("".join(run), style=run_style or "")
                run = []
            run.append(ch)
            run_style = style
        if run:
            t.append("".join(run), style=run_style or "")
        lines.append(t)
    return lines


def simple_area(values: Sequence[float | None], rows: int, style: str, hi: float = 100.0) -> list[Text]:
    """One series (``None``: no data, a blank column) as an area chart scaled to ``hi``."""
    cols = [
        column_cells(((v / hi if hi > 0 else 0.0, style),), rows, floor=1) if v is not None else [(" ", None)] * rows
        for v in values
    ]
    return area_rows(cols, rows)
