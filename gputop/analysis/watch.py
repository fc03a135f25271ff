"""The stuck verdict as events: one (source ``stuck``) when the attached job becomes stuck, one
when its main thread moves again, for the event log, the status line and recordings.

The verdict is the window's (analysis.window): the one the Stacks pane shows and the advisor's
stuck rule reads, worked out once a tick. The session's job stage hands it to ``events_for``;
``poll`` reads a window of its own, for a watch run alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping

from ..model import Event
from .stuck import GPU_NOTES, StuckVerdict
from .window import read_window

if TYPE_CHECKING:
    from ..store import Store


class StuckWatch:
    """Remembers which stuck run it has told of, so each is told once. ``target_pid`` may be a
    callable, to follow the session."""

    name = "stuck"

    def __init__(self, store: Store, target_pid: int | None | Callable[[], int | None], threshold: float,
                 interval: float = 1.0) -> None:
        self.store = store
        self.threshold = threshold
        self.interval = interval
        self._target = target_pid if callable(target_pid) else (lambda: target_pid)
        self._reported: tuple[int, float] | None = None  # (pid, start of the stuck run)

    def poll(self) -> list[object]:
        pid = self._target()
        if pid is None or self.store.now <= 0:
            return []
        w = read_window(self.store, pid, self.threshold)
        return self.events_for(w.stuck, pid, w.now, w.pid_rank) if w.stuck is not None else []

    def events_for(self, v: StuckVerdict, pid: int, now: float, pid_rank: Mapping[int, int] | None = None) -> list[Event]:
        """The events a verdict on ``pid`` at ``now`` makes; ``pid_rank`` names a multi-rank job's
        ranks in them."""
        if self._reported is not None:
            was_pid, since = self._reported
            if was_pid != pid:
                self._reported = None
            elif v.since is not None and v.since > since:  # a new unchanged run: it moved
                self._reported = None
                return [Event(now, self.name, f"main thread of {_who(pid, pid_rank)} is moving again", "info")]
            else:
                return []
        if not v.stuck:
            return []
        self._reported = (pid, v.since or now)
        gpu_note = GPU_NOTES.get(v.gpu, "GPU activity unknown")
        cpu_note = "" if v.tree_cores is None else f", processes at {v.tree_cores * 100:.0f} % CPU"
        held = f"{'' if v.held_exact else '≥ '}{v.held_s:.0f} s"
        category = v.category.value if v.category is not None else "?"
        kind = f": {v.diagnosis.summary}" if v.diagnosis is not None else ""
        return [Event(now, self.name, f"{_who(pid, pid_rank)} looks stuck: no progress for {held} at {v.where} "
                                      f"({category}, {gpu_note}{cpu_note}){kind}", "warning")]

    def close(self) -> None:
        pass


def _who(pid: int, pid_rank: Mapping[int, int] | None) -> str:
    """'PID 123', or 'rank 0 (PID 123)' for a rank of a multi-rank job."""
    rank = (pid_rank or {}).get(pid)
    return f"PID {pid}" if rank is None else f"rank {rank} (PID {pid})"
