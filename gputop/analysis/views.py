"""What the Stacks and Ranks panes show, computed off the UI thread: a derived stage.

The Stacks pane shows ``stacks_summary.stacks_view`` of the target (its threads, the main thread's
time by category and its hottest frames over a minute, its workers, and the stuck verdict, which
reads the threshold plus a minute of history); the Ranks pane shows ``ranks.job_view`` (each rank's
main thread over a minute). Both walk every stack sample in their windows, and the panes used to
compute them at each UI refresh, on the event loop that also handles the keys. Measured on 2 cores
(bench/pane_views.py) with 10,000 samples of an 8-rank job within reach: ~4 ms for the stacks view
and ~9 ms for the job's, 70-90 % of a refresh of those tabs (8-22 ms); with the store's 20,000
~8 and ~17 ms (refreshes of 21-43 ms). So this stage computes both on its own pipeline thread,
once a second (the advisor's and the stuck watch's cadence), and returns them as one ``PaneViews``
through the pipeline like the advisor's ``Verdict``: the store keeps the latest and the panes only
lay it out (a refresh of either tab is then ~2 ms). Live and replay run the same stage
(``session``), so both show the same; only the UI's sessions have it (no headless command shows a
pane).
"""

from __future__ import annotations

from typing import Callable

from ..model import PaneViews
from ..store import Store
from .ranks import job_view
from .stacks_summary import DEFAULT_WINDOW_S, stacks_view

# As often as the advisor and the stuck watch look: durations on screen ("stuck for 42 s") move
# by the second, and the UI redraws every 2 s (0.5 s in a replay) at most.
VIEWS_EVERY_S = 1.0


def pane_views(store: Store, target_pid: int | None, stuck_after: float, window_s: float = DEFAULT_WINDOW_S,
               now: float | None = None) -> PaneViews:
    """The panes' views of the store at ``now`` (its clock): the target's stacks (None without a
    target) and the multi-rank job (None when there is none)."""
    now = store.now if now is None else now
    stacks = stacks_view(store, target_pid, stuck_after, window_s, now) if target_pid is not None else None
    return PaneViews(now, target_pid, stacks, job_view(store, window_s, now))


class ViewsStage:
    """``pane_views`` as a pipeline stage: reads the store, returns a ``PaneViews`` when the store's
    clock, a replay's jump or the target changed since the last one (a paused replay costs
    nothing). ``target_pid`` may be a callable, to follow the session."""

    name = "views"

    def __init__(self, store: Store, target_pid: int | None | Callable[[], int | None], stuck_after: float,
                 window_s: float = DEFAULT_WINDOW_S, interval: float = VIEWS_EVERY_S) -> None:
        self.store = store
        self.stuck_after = stuck_after
        self.window_s = window_s
        self.interval = interval
        self._target = target_pid if callable(target_pid) else (lambda: target_pid)
        self._seen: tuple | None = None  # (clock, resets, target) of the last views

    def poll(self) -> list[object]:
        now = self.store.now
        if now <= 0:
            return []  # nothing collected yet
        pid = self._target()
        key = (now, self.store.resets, pid)
        if key == self._seen:
            return []
        self._seen = key
        return [pane_views(self.store, pid, self.stuck_after, self.window_s, now)]

    def close(self) -> None:
        pass
