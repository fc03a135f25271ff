"""The report's memory story: each GPU's memory over the run (the card's and the job's own), the
forecast the advisor showed live (the recorded memory-growth finding), and how the job likely
ended (the recorded oom-exit finding); on the host, the DataLoader workers' private memory (USS)
over the run, with the memory view's judgement of it (copy-on-read, or a leak in the main
process). Pure: a ``Summary`` in, plain data and strings out; the text and HTML renderers lay
them out.

The forecast is the recorded one, not fitted again here: the report says what the person was
told while the job ran, and when.
"""

from __future__ import annotations

import re
from typing import Sequence

from ..analysis import COPY_ON_READ, FLAT, GROWING, MAIN_LEAK, PLATEAU, SAWTOOTH, rate_text
from ..units import fmt_bytes
from .summary import FindingSummary, GpuSummary, Summary, WorkersMemory, WorkerUss

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


def workers_line(w: WorkersMemory) -> str:
    """The workers' private memory over the run in one sentence: how many, their sum from the
    first reading to the last and its peak, and the judgement (``workers_judgement``)."""
    n = len(w.workers)
    head = (f"{n} DataLoader worker{'s' if n != 1 else ''}, their sum {fmt_bytes(w.total_first)} → "
            f"{fmt_bytes(w.total_last)} (peak {fmt_bytes(w.total_peak)})")
    return f"{head}; {workers_judgement(w)}"


def workers_judgement(w: WorkersMemory) -> str:
    """What the memory view makes of the workers' USS at the end of the run: how many grew
    steadily and at what rate each (the median, as the advisor says it), and whose memory grew
    (copy-on-read, or the main process) where the evidence tells."""
    p = w.private
    if not p.judged:
        return "too few readings for a trend (a minute and ten readings a worker)"
    levelled = sum(1 for x in w.workers if x.growth.kind == PLATEAU)
    if p.growing:
        out = f"{p.growing} of {p.judged} grew steadily, {rate_text(p.median_rate)} each (median)"
    else:
        out = f"none of the {p.judged} grew steadily"
    if levelled:
        out += f", {levelled} grew, then levelled off"
    if p.cause == COPY_ON_READ:
        out += (": copy-on-read (the Dataset's Python objects copied into each worker as their refcounts are "
                "touched), the main process's RSS flat")
    elif p.cause == MAIN_LEAK:
        out += ": the main process's RSS grew instead (a leak in the main process, not copy-on-read)"
    elif not p.growing and not levelled:
        out += ": no copy-on-read"
    return out


_TREND = {FLAT: "flat", PLATEAU: "grew, then levelled off", SAWTOOTH: "rose and fell"}


def worker_trend(x: WorkerUss) -> str:
    """'grew 40 MB/min', 'flat', 'grew, then levelled off', 'rose and fell', 'too few readings'."""
    if x.growth.kind == GROWING:
        return f"grew {rate_text(x.growth.rate)}"
    return _TREND.get(x.growth.kind, "too few readings")


def worker_line(x: WorkerUss) -> str:
    """'worker 4242: 300.0M → 396.7M (peak 396.7M), grew 40 MB/min'."""
    return (f"worker {x.pid}: {fmt_bytes(x.first)} → {fmt_bytes(x.last)} (peak {fmt_bytes(x.peak)}), "
            f"{worker_trend(x)}")


def workers_dict(w: WorkersMemory | None) -> dict | None:
    """The workers' private memory for ``report --json``: bytes and bytes/s, the judgement as the
    memory view makes it (``cause``: "copy-on-read", "main-process" or null)."""
    if w is None:
        return None
    p = w.private
    return {
        "workers": len(w.workers),
        "total_first_bytes": w.total_first,
        "total_last_bytes": w.total_last,
        "total_peak_bytes": w.total_peak,
        "judged": p.judged,
        "growing": p.growing,
        # the growing workers' median rate (0 when none grew steadily), and the sum's
        "growth_median_bytes_per_s": p.median_rate,
        "growth_total_bytes_per_s": p.total_rate,
        "grows": p.grows,
        "cause": p.cause,
        "text": workers_line(w),
        "per_worker": [
            {"pid": x.pid, "first_bytes": x.first, "last_bytes": x.last, "peak_bytes": x.peak,
             "trend": x.growth.kind, "growth_bytes_per_s": x.growth.rate if x.growth.growing else 0.0,
             "first_read": x.start, "last_read": x.end}
            for x in w.workers
        ],
    }


__all__ = ["EXIT_ID", "GROWTH_ID", "card_memory", "exit_gpu", "exit_of", "forecast_of", "job_memory", "memory_line",
           "worker_line", "worker_trend", "workers_dict", "workers_judgement", "workers_line"]
