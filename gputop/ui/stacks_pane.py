"""The stacks pane: what the attached job's threads and workers are doing, and whether it is stuck.

It lays out the store's latest ``PaneViews`` (``gputop.analysis.views``: the target's
``stacks_summary.StacksView``, computed on the pipeline's thread) through ``gputop.present.stacks``;
it analyses nothing on the event loop. The only work of its own is the on-demand native dump,
which runs py-spy (~0.6 s) in a worker thread.
"""

from __future__ import annotations

import time

from rich.text import Text

from textual.binding import Binding

from .lines_pane import LinesPane
from .pane import PaneContext
from .styled_lines import lines_to_text

from ..present import Line, stacks_pane_lines, stacks_waiting_lines
from ..units import fmt_clock


# Semantic style names of gputop.present.stacks -> Rich styles (terminal colours, so the
# user's theme and NO_COLOR apply).
STYLES = {
    "title": "bold",
    "head": "bold underline",
    "dim": "dim",
    "project": "bold cyan",
    "path": "cyan",
    "lib": "",
    "code": "italic",
    "bad": "bold red",
    "warn": "yellow",
    "num": "bold",
    "native": "",
    "cat.data-wait": "red",
    "cat.data-fetch": "magenta",
    "cat.host-sync": "bright_red",
    "cat.h2d-copy": "bright_magenta",
    "cat.forward": "green",
    "cat.backward": "bright_green",
    "cat.optimizer": "cyan",
    "cat.collective": "yellow",
    "cat.checkpoint-io": "blue",
    "cat.gc": "bright_yellow",
    "cat.idle": "bright_black",
    "cat.other": "white",
}


def to_text(lines: list[Line]) -> Text:
    return lines_to_text(lines, STYLES)


class StacksPane(LinesPane):
    """Call ``update_view(ctx)`` on each UI tick."""

    STYLES = STYLES
    BODY_ID = "stacks-body"

    BINDINGS = [Binding("n", "native_dump", "Native dump")]

    def __init__(self, *, native_dump=None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        # ``native_dump(pid) -> text`` (raises UserError): given by whoever owns the session.
        self._native_dump = native_dump
        self._pid: int | None = None
        self._native: list[str] = []
        self._native_busy = False
        self._ctx: PaneContext | None = None  # the last context, to redraw from when a native dump ends
        self._views = None  # the PaneViews shown: held so its id, in the redraw key, is not reused

    # ----------------------------------------------------------------- rendering

    def update_view(self, ctx: PaneContext) -> None:
        self._ctx = ctx
        store, target_pid = ctx.store, ctx.target_pid
        if target_pid != self._pid:
            self._pid = target_pid
            self._native = []
        # Redraw when the views stage published (each second while data comes; durations such as
        # "stuck for" are its, by the store's clock), or the native dump or the width changed.
        views = store.pane_views()
        key = (id(views), target_pid, len(self._native), self._native_busy, self.size.width, ctx.frames_lost)
        if key == self._last:
            return
        self._last, self._views = key, views
        if target_pid is None:
            lines: list[Line] = [
                (("Not attached to a training process.", "title"),),
                (("Select its row in the process table and press Enter, or run: gputop --pid PID", "dim"),),
            ]
        else:
            native = list(self._native)
            if self._native_busy:
                native = ["running py-spy dump --native …"]
            if views is None or views.target_pid != target_pid or views.stacks is None:
                lines = stacks_waiting_lines(target_pid, native)  # just attached: the stage looks within a second
            else:
                lines = stacks_pane_lines(views.stacks, self.text_width, native, ctx.frames_lost)
        self.show(lines)

    # ----------------------------------------------------------------- native dump

    def action_native_dump(self) -> None:
        self.request_native_dump(self._pid)

    def request_native_dump(self, pid: int | None) -> None:
        """Run ``py-spy dump --native`` for ``pid`` off the event loop; show it below."""
        if pid is None:
            self.notify("not attached to a process", severity="warning")
            return
        if self._native_busy:
            return
        self._native_busy = True
        self._redraw()
        self.run_worker(lambda: self._native_worker(pid), thread=True, exclusive=True, group="native-dump")

    def _native_worker(self, pid: int) -> None:
        from ..errors import UserError

        started = time.time()
        try:
            if self._native_dump is None:
                raise UserError("native dumps need a live session")
            out = self._native_dump(pid)
            lines = [f"Native dump of PID {pid} at {fmt_clock(started)} ({time.time() - started:.1f} s):"]
            lines += out.rstrip().splitlines()
        except UserError as exc:
            lines = [f"Native dump of PID {pid} failed: {exc}"]
        self.app.call_from_thread(self._show_native, pid, lines)

    def _show_native(self, pid: int, lines: list[str]) -> None:
        self._native_busy = False
        if pid == self._pid:
            self._native = lines
        self._redraw()

    def _redraw(self) -> None:
        self._last = None
        if self._ctx is not None:
            self.update_view(self._ctx)
