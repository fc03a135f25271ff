"""The ranks pane: a row per local rank of the attached multi-rank job (what it does now, where
its time went, its hot function), each GPU's breakdown under the rank that owns it, and the links
between the ranks' GPUs.

It lays out the store's latest ``PaneViews`` (``analysis.views``: ``analysis.ranks.job_view``,
computed on the pipeline's thread) through ``present.ranks``; it analyses nothing itself.
"""

from __future__ import annotations

from .lines_pane import LinesPane
from .pane import PaneContext

from ..present import ranks_pane_lines, ranks_waiting_lines
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
    """Call ``update_view(ctx)`` on each UI tick."""

    STYLES = STYLES
    BODY_ID = "ranks-body"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._views = None  # the PaneViews shown: held so its id, in the redraw key, is not reused

    def update_view(self, ctx: PaneContext) -> None:
        store = ctx.store
        # Redraw when the views stage or the advisor (the GPUs' breakdowns) published.
        views = store.pane_views()
        key = (id(views), store.analysis_version, self.size.width)
        if key == self._last:
            return
        self._last, self._views = key, views
        if views is None:
            self.show(ranks_waiting_lines())
            return
        self.show(ranks_pane_lines(views.job, self.text_width, store.breakdowns(), ctx.nvlink_bps))
