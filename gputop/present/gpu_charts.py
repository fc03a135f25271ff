"""A GPU panel's history charts: utilisation (with SM and tensor activity inside it, and idle
columns coloured by their cause when attached), power beside it, and memory, over one window.

Power sits beside utilisation because the two together tell work from a spin: a GPU "busy" 100 %
at near-idle power runs a kernel that waits (an NCCL collective), not one that computes.
"""

from __future__ import annotations

from typing import Sequence

from rich.text import Text

from ..analysis import IDLE_UTIL_PCT, Bucket
from ..model import GpuSample
from ..units import bridge_gaps, fmt_bytes
from .idle_causes import CAUSE_SHORT, CAUSE_STYLE
from .plot import CAUSE_SHADE, EIGHTHS, area_rows, column_cells, minmax

UTIL_STYLE, SM_STYLE, TENSOR_STYLE = "green", "blue", "cyan"
IDLE_STYLE = "red"  # idle with no cause known (not attached, or no stack sample near it)
POWER_STYLE, MEM_STYLE = "yellow", "magenta"
# The legend's swatch.
SWATCH = EIGHTHS[6]


def window_label(seconds: float) -> str:
    """'30s', '2m', '15m': the chart window in at most 4 characters."""
    return f"{seconds / 60:.0f}m" if seconds >= 60 else f"{seconds:.0f}s"


def split_width(width: int) -> tuple[int, int, int]:
    """Columns for utilisation, power and memory (a space between each): utilisation gets half,
    being the chart read first and the one coloured by cause."""
    room = max(3, width - 2)
    util = room // 2
    power = (room - util) // 2
    return util, power, room - util - power


def _series(points: Sequence[tuple[float, float]], t0: float, t1: float, width: int) -> list[tuple[float | None, float | None]]:
    # A metric polled every 2 s, drawn in 1 s columns, would alternate value and blank.
    return bridge_gaps(minmax(points, t0, t1, width), points, t0, t1)


def util_columns(history, width: int, rows: int) -> tuple[list, set[Bucket], bool]:
    """The utilisation chart's columns; the causes drawn; whether an idle column went uncoloured."""
    t0, t1 = history.t0, history.t1
    pts = [(p.ts, p.util) for p in history.util]
    if not pts:  # no 200 ms buffer on this GPU: the polls' own utilisation
        pts = [(x.ts, x.util_gpu) for x in history.samples if x.util_gpu is not None]
    util = _series(pts, t0, t1, width)
    sm = _series([(x.ts, x.sm_active) for x in history.samples if x.sm_active is not None], t0, t1, width)
    tc = _series([(x.ts, x.tensor_active) for x in history.samples if x.tensor_active is not None], t0, t1, width)
    causes = history.causes
    drawn: set[Bucket] = set()
    plain_idle = False
    cols = []
    for k, (hi, lo) in enumerate(util):
        if hi is None:
            cols.append([(" ", None)] * rows)
            continue
        style, shade = UTIL_STYLE, None
        if lo is not None and lo < IDLE_UTIL_PCT:
            cause = causes[k] if causes is not None and k < len(causes) else None
            if cause is None:
                style = IDLE_STYLE
                plain_idle = True
            else:
                style = shade = CAUSE_STYLE[cause]
                drawn.add(cause)
        layers = []
        # SM and tensor activity are shares of the time kernels ran: drawn inside utilisation.
        for v, st in ((tc[k][0], TENSOR_STYLE), (sm[k][0], SM_STYLE)):
            if v is not None and v > 0:
                layers.append((min(v, hi) / 100.0, st))
        layers.append((hi / 100.0, style))
        cols.append(column_cells(layers, rows, floor=1, shade=shade))
    return cols, drawn, plain_idle


def _plain_columns(values, rows: int, style: str, top: float) -> list:
    return [
        column_cells(((hi / top if top > 0 else 0.0, style),), rows, floor=1) if hi is not None else [(" ", None)] * rows
        for hi, _ in values
    ]


def chart_lines(history, s: GpuSample, width: int, rows: int, attached: bool) -> list[Text]:
    """``rows`` chart lines, a legend line under them and, when attached, a line naming the idle
    causes drawn. ``history``: t0, t1, util points, GPU samples and ``causes`` (a cause or
    ``None`` per utilisation column; ``None`` altogether when not attached)."""
    uw, pw, mw = split_width(width)
    t0, t1 = history.t0, history.t1
    ucols, drawn, plain_idle = util_columns(history, uw, rows)
    limit = s.power_limit_w or max((x.power_w or 0.0 for x in history.samples), default=0.0) or 1.0
    power = _series([(x.ts, x.power_w) for x in history.samples if x.power_w is not None], t0, t1, pw)
    mem = _series([(x.ts, 100.0 * x.mem_fraction) for x in history.samples if x.mem_fraction is not None], t0, t1, mw)
    parts = (area_rows(ucols, rows), area_rows(_plain_columns(power, rows, POWER_STYLE, limit), rows),
             area_rows(_plain_columns(mem, rows, MEM_STYLE, 100.0), rows))
    lines = []
    for r in range(rows):
        t = Text(no_wrap=True, overflow="ellipsis")
        for i, part in enumerate(parts):
            if i:
                t.append(" ")
            t.append_text(part[r])
        lines.append(t)

    # The legend: what each chart is, its scale, and the window `[` `]` change.
    legend = Text(no_wrap=True, overflow="ellipsis")
    u = Text(no_wrap=True)
    u.append(f"util {window_label(t1 - t0)} ", style="bold")
    for name, style in (("SM", SM_STYLE), ("tensor", TENSOR_STYLE)):
        u.append(SWATCH, style=style)
        u.append(f"{name} ", style="dim")
    if plain_idle or not attached:
        u.append(SWATCH, style=IDLE_STYLE)
        u.append("idle", style="dim")
    _cell(legend, u, uw)
    legend.append(" ")
    p = Text(no_wrap=True)
    p.append("power", style="bold")
    p.append(f" to {s.power_limit_w:.0f}W" if s.power_limit_w else "", style="dim")
    _cell(legend, p, pw)
    legend.append(" ")
    m = Text(no_wrap=True)
    m.append("mem", style="bold")
    m.append(f" to {fmt_bytes(s.mem_total)}" if s.mem_total else "", style="dim")
    _cell(legend, m, mw)
    lines.append(legend)
    if attached:
        lines.append(cause_legend(drawn))
    return lines


def cause_legend(drawn: set[Bucket]) -> Text:
    """The idle causes the chart draws, in the Advisor's order; says so when there are none."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("idle by cause: ", style="dim")
    if not drawn:
        t.append("no attributed idle time in this window", style="dim")
        return t
    for b in (b for b in Bucket if b in drawn):
        t.append(CAUSE_SHADE + SWATCH, style=CAUSE_STYLE[b])
        t.append(f" {CAUSE_SHORT[b]}  ")
    return t


def _cell(line: Text, part: Text, width: int) -> None:
    part.truncate(width, overflow="ellipsis", pad=True)
    line.append_text(part)
