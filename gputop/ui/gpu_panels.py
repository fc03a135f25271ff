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


def choose_mode(height: int, n_gpus: int) -> str:
    """The largest panel size at which ``n_gpus`` panels leave the table its rows."""
    avail = height - 1 - HOST_LINES - 1 - 1 - 3 - MIN_TABLE_ROWS  # header, host, status, footer, tabs
    for mode in (FULL, MEDIUM, COMPACT):
        per = PANEL_LINES[mode] + (1 if mode == FULL else 0)  # full panels carry a rule
        if n_gpus * per <= avail:
            return mode
    return COMPACT


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
        mode = choose_mode(height, len(indices))
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
            widget.set_lines(gpu_panel_lines(view.gpu_info.get(i), view.latest_gpu(i), history, width, mode))
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
