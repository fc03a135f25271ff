"""A recording's span: the one definition that `info`, `report`, `replay` and `record --list`
all use (its length is written by ``units.fmt_length``). Pure: numbers in, numbers and text out.

NVML keeps ~20 s of 200 ms utilisation samples; the first poll of a session reads that buffer
whole, so a recording starts with GPU utilisation from *before* the recorder ran (the
"backfill"). It is kept in the file (a replay's charts show it as history, as live charts do)
but is not part of the recording's span: nothing else was recorded then, so seeking there would
show an empty session. The span starts at the first sample of any other series.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Span:
    start: float
    end: float
    backfill_s: float = 0.0  # GPU utilisation history in the file from before ``start``

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)


def recording_span(
    recorded_firsts: Iterable[float | None],
    ends: Iterable[float | None],
    backfill_first: float | None = None,
    fallback_start: float = 0.0,
) -> Span:
    """``recorded_firsts``: the first timestamp of every series recorded as it happened (polls,
    host, processes, stacks, events); ``ends``: the last of every series; ``backfill_first``:
    the first buffered utilisation point, which may predate the recorder."""
    firsts = [t for t in recorded_firsts if t is not None]
    last = [t for t in ends if t is not None]
    if firsts:
        start = min(firsts)
    elif backfill_first is not None:
        start = backfill_first  # nothing but utilisation points: they are the recording
    else:
        start = fallback_start
    backfill = start - backfill_first if backfill_first is not None and backfill_first < start else 0.0
    end = max(last) if last else start
    return Span(float(start), float(max(start, end)), backfill)


def backfill_note(backfill_s: float) -> str:
    """What to say about the GPU history from before the recording started ('' if none)."""
    if backfill_s < 0.5:
        return ""
    return f"plus {backfill_s:.0f} s of GPU utilisation history from before recording started, not counted"
