"""The replay timeline: where the replay is in the whole run, where the GPU was idle, where the
advisor found something, and the replay controls.

Pure rendering first (``timeline_cells``, ``render_bar``, ``status_text``: plain data in, Rich
text out, tested without a terminal), then the widget and the key bindings the app mounts for a
replay session::

    class GputopApp(ReplayControls, App): BINDINGS = [..., *REPLAY_BINDINGS]
    # in compose(), when session.mode == "replay":
    yield ReplayTimeline(session.replay, id="timeline")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Input, Static

from ..model import Event
from ..units import fmt_clock, fmt_length, fmt_time

if TYPE_CHECKING:  # assembled above the UI (the session) or read through it (the replay source)
    from ..record import ReplaySource
    from ..session import Session

# Shading of a cell by mean utilisation (eighth blocks), and what marks idle / no data.
LEVELS = " ▁▂▃▄▅▆▇█"
IDLE_STYLE = "bold red"
BUSY_STYLE = "green"
NODATA = "·"
SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
SEVERITY_RANK = {"info": 1, "warning": 2, "critical": 3}


@dataclass(frozen=True)
class Cell:
    util: float | None  # mean utilisation over the cell's time, % (None: no data)
    idle: bool  # an idle period touches the cell
    finding: str | None  # worst severity of a finding first reported in the cell


def timeline_cells(overview, idle_periods, marks, start: float, end: float, width: int) -> list[Cell]:
    """Split [start, end] into ``width`` cells. ``overview``: rows with ts, span, covered_s,
    busy_s (any GPU, summed); ``idle_periods``: items with start/end; ``marks``: items with ts
    and severity."""
    width = max(1, width)
    span = max(1e-9, end - start)
    busy = [0.0] * width
    covered = [0.0] * width
    for r in overview:
        if r.covered_s <= 0:
            continue
        mid = r.ts + r.span / 2.0
        i = int((mid - start) / span * width)
        if 0 <= i < width:
            busy[i] += r.busy_s
            covered[i] += r.covered_s
        elif i == width:
            busy[-1] += r.busy_s
            covered[-1] += r.covered_s
    idle = [False] * width
    for p in idle_periods:
        a = max(0, int((p.start - start) / span * width))
        b = min(width - 1, int((p.end - start) / span * width - 1e-9))
        for i in range(a, b + 1):
            idle[i] = True
    finding: list[str | None] = [None] * width
    for m in marks:
        i = min(width - 1, max(0, int((m.ts - start) / span * width)))
        sev = m.severity if m.severity in SEVERITY_RANK else "info"
        if finding[i] is None or SEVERITY_RANK[sev] > SEVERITY_RANK[finding[i]]:  # type: ignore[index]
            finding[i] = sev
    return [
        Cell(100.0 * busy[i] / covered[i] if covered[i] > 0 else None, idle[i], finding[i]) for i in range(width)
    ]


def render_bar(cells: Sequence[Cell], position: float | None = None) -> tuple[Text, Text]:
    """Two lines: finding marks with the position cursor above, utilisation shading below.

    ``position``: 0..1 across the bar. Idle cells are drawn red whatever their mean.
    """
    width = len(cells)
    cur = None if position is None else min(width - 1, max(0, int(position * width)))
    top = Text(no_wrap=True)
    bar = Text(no_wrap=True)
    for i, c in enumerate(cells):
        if i == cur:
            top.append("▼", "bold reverse")
        elif c.finding:
            top.append("◆", SEVERITY_STYLE[c.finding])
        else:
            top.append(" ")
        if c.util is None:
            bar.append(NODATA, "dim")
        else:
            level = LEVELS[max(1, min(8, round(c.util / 100.0 * 8)))]
            bar.append(level, IDLE_STYLE if c.idle else BUSY_STYLE)
    return top, bar


def status_text(status: dict, width: int = 120) -> Text:
    """``▶ 60×  2026-11-22 14:03:12  2:03:12 / 24:00:00`` and the key hints that fit."""
    pos, start, end = status["position"], status["start"], status["end"]
    t = Text(no_wrap=True, overflow="ellipsis")
    if status.get("at_end"):
        t.append("■ end", "bold yellow")
    elif status.get("playing"):
        t.append("▶", "bold green")
    else:
        t.append("❚❚", "bold yellow")
    speed = status["speed"]
    t.append(f" {speed:g}×  ", "bold")
    t.append(fmt_time(pos), "bold")
    t.append(f"  {fmt_length(pos - start)} / {fmt_length(end - start)}", "dim")
    if status.get("damage"):
        t.append("  damaged file: data ends early", "bold red")
    hints = "   space play/pause  +/- speed  ,/. step  x/X idle  f/F finding  g go to  home/end"
    if len(t) + len(hints) <= width:
        t.append(hints, "dim")
    return t


# --------------------------------------------------------------------------- widget


class ReplayTimeline(Widget):
    """Three lines: the replay status, finding marks and cursor, the utilisation bar. A click
    on the bar jumps there."""

    HEIGHT = 3  # lines: the screen's layout counts them (app._chrome)
    DEFAULT_CSS = f"""
    ReplayTimeline {{
        height: {HEIGHT};
        padding: 0 1;
        background: $boost;
    }}
    """
    REFRESH_S = 0.25

    def __init__(self, source, **kwargs) -> None:
        super().__init__(**kwargs)
        self.source = source
        self._cells: list[Cell] | None = None
        self._cells_width = 0

    def on_mount(self) -> None:
        self.set_interval(self.REFRESH_S, self.refresh)

    def _bar_width(self) -> int:
        return max(10, self.size.width - 2)

    def cells(self) -> list[Cell]:
        width = self._bar_width()
        if self._cells is None or width != self._cells_width:
            src = self.source
            self._cells = timeline_cells(src.overview(), src.idle_periods(), src.finding_marks(),
                                         src.start_ts, src.end_ts, width)
            self._cells_width = width
        return self._cells

    def render(self) -> Text:
        st = self.source.status()
        span = max(1e-9, st["end"] - st["start"])
        top, bar = render_bar(self.cells(), (st["position"] - st["start"]) / span)
        out = status_text(st, self._bar_width())
        out.append("\n")
        out.append_text(top)
        out.append("\n")
        out.append_text(bar)
        return out

    def on_click(self, event: events.Click) -> None:
        if event.y >= 1:
            x = event.x - 1  # left padding
            self.source.seek_fraction(x / max(1, self._bar_width() - 1))
            self.refresh()


# --------------------------------------------------------------------------- controls

REPLAY_BINDINGS = [
    Binding("space", "replay('toggle')", "Play/pause"),
    Binding("plus,equals_sign", "replay('faster')", "Faster", show=False),
    Binding("minus", "replay('slower')", "Slower", show=False),
    Binding("full_stop", "replay('forward')", "Step", show=False),
    Binding("comma", "replay('back')", "Back", show=False),
    Binding("x", "replay('next_idle')", "Next idle"),
    Binding("X", "replay('prev_idle')", "Prev idle", show=False),
    Binding("f", "replay('next_finding')", "Next finding"),
    Binding("F", "replay('prev_finding')", "Prev finding", show=False),
    # Before the process list's own Home/End (first/last row): in a replay they move in time, as
    # the help and the timeline say. PgUp/PgDn still page the list.
    Binding("home", "replay('start')", "Start", show=False, priority=True),
    Binding("end", "replay('end')", "End", show=False, priority=True),
    Binding("g", "replay_goto", "Go to"),
]


def step_for(speed: float) -> float:
    """Seconds a step key moves: ten seconds of play at 1x, more when playing fast."""
    return 10.0 if speed <= 10 else 60.0 if speed <= 60 else 600.0


def replay_action(source, name: str) -> str | None:
    """Apply one control; returns a short message for the user, if any."""
    if source is None:
        return "not a replay"
    if name == "toggle":
        source.toggle_pause()
        return None
    if name == "faster":
        return f"speed {source.faster():g}×"
    if name == "slower":
        return f"speed {source.slower():g}×"
    if name in ("forward", "back"):
        step = step_for(source.speed)
        source.step(step if name == "forward" else -step)
        return None
    if name == "start":
        source.seek(source.start_ts)
        return None
    if name == "end":
        source.seek(source.end_ts)
        return None
    targets = {
        "next_idle": (source.next_idle, "no idle period after this point"),
        "prev_idle": (source.prev_idle, "no idle period before this point"),
        "next_finding": (source.next_finding, "no finding after this point"),
        "prev_finding": (source.prev_finding, "no finding before this point"),
    }
    if name in targets:
        fn, missing = targets[name]
        ts = fn()
        here = source.position
        # A "next" jump goes forward and a "previous" one back, or nowhere: at a recording's end
        # `x` moved back a second, which reads as a jump to a stall that is not there.
        ahead = name.startswith("next")
        if ts is not None:
            ts = min(source.end_ts, max(source.start_ts, ts))
        if ts is None or (ts <= here if ahead else ts >= here):
            return missing
        source.seek(ts)
        return f"at {fmt_clock(ts)}"
    return f"unknown replay control {name!r}"


class GotoScreen(ModalScreen[str | None]):
    """Ask for a time: +90s, 14:03, 2026-11-22 14:03 or 50%."""

    DEFAULT_CSS = """
    GotoScreen { align: center middle; }
    GotoScreen > Static { width: 60; padding: 0 1; background: $panel; }
    GotoScreen > Input { width: 60; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        yield Static("Go to: +90s, -5m, 14:03[:30], 2026-11-22 14:03 or 50%  (Esc cancels)")
        yield Input(placeholder="time", id="goto")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ReplayControls:
    """Mix into the App: the actions REPLAY_BINDINGS name, on the app's ``session``."""

    session: Session  # set by the app it is mixed into

    def _replay_source(self) -> ReplaySource | None:
        return self.session.replay

    def action_replay(self, name: str) -> None:
        msg = replay_action(self._replay_source(), name)
        if msg:
            self.notify(msg, timeout=2)  # type: ignore[attr-defined]
            self._say(msg)

    def _say(self, msg: str) -> None:
        """The control's answer on the status line too, as an event of the replay: a toast alone
        went unseen (`x` at the start of a CPU-only recording looked like a key that did nothing)."""
        session = self.session
        if session.replay is None:
            return
        store = session.store
        # Said at the store's clock (the position's data): the status line fades events by it.
        session.pipeline.publish([Event(store.now or session.replay.position, "replay", msg)])

    def action_replay_goto(self) -> None:
        source = self._replay_source()
        if source is None:
            return

        def done(text: str | None) -> None:
            if not text:
                return
            try:
                source.goto(text)
            except ValueError as exc:
                self.notify(str(exc), severity="error", timeout=4)  # type: ignore[attr-defined]

        self.push_screen(GotoScreen(), done)  # type: ignore[attr-defined]
