"""The GPU panels: one per GPU, shrunk (full, charts, medium, one line) so that all of them and a
few rows of the process table fit the terminal; the charts take the table's space when it has
no GPU process to list."""

from __future__ import annotations

from textual.containers import VerticalScroll

from ..present import (
    CHARTS, COMPACT, FULL, MEDIUM, PANEL_LINES, History, column_causes, gpu_panel_lines, hidden_gpus_line,
    index_width, no_gpu_text, split_width,
)
from .lines_view import LinesView

# Rows the process table keeps for itself before GPU panels shrink to fit (its title and rows).
MIN_TABLE_ROWS = 6
# ...and with no GPU process to list: the pane's least height (``.pane``'s min-height in
# gputop.tcss; the charts get the rest).
EMPTY_TABLE_ROWS = 3
HOST_LINES = 3
# The lines the screen's other parts were budgeted by default: header, host, status, footer, and
# three for the tabs (two of them spare). A screen whose other parts take more (a replay's
# three-line timeline, an attached job's verdict line) passes what they take (``chrome``): the
# panels then leave the table its rows instead of pushing the status line off the screen.
DEFAULT_CHROME = 1 + HOST_LINES + 1 + 1 + 3

# The panels' share of the screen at most (of the screen less the footer docked at its bottom):
# with processes to list, the rest is the table's; without, the charts may take most of it.
MAX_SHARE = 0.6
MAX_SHARE_NO_PROCS = 0.8
# Chart rows a panel draws at most (8 eighths each): past this a taller chart shows no more.
MAX_CHART_ROWS = 12
# The fewest chart rows a full panel draws (else a charts panel, one line of numbers, draws more).
MIN_FULL_ROWS = 3


def choose_layout(height: int, n_gpus: int, attached: bool = False, procs: bool | int = True,
                  chrome: int = DEFAULT_CHROME) -> tuple[str, int]:
    """The largest panel size at which ``n_gpus`` panels leave the process table its rows, and
    how many chart rows each full or charts panel draws: full panels with at least three rows,
    else charts panels with at least two, else panels without charts. ``attached``: a line more
    per panel (the idle causes' legend); ``procs``: whether the table has processes to list;
    ``chrome``: the lines the rest of the screen takes (``DEFAULT_CHROME``)."""
    avail = panel_room(height, procs, chrome)
    per_gpu = avail // max(1, n_gpus)
    legend = 2 if attached else 1
    for mode, least in ((FULL, MIN_FULL_ROWS), (CHARTS, 2)):
        rows = min(MAX_CHART_ROWS, per_gpu - PANEL_LINES[mode] - legend - 1)  # a rule under each
        if rows >= least:
            return mode, rows
    for mode in (MEDIUM, COMPACT):
        if n_gpus * PANEL_LINES[mode] <= avail:
            return mode, 0
    return COMPACT, 0


def panel_room(height: int, procs: bool | int = True, chrome: int = DEFAULT_CHROME) -> int:
    """Lines the GPU panels may take at ``height``: the rest of the screen takes ``chrome`` lines
    (never counted as fewer than the default budget) and the process table keeps its rows.
    ``procs``: whether the table has processes to list, or how many (then it keeps no more rows
    than they take, its header and one for a process that comes: 2 GPUs' charts at 80x24 were
    left out while the lines kept for a table of two processes stood empty)."""
    if procs is True or procs is False:
        table = MIN_TABLE_ROWS if procs else EMPTY_TABLE_ROWS
    else:
        table = max(EMPTY_TABLE_ROWS, min(MIN_TABLE_ROWS, procs + 2)) if procs else EMPTY_TABLE_ROWS
    avail = height - max(chrome, DEFAULT_CHROME) - table
    return max(1, min(avail, int((height - 1) * (MAX_SHARE if procs else MAX_SHARE_NO_PROCS))))


def shown_gpus(indices: list[int], mode: str, height: int, procs: bool | int = True,
               chrome: int = DEFAULT_CHROME) -> tuple[list[int], list[int]]:
    """(the GPUs that get a panel, the ones that do not): when even one line each does not fit,
    the first ones fit and one line stands for the rest (``present.hidden_gpus_line``) instead of
    leaving them below the fold with no word."""
    room = panel_room(height, procs, chrome)
    if mode != COMPACT or len(indices) <= room:
        return indices, []
    keep = max(1, room - 1)
    return indices[:keep], indices[keep:]


def choose_mode(height: int, n_gpus: int) -> str:
    """The panel size ``choose_layout`` picks."""
    return choose_layout(height, n_gpus)[0]


def job_memory(view, target: int | None):
    """The attached job's ``MemoryView`` from the latest panes' views the job stage published
    (computed on the pipeline's thread with the advisor's, never here); None unattached, before
    the first views, or while they still describe a previous target. ``view``: the store or the
    paused display's snapshot of it."""
    views = view.pane_views() if target is not None and view is not None else None
    if views is None or views.target_pid != target:
        return None
    return views.memory


def job_gpus(gpu_processes, target: int | None) -> set[int]:
    """The GPUs NVML lists the attached process on: the only ones its own main-thread stacks
    can explain (a launcher's stacks say nothing of its ranks' GPUs, which stay uncoloured)."""
    if target is None:
        return set()
    return {p.gpu_index for p in gpu_processes if p.pid == target}


class GpuPanels(VerticalScroll):
    """Call ``show(view, chart_window, height)`` on each redraw; it returns the panel size used."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._panels: dict[int | str, LinesView] = {}
        self._share = "60%"  # #gpus' max-height in gputop.tcss
        self.recorded = False  # a replay: what the panels show was recorded, not happening now

    def show(self, view, chart_window: float, height: int, target: int | None = None, job=None,
             chrome: int = DEFAULT_CHROME) -> str:
        """``job``: the store the attached job's stacks and host samples are read from (the live
        one even while the display is paused: ``view`` may be a snapshot without them);
        ``chrome``: the lines the rest of the screen takes."""
        every = view.gpu_indices()
        if not every:
            self._no_gpus(view.system)
            return FULL
        gpu_procs = view.gpu_processes()
        attached = target is not None
        listed = len({p.pid for p in gpu_procs})  # the table's rows (with GPUs it lists their processes)
        mode, charts = choose_layout(height, len(every), attached, procs=listed, chrome=chrome)
        indices, hidden = shown_gpus(every, mode, height, procs=listed, chrome=chrome)
        want: list[int | str] = [*indices, *(["more"] if hidden else [])]
        if list(self._panels) != want:
            self._sync(want)
        index_w = index_width(indices)
        share = f"{round(100 * (MAX_SHARE if gpu_procs else MAX_SHARE_NO_PROCS))}%"
        if share != self._share:  # only on a change: a style set every tick would lay out again
            self._share = self.styles.max_height = share
        width = max(20, (self.size.width or self.app.size.width or 80) - 2)
        now = view.now
        t0 = now - chart_window
        t1 = now + 1e-6
        mine = job_gpus(gpu_procs, target) if attached and job is not None else set()
        # From ``view``: paused, the forecast stays the one of the paused moment.
        memory = job_memory(view, target)
        stacks = host = ()
        if mine:
            stacks = [x for x in job.stack_window(t0, t1) if x.pid == target and x.is_main]
            host = job.host_window(t0, t1)
        if hidden:
            self._panels["more"].set_lines([hidden_gpus_line([(i, view.latest_gpu(i)) for i in hidden], width)])
        for i, widget in self._panels.items():
            if not isinstance(i, int):
                continue
            widget.set_class(mode in (FULL, CHARTS), "-full")
            history = None
            if mode != MEDIUM:
                util = view.util_window(i, t0)
                samples = view.gpu_window(i, t0) if mode != COMPACT else ()
                causes = None
                if mode != COMPACT and attached:
                    # Uncoloured where the job's stacks cannot speak for this GPU.
                    causes = column_causes(i, util, samples, stacks if i in mine else (), host, t0, t1,
                                           split_width(width)[0])
                history = History(t0=t0, t1=t1, util=util, samples=samples, causes=causes, attached=attached)
            widget.set_lines(gpu_panel_lines(view.gpu_info.get(i), view.latest_gpu(i), history, width, mode, charts,
                                             memory.gpu(i) if memory is not None else None, index_w))
        return mode

    def _no_gpus(self, system) -> None:
        if "none" not in self._panels:
            self._replace({"none": LinesView(classes="gpu-panel")})
        # The reason is in the header; this line says what still works (a replay: what was recorded),
        # wrapped to the panel's width: one line cut at 80 columns lost the end of its sentence.
        width = max(20, (self.size.width or self.app.size.width or 80) - 2)
        lines = no_gpu_text(system, recorded=self.recorded).wrap(self.app.console, width)
        self._panels["none"].set_lines(list(lines))

    def _sync(self, want: list[int | str]) -> None:
        """Panels for ``want``, in its order, keeping the ones already there: a resize that shows
        a GPU more or less mounts or removes that one (a widget's id is taken until its removal
        completes, so replacing them all at once would mount a second ``gpu-0``)."""
        if not self.is_attached:
            return  # the app is closing: nothing to mount into
        if "none" in self._panels:
            self._replace({})
        for key in [k for k in self._panels if k not in want]:
            self._panels.pop(key).remove()
        panels: dict[int | str, LinesView] = {}
        for pos, key in enumerate(want):
            widget = self._panels.get(key)
            if widget is None:
                widget = LinesView(classes="gpu-panel", id=f"gpu-{key}")
                after = next((self._panels[k] for k in reversed(want[:pos]) if k in self._panels), None)
                if after is not None:
                    self.mount(widget, after=after)
                elif self.children:
                    self.mount(widget, before=0)
                else:
                    self.mount(widget)
                self._panels[key] = widget
            panels[key] = widget
        self._panels = panels

    def _replace(self, panels: dict[int | str, LinesView]) -> None:
        if not self.is_attached:
            return  # the app is closing: nothing to mount into
        for w in self._panels.values():
            w.remove()
        self._panels = panels
        self.mount(*panels.values())
