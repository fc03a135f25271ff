"""The GPU panel's memory forecast: "MEM 21.3G/80.0G +310 MB/min, full in ~14 min (10-20)", beside
the memory figure when the job's memory on that GPU grows steadily, coloured by how soon it runs out.

Pure: a ``GpuMemory`` (analysis.memory_window, published with the panes' views) in, Rich text
out. A warm-up, a plateau, a saw-tooth or too little history says nothing: the panel's figure
already says how full the card is, and only steady growth changes what the person should do.
"""

from __future__ import annotations

from rich.text import Text

from ..advisor import MEMORY_WARN_WITHIN_S
from ..analysis import GpuMemory, eta_text, rate_text

# Sooner than this, the job dies before most people could checkpoint it and fix the leak:
# the loudest colour. Judgement (a checkpoint of a large model takes minutes).
URGENT_S = 15 * 60.0
# Between URGENT_S and the advisor's warning bar (memory-growth is a warning within 2 h) the
# colour of a warning; further away, or with no limit to reach, quiet.
URGENT_STYLE, WARN_STYLE, QUIET_STYLE = "bold red", "yellow", "dim"


def forecast_style(eta_s: float | None) -> str:
    if eta_s is None:
        return QUIET_STYLE
    if eta_s <= URGENT_S:
        return URGENT_STYLE
    if eta_s <= MEMORY_WARN_WITHIN_S:
        return WARN_STYLE
    return QUIET_STYLE


def forecast_texts(gm: GpuMemory | None) -> list[str]:
    """The forecast's wordings, longest first (the panel takes the longest that fits); none
    unless the memory grows steadily. Where NVML gives no per-process figure the series is the
    whole card's (other processes' memory counts in it), and the text says so ("card +310 MB/min")."""
    if gm is None or not gm.growth.growing:
        return []
    g = gm.growth
    card = "" if gm.source == "process" else "card "
    rate = f"{card}+{rate_text(g.rate)}"
    if g.eta_s is None:
        return [rate]
    eta = eta_text(g)
    point = eta.split(" (")[0]  # "~14 min" without its interval
    return [f"{rate}, full in {eta}", f"{rate}, full {point}", f"{card}full {point}"]


def fitting(gm: GpuMemory | None, room: int) -> str | None:
    """The longest wording within ``room`` cells, else the shortest; None when there is none."""
    texts = forecast_texts(gm)
    if not texts:
        return None
    return next((t for t in texts if len(t) <= room), texts[-1])


def forecast_text(gm: GpuMemory | None, room: int) -> Text | None:
    """The longest wording that fits ``room`` cells (the shortest when none does: a forecast of
    the end outranks the figures it pushes off the line), styled by urgency; None when there is
    nothing to say."""
    chosen = fitting(gm, room)
    if chosen is None or gm is None:
        return None
    return Text(chosen, style=forecast_style(gm.growth.eta_s))


__all__ = ["URGENT_S", "fitting", "forecast_style", "forecast_text", "forecast_texts"]
