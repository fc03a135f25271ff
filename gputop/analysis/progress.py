"""Is a job whose main thread's stack has not moved still making progress? Pure, on model types.

An unchanged stack is not proof of no progress: a loop that spends every step in one long call
(``__getitem__`` with num_workers=0, a wait on saturated DataLoader workers, threads fighting
over too few cores) shows the same frames and lines sample after sample while it works, slowly.
The OS says whether work goes on: if the target's process tree (the target and its DataLoader
workers) burns CPU over the recent part of the unchanged span, the job is working. Measured on
an H100 box (bench/advisor_bench.py): the slow-but-working scenarios kept at least one core busy
(the main thread ~100 % inside ``__getitem__``; every worker ~100 % while the main thread waits on
their queue), the real deadlock (a worker blocked on a lock, the main thread waiting on its
queue) sat at ~0 %. Without the target's own CPU (a store holding stacks only), py-spy's
per-sample "on CPU" flag of the main thread stands in for it.

A main thread inside a collective is the exception: a hung NCCL collective spins its kernel (the
GPU reads 100 % busy), the main thread typically spin-waits on the stream and NCCL's proxy
threads poll, so neither the GPU nor the CPU says anything about progress there; only the stack
counts.

One decision, ``working``, used by the stuck verdict (gputop.analysis.stuck), which the pane, the
stuck watch's events and the advisor's stuck rule all read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..model import Category, ProcSample, StackSample
from .threshold import DERIVED, JUDGEMENT, Threshold

# The process tree using at least this many cores on average over the recent span is working,
# whatever its stack says. Measured: slow-but-working jobs >= 1 core (one busy main thread or
# one busy worker each), the deadlock ~0; idle Python/torch processes polling a queue or running
# a pin-memory thread stay at a few % of a core, even several of them.
TREE_BUSY_CORES = Threshold(
    0.2, "cores", JUDGEMENT,
    "The process tree using this many cores on average is working whatever its stack says: slow-but-working jobs "
    "measured >= 1 core, the deadlock ~0, idle torch processes a few % of a core.")
# How far back the CPU check looks (within the unchanged span): recent enough that a job that
# worked and then hung is called stuck soon after, long enough to smooth one 1 s reading.
CPU_WINDOW_S = Threshold(
    10.0, "s", JUDGEMENT,
    "How far back the CPU check looks: recent enough that a job that worked and then hung is called stuck soon "
    "after, long enough to smooth one 1 s reading.")
# A psutil cpu_percent reading covers the poll interval before its timestamp (the host and
# stacks sources poll every second): one taken less than this after the stack stopped moving
# also covers time before it.
CPU_READING_S = Threshold(
    1.0, "s", DERIVED,
    "A psutil cpu_percent reading covers the poll interval before it (the sources poll every second): one taken "
    "sooner after the stack stopped also covers time before it.")
# Without the target's own CPU: the main thread on CPU (py-spy's "active") in at least this
# share of its recent samples is computing, not blocked. A thread blocked on a lock, a queue or
# a sleep reads inactive in every sample.
MAIN_ACTIVE_SHARE = Threshold(
    0.5, "share", JUDGEMENT,
    "Without the target's own CPU, a main thread on CPU (py-spy's 'active') in this share of its recent samples "
    "computes: a blocked thread reads inactive in every sample.")


@dataclass(frozen=True)
class Activity:
    """What the OS and py-spy say the job did over the recent part of an unchanged span."""

    cores: float | None = None  # cores the target + workers used on average; None: no reading
    target_known: bool = False  # the target's own CPU is among the readings
    main_active: float | None = None  # share of the main thread's samples on CPU; None: none


def tree_cores(tree: Mapping[int, Sequence[ProcSample]], pid: int, t0: float, t1: float) -> tuple[float | None, bool]:
    """(cores used on average by the processes of ``tree`` (pid -> samples; the target ``pid``
    and its workers) from readings in [t0, t1], whether the target's own CPU was read).
    None: no reading of any of them."""
    total: float | None = None
    target_known = False
    for p, samples in tree.items():
        xs = [s.cpu_percent for s in samples if t0 <= s.ts <= t1 and s.cpu_percent is not None]
        if xs:
            total = (total or 0.0) + sum(xs) / len(xs) / 100.0
            target_known = target_known or p == pid
    return total, target_known


def activity(run: Sequence[StackSample], now: float, tree: Mapping[int, Sequence[ProcSample]]) -> Activity:
    """The job's activity over the recent part of ``run`` (the main thread's unchanged stacks,
    time order, the first one where it stopped moving)."""
    if not run:
        return Activity()
    start, pid = run[0].ts, run[-1].pid
    cores, known = tree_cores(tree, pid, max(now - CPU_WINDOW_S, start + CPU_READING_S), now)
    if cores is None:  # the span is younger than one reading: the newest readings
        cores, known = tree_cores(tree, pid, now - CPU_WINDOW_S, now)
    recent = [s for s in run if s.ts >= now - CPU_WINDOW_S]
    share = sum(s.active for s in recent) / len(recent) if recent else None
    return Activity(cores, known, share)


def working(category: Category, gpu: str, act: Activity) -> str | None:
    """Why a job whose main stack has not moved is still making progress (a phrase), or None
    when nothing says it is: then it is stuck. ``gpu``: busy | idle | unknown."""
    if category is Category.COLLECTIVE or gpu == "spin":
        # a hung collective spins GPU and CPU alike (the CUDA driver yields in a loop while a
        # kernel waits): only the stack counts
        return None
    if gpu == "busy":
        return "the GPU is busy"
    if act.cores is not None and act.cores >= TREE_BUSY_CORES:
        return f"its processes are at {act.cores * 100:.0f} % CPU"
    if not act.target_known and act.main_active is not None and act.main_active >= MAIN_ACTIVE_SHARE:
        return f"the main thread is on CPU in {act.main_active * 100:.0f} % of its samples"
    return None
