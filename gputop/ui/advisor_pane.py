"""The advisor pane: where each GPU's time went over the window, and the ranked findings.

It renders what the advisor already computed (``store.findings()`` and the breakdowns it
publishes with ``store.set_analysis("breakdowns", ...)``) through ``gputop.advisor.format``;
it computes nothing itself.
"""

from __future__ import annotations

from rich.text import Text

from .styled_lines import lines_to_text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

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
            yield Static(id="advisor-body")

    def update_view(self, store) -> None:
        key = (store.version, self.size.width)
        if key == self._last:
            return
        self._last = key
        breakdowns = store.analysis("breakdowns", ()) or ()
        session = getattr(self.app, "session", None)
        attached = getattr(session, "target_pid", None) is not None
        lines = pane_lines(store.findings(), breakdowns, max(40, self.size.width - 2), attached)
        self.last_lines = lines
        self.query_one("#advisor-body", Static).update(to_text(lines))
