"""The advisor pane: where each GPU's time went over the window, and the ranked findings.

It renders what the advisor already computed (``store.findings()`` and the breakdowns it
returns in its ``Verdict``: ``store.breakdowns()``) through ``gputop.present.advice``;
it computes nothing itself.
"""

from __future__ import annotations

from textual import events
from textual.containers import VerticalScroll

from ..advisor import nothing_yet
from ..present import advice_pane_lines, finding_starts, session_start_in
from ..units import fmt_clock
from .lines_pane import LinesPane
from .lines_view import LinesView
from .pane import PaneContext

# Semantic styles of gputop.present.advice -> Rich styles (terminal colours, so the user's
# theme and NO_COLOR apply).
STYLES = {
    "title": "bold",
    "dim": "dim",
    "num": "bold",
    "action": "bold cyan",
    "sev.critical": "bold red",
    "sev.warning": "bold yellow",
    "sev.info": "blue",
    "warn": "yellow",
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


def verdict_for(store, pid: int | None, has_gpu: bool) -> tuple:
    """(breakdowns, findings, pending, collecting) of the advisor's latest verdict, if it speaks of
    the job attached now: just after the user attaches to another job it is still the previous
    one's (its findings, its age), and none is there before the first evaluation; then nothing but
    what is being collected. The pane and the verdict line read the same, so they never disagree."""
    published, about = store.verdict_target()
    if published and about == pid:
        return store.breakdowns(), store.findings(), store.pending_findings(), store.collecting()
    return (), [], [], nothing_yet(pid is not None, has_gpu)


class AdvisorPane(LinesPane):
    """Call ``update_view(ctx)`` on each UI tick; it redraws only when the advisor published."""

    STYLES = STYLES
    BODY_ID = "advisor-body"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._findings: list = []
        self._starts: list[int] = []  # row of each finding's title line

    def update_view(self, ctx: PaneContext) -> None:
        store, pid, no_stacks = ctx.store, ctx.target_pid, ctx.no_stacks
        attached = pid is not None
        # The pane shows only what the advisor published: new samples alone change nothing here.
        has_gpu = bool(store.gpu_indices())
        # The target's end, as its sampler recorded it (a ProcSample with status "exited"; in a
        # replay, from the file): the findings are then what was showing while it ran.
        last = store.procs_latest().get(pid) if pid is not None else None
        exited = last.ts if last is not None and last.status == "exited" else None
        key = (store.analysis_version, self.size.width, attached, has_gpu, no_stacks, exited, pid, ctx.findings_lost)
        if key == self._last:
            return
        self._last = key
        # The advisor's latest verdict, if it speaks of the job attached now: just after the user
        # attaches to another job it is still the previous one's (its findings, its age), and none
        # is there before the first evaluation. Then the pane says what is being collected.
        breakdowns, self._findings, pending, collecting = verdict_for(store, pid, has_gpu)
        lines = advice_pane_lines(self._findings, breakdowns, self.text_width, attached, has_gpu,
                                  pending=pending, no_stacks=no_stacks, collecting=collecting,
                                  exited=None if exited is None else f"PID {pid} at {fmt_clock(exited)}",
                                  session_start=session_start_in(store, breakdowns), findings_lost=ctx.findings_lost)
        self._starts = finding_starts(lines)
        self.show(lines)

    # ----------------------------------------------------------------- copying an action

    def finding_at(self, row: int):
        """The finding whose block holds ``row`` (a line of the pane), if any."""
        index = max((i for i, start in enumerate(self._starts) if start <= row), default=None)
        return self._findings[index] if index is not None and index < len(self._findings) else None

    def visible_finding(self):
        """The first finding whose title is on screen (the top one if none is)."""
        top = self.query_one(VerticalScroll).scroll_offset.y
        on_screen = [f for f, start in zip(self._findings, self._starts) if start >= top]
        return on_screen[0] if on_screen else (self.finding_at(top) or (self._findings[0] if self._findings else None))

    def copy_action(self, finding) -> None:
        if finding is None:
            self.app.notify("no finding to copy", severity="warning", timeout=3)
            return
        # OSC 52: the terminal puts it on the clipboard, over SSH too, where the terminal allows it.
        self.app.copy_to_clipboard(finding.action)
        self.app.notify(f"copied: {finding.action[:70]}{'…' if len(finding.action) > 70 else ''}", timeout=4)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self.query_one(LinesView))
        if offset is not None:
            self.copy_action(self.finding_at(offset.y))
