"""The advisor pane: where each GPU's time went over the window, and the ranked findings.

It renders what the advisor already computed (``store.findings()`` and the breakdowns it
publishes with ``store.set_analysis("breakdowns", ...)``) through ``gputop.advisor.format``;
it computes nothing itself.
"""

from __future__ import annotations

from rich.text import Text

from .lines_view import LinesView
from .styled_lines import lines_to_text, lines_to_texts
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget

from ..advisor.format import Line, pane_lines

# Semantic styles of gputop.advisor.format -> Rich styles (terminal colours, so the user's
# theme and NO_COLOR apply).
STYLES = {
    "title": "bold",
    "dim": "dim",
    "num": "bold",
    "action": "bold cyan",
    "sev.critical": "bold red",
    "sev.warning": "bold yellow",
    "sev.info": "blue",
    "bucket.busy": "green",
    "bucket.data": "red",
    "bucket.cpu": "magenta",
    "bucket.sync": "bright_red",
    "bucket.h2d": "bright_magenta",
    "bucket.io": "yellow",
    "bucket.collective": "bright_yellow",
    "bucket.checkpoint": "blue",
    "bucket.unknown": "bright_black",
}


def to_text(lines: list[Line]) -> Text:
    return lines_to_text(lines, STYLES)


class AdvisorPane(Widget):
    """Call ``update_view(store)`` on each UI tick; it redraws only when the store changed."""

    DEFAULT_CSS = """
    AdvisorPane { height: 1fr; }
    AdvisorPane > VerticalScroll { height: 1fr; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._last: tuple | None = None
        self.last_lines: list[Line] = []  # what is shown, for tests and screenshots

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield LinesView(id="advisor-body")

    def update_view(self, store) -> None:
        session = getattr(self.app, "session", None)
        attached = getattr(session, "target_pid", None) is not None
        # The pane shows only what the advisor published: new samples alone change nothing here.
        key = (getattr(store, "analysis_version", store.version), self.size.width, attached)
        if key == self._last:
            return
        self._last = key
        breakdowns = store.analysis("breakdowns", ()) or ()
        lines = pane_lines(store.findings(), breakdowns, max(40, self.size.width - 2), attached)
        self.last_lines = lines
        # Only the lines that changed are repainted: most ticks change a few numbers.
        self.query_one("#advisor-body", LinesView).set_lines(lines_to_texts(lines, STYLES, max(1, self.size.width - 2)))
