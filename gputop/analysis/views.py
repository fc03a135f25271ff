"""What the Stacks and Ranks panes show, computed off the UI thread.

The Stacks pane shows the target's ``StacksView`` (its threads, the main thread's time by category
and its hottest frames over the window, its workers, and the stuck verdict); the Ranks pane shows
the job's ``JobView`` (each rank's main thread over the window). Both walk every stack sample in
their windows, and the panes used to compute them at each UI refresh, on the event loop that also
handles the keys. Measured on 2 cores (bench/pane_views.py) with 10,000 samples of an 8-rank job
within reach: ~4 ms for the stacks view and ~9 ms for the job's, 70-90 % of a refresh of those tabs
(8-22 ms); with the store's 20,000 ~8 and ~17 ms (refreshes of 21-43 ms). So the session's job
stage computes both on its pipeline thread, once a second, from the same evidence window as the
advisor and the stuck watch (analysis.window: the stuck verdict and the ranks' views are worked
out once for all three), and publishes them as one ``PaneViews`` like the advisor's ``Verdict``:
the store keeps the latest and the panes only lay it out (a refresh of either tab is then ~2 ms).
Live and replay run the same stage, so both show the same; only the UI's sessions ask for the
views (no headless command shows a pane).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..model import PaneViews
from .window import DEFAULT_WINDOW_S, JobWindow, read_window

if TYPE_CHECKING:
    from ..store import Store


def views_of(window: JobWindow) -> PaneViews:
    """The panes' views of one window: the named target's stacks (None without a target) and the
    multi-rank job (None when there is none)."""
    return PaneViews(window.now, window.named_target, window.stacks_view, window.job_view)


def pane_views(store: Store, target_pid: int | None, stuck_after: float, window_s: float = DEFAULT_WINDOW_S,
               now: float | None = None) -> PaneViews:
    """The panes' views of the store at ``now`` (its clock), from a window of their own."""
    return views_of(read_window(store, target_pid, stuck_after, window_s, now))


class ViewsStage:
    """The views' part of the job stage: a ``PaneViews`` when the store's clock, a replay's jump or
    the target changed since the last one (a paused replay costs nothing). ``poll`` reads a window
    of its own, for the stage run alone. ``target_pid`` may be a callable, to follow the session."""

    name = "views"

    def __init__(self, store: Store, target_pid: int | None | Callable[[], int | None], stuck_after: float,
                 window_s: float = DEFAULT_WINDOW_S, interval: float = 1.0) -> None:
        self.store = store
        self.stuck_after = stuck_after
        self.window_s = window_s
        self.interval = interval
        self._target = target_pid if callable(target_pid) else (lambda: target_pid)
        self._seen: tuple | None = None  # (clock, resets, target) of the last views

    def due(self) -> bool:
        """Whether the data, a jump or the target changed since the last views (and there are data)."""
        now = self.store.now
        return now > 0 and (now, self.store.resets, self._target()) != self._seen

    def views_for(self, window: JobWindow) -> list[object]:
        """The views of ``window`` (read at the store's clock for the current target)."""
        self._seen = (window.now, self.store.resets, window.named_target)
        return [views_of(window)]

    def poll(self) -> list[object]:
        if not self.due():
            return []
        return self.views_for(read_window(self.store, self._target(), self.stuck_after, self.window_s))

    def close(self) -> None:
        pass
