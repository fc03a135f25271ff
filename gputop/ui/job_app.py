"""The job view (``gputop job``): one distributed job across its hosts, refreshed from Prometheus.

The verdict (straggler, the rank that never arrives, ranks nobody reports) stays at the top; the
ranks scroll below it, grouped by host. The app renders what ``fetch`` returns (a ``fleet.Job``
and its ``fleet.Judgement``, the findings held across refreshes by ``fetch``'s memory) through
``present.job``; it queries nothing itself. Each refresh
runs in a worker thread, so a slow or unreachable server never blocks the keys; a failed
refresh says so on the status line and keeps the last answer on screen.
"""

from __future__ import annotations

import time
from typing import Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll

from ..present import header_lines, rank_lines, verdict_lines
from ..units import fmt_clock
from .lines_view import LinesView
from .ranks_pane import STYLES as RANK_STYLES
from .styled_lines import lines_to_texts

STYLES = {**RANK_STYLES, "grp.comm": "yellow"}
CHROME = 2 + 1  # padding and the scrollbar, as the panes reserve


class JobApp(App):
    TITLE = "gputop job"
    CSS = """
    #job-top { height: auto; padding: 0 1; }
    #job-scroll { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
    #job-status { height: 1; padding: 0 1; color: $text-muted; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("ctrl+c", "quit", "quit", show=False),
        Binding("r", "refresh_now", "refresh"),
        Binding("j,down", "scroll(1)", "down", show=False),
        Binding("k,up", "scroll(-1)", "up", show=False),
        Binding("pagedown", "scroll(10)", show=False),
        Binding("pageup", "scroll(-10)", show=False),
    ]

    def __init__(self, fetch: Callable[[], tuple], interval: float, first: tuple | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.fetch = fetch
        self.interval = interval
        self.clock = clock
        self._shown: tuple | None = first
        self._at = clock() if first is not None else None
        self.last_error: str | None = None

    def compose(self) -> ComposeResult:
        yield LinesView(id="job-top")
        with VerticalScroll(id="job-scroll"):
            yield LinesView(id="job-ranks")
        yield LinesView(id="job-status", cut_words=True)

    def on_mount(self) -> None:
        if self._shown is None:
            self.refresh_job()
        else:
            self._render()
        self.set_interval(self.interval, self.refresh_job)

    def on_resize(self) -> None:
        self._render()

    @property
    def text_width(self) -> int:
        return max(40, self.size.width - CHROME)

    def action_refresh_now(self) -> None:
        self.refresh_job()

    def action_scroll(self, lines: int) -> None:
        self.query_one("#job-scroll", VerticalScroll).scroll_relative(y=lines, animate=False)

    @work(thread=True, exclusive=True, group="fetch")
    def refresh_job(self) -> None:
        try:
            got = self.fetch()
        except Exception as exc:  # the server went away, the job ended: keep the last answer
            self.call_from_thread(self._failed, str(exc))
            return
        self.call_from_thread(self._got, got)

    def _got(self, got: tuple) -> None:
        self._shown, self._at, self.last_error = got, self.clock(), None
        self._render()

    def _failed(self, why: str) -> None:
        self.last_error = why
        self._render()

    def _render(self) -> None:
        if not self.is_mounted:
            return
        width = self.text_width
        status = self.query_one("#job-status", LinesView)
        if self._shown is None:
            self.query_one("#job-top", LinesView).set_lines(
                lines_to_texts([(("asking Prometheus …", "dim"),)], STYLES, width))
        else:
            job, judgement = self._shown
            # The newest evaluation's time where the judgement has one: what the data says, not
            # when it arrived.
            when = judgement.at if judgement.at is not None else self._at
            at = f"as of {fmt_clock(when)}" if when else ""
            top = [*header_lines(job, at, self.interval), *verdict_lines(job, judgement, width)]
            self.query_one("#job-top", LinesView).set_lines(lines_to_texts(top, STYLES, width))
            self.query_one("#job-ranks", LinesView).set_lines(
                lines_to_texts(rank_lines(job, judgement, width), STYLES, width))
        line = (f"refresh failed: {self.last_error}", "bad") if self.last_error else ("q quit · r refresh · ↑↓ PgUp PgDn scroll", "dim")
        status.set_lines(lines_to_texts([(line,)], STYLES, width))
