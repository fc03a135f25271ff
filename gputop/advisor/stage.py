"""The session's one derived stage: each tick, one evidence window (analysis.window) read from the
store, and from it the advisor's ``Verdict`` and findings, the stuck watch's events and the panes'
views, published through the pipeline like a source's batch.

The GPU panels' memory forecast rides with the panes' views (``PaneViews.memory``): the window's
memory view, which the advisor has already worked out for its memory rules, so the UI lays it out
and computes nothing. A new forecast close to the limit is also said once as an event (the memory
watch), where the stuck watch runs: the live session's, not a replay's (its recording holds it).

The three used to be stages of their own, each querying the store every second and rebuilding the
same evidence: a tick computed the stuck verdict up to three times, from two different sets of
inputs, and the rank map four times. Now each piece is worked out once, and the Advisor tab, the
stuck event and the Stacks tab read the same verdict. Each part keeps its own state (the advisor's
hysteresis, which stuck run was told, which views were published); a session leaves out the parts
it does not use (the headless commands the views, a replay the stuck watch: its recording holds
the events).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from ..analysis import DEFAULT_STUCK_AFTER_S, JobWindow, StuckWatch, ViewsStage, read_window
from ..model import PaneViews
from .context import DEFAULT_WINDOW_S
from .engine import AdvisorSource, advisor_every
from .memory_watch import MemoryWatch

if TYPE_CHECKING:
    from ..session import Session
    from ..store import Store


class JobStage:
    """The advisor (optional), the stuck watch (optional) and the views (optional) over one window
    a tick. ``target_pid`` may be a callable, to follow the session."""

    name = "job"

    def __init__(self, store: Store, target_pid: int | None | Callable[[], int | None], *,
                 window_s: float = DEFAULT_WINDOW_S, stuck_after_s: float = DEFAULT_STUCK_AFTER_S,
                 advisor: AdvisorSource | None = None, stuck_watch: StuckWatch | None = None,
                 views: ViewsStage | None = None, memory_watch: MemoryWatch | None = None,
                 interval: float | None = None) -> None:
        self.store = store
        self._target = target_pid if callable(target_pid) else (lambda: target_pid)
        self.window_s = window_s
        self.stuck_after_s = stuck_after_s
        self.advisor = advisor
        self.stuck_watch = stuck_watch
        self.views = views
        self.memory_watch = memory_watch
        self.interval = advisor_every() if interval is None else interval
        self.windows_read = 0  # windows read from the store (a tick reads one, a fresh start two)

    def poll(self) -> list[object]:
        now = self.store.now
        if now <= 0:
            return []  # nothing collected yet
        target = self._target()
        # The advisor's own settings win where it has them (a test may change its window).
        window_s = self.advisor.advisor.window_s if self.advisor is not None else self.window_s
        read: dict[float, JobWindow] = {}

        def window_at(at: float | None = None) -> JobWindow:
            at = now if at is None else at
            if at not in read:
                read[at] = read_window(self.store, target, self.stuck_after_s, window_s, at)
                self.windows_read += 1
            return read[at]

        out: list[object] = []
        if self.advisor is not None:
            out += self.advisor.advise(target, window_at)
        if self.stuck_watch is not None and target is not None:
            w = window_at()
            if w.stuck is not None:
                out += self.stuck_watch.events_for(w.stuck, target, w.now, w.pid_rank)
        if self.memory_watch is not None and target is not None:
            w = window_at()
            out += self.memory_watch.events_for(w.memory, target, w.now)
        if self.views is not None and self.views.due():
            w = window_at()
            # The window's memory view is cached on it: the advisor's rules worked it out already.
            out += [replace(v, memory=w.memory) if isinstance(v, PaneViews) else v for v in self.views.views_for(w)]
        return out

    def close(self) -> None:
        pass


def add_job_stage(session: Session, *, advise: bool = True, stuck: bool = True, views: bool = False) -> JobStage:
    """Put the job stage on a live or replayed session's pipeline. The UI, ``advise``, ``record``
    and ``replay`` all call this with the session, so they run one advisor with the same window,
    stuck threshold and cadence, and reach one verdict on the same data (the hysteresis counts
    evaluations, so how often it runs changes how soon, never what)."""
    target = lambda: session.target_pid  # noqa: E731 - follows the session's attaches
    stage = JobStage(
        session.store, target, window_s=session.window, stuck_after_s=session.stuck_after,
        advisor=AdvisorSource(session.store, interval=advisor_every(), window_s=session.window,
                              stuck_after_s=session.stuck_after, target_pid=target,
                              unattached_every=session.advisor_idle_every) if advise else None,
        stuck_watch=StuckWatch(session.store, target, session.stuck_after) if stuck else None,
        views=ViewsStage(session.store, target, session.stuck_after, session.window) if views else None,
        # Its events are recorded like the stuck watch's: a replay shows them from the file.
        memory_watch=MemoryWatch() if stuck else None,
    )
    session.pipeline.add_source(stage)
    return stage
