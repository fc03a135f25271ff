"""The ranks pane: a row per local rank of the attached multi-rank job (what it does now, where
its time went, its hot function), each GPU's breakdown under the rank that owns it, and the links
between the ranks' GPUs.

It renders ``analysis.ranks.job_view`` through ``present.ranks``; it computes nothing itself.
"""

from __future__ import annotations

from .lines_pane import LinesPane

from ..analysis.ranks import job_view
from ..analysis.stacks_summary import DEFAULT_WINDOW_S
from ..present.ranks import pane_lines
from .stacks_pane import STYLES as STACK_STYLES
from .advisor_pane import STYLES as ADVICE_STYLES

# Semantic styles of gputop.present.ranks -> Rich styles (terminal colours, so the user's theme
# and NO_COLOR apply); the bucket colours are the Advisor's.
STYLES = {
    **STACK_STYLES,
    **{k: v for k, v in ADVICE_STYLES.items() if k.startswith("bucket.")},
    "grp.compute": "green",
    "grp.data": "red",
    "grp.comm": "yellow",
    "grp.ckpt": "blue",
    "grp.other": "",
}


class RanksPane(LinesPane):
    """Call ``update_view(store, nvlink_bps)`` on each UI tick."""

    STYLES = STYLES
    BODY_ID = "ranks-body"

    def __init__(self, *, window_s: float = DEFAULT_WINDOW_S, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.window_s = window_s

    def update_view(self, store, nvlink_bps=None) -> None:
        key = (store.version, getattr(store, "analysis_version", None), self.size.width)
        if key == self._last:
            return
        self._last = key
        self.show(pane_lines(job_view(store, self.window_s), self.text_width, store.breakdowns(), nvlink_bps))
