"""The Textual app: lays out the panels and panes, redraws them from the store on a timer, and
turns keys into intents on the session it was handed (attach, record, replay controls).

Collection runs on the pipeline's threads; this module only reads the store (cheap, locked
copies) and never calls NVML, psutil or py-spy on the event loop. The GPU panels
(``gpu_panels``), the process table (``process_table``) and the panes are widgets of their own.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from rich.text import Text
from textual import events, on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.widget import MountError
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Static

from .. import __version__
from ..errors import UserError, say
from ..model import Event
from ..present import FULL, header_text, host_panel_lines, sampling_text, verdict_line
from ..store import Store, StoreSnapshot
from ..units import fmt_clock
from .advisor_pane import STYLES as ADVICE_STYLES
from .advisor_pane import AdvisorPane, verdict_for
from .gpu_panels import HOST_LINES, GpuPanels, job_memory
from .lines_view import LinesView
from .pane import Pane, PaneContext
from .styled_lines import lines_to_texts
from .proc_list import ProcList
from .process_table import ProcessTable
from .ranks_pane import RanksPane
from .stacks_pane import StacksPane
from .tab_bar import TabBar
from .terminal import ExitWatchdog, forget_terminal, terminal_fds, terminal_gone
from .timeline import REPLAY_BINDINGS, ReplayControls, ReplayTimeline

if TYPE_CHECKING:  # the session is assembled above the UI; the UI only uses it
    from ..session import Session

TABS = (("processes", "Processes"), ("advisor", "Advisor"), ("stacks", "Stacks"))
# Shown only while the session watches a multi-rank job (a rank map is in the store).
RANKS_TAB = ("ranks", "Ranks")
PANES = {"processes": "#procs", "advisor": "#advisor-pane", "stacks": "#stacks-pane", "ranks": "#ranks-pane"}
CHART_WINDOWS = (30.0, 60.0, 120.0, 300.0, 900.0)  # seconds of history the charts show
FILTER_LINES = 3  # the filter box's height (#filter in gputop.tcss)
# The status line shows the newest event, but an error of the last minute wins over later
# routine events (looked for among the newest few).
# How often the Advisor tab (when shown) looks for the advisor's next verdict, when the display's
# own refresh is slower: half the advisor's one-second cadence, so a verdict shows within 0.5 s.
ADVISOR_TAB_EVERY_S = 0.5
STATUS_LOOKBACK_EVENTS = 20
STATUS_ERROR_KEEP_S = 60.0
# The status line shows what changed recently: an event older than this fades back to the hint.
STATUS_FADE_S = 30.0
DEFAULT_CHART_WINDOW = 120.0

HELP = """\
[b]gputop keys[/b]

  [b]q[/b] [b]ctrl+c[/b]     quit
  [b]?[/b]            this help
  [b]p[/b]            pause / resume the display
  [b]/[/b]            filter processes (Esc clears)
  [b]↑ ↓ j k[/b]      move in the process list ([b]PgUp PgDn Home End[/b], the wheel)
  [b]Enter[/b]        attach to the selected process (or click it twice)
  [b]< >[/b] [b]i[/b]        sort column left / right, invert
  [b]M P T N[/b]      sort by GPU memory, CPU, time, PID
  [b][ ][/b]          chart window shorter / longer
  [b]1 2 3 4[/b]      processes / advisor / stacks / ranks (multi-rank) tab
  [b]Tab[/b]          focus the tab's view (then PgUp PgDn End scroll it)
  [b]n[/b]            native stack dump of the attached job (~0.6 s)
  [b]y[/b]            copy the first finding's exact change (or click a finding)
  [b]r[/b]            start / stop recording to gputop-DATE.gputop

[b]replay[/b]  [b]space[/b] play/pause  [b]+ -[/b] speed  [b], .[/b] step
        [b]x X[/b] next/previous idle period  [b]f F[/b] next/previous finding
        [b]g[/b] go to a time  [b]Home End[/b] start / end

Collection never runs on the display thread: pausing the display keeps
recording and analysis going. Colours follow the terminal; NO_COLOR is honoured.

[dim]Esc, q or ? closes this help.[/dim]
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")


class GputopApp(ReplayControls, App[int]):
    CSS_PATH = "gputop.tcss"
    TITLE = "gputop"
    ENABLE_COMMAND_PALETTE = False

    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("question_mark", "help", "Help"),
        Binding("p", "pause", "Pause"),
        Binding("slash", "filter", "Filter"),
        Binding("less_than_sign", "sort_step(-1)", "Sort", show=False),
        Binding("greater_than_sign", "sort_step(1)", "Sort", show=False),
        Binding("i", "invert_sort", "Invert", show=False),
        Binding("M", "sort_by('gpu_mem')", "Sort mem", show=False),
        Binding("P", "sort_by('cpu')", "Sort CPU", show=False),
        Binding("T", "sort_by('time')", "Sort time", show=False),
        Binding("N", "sort_by('pid')", "Sort PID", show=False),
        Binding("j", "cursor(1)", "Down", show=False),
        Binding("k", "cursor(-1)", "Up", show=False),
        Binding("left_square_bracket", "zoom(-1)", "Shorter", show=False),
        Binding("right_square_bracket", "zoom(1)", "Longer", show=False),
        Binding("1", "tab('processes')", "Procs", show=False),
        Binding("2", "tab('advisor')", "Advisor"),
        Binding("3", "tab('stacks')", "Stacks"),
        Binding("4", "tab('ranks')", "Ranks", show=False),
        Binding("n", "native_dump", "Native dump", show=False),
        Binding("y", "copy_action", "Copy fix", show=False),
        Binding("escape", "clear_filter", "Clear", show=False),
        Binding("r", "toggle_record", "Record"),
        *REPLAY_BINDINGS,
    ]

    def __init__(self, session: Session, interval: float | None = None, refresh: float | None = None,
                 command: str | None = None) -> None:
        super().__init__()
        self.session = session
        self.store = session.store
        interval = session.interval if interval is None else interval  # the header's "every N s"
        self.interval = interval
        # Redraw as often as new samples arrive: a faster redraw would only repaint the same data.
        self.refresh_every = refresh if refresh is not None else interval
        if refresh is None and session.mode == "replay":
            self.refresh_every = min(interval, 0.5)  # jumps and fast playback show at once
        self.paused = False
        self.chart_window = DEFAULT_CHART_WINDOW
        self.panel_mode = FULL
        self._seen_version = -1
        # The newest event notified, by what it says (ts, source, message): a replay's seek reads
        # the same events back as new objects, and they must not be notified again.
        self._notified: tuple[float, str, str] | None = None
        self.active_tab = "processes"
        self._frozen: StoreSnapshot | None = None
        self._filter_visible = False
        self._mounted_ok = False  # resize events can arrive before on_mount has built the table
        self._panes: dict[str, Pane] = {}  # the tabs' panes by tab, once mounted
        self._tty_fds: list[int] = []  # the standard streams that were terminals when the app started
        # Stops collection and closes the recording once, whoever gets there first: the caller
        # once the app has returned, or the watchdog that finishes an exit a signal or a lost
        # terminal asked for when Textual's shutdown cannot.
        self.close_session = _once(lambda: close_session(session, command))
        self.watchdog = ExitWatchdog(self.close_session)
        # SIGTERM / SIGHUP that came before the app was mounted (``catch_early_signals``).
        self._early_signals: list[int] = []

    # ----------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        yield LinesView(id="header")
        if self.session.mode == "replay":
            yield ReplayTimeline(self.session.replay, id="timeline")
        # The attached job's verdict on every screen: the Advisor tab's top finding, one line.
        yield LinesView(id="verdict")
        panels = GpuPanels(id="gpus")
        panels.recorded = self.session.mode == "replay"
        yield panels
        yield LinesView(id="host")
        # The panes are siblings shown one at a time: no container repaints around the process list.
        yield TabBar(TABS, "processes", id="tabs")
        yield ProcessTable(id="procs", classes="pane")
        yield Input(placeholder="filter: pid, user, gpuN or command text", id="filter")
        yield AdvisorPane(id="advisor-pane", classes="pane")
        # The pane asks the session for native dumps: the UI itself runs no py-spy.
        yield StacksPane(native_dump=self.session.native_dump, id="stacks-pane", classes="pane")
        yield RanksPane(id="ranks-pane", classes="pane")
        yield LinesView(id="status", cut_words=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(ProcessTable)
        self._panes = {"advisor": self.query_one("#advisor-pane", AdvisorPane),
                       "stacks": self.query_one("#stacks-pane", StacksPane),
                       "ranks": self.query_one("#ranks-pane", RanksPane)}
        self._show_panes()
        # Keys go to the process table from the start (arrows, Enter to attach).
        self.query_one("#gpus").can_focus = False
        table.focus()
        if self.session.without_gpus:
            table.sort_by("cpu")  # no GPU memory to sort by: the busiest processes first
        self._mounted_ok = True
        if not self.is_headless:
            self._tty_fds = terminal_fds()
            self._exit_on_signals()
        self.set_interval(self.refresh_every, self.tick)
        if self.refresh_every > ADVISOR_TAB_EVERY_S:
            # The advisor publishes once a second: its tab follows it, so what it says (a job's
            # age, a stall's length) is its latest evaluation's, not one a poll interval old.
            self.set_interval(ADVISOR_TAB_EVERY_S, self._tick_advisor)
        self.tick(force=True)

    def _tick_advisor(self) -> None:
        if self._mounted_ok and not self.paused and self.active_tab == "advisor":
            self._update_panes("advisor")

    def _exit_on_signals(self) -> None:
        """SIGTERM (a job scheduler, `kill`) and SIGHUP (the SSH session dropped) end the app
        like `q`: the caller then stops collection and closes the recording, so it is left as
        one complete file, not a database with its write-ahead log beside it. Plain handlers, not
        the event loop's: SIGHUP's must run before the SIGCONT a hang-up brings (``terminal``),
        and an exit must be asked for even when the event loop is stuck (the watchdog ends it)."""
        import asyncio
        import signal

        loop = asyncio.get_running_loop()

        def handler(signum: int, _frame: object) -> None:
            if signum == getattr(signal, "SIGHUP", None):
                forget_terminal()  # gone: nothing may be drawn on it again
            self._request_exit(128 + signum, loop)

        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is None:
                continue
            try:
                if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
                    signal.signal(sig, handler)
            except (ValueError, OSError):
                pass  # not the main thread: nothing to install
        if self._early_signals:  # one came while the app started: it ends now, as it would have
            handler(self._early_signals[0], None)

    def catch_early_signals(self, came: Sequence[int] = ()) -> Callable[[], None]:
        """Take SIGTERM and SIGHUP until the app is mounted (``_exit_on_signals``): Textual's
        start-up takes seconds on a loaded host, and a signal then killed the process where it
        stood, its recording left "not closed cleanly". Each is noted (the app ends as soon as it
        is mounted) and arms the watchdog, which stops the session (closing the recording) and
        ends the process if the app never comes up. ``came``: signals held while gputop started.
        Returns what puts the previous handlers back."""
        import signal

        def handler(signum: int, _frame: object) -> None:
            self._early_signals.append(signum)
            self.watchdog.arm(128 + signum)

        old: dict[int, object] = {}
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is None:
                continue
            try:
                prev = signal.getsignal(sig)
                if prev is not signal.SIG_IGN:
                    old[sig] = prev
                    signal.signal(sig, handler)
            except (ValueError, OSError):
                pass  # not the main thread
        for sig in came:
            handler(sig, None)

        def restore() -> None:
            for sig, prev in old.items():
                try:
                    signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
                except (ValueError, OSError, TypeError):
                    pass

        return restore

    def _request_exit(self, code: int, loop) -> None:
        """End the app with ``code`` as `q` does, and make sure the process ends even if the
        UI's shutdown cannot finish (``ExitWatchdog``)."""
        self.watchdog.arm(code)
        try:
            loop.call_soon_threadsafe(lambda: self.exit(return_code=code))
        except RuntimeError:
            pass  # the loop is closed: the app has ended already, its caller is closing the session

    def _check_terminal(self) -> bool:
        """Whether the terminal is still there; when it is gone (EIO, no SIGHUP: a process that
        ignored it), the app ends as on SIGHUP."""
        if not self._tty_fds or not terminal_gone(self._tty_fds):
            return True
        import asyncio
        import signal

        self._tty_fds = []
        forget_terminal()
        self._request_exit(128 + int(getattr(signal, "SIGHUP", 1)), asyncio.get_running_loop())
        return False

    def on_resize(self) -> None:
        # The new size is applied to the widgets after this event: lay out again after that.
        self.call_after_refresh(self.tick, True)

    # ----------------------------------------------------------------- state

    @property
    def state(self) -> str:
        if self.session.mode == "replay":
            base = "replay"
        elif self.session.mode == "fake":
            base = "live (fake GPUs)"
        else:
            base = "live"
        if self.paused:
            base = f"paused · {base}"
        if self.session.recorder is not None:
            base = f"recording · {base}"
        return base

    @property
    def view(self) -> Store | StoreSnapshot:
        """What the panels draw: the live store, or the moment the display was paused at."""
        return self._frozen if self._frozen is not None else self.store

    # ----------------------------------------------------------------- refresh

    def tick(self, force: bool = False) -> None:
        # Once an exit is asked for (q, a signal, a lost terminal) nothing is drawn again: a timer or
        # a call after a refresh can still fire while the screens come down, and a panel mounted
        # into a widget already detached raised MountError in Textual's shutdown (its generic
        # exit status 1 and a traceback, once in CI after a SIGTERM).
        if not self._mounted_ok or getattr(self, "_exit", False) or not self._check_terminal():
            return
        try:
            self._redraw(force)
        except (NoMatches, MountError):
            pass  # a timer (or a call after a refresh) that fired while the app exits: its screen is going

    def _redraw(self, force: bool) -> None:
        self._update_header()
        self._update_verdict()
        if self.paused and not force:
            return
        version = self.store.version
        if version == self._seen_version and not force:
            return
        self._seen_version = version
        self._update_gpus()
        self._update_host()
        self._update_tabs()
        tab = self.active_tab
        if tab == "processes":
            self._update_processes()
        else:
            self._update_panes(tab)
        self._update_status()

    def _update_verdict(self) -> None:
        view = self.query_one("#verdict", LinesView)
        pid = self.session.target_pid
        view.display = pid is not None
        if pid is None:
            return
        width = max(20, (self.size.width or 80) - 2)
        _, findings, pending, collecting = verdict_for(self.store, pid, bool(self.store.gpu_indices()))
        last = self.store.procs_latest().get(pid)
        exited = f"PID {pid} at {fmt_clock(last.ts)}" if last is not None and last.status == "exited" else None
        line = verdict_line(findings, width, pending=pending, collecting=collecting, exited=exited,
                            no_stacks=self.session.attach_error, findings_lost=self.session.findings_lost)
        view.set_lines(lines_to_texts([line], ADVICE_STYLES, width))

    def _update_header(self) -> None:
        width = self.size.width or 80
        self.query_one("#header", LinesView).set_text(
            header_text(self.store.system, __version__, self.interval, self.state, width)
        )

    def _update_gpus(self) -> None:
        self.panel_mode = self.query_one(GpuPanels).show(self.view, self.chart_window, self.size.height or 24,
                                                         self.session.target_pid, self.store, self._chrome())

    def _chrome(self) -> int:
        """The lines every part of the screen but the GPU panels and the tab's pane takes now."""
        height = self.size.height or 24
        lines = 1 + (HOST_LINES if height >= 30 else 2) + 1 + 1 + 1  # header, host, tabs, status, footer
        if self.session.mode == "replay":
            lines += ReplayTimeline.HEIGHT
        if self.session.target_pid is not None:
            lines += 1  # the verdict line
        if self._filter_visible and self.active_tab == "processes":
            lines += FILTER_LINES
        return lines

    def _update_processes(self) -> None:
        self.query_one(ProcessTable).show(self.view, self.session.target_pid)

    def _update_host(self) -> None:
        width = max(20, (self.size.width or 80) - 2)
        lines = HOST_LINES if (self.size.height or 24) >= 30 else 2
        # The attached job's workers' private memory, from the memory view the job stage published.
        memory = job_memory(self.view, self.session.target_pid)
        self.query_one("#host", LinesView).set_lines(
            host_panel_lines(self.view.latest_host(), width, lines, memory.private if memory is not None else None))

    def _update_tabs(self) -> None:
        """The Ranks tab appears once the session watches a multi-rank job."""
        from ..analysis import rank_map

        bar = self.query_one("#tabs", TabBar)
        want = TABS + ((RANKS_TAB,) if rank_map(self.store.events()) else ())
        if bar.tabs != want:
            bar.set_tabs(want)

    def pane_context(self) -> PaneContext:
        """What the panes draw from this tick: the store, and the session's facts about its job."""
        session = self.session
        return PaneContext(self.store, session.target_pid, no_stacks=session.attach_error, nvlink_bps=session.nvlink_bps,
                           findings_lost=session.findings_lost, frames_lost=session.frames_lost)

    def _update_panes(self, tab: str) -> None:
        pane = self._panes.get(tab)
        if pane is not None:
            pane.update_view(self.pane_context())

    def _update_status(self) -> None:
        # Debug events are data for the analysis (NCCL's RAS reports), not lines for a person; nor
        # is a metric the GPU model lacks, in recordings made before NVML noted it as debug.
        events = [e for e in self.store.events(STATUS_LOOKBACK_EVENTS) if e.level != "debug" and not _model_lacks(e)]
        status = self.query_one("#status", LinesView)
        # What attached sampling costs the job, as the sampler measures it: always in sight.
        state = self.session.target_state if self.session.mode != "replay" else None
        # Nothing is sampled from a job that has exited, and nothing is cost.
        cost = state.running_cost if state is not None else None
        # Said whole, held back or not: why the advisor's first verdict is slow to come.
        cost_text = f" · {sampling_text(cost)}" if cost is not None else ""
        if not events:
            status.set_text(Text("ready · press ? for keys" + cost_text, style="dim"))
            return
        # Every new warning or error gets a notification (several can arrive in one tick: why an
        # attach failed and that NVML is missing, at start); the status line keeps a recent error
        # in sight over later routine events, so the reason something is missing stays visible.
        last = self._notified
        fresh = [e for e in events if last is None or _event_key(e) > last]
        for new in fresh[-3:]:
            if new.level in ("warning", "error"):
                self.notify(new.message, severity="error" if new.level == "error" else "warning", timeout=6)
        if fresh:
            self._notified = _event_key(fresh[-1])
        now = self.store.now
        errors = [e for e in events if e.level == "error" and now - e.ts <= STATUS_ERROR_KEEP_S]
        ev = errors[-1] if errors else events[-1]
        if not errors and now - ev.ts > STATUS_FADE_S:
            status.set_text(Text("ready · press ? for keys" + cost_text, style="dim"))
            status.set_class(False, "-warning")
            status.set_class(False, "-error")
            return
        when = fmt_clock(ev.ts)
        status.set_text(Text(f"{when} {ev.source}: {ev.message}" + cost_text))
        status.set_class(ev.level == "warning", "-warning")
        status.set_class(ev.level == "error", "-error")

    # ----------------------------------------------------------------- process selection

    @on(ProcList.Selected, "#procs")
    def _on_row_selected(self, event: ProcList.Selected) -> None:
        self.action_attach()

    def action_attach(self) -> None:
        row = self.query_one(ProcessTable).selected
        if row is not None:
            self.attach(row.pid)

    def attach(self, pid: int) -> None:
        if self.session.mode == "fake":
            # The scripted GPUs' processes are made up: a real process may hold that PID.
            self.notify("these are fake GPUs and processes: nothing to attach to "
                        "(run gputop --pid PID beside a real job)", severity="warning", timeout=6)
            return
        if self.session.target_pid == pid and self.session.stacks is not None:
            self.action_tab("stacks")
            return
        self._attach_worker(pid)

    @work(thread=True, exclusive=True, group="attach")
    def _attach_worker(self, pid: int) -> None:
        # Attaching runs py-spy once (~10 ms, longer on a busy box): off the event loop.
        try:
            self.session.attach(pid)
        except UserError:
            # The session published why (an event: the status line shows it and a notification
            # follows, and a running recording keeps it); no second toast here.
            return
        self.call_from_thread(self.action_tab, "stacks")

    # ----------------------------------------------------------------- actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        replay = self.session.mode == "replay"
        if action == "replay" and parameters in (("start",), ("end",)) and isinstance(self.focused, Input):
            return False  # Home/End edit the filter being typed
        if action in ("replay", "replay_goto"):
            return replay
        if action in ("toggle_record", "attach", "native_dump"):
            return not replay
        return True

    def action_toggle_record(self) -> None:
        if self.session.recorder is None:
            path = Path(time.strftime("gputop-%Y%m%d-%H%M%S.gputop"))
            try:
                self.session.start_recording(path)
            except UserError as exc:
                self.notify(f"cannot record: {exc}", severity="error", timeout=8)
                return
            self.notify(f"recording to {path.resolve()}", timeout=5)
        else:
            self._close_recording()
        self.tick(force=True)

    @work(thread=True, group="record")
    def _close_recording(self) -> None:
        # Closing waits for the next poll (what happened up to the stop, at most a poll interval)
        # and writes the queued batches: off the event loop.
        rec = self.session.stop_recording()
        where = f": {Path(rec.path).resolve()}" if rec is not None else ""
        self.call_from_thread(self.notify, f"recording stopped and saved{where}", timeout=4)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_pause(self) -> None:
        self.paused = not self.paused
        replay = self.session.replay
        if replay is not None:
            replay.toggle_pause()  # a paused replay stops feeding the store, and jumps must show
        else:
            self._frozen = StoreSnapshot(self.store) if self.paused else None
        self.tick(force=not self.paused)

    def action_filter(self) -> None:
        self.action_tab("processes")
        box = self.query_one("#filter", Input)
        self._filter_visible = True
        self._show_panes()
        # Focused now: ``box.focus()`` focuses it only after the keys already queued are handled,
        # so a word typed or pasted right after '/' went to the app's keys ('r' of "secret" started
        # a recording) and the box opened empty.
        self.set_focus(box)

    def on_key(self, event: events.Key) -> None:
        # Keys typed in one burst with '/' (a paste, a fast typist) were already on their way to
        # the widget focused before it, and reach the app here once the filter box has the focus
        # (Textual then skips the app's bindings for printable keys): they are the filter's words.
        box = self.query_one("#filter", Input)
        if self.focused is box and event.is_printable and event.character:
            box.insert_text_at_cursor(event.character)
            event.stop()
            event.prevent_default()

    @on(Input.Changed, "#filter")
    def _on_filter_changed(self, event: Input.Changed) -> None:
        self.query_one(ProcessTable).set_filter(event.value)

    @on(Input.Submitted, "#filter")
    def _on_filter_submitted(self, event: Input.Submitted) -> None:
        box = self.query_one("#filter", Input)
        if not box.value:
            self._filter_visible = False
            self._show_panes()
        self.query_one(ProcessTable).focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        self._filter_visible = False
        self._show_panes()
        table = self.query_one(ProcessTable)
        table.set_filter("")
        table.focus()

    def action_sort_step(self, step: int) -> None:
        self.query_one(ProcessTable).sort_step(step)

    def action_sort_by(self, key: str) -> None:
        self.query_one(ProcessTable).sort_by(key)

    def action_invert_sort(self) -> None:
        self.query_one(ProcessTable).invert()

    def action_cursor(self, step: int) -> None:
        self.query_one(ProcessTable).action_move(step)

    def action_zoom(self, step: int) -> None:
        i = min(range(len(CHART_WINDOWS)), key=lambda k: abs(CHART_WINDOWS[k] - self.chart_window))
        j = max(0, min(len(CHART_WINDOWS) - 1, i + step))
        self.chart_window = w = CHART_WINDOWS[j]
        label = f"{w / 60:g} min" if w >= 60 else f"{w:g} s"
        if j == i:
            edge = "shortest" if step < 0 else "longest"
            self.notify(f"charts already show the {edge} window ({label})", timeout=2)
        else:
            self.notify(f"charts show the last {label}", timeout=2)
        self.tick(force=True)

    def action_tab(self, tab: str) -> None:
        if tab not in {name for name, _ in self.query_one("#tabs", TabBar).tabs}:
            self.notify("the Ranks tab shows a multi-rank job: attach to its launcher's PID or a rank's", timeout=4)
            return
        # Without this, focus falls back to the filter box and the tabs follow it back.
        self.set_focus(None)
        self.active_tab = tab
        self.query_one("#tabs", TabBar).active = tab
        self._show_panes()
        if tab == "processes":
            # At once, not with Widget.focus (which focuses after the keys already queued): see
            # action_filter.
            self.set_focus(self.query_one(ProcessTable))
        self.tick(force=True)
        # A pane that was hidden has no width yet: lay it out again once it has one.
        self.call_after_refresh(self.tick, True)

    def _show_panes(self) -> None:
        for name, selector in PANES.items():
            self.query_one(selector).display = name == self.active_tab
        self.query_one("#filter", Input).display = self.active_tab == "processes" and self._filter_visible

    @on(TabBar.Changed, "#tabs")
    def _on_tab_clicked(self, event: TabBar.Changed) -> None:
        self.action_tab(event.tab)

    def action_copy_action(self) -> None:
        """Copy the exact change of the finding at the top of the Advisor tab."""
        from .advisor_pane import AdvisorPane

        self.action_tab("advisor")
        for pane in self.query(AdvisorPane):
            pane.copy_action(pane.visible_finding())

    def action_native_dump(self) -> None:
        pane = self._panes.get("stacks")
        if isinstance(pane, StacksPane):
            self.action_tab("stacks")
            pane.request_native_dump(self.session.target_pid)


# --------------------------------------------------------------------------- entry points


def run_app(session: Session, came: Sequence[int] = (), command: str | None = None) -> int:
    """Run the UI over a finished session (live, fake or replay) until the user quits; collection
    stops and the recording is closed however it ends. ``came``: SIGTERM / SIGHUP that arrived
    while the command opened the session (the app ends as soon as it is up). ``command``: the
    command that runs it (``attach``; None for plain ``gputop``), which its last line names."""
    app = GputopApp(session, interval=session.interval, command=command)
    restore = app.catch_early_signals(came)
    try:
        session.start()
        app.run()
    finally:
        app.close_session()
        app.watchdog.done()
        restore()
    # An exit a signal or a lost terminal asked for ends with that signal's status (128 + N), what
    # a scheduler or a shell expects, even where Textual's own shutdown then met an error and set
    # its generic 1 (its traceback, if any, is still printed).
    return app.watchdog.code or app.return_code or 0


_NOT_SUPPORTED_PARTS = re.compile(r"[^;]*\(not supported\)")


def _model_lacks(e: Event) -> bool:
    """An NVML note that names only metrics this GPU model does not have (a fan on a datacenter
    GPU): a fact of the model, said by `doctor`, not news for the status line."""
    if e.source != "nvml" or ": not available: " not in e.message:
        return False
    parts = e.message.split(": not available: ", 1)[1].split("; ")
    return all(_NOT_SUPPORTED_PARTS.fullmatch(p) for p in parts)


def _event_key(e: Event) -> tuple[float, str, str]:
    return (e.ts, e.source, e.message)


def _once(fn):
    """``fn`` run by the first caller only; later callers wait for it to finish."""
    lock = threading.Lock()
    done: list[bool] = []

    def run() -> None:
        with lock:
            if not done:
                done.append(True)
                fn()

    return run


def close_session(session: Session, command: str | None = None) -> None:
    """Stop collection and close the recording; then say where the file is, on a terminal that
    may be gone."""
    recorder = session.recorder  # recording when the user quit: closed by stop()
    session.stop()
    if recorder is not None:
        # Said once the terminal is back: where the file is (the notice at its start is gone).
        error = recorder.error
        try:
            say(command, error, "error") if error else say(command, f"recording saved: {Path(recorder.path).resolve()}")
        except OSError:
            pass  # the terminal hung up: the file is closed all the same
