"""The report's memory story: each GPU's memory over the run (the card's and the job's own), the
forecast the advisor showed live (the recorded memory-growth finding), and how the job likely
ended (the recorded oom-exit finding). Pure: a ``Summary`` in, plain data and strings out; the
text and HTML renderers lay them out.

The forecast is the recorded one, not fitted again here: the report says what the person was
told while the job ran, and when.
"""

from __future__ import annotations

import re
from typing import Sequence

from ..units import fmt_bytes
from .summary import FindingSummary, GpuSummary, Summary

GROWTH_ID, EXIT_ID = "memory-growth", "oom-exit"
# The oom-exit finding names the GPU that was full ("GPU 0's memory was at 99 % ..."); without
# one it is the host's (the OOM killer).
_EXIT_GPU = re.compile(r"\bGPU (\d+)'s memory")


def forecast_of(s: Summary, gpu: int | None) -> FindingSummary | None:
    """The memory-growth finding recorded for ``gpu`` (None: the host's), if any."""
    return next((fs for fs in s.findings if fs.finding.id == GROWTH_ID and fs.finding.gpu_index == gpu), None)


def exit_of(s: Summary) -> FindingSummary | None:
    """The recorded oom-exit finding: what likely ended the job, if it ran out of memory."""
    return next((fs for fs in s.findings if fs.finding.id == EXIT_ID), None)


def exit_gpu(fs: FindingSummary) -> int | None:
    """The GPU a likely CUDA OOM names; None for the host's OOM killer."""
    for e in (fs.finding.title, *fs.finding.evidence):
        m = _EXIT_GPU.search(e)
        if m:
            return int(m.group(1))
    return None


def job_memory(g: GpuSummary) -> list[tuple[float, float | None]]:
    """The job's own memory on ``g`` per chart bucket (None where it had no figure)."""
    return [(t, b.job_mem_max) for t, b in g.chart]


def card_memory(g: GpuSummary) -> list[tuple[float, float | None]]:
    return [(t, None if b.mem_max is None else float(b.mem_max)) for t, b in g.chart]


def _ends(points: Sequence[tuple[float, float | None]]) -> tuple[float, float, float] | None:
    vals = [v for _, v in points if v is not None]
    return (vals[0], vals[-1], max(vals)) if vals else None


def memory_line(g: GpuSummary) -> str | None:
    """One line: the job's memory from the start to the end of the run and its peak, and the
    card's peak against its total; None without a memory reading."""
    job, card = _ends(job_memory(g)), _ends(card_memory(g))
    parts = []
    if job is not None:
        first, last, peak = job
        parts.append(f"the job's {fmt_bytes(first)} → {fmt_bytes(last)} (peak {fmt_bytes(peak)})")
    if card is not None:
        total = f" of {fmt_bytes(g.memory_total)}" if g.memory_total else ""
        parts.append(f"the card's peak {fmt_bytes(card[2])}{total}")
    return "; ".join(parts) or None


__all__ = ["EXIT_ID", "GROWTH_ID", "card_memory", "exit_gpu", "exit_of", "forecast_of", "job_memory", "memory_line"]
