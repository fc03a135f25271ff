"""The advisor pane: where each GPU's time went over the window, and the ranked findings.

It renders what the advisor already computed (``store.findings()`` and the breakdowns it
publishes with ``store.set_analysis("breakdowns", ...)``) through ``gputop.advisor.format``;
it computes nothing itself.
"""

from __future__ import annotations

from ..advisor.format import pane_lines
from .lines_pane import LinesPane

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


class AdvisorPane(LinesPane):
    """Call ``update_view(store)`` on each UI tick; it redraws only when the advisor published."""

    STYLES = STYLES
    BODY_ID = "advisor-body"

    def update_view(self, store) -> None:
        session = getattr(self.app, "session", None)
        attached = getattr(session, "target_pid", None) is not None
        # The pane shows only what the advisor published: new samples alone change nothing here.
        key = (getattr(store, "analysis_version", store.version), self.size.width, attached)
        if key == self._last:
            return
        self._last = key
        breakdowns = store.analysis("breakdowns", ()) or ()
        self.show(pane_lines(store.findings(), breakdowns, self.text_width, attached))
