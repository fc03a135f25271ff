"""The GPU panels: one per GPU, shrunk (full, medium, one line) so that all of them and a few
rows of the process table fit the terminal."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll

from ..present.panels import COMPACT, FULL, MEDIUM, PANEL_LINES, History, gpu_panel_lines
from .lines_view import LinesView

# Rows the process table keeps for itself before GPU panels shrink to fit.
MIN_TABLE_ROWS = 6
HOST_LINES = 3


# The panels' share of the screen at most (``#gpus { max-height: 60% }`` in gputop.tcss, of the
# screen less the footer docked at its bottom).
MAX_SHARE = 0.6
CHART_LINES = PANEL_LINES[FULL] - PANEL_LINES[MEDIUM]  # util, tensor, memory and power


def choose_layout(height: int, n_gpus: int) -> tuple[str, int]:
    """The largest panel size at which ``n_gpus`` panels leave the table its rows, and how many
    history charts each full panel draws: all of them, else as many as fit (the utilisation
    chart first) before the panels fall back to no charts at all."""
    avail = height - 1 - HOST_LINES - 1 - 1 - 3 - MIN_TABLE_ROWS  # header, host, status, footer, tabs
    avail = min(avail, int((height - 1) * MAX_SHARE))
    for charts in range(CHART_LINES, 0, -1):
        if n_gpus * (PANEL_LINES[MEDIUM] + charts + 1) <= avail:  # full panels carry a rule
            return FULL, charts
    for mode in (MEDIUM, COMPACT):
        if n_gpus * PANEL_LINES[mode] <= avail:
            return mode, 0
    return COMPACT, 0


def choose_mode(height: int, n_gpus: int) -> str:
    """The panel size ``choose_layout`` picks."""
    return choose_layout(height, n_gpus)[0]


class GpuPanels(VerticalScroll):
    """Call ``show(view, chart_window, height)`` on each redraw; it returns the panel size used."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._panels: dict[int | str, LinesView] = {}

    def show(self, view, chart_window: float, height: int) -> str:
        indices = view.gpu_indices()
        if not indices:
            self._no_gpus(view.system)
            return FULL
        if set(self._panels) != set(indices):
            self._replace({i: LinesView(classes="gpu-panel", id=f"gpu-{i}") for i in indices})
        mode, charts = choose_layout(height, len(indices))
        width = max(20, (self.size.width or self.app.size.width or 80) - 2)
        now = view.now
        t0 = now - chart_window
        for i, widget in self._panels.items():
            widget.set_class(mode == FULL, "-full")
            history = None
            if mode != MEDIUM:
                history = History(
                    t0=t0,
                    t1=now + 1e-6,
                    util=view.util_window(i, t0),
                    samples=view.gpu_window(i, t0) if mode == FULL else (),
                )
            widget.set_lines(gpu_panel_lines(view.gpu_info.get(i), view.latest_gpu(i), history, width, mode, charts))
        return mode

    def _no_gpus(self, system) -> None:
        if "none" not in self._panels:
            self._replace({"none": LinesView(classes="gpu-panel")})
        msg = Text()
        if system is not None and system.nvml_error:
            # The reason is in the header; this line says what still works.
            msg.append("No GPU data. ", style="bold yellow")
            msg.append("Host and process monitoring continue; the table lists the busiest processes.", style="dim")
        else:
            msg.append("Waiting for GPU data…", style="dim")
        self._panels["none"].set_text(msg)

    def _replace(self, panels: dict[int | str, LinesView]) -> None:
        for w in self._panels.values():
            w.remove()
        self._panels = panels
        self.mount(*panels.values())
