"""The memory watch: a new steady-growth forecast that reaches the limit soon is said once, as an
event, so the status line (and a notification) tells it where the person is looking, and a
recording keeps when it was first said.

The Advisor's memory-growth finding says it too, with the evidence and the fix, but only on its
tab and in the verdict line; this is the one-time heads-up. It reads the window's memory view
(analysis.memory_window), the same the advisor reads, so it adds no evidence of its own.
"""

from __future__ import annotations

from ..analysis import MemoryView, eta_text, rate_text
from ..model import Event
from .rules.memory import WARN_WITHIN_S

# A forecast is said once two evaluations in a row agree, as a finding shows (the advisor's
# hysteresis): one noisy fit that dips under the bar is not news.
AGREE = 2


class MemoryWatch:
    """Call ``events_for`` each evaluation with the target's memory view. Each device (a GPU,
    the host) is told at most once per target: the forecast then lives on in the Advisor tab and
    the GPU panel, which follow it as it changes; telling it again each time the fit wobbles
    across the bar would be noise."""

    name = "memory"

    def __init__(self) -> None:
        self._target: int | None = None
        self._told: set[str] = set()
        self._streak: dict[str, int] = {}

    def events_for(self, memory: MemoryView | None, target: int | None, now: float) -> list[Event]:
        if target != self._target:
            self._target, self._told, self._streak = target, set(), {}
        if memory is None:
            return []
        soon: list[tuple[str, str]] = []
        for gm in memory.gpus:
            g = gm.growth
            # The whole card's figure where NVML gives no per-process one: said as the card's.
            whose = "the job's memory" if gm.source == "process" else "the whole card's memory"
            soon.append((f"gpu{gm.index}", self._line(f"GPU {gm.index}", whose, g)))
        if memory.host is not None:
            # The host's growth is the job's own (its processes', memory_window), not the host's
            # used memory; in a container, against the job's control group's limit.
            where = "the job's control group" if memory.host_cgroup else "the host"
            soon.append(("host", self._line(where, "the job's memory", memory.host)))
        out = []
        for key, line in soon:
            if not line:
                self._streak[key] = 0
                continue
            self._streak[key] = self._streak.get(key, 0) + 1
            if self._streak[key] >= AGREE and key not in self._told:
                self._told.add(key)
                out.append(Event(now, "memory", line, "warning"))
        return out

    @staticmethod
    def _line(device: str, whose: str, g) -> str:
        """The message when ``g`` grows to its limit within WARN_WITHIN_S, else ''. The time
        comes first: the status line is one line, cut at the terminal's width. No pointer to the
        Advisor tab: the event is also recorded, and read back in a report or a replay, where no
        tab is."""
        if not g.growing or g.eta_s is None or g.eta_s > WARN_WITHIN_S:
            return ""
        # A bounded forecast (the workers' copy-on-read) is not made at today's rate: said so.
        slowing = "" if g.ceiling is None else ", slowing (copy-on-read)"
        return f"{device} runs out of memory in {eta_text(g)}: {whose} grows {rate_text(g.rate)}{slowing}"


__all__ = ["AGREE", "MemoryWatch"]
