"""Hangs: the main thread has not moved and nothing computes.

Whether the job is stuck is the analysis's verdict (``analysis.stuck``, with its own threshold,
the session's stuck-after, or at attach from the evidence's reach); why and where every party
waits is ``analysis.hang``'s diagnosis. This rule words them: the kind in the title, every
party's line in the evidence, the kind's own next step as the action.
"""

from __future__ import annotations

from ...analysis import COLLECTIVE, autopsy_hint
from ...analysis import DESYNC, HANG, UNKNOWN_HANG, ras_line

from ...analysis import CPU_DEVICE
from ...model import Category
from ...analysis import CPU_WINDOW_S, TREE_BUSY_CORES
from ..context import AnalysisContext, GpuView
from .base import Hit, uses, workers_cpu_line
from .threshold import JUDGEMENT, Threshold

RECENT_UTIL_S = Threshold(
    5.0, "s", JUDGEMENT,
    "The GPU utilisation quoted beside a hang is over this many recent seconds: long enough to average the "
    "200 ms samples, short enough to show the GPU as it is now.")


@uses(RECENT_UTIL_S)
def check_stuck(ctx: AnalysisContext) -> Hit | None:
    v = ctx.stuck
    if v is None or not v.stuck:
        return None
    # A long save that still writes is not stuck: the verdict itself (analysis.stuck) says so from the
    # job's own bytes through read/write. The host's disk is no such evidence: any writer on the host
    # (another job, gputop's own recording) would hide a save that waits on a lock forever.
    held = f"{'' if v.held_exact else '≥ '}{v.held_s:.0f} s"
    cat = v.category.value if v.category else "unknown"
    d = v.diagnosis
    ev = [f"main thread of PID {ctx.target_pid} unchanged for {held} at {v.where} ({cat})"]
    if d is not None:
        # Why, then where every party waits: the main thread, the other threads, each worker. The
        # title says the diagnosis; "why" is said here only where the title says something else (a
        # desync NCCL's counts name), and no kind of hang named is no reason ("unknown") to give.
        if d.kind != UNKNOWN_HANG and not _titled(ctx, d):
            ev.append(f"why ({d.kind}): {d.summary}")
        ev.extend(d.evidence)
        lines = [p.line() for p in d.parties]
        for text in dict.fromkeys(lines):  # identical parties (pool threads) once, counted
            n = lines.count(text)
            ev.append(text + (f" (x{n})" if n > 1 else ""))
    ev.extend(v.evidence)
    gpus = [g for g in ctx.gpus if g.index != CPU_DEVICE]
    if gpus:
        ev.append(", ".join(f"{g.name} at {_recent_util(g):.0f} %" for g in gpus)
                  + f" over the last {RECENT_UTIL_S:.0f} s")
    if ctx.workers.count:
        ev.append(workers_cpu_line(ctx))
    if v.tree_cores is not None and v.proc is None:
        # The progress check's own number: why an unchanged stack is a hang, not a slow step.
        idle = v.tree_cores < TREE_BUSY_CORES  # else a collective, spinning without progress
        ev.append(f"the job's processes at {v.tree_cores * 100:.0f} % CPU over the last "
                  f"{min(CPU_WINDOW_S, v.held_s):.0f} s{': nothing is computing' if idle else ' (spinning)'}")
    # NCCL's own count of each rank's collectives, where its RAS service answers: a rank that stopped
    # launching them names itself, with no sampling at all.
    ev.extend(ras_line(r) for r in ctx.nccl if r.verdict in (HANG, DESYNC))
    if d is not None:
        action = d.action
    elif v.category in (Category.DATA_WAIT, Category.DATA_FETCH):
        action = (
            f"see where the workers wait: gputop stacks --pid {ctx.target_pid}; "
            "make a hang fail instead of waiting forever: DataLoader(..., timeout=120)"
        )
    elif v.category is Category.COLLECTIVE:
        action = (
            "see which rank is missing: gputop stacks --pid PID on every rank; "
            "dist.init_process_group(..., timeout=datetime.timedelta(minutes=10)) so a hang raises "
            "(on NCCL with TORCH_NCCL_ASYNC_ERROR_HANDLING=1)"
        )
    else:
        action = f"see every thread: py-spy dump --pid {ctx.target_pid} --locals (the deadlock is usually visible)"
    title = f"Job stuck: no progress for {held}"
    if d is not None:
        title += f": {d.summary}"
    # NCCL's own counts say the ranks called different collectives: that is the cause, whatever
    # the stacks (which on NCCL show the line after the call) make of it.
    desync = next((r for r in ctx.nccl if r.verdict == DESYNC), None)
    if desync is not None and (d is None or d.kind == COLLECTIVE):
        title = f"Job stuck: no progress for {held}: collective desync: {desync.detail}"
        action = ("make every rank call the same collectives in the same order (a collective under a rank-dependent "
                  "`if`, or a different number of steps per rank, desyncs them); TORCH_DISTRIBUTED_DEBUG=DETAIL names "
                  "the mismatched call (debugging only); see where each rank stands: gputop stacks --pid PID on each")
    if (d is not None and d.kind == COLLECTIVE) or (d is None and v.category is Category.COLLECTIVE):
        # The job's own flight recorder will say which rank did not join, once its watchdog fires.
        hint = autopsy_hint(ctx.env) or next((h for r in ctx.ranks if r.env and (h := autopsy_hint(dict(r.env)))), None)
        if hint:
            action += f"; {hint}"
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain="the job makes progress again",
        cost_s=v.held_s * max(1, len(gpus)),
        confidence=v.confidence or (0.9 if v.held_exact else 0.8),
        gpu_index=gpus[0].index if gpus else None,
        title=title,
    )


def _titled(ctx: AnalysisContext, d) -> bool:
    """Whether the title carries the diagnosis's summary (it does unless NCCL's counts name a
    desync, which then takes the title)."""
    return not any(r.verdict == DESYNC for r in ctx.nccl) or d.kind != COLLECTIVE


def _recent_util(g: GpuView, seconds: float = RECENT_UTIL_S) -> float:
    xs = [s for s in g.slices if s.end >= g.breakdown.t1 - seconds]
    return sum(s.util for s in xs) / len(xs) if xs else 0.0
