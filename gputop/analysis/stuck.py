"""Is the attached job stuck? Pure: ``judge`` reads the main thread's samples and what the window
(analysis.window) says of the job, and returns a verdict.

Stuck means: the main thread's Python stack has not changed for ``threshold`` seconds and the
GPU work of the target has stopped (or cannot be seen: no NVML, or the target holds no GPU
context we can see, e.g. from inside another PID namespace). A training loop that progresses
moves its main thread's line many times a second, so an identical stack for tens of seconds is
a hang, a deadlock or a wait that never ends.

An unchanged stack is not proof of no progress, though: a slow loop that spends every step in
one long call looks the same sample after sample. A job whose process tree burns CPU is working;
gputop.analysis.progress says when (``working``). ``analysis.watch.StuckWatch`` turns the verdict
into events.

One exception to "the GPU has stopped": a main thread inside a collective. A hung NCCL
collective spins its kernel and NVML shows the GPU 100 % busy for as long as it hangs (and its
CPU proves nothing either: see gputop.analysis.progress). Another: a main thread in a
synchronising call while the GPU stays busy for the whole threshold, a kernel that never ends.

**A verdict at attach.** A job that hung before gputop arrived must not wait ``threshold`` seconds
of watching: when the main thread has not moved since the first sample and the kernel says the
job's processes do not move either (CPU time and bytes through read/write flat between /proc
readings, from the procfs source; psutil's readings where there are none, as in a replay), it is
called stuck once ``EARLY_MIN_S`` of such evidence is in, with the time it has been stuck given as
a lower bound from the evidence's reach ("≥ 14 s" when NVML's buffer shows the GPU idle for its
whole depth) and a confidence that grows with it. gputop.analysis.hang says why and where.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from .classify import is_library, project_frame, stack_key, where
from ..model import Category, Frame, GpuProcess, GpuSample, ProcSample, StackSample, TaskSample, UtilPoint
from .hang import COLLECTIVE, Diagnosis, Progress, diagnose, progress
from .progress import CPU_READING_S, CPU_WINDOW_S, MAIN_ACTIVE_SHARE, TREE_BUSY_CORES, activity, tree_cores, working
from .efficiency import is_worker, parents_of, worker_stats
from .nccl_ras import HANG, CommVerdict
from .ranks import moving_ranks
from .spin import spins_now
from .threshold import IntThreshold, JUDGEMENT, Threshold

# A job whose main stack and processes have not moved for this long, GPU idle, is called stuck:
# longer than a checkpoint save or an evaluation pass on most jobs, short enough to be noticed
# while someone watches. The one default every command and pane uses.
DEFAULT_STUCK_AFTER_S = Threshold(
    30.0, "s", JUDGEMENT,
    "No progress this long, GPU idle, is stuck: longer than a checkpoint save or an evaluation pass on most jobs, "
    "short enough to be noticed while someone watches.")
# NVML utilisation at or below this counts as "no GPU work": an idle GPU reads 0, and a few %
# absorbs a monitoring tool's own blips.
GPU_IDLE_PCT = Threshold(
    5.0, "%", JUDGEMENT,
    "NVML utilisation at or below this is no GPU work: an idle GPU reads 0, and a few % absorbs a monitoring "
    "tool's own blips.")
# How far back "the GPU has stopped" looks: five 1 s polls / twenty-five 200 ms buffer points,
# enough not to call a gap between two kernels a stop.
GPU_IDLE_WINDOW_S = Threshold(
    5.0, "s", JUDGEMENT,
    "How far back 'the GPU has stopped' looks: five 1 s polls or twenty-five 200 ms buffer points, so a gap "
    "between two kernels is not a stop.")
# With no main-thread sample this recent, sampling has stopped (target gone, py-spy failing):
# no verdict rather than a stale one. Default sampling is 5 Hz.
STALE_AFTER_S = Threshold(
    5.0, "s", JUDGEMENT,
    "With no main-thread sample this recent, sampling has stopped (target gone, py-spy failing): no verdict rather"
    " than a stale one.")
# Beyond the threshold, how much history to scan to say how long it has been stuck.
LOOKBACK_EXTRA_S = Threshold(
    60.0, "s", JUDGEMENT,
    "Beyond the threshold, how much history is scanned to say how long the job has been stuck.")
# The verdict at attach: the main thread unchanged since the first sample, and the job's
# processes flat in /proc, for at least this long. Judgement: 15 identical stacks at 5 Hz and
# three /proc readings; a training step, a DataLoader batch or a logging call moves well inside
# it, and with the advisor's 2 s cadence the verdict lands ~4 s after attaching.
EARLY_MIN_S = Threshold(
    3.0, "s", JUDGEMENT,
    "The verdict at attach: the main thread unchanged since the first sample, and the job's processes flat in "
    "/proc, this long: 15 identical stacks at 5 Hz; a step, a batch or a log call moves well inside it.")
# A main thread that used this much of a core over the /proc span is computing, however little
# the host gives it. Judgement: a thread blocked in futex/read/recv accrues no CPU time at all
# (measured here: 0.0 % for the deadlock, socket and hung-worker targets), and a busy thread
# starved by eight processes on two cores still got 15 %.
MAIN_THREAD_WORKING_CORES = Threshold(
    0.05, "cores", JUDGEMENT,
    "A main thread that used this much of a core over the /proc span is computing: a blocked thread accrues none "
    "(0.0 % measured on the hung targets), and a busy one starved on two cores still got 15 %.")
# The /proc readings must span at least this long (two readings at the procfs source's 1 s).
PROC_MIN_SPAN_S = Threshold(
    1.5, "s", JUDGEMENT,
    "The /proc readings must span at least this: two readings at the procfs source's 1 s.")
# Bytes through read/write syscalls (files, sockets, pipes) above this rate are work, whatever the
# stack: a checkpoint save or a slow read makes progress. Judgement: 64 KiB/s is far above a hung
# job's log lines and loader heartbeats (0 measured on the hung targets) and far below any save.
IO_PROGRESS_BPS = IntThreshold(
    64 * 1024, "bytes/s", JUDGEMENT,
    "Bytes through read/write syscalls above this rate are work whatever the stack: far above a hung job's log "
    "lines and heartbeats (0 measured on the hung targets), far below any save.")
# Confidence of a verdict at attach: from EARLY_CONFIDENCE at EARLY_MIN_S up to
# EARLY_CONFIDENCE_MAX at the threshold; a verdict reached over the whole threshold keeps the
# older 0.9 / 0.8. Judgement: early evidence is strong (the kernel's) but short.
EARLY_CONFIDENCE = Threshold(
    0.55, "confidence", JUDGEMENT,
    "The confidence of a verdict at attach at EARLY_MIN_S, rising to EARLY_CONFIDENCE_MAX at the threshold: early "
    "evidence is strong but short.")
EARLY_CONFIDENCE_MAX = Threshold(
    0.85, "confidence", JUDGEMENT,
    "The confidence of a verdict at attach once it reaches the threshold (one reached over the whole threshold "
    "keeps 0.9 / 0.8).")
# A main thread that stopped while watched, its GPU spinning for the whole look-back: stuck after
# this long (the spin's own look-back, GPU_IDLE_WINDOW_S, covers it), with this confidence.
# Judgement: a training step moves its line many times a second, and a spinning GPU does no work.
SPIN_STUCK_S = Threshold(
    5.0, "s", JUDGEMENT,
    "A main thread that stopped while watched, its GPU spinning the whole look-back, is stuck after this long: a "
    "step moves its line many times a second, and a spinning GPU does no work.")
SPIN_CONFIDENCE = Threshold(
    0.7, "confidence", JUDGEMENT,
    "The confidence of a stuck verdict from a stopped main thread and a spinning GPU.")

# A main thread that every sample shows waiting at one place (asleep, blocked) can still work
# between the samples: a loop that sleeps 50 ms a step in its logging is asleep ~97 % of the time,
# and at the ~1 stack/s a loaded host allows, fifty samples in a row at the sleep line are likely
# (with n samples all at one place, up to ~3/n of the time can be spent elsewhere unseen). The
# kernel's count of the thread's CPU time and of its wakes tells a loop that works from a wait that
# never ends: a blocked thread never wakes, a poll loop wakes but runs microseconds each time.
WAKE_WORK_MS = Threshold(
    0.5, "ms", JUDGEMENT,
    "A main thread every sample shows waiting that runs this long each time it wakes works between the samples: "
    "a poll loop that waits forever (`while not ready: sleep(d)`) ran 30-70 us a wake (measured, d from 1 ms to "
    "1 s), a training loop that sleeps 50 ms a step in its logging 1.7 ms.")
MIN_WAKES = IntThreshold(
    3, "wakes", JUDGEMENT,
    "At least this many wakes of the main thread over the span, so one timer, signal or sampler's stop is not "
    "taken for a loop's work.")
# The DataLoader's wait (category data-wait) wakes by itself only for its worker status check
# (torch's MP_STATUS_CHECK_INTERVAL, 5 s): a main thread in it that wakes far more often is handed
# batches, whatever its workers' stacks look like.
DATA_WAIT_WAKES_PER_S = Threshold(
    2.0, "wakes/s", JUDGEMENT,
    "A main thread in the DataLoader's wait that wakes this often is handed batches: that wait wakes by itself "
    "only for its 5 s worker status check (0.2/s); measured 512/s on a job getting 29 batches/s from two workers "
    "that sleep in __getitem__.")
# Without the main thread's wake counts (a replay: psutil's per-process CPU only; /proc without
# schedstat: its CPU time alone), its CPU (else the target's) must tell a working loop from a
# poll. Measured: poll loops that sleep 10 ms or more a check used at most 0.67 % of a core, the
# hung targets 0.0 %, a loop that sleeps 50 ms a step 3.4 %. A poll every 1 ms (2.7 %) is not
# told from work by this reading alone: it gets no stuck verdict then, rather than a wrong one on
# a loop that works.
WAITING_WORK_CORES = Threshold(
    0.01, "cores", JUDGEMENT,
    "Without wake counts, a main thread (else its process) that waits in every sample but uses this much of a core "
    "works between them: poll loops sleeping >= 10 ms used <= 0.67 %, a loop sleeping 50 ms a step 3.4 %.")


# A thread seen waiting in a collective in every sample counts as working between them only while
# it uses at most this share of a core. Judgement: a gloo rank that waits for a straggler wakes
# each step for the step's own work (a few % of a core: the new user's job, 2-10 %); a wait that
# spins in a driver or a busy-polling transport burns most of a core (NCCL ranks measured at
# 100 % in sched_yield), where CPU says nothing of progress.
COLLECTIVE_BLOCKED_MAX_CORES = Threshold(
    0.5, "cores", JUDGEMENT,
    "A thread waiting in a collective in every sample counts as working between them only under this CPU: a gloo "
    "rank waiting for a straggler uses a few % of a core; a spinning wait burns most of one and proves nothing.")


def between_samples(run: Sequence[StackSample], category: Category, gpu: str, recent: Progress | None,
                    target_cores: float | None) -> str | None:
    """Why a main thread whose samples (``run``: its unchanged ones, time order) show it waiting at
    one place is still working between them (a phrase), or None. ``recent``: /proc's view of the
    job over the recent part of the run; ``target_cores``: the target's own CPU (psutil), used
    where /proc's per-thread readings are not there."""
    if not run or category is Category.HOST_SYNC or gpu in ("spin", "busy") or (
            category is Category.COLLECTIVE and gpu != "unknown"):
        # A thread waiting on the GPU or on peers through it (NCCL) may spin in the driver: its CPU
        # says nothing. With no GPU of the job's seen ("unknown": gloo on the CPU) a collective
        # blocks in the kernel like any wait, and its wakes and CPU say whether steps go by.
        return None
    if sum(s.active for s in run) / len(run) >= MAIN_ACTIVE_SHARE:
        return None  # on a CPU at its line: its CPU is spent there (a slow call, or a spin), not elsewhere
    if category is Category.COLLECTIVE:
        # A collective's wait that burns much of a core spins (a driver, a busy-poll transport):
        # only a thread that mostly blocks and wakes to work speaks for steps going by.
        cores = recent.main_cores if recent is not None and recent.main_cores is not None else target_cores
        if cores is None or cores > COLLECTIVE_BLOCKED_MAX_CORES:
            return None
    unseen = f"{len(run)} samples at one place leave up to ~{min(100.0, 300.0 / len(run)):.0f} % of its time unseen"
    counted = recent is not None and recent.main_cores is not None and recent.span_s >= PROC_MIN_SPAN_S
    if counted and (recent.main_wakes is not None or recent.main_runs is not None):
        # Its wakes (voluntary switches) where read: on a host busier than its cores each wake's work
        # is split over several runs by preemption, and per run a working loop reads like a poll (a
        # loop sleeping 50 ms a step, starved, ran 409 of 417 runs preempted: 0.86 ms a run, 30 ms a
        # wake).
        runs = recent.main_wakes if recent.main_wakes is not None else recent.main_runs
        span = recent.span_s
        per_wake_ms = recent.main_cores * span * 1e3 / runs if runs else 0.0
        if runs >= MIN_WAKES and per_wake_ms >= WAKE_WORK_MS:
            return (f"the main thread wakes {runs / span:.0f} times/s and runs {per_wake_ms:.1f} ms each time "
                    f"({recent.main_cores * 100:.1f} % of a core): work between the samples, not a poll ({unseen})")
        if category is Category.DATA_WAIT and runs / span >= DATA_WAIT_WAKES_PER_S:
            return (f"its wait for data ends {runs / span:.0f} times/s ({recent.main_cores * 100:.1f} % of a core): "
                    f"batches arrive ({unseen})")
        if category is Category.DATA_FETCH and runs / span >= DATA_WAIT_WAKES_PER_S and _fetch_returns(run[-1]):
            return (f"it fetches the batch's items itself and its wait in the dataset ends {runs / span:.0f} times/s "
                    f"with no loop of its own around it: each item's read returns and the next begins ({unseen})")
        return None
    if counted:
        # /proc without schedstat (no wake counts): the main thread's own CPU, as psutil's below.
        if recent.main_cores >= WAITING_WORK_CORES:
            return (f"the main thread uses {recent.main_cores * 100:.1f} % of a core while it waits in every sample: "
                    f"work between the samples, not a poll ({unseen})")
        return None
    if recent is None and target_cores is not None and target_cores >= WAITING_WORK_CORES:
        return (f"the process uses {target_cores * 100:.1f} % of a core while its main thread waits in every sample: "
                f"work between the samples, not a poll ({unseen})")
    return None


# The DataLoader's fetcher in the main process (no workers): it calls the dataset once per item of
# the batch and moves on.
_FETCHER = "torch/utils/data/_utils/fetch.py"


def _fetch_returns(s: StackSample) -> bool:
    """The main thread is in a dataset's item read that the DataLoader's fetcher called, every
    frame from the wait up to the fetcher the user's own and read, none of them in a loop: each
    time the wait ends the read returns (a sleep of a few ms per item, a remote read), where a
    poll (``while not ready: sleep(d)``) sits in a loop of its own, and a library's frames
    (a retry loop in an HTTP client) are not read and so never count as returning."""
    for f in s.frames:
        if f.filename.replace("\\", "/").endswith(_FETCHER):
            return f is not s.frames[0]
        if is_library(f.filename) or f.code is None or f.loop != 0:
            return False
    return False


def _psutil_io_bps(tree: Mapping[int, Sequence[ProcSample]], t0: float, t1: float) -> float | None:
    """Bytes/s the processes of ``tree`` read and wrote on average in [t0, t1] (psutil), or None."""
    total = None
    for ss in tree.values():
        xs = [(s.io_read_bps or 0.0) + (s.io_write_bps or 0.0) for s in ss
              if t0 <= s.ts <= t1 and (s.io_read_bps is not None or s.io_write_bps is not None)]
        if xs:
            total = (total or 0.0) + sum(xs) / len(xs)
    return total


# How a verdict names the GPU's state ("spin": 'busy' in a kernel that waits, analysis.spin).
GPU_NOTES = {"idle": "GPU idle", "busy": "GPU busy", "spin": "GPU 'busy' spinning: few SMs active, power near idle"}


@dataclass(frozen=True)
class StuckVerdict:
    stuck: bool
    reason: str  # one line: why stuck, or why not
    since: float | None = None  # when the main stack last changed (start of the unchanged run)
    held_s: float = 0.0  # how long the main stack has been unchanged
    held_exact: bool = True  # False: unchanged since before the history looked at ("at least")
    where: str = ""  # 'file:line in function' (newest project frame)
    at: Frame | None = None  # that frame (the newest frame when no project frame)
    frame: Frame | None = None  # the newest frame of the main thread
    category: Category | None = None
    gpu: str = "unknown"  # busy | idle | unknown
    others: tuple[StackSample, ...] = ()  # the latest stack of every other thread and worker
    tree_cores: float | None = None  # cores the target + workers used recently (None: unknown)
    early: bool = False  # called at attach, before the threshold, from the evidence's reach
    confidence: float = 0.0  # 0..1 (only meaningful when stuck)
    evidence: tuple[str, ...] = ()  # what says no progress: the stacks, /proc, the GPU buffer
    diagnosis: Diagnosis | None = None  # the kind of hang and every party's wait (when stuck)
    proc: Progress | None = None  # /proc's view of the job over the unchanged span
    # Bytes/s the job's processes moved through read/write over the recent part of the unchanged
    # span (/proc's counters, else psutil's bytes through storage); None: no reading. A save
    # still running that moves bytes progresses; one that moves none may be a hang.
    io_bps: float | None = None
    # Why the job works while its main stack stands still ("its workers compute", "the GPU is
    # busy"), at any length of the run; None: nothing says it does (or no run judged).
    works: str | None = None

    @property
    def io_moves(self) -> bool:
        """The job's processes move bytes through read/write at a rate that is work (a save writing)."""
        return self.io_bps is not None and self.io_bps >= IO_PROGRESS_BPS


def spinning_pids(pids: Sequence[int], gpu_processes: Sequence[GpuProcess],
                  samples: Mapping[int, Sequence[GpuSample]], points: Mapping[int, Sequence[UtilPoint]],
                  now: float) -> frozenset[int]:
    """The processes among ``pids`` whose every GPU has spun for the last GPU_IDLE_WINDOW_S
    (analysis.spin): 'busy' in a kernel that waits, a NCCL collective's for a peer or one that
    never ends. Read from whole-GPU polls, so a GPU shared with another job's work is not one."""
    out = set()
    for pid in pids:
        idx = {p.gpu_index for p in gpu_processes if p.pid == pid}
        if idx and all(spins_now(samples.get(i, ()), points.get(i, ()), now, GPU_IDLE_WINDOW_S) for i in idx):
            out.add(pid)
    return frozenset(out)


def idle_reach(points: Sequence[tuple[float, float]], now: float) -> float:
    """How far back from ``now`` the GPU has been idle without a break: ``points`` are
    (start, util %) in time order (NVML's 200 ms buffer or the polls). 0: busy now or unknown."""
    start = None
    for ts, util in reversed(points):
        if util > GPU_IDLE_PCT:
            break
        start = ts
    return 0.0 if start is None else max(0.0, now - start)


def unchanged_run(main: Sequence[StackSample]) -> tuple[StackSample, StackSample] | None:
    """(first, last) samples of the newest run of identical stacks in one thread's samples
    (time order)."""
    if not main:
        return None
    last = main[-1]
    key = stack_key(last.frames)
    first = last
    for s in reversed(main[:-1]):
        if stack_key(s.frames) != key:
            break
        first = s
    return first, last


def judge(
    main: Sequence[StackSample],
    now: float,
    threshold: float,
    gpu: str = "unknown",
    others: Sequence[StackSample] = (),
    history_start: float | None = None,
    exited: bool = False,
    procs: Mapping[int, Sequence[ProcSample]] | None = None,
    tasks: Mapping[int, Sequence[TaskSample]] | None = None,
    gpu_idle_s: float = 0.0,
    ranks: Mapping[int, int] | None = None,
    spin_pids: frozenset[int] = frozenset(),
) -> StuckVerdict:
    """The verdict from the main thread's samples (time order), the GPU state and, when given,
    the OS's view of the processes (``procs``: pid -> samples, time order; the target's and its
    workers' CPU readings are used; ``tasks``: pid -> /proc readings of the target and its
    children, time order). ``gpu_idle_s``: how long the job's GPUs have been idle without a break
    (NVML's buffer reaches back before the attach). ``ranks``: pid -> rank of a multi-rank job,
    so the diagnosis names each party by its rank."""
    others = tuple(others)
    if exited:
        return StuckVerdict(False, "the target has exited", gpu=gpu, others=others)
    run = unchanged_run(main)
    if run is None:
        return StuckVerdict(False, "no stack samples of the main thread yet", gpu=gpu, others=others)
    first, last = run
    top = last.frames[0] if last.frames else None
    base = dict(
        since=first.ts,
        where=where(last.frames),
        at=project_frame(last.frames) or top,
        frame=top,
        category=last.category,
        gpu=gpu,
        others=others,
    )
    if now - last.ts > STALE_AFTER_S:
        return StuckVerdict(False, f"no stack sample for {now - last.ts:.0f} s", **base)
    held = now - first.ts
    # The run reaching back to the first sample looked at means "at least this long".
    reaches_start = first is main[0]
    exact = history_start is None or not reaches_start or first.ts - history_start > 1.0
    parents = parents_of(ss[-1] for ss in (procs or {}).values() if ss)
    tree = {p: ss for p, ss in (procs or {}).items()
            if ss and (p == last.pid or is_worker(ss[-1], last.pid, parents=parents))}
    act = activity([s for s in main if s.ts >= first.ts], now, tree)
    cores = act.cores
    family = {p: ss for p, ss in (tasks or {}).items() if ss}
    prog = progress(family, first.ts, now, main_tid=last.pid) if family else None
    if prog is not None:
        cores = prog.cores  # the kernel's CPU time: exact, and there after one second
    # Whether it works between the samples, judged over the recent part of the run (as ``activity``
    # is), so a loop that worked at this line and then hung at it is not excused by its past.
    recent_t0 = max(first.ts, now - CPU_WINDOW_S)
    recent_prog = progress(family, recent_t0, now, main_tid=last.pid) if family else None
    # A psutil reading covers the second before it: one just after the stack stopped also covers before.
    cpu_t0 = max(first.ts + CPU_READING_S, now - CPU_WINDOW_S)
    target_cores = tree_cores({last.pid: tree[last.pid]}, last.pid, cpu_t0, now)[0] if last.pid in tree else None
    run_samples = [s for s in main if s.ts >= first.ts]
    between = between_samples(run_samples, last.category, gpu, recent_prog, target_cores)
    psutil_io = None if prog is not None else _psutil_io_bps(tree, recent_t0, now)
    base.update(io_bps=recent_prog.io_bps if recent_prog is not None else psutil_io)
    base.update(held_s=held, held_exact=exact, tree_cores=cores, proc=prog)
    latest_tasks = {p: ss[-1] for p, ss in family.items()}
    # The workers the OS shows, counted as the advisor's worker line counts them (worker_stats),
    # so "k of N workers" and "N loader workers at x % CPU" agree; the stacks may hold fewer.
    main_by_pid: dict[int, list[StackSample]] = {}
    for s in others:
        if s.is_main:
            main_by_pid.setdefault(s.pid, []).append(s)
    running = worker_stats(procs, last.pid, now, stacks=main_by_pid).count if procs else None

    def stuck(reason: str, held_s: float, held_exact: bool, early: bool, confidence: float,
              evidence: list[str]) -> StuckVerdict:
        d = diagnose(last, others, last.pid, gpu, latest_tasks, ranks=ranks, workers_running=running,
                     spin_pids=spin_pids | ({last.pid} if gpu == "spin" else frozenset()))
        fields = dict(base, held_s=held_s, held_exact=held_exact)
        return StuckVerdict(True, reason, early=early, confidence=confidence, evidence=tuple(evidence),
                            diagnosis=d, **fields)

    gpu_note = GPU_NOTES.get(gpu, "GPU activity unknown")
    # Why the job works while the stack stands still (None: nothing says it does): judged at every
    # length of the run, so a hang forming (analysis.hang_forming) is told from a long wait that
    # works before the threshold too.
    why = working(last.category, gpu, act if prog is None else _with_cores(act, prog.cores))
    if why is None and prog is not None and prog.io_bps >= IO_PROGRESS_BPS:
        why = f"its processes move {prog.io_bps / 1e6:.1f} MB/s through read/write"
    if why is None and psutil_io is not None and psutil_io >= IO_PROGRESS_BPS:
        why = f"its processes read and write {psutil_io / 1e6:.1f} MB/s"
    if why is None:
        why = between
    if why == "the GPU is busy" and last.category is Category.HOST_SYNC:
        why = None  # waiting on the GPU for the whole run while it is busy: a kernel that never ends
        gpu_note = "GPU busy"
    base.update(works=why)
    if held >= threshold:
        if why is not None:
            return StuckVerdict(False, f"main thread unchanged for {held:.0f} s but {why}", **base)
        cpu_note = "" if cores is None else f", processes at {cores * 100:.0f} % CPU"
        held_text = f"{'' if exact else '≥ '}{held:.0f} s"
        ev = [f"main thread's stack unchanged for {held_text} ({len([s for s in main if s.ts >= first.ts])} samples)"]
        ev += _proc_lines(prog)
        if gpu == "spin":
            ev.append(SPIN_EVIDENCE)
        return stuck(f"main thread unchanged for {held_text} ({last.category.value}, {gpu_note}{cpu_note})",
                     held, exact, False, 0.9 if exact else 0.8, ev)

    # ------------------------------------------------------------- a hang that starts while watched
    # A main thread still on a GPU that has spun for the whole look-back (a kernel waiting for a
    # peer or a flag, analysis.spin) is not a slow step: a step that computes moves the GPU's SMs.
    # Called after SPIN_STUCK_S rather than the threshold (a collective hang is otherwise a 30 s
    # wait); a rank waiting while another moves is still a straggler (across_ranks).
    if gpu == "spin" and not reaches_start and held >= SPIN_STUCK_S:
        if prog is not None and prog.io_bps >= IO_PROGRESS_BPS:
            return StuckVerdict(False, f"main thread unchanged for {held:.0f} s but its processes move "
                                       f"{prog.io_bps / 1e6:.1f} MB/s through read/write", **base)
        n = len([s for s in main if s.ts >= first.ts])
        ev = [f"main thread's stack unchanged for {held:.0f} s ({n} samples) while its GPU spins", SPIN_EVIDENCE]
        ev += _proc_lines(prog)
        return stuck(f"no progress for {held:.0f} s ({last.category.value}, {gpu_note})", held, True, False,
                     SPIN_CONFIDENCE, ev)

    # ------------------------------------------------------------- while every other rank's GPU spins
    # NCCL waits on the GPU: when every other rank's GPU spins in a collective waiting for a peer
    # and this rank's main thread has stood still for SPIN_STUCK_S, none of them computes, so none
    # arrives. Two ways this rank stands still:
    # - outside any collective, with nothing that says it works (its CPU, its IO, its workers): it is
    #   the rank that never arrives (a held-out job's rank 0 blocked on a dead writer thread's queue
    #   was "weighing" for 20 s, its peer spinning in the all-reduce from the hang's fifth second;
    #   NCCL's counts said the same 7 s later);
    # - in a collective on its host (a gloo group's barrier, a blocking call) the others do not call
    #   (a held-out job's rank 0 alone in a checkpoint barrier under `if rank == 0:`, its peer's GPU
    #   spinning in the step's all-reduce from the hang's second second, was called a straggler for
    #   15 s).
    # A rank that works while they wait is a straggler, the rule's, not this: a straggler's GPU
    # computes or idles; it does not spin.
    peers = [p for p in (ranks or {}) if p != last.pid]
    if peers and not reaches_start and held >= SPIN_STUCK_S and all(p in spin_pids for p in peers):
        in_host_collective = last.category is Category.COLLECTIVE and gpu != "spin"
        elsewhere = (why is None and gpu != "busy"
                     and last.category not in (Category.COLLECTIVE, Category.HOST_SYNC))
        if in_host_collective and prog is not None and prog.io_bps >= IO_PROGRESS_BPS:
            return StuckVerdict(False, f"main thread unchanged for {held:.0f} s but its processes move "
                                       f"{prog.io_bps / 1e6:.1f} MB/s through read/write", **base)
        if in_host_collective or elsewhere:
            n = len([s for s in main if s.ts >= first.ts])
            spinning = f"every other rank's GPU spins in a collective waiting for a peer ({len(peers)} of {len(peers)})"
            if in_host_collective:
                ev = [f"main thread's stack unchanged for {held:.0f} s ({n} samples), in a collective on its host",
                      spinning + ": no rank computes, so none arrives"]
                reason = "while the other ranks wait in a collective on their GPUs"
            else:
                ev = [f"main thread's stack unchanged for {held:.0f} s ({n} samples), outside any collective",
                      spinning]
                reason = "while the other ranks wait for it in a collective"
            ev += _proc_lines(prog)
            return stuck(f"no progress for {held:.0f} s ({last.category.value}) {reason}", held, True, False,
                         SPIN_CONFIDENCE, ev)

    # ------------------------------------------------------------- the verdict at attach
    early = _early(main, first, last, now, threshold, gpu, gpu_idle_s, act, prog, reaches_start, between, psutil_io,
                   asleep=_in_sleep_call(latest_tasks.get(last.pid), last.pid))
    if isinstance(early, str):
        return StuckVerdict(False, early, **base)
    reach, ev = early
    conf = EARLY_CONFIDENCE + (EARLY_CONFIDENCE_MAX - EARLY_CONFIDENCE) * min(1.0, (reach - EARLY_MIN_S) / max(1.0, threshold - EARLY_MIN_S))
    cpu_note = "" if cores is None else f", processes at {cores * 100:.0f} % CPU"
    return stuck(f"no progress for ≥ {reach:.0f} s since before attaching ({last.category.value}, {gpu_note}{cpu_note})",
                 reach, False, True, round(conf, 2), ev)


def _with_cores(act, cores: float):
    from dataclasses import replace

    return replace(act, cores=cores, target_known=True)


def _proc_lines(prog: Progress | None) -> list[str]:
    if prog is None:
        return []
    return [f"/proc over {prog.span_s:.1f} s: the job's processes used {prog.cores * 100:.1f} % of a core, "
            f"{prog.ran} of {prog.threads} threads ran, {prog.io_bps / 1024:.1f} KiB/s through read/write"]


def _early(main: Sequence[StackSample], first: StackSample, last: StackSample, now: float, threshold: float,
           gpu: str, gpu_idle_s: float, act, prog: Progress | None, reaches_start: bool, between: str | None = None,
           psutil_io: float | None = None, asleep: bool = False) -> tuple[float, list[str]] | str:
    """(how long at least, the evidence) when the job was stuck before gputop came; else why not.
    ``between``: why the main thread works between its samples (``between_samples``), if it does;
    ``psutil_io``: the job's bytes/s through storage where /proc's counters are not there."""
    held = now - first.ts
    if not reaches_start:
        return f"main thread moved {held:.0f} s ago"  # it moved while watched: the threshold decides
    if held < EARLY_MIN_S:
        return f"main thread unchanged for {held:.0f} s since attaching"
    code = (last.frames[0].code or "") if last.frames else ""
    if "sleep(" in code and not _sleeps_past(code, threshold):
        return f"main thread sleeps on purpose ({where(last.frames)})"  # a sleep ends by itself
    if not code and asleep:
        # No source to read the line from (`python -c`, a file gone or edited) but the kernel shows
        # the thread in a sleep call: a sleep ends by itself, so the threshold decides, as for a
        # sleep whose line is read (`python -c "time.sleep(60)"` was called stuck 4 s in).
        return f"main thread sleeps ({where(last.frames)}, in the kernel's nanosleep; its source not readable)"
    if gpu == "busy" and last.category is not Category.COLLECTIVE:
        return f"main thread unchanged for {held:.0f} s but the GPU is busy"
    # A thread waiting on a GPU that spins (a collective's kernel waiting for a peer, a kernel that
    # never ends) may itself spin: the CUDA driver yields in a loop while a launch queue stays full
    # or a sync waits (measured: state R, 100 % of a core, sched_yield under cuMemsetD8Async on a
    # hung NCCL rank). Its CPU proves nothing then, as in a collective.
    waits_gpu = last.category is Category.COLLECTIVE or gpu == "spin"
    if prog is not None:
        if prog.span_s < PROC_MIN_SPAN_S:
            return "too few /proc readings yet"
        if not waits_gpu and prog.cores >= TREE_BUSY_CORES:
            return f"main thread unchanged for {held:.0f} s but its processes are at {prog.cores * 100:.0f} % CPU"
        if not waits_gpu and last.category is not Category.HOST_SYNC and (
            prog.main_state == "R" or (prog.main_cores or 0.0) >= MAIN_THREAD_WORKING_CORES
        ):
            # On a host busier than its cores the job's CPU share can fall under TREE_BUSY_CORES
            # while its main thread still computes: a thread blocked in a wait never runs at all.
            return (f"main thread unchanged for {held:.0f} s but it runs "
                    f"({(prog.main_cores or 0.0) * 100:.0f} % of a core, state {prog.main_state or '?'})")
        if prog.io_bps >= IO_PROGRESS_BPS:
            return f"main thread unchanged for {held:.0f} s but its processes move {prog.io_bps / 1e6:.1f} MB/s"
        if between is not None:
            return f"main thread unchanged for {held:.0f} s but {between}"
        proc_reach = prog.span_s
    else:
        # No /proc readings (a replay, another platform): psutil's readings and py-spy's flags.
        if last.category is Category.COLLECTIVE and gpu == "unknown" and (act.cores is None or not act.target_known):
            # A collective's wait with no GPU of the job's seen (gloo) blocks on the CPU: its CPU says
            # whether steps go by (between_samples), and it has not been read yet (an exporter
            # polls every 5 s): a rank waiting for a straggler was called stuck at its first look.
            return "no CPU readings of the job yet (a collective's wait on the CPU)"
        if not waits_gpu and (act.cores is None or not act.target_known):
            return "no CPU readings of the job yet"
        if not waits_gpu and act.cores >= TREE_BUSY_CORES:
            return f"main thread unchanged for {held:.0f} s but its processes are at {act.cores * 100:.0f} % CPU"
        if not waits_gpu and act.main_active is not None and act.main_active > 0:
            return "the main thread was on CPU in some samples"
        if psutil_io is not None and psutil_io >= IO_PROGRESS_BPS:
            return f"main thread unchanged for {held:.0f} s but its processes read and write {psutil_io / 1e6:.1f} MB/s"
        if between is not None:
            return f"main thread unchanged for {held:.0f} s but {between}"
        proc_reach = 0.0
    reach = max(held, proc_reach, gpu_idle_s if gpu == "idle" else 0.0)
    n = len([s for s in main if s.ts >= first.ts])
    ev = [f"main thread's stack identical in all {n} samples since attaching ({held:.1f} s)"]
    if "sleep(" in code:
        ev.append(f"it sleeps in `{code.strip()}`, longer than the stuck threshold ({threshold:.0f} s): no step waits that long")
    ev += _proc_lines(prog)
    if gpu == "idle" and gpu_idle_s > 0:
        ev.append(f"GPU idle for {gpu_idle_s:.0f} s without a break (NVML's buffer reaches back before the attach)")
    if gpu == "spin":
        ev.append(SPIN_EVIDENCE)
    return reach, ev


_SLEEP_LITERAL = re.compile(r"sleep\(\s*([0-9][0-9_]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*\)")


_SLEEP_SYSCALLS = ("clock_nanosleep", "nanosleep")


def _in_sleep_call(task: TaskSample | None, tid: int) -> bool:
    """The thread ``tid`` of the reading is blocked in a sleep syscall (time.sleep's), as /proc's
    syscall or wchan says."""
    if task is None:
        return False
    st = next((t for t in task.threads if t.tid == tid), None)
    if st is None:
        return False
    if st.syscall:  # the syscall says it where it is known; wchan only where it is not
        return st.syscall in _SLEEP_SYSCALLS
    return "nanosleep" in (st.wchan or "")


def _sleeps_past(code: str, threshold: float) -> bool:
    """The line sleeps for a literal number of seconds longer than the stuck threshold
    (``time.sleep(100000)``): no step waits that long, so it is not the sleep of a working loop,
    which ends by itself. A sleep by a name or an expression says nothing and stays exempt (a new
    user's job asleep in `time.sleep(100000)` since before the attach was called stuck only after
    the 30 s threshold, where /proc's flat counters had said so at 4 s)."""
    m = _SLEEP_LITERAL.search(code)
    if m is None:
        return False
    try:
        return float(m.group(1).replace("_", "")) > threshold
    except ValueError:
        return False


SPIN_EVIDENCE = ("GPU 'busy' 100 % with few SMs active and no tensor-core work, power near idle: a kernel spins "
                 "waiting (a NCCL collective for a peer, or a kernel that never ends), it does no work")


def latest_others(samples: Sequence[StackSample], pid: int) -> tuple[StackSample, ...]:
    """Newest sample of every thread but the target's main one: the target's other threads
    from its newest dump, and each worker's threads from that worker's newest dump."""
    newest: dict[int, float] = {}
    for s in samples:
        newest[s.pid] = s.ts
    out = [s for s in samples if s.ts == newest[s.pid] and not (s.pid == pid and s.is_main)]
    out.sort(key=lambda s: (s.pid != pid, s.pid, not s.is_main, s.thread_name))
    return tuple(out)


def rank_works_between(tasks: Mapping[int, Sequence[TaskSample]] | None,
                       procs: Mapping[int, Sequence[ProcSample]] | None, now: float):
    """Whether a rank whose samples (time order) sit at one place works between them, by the
    same evidence and bars as the target's own verdict (``between_samples``): its main thread's
    wakes and CPU from /proc, else its process's CPU (psutil)."""
    def works(pid: int, samples: Sequence[StackSample]) -> bool | None:
        """True: works between its samples; False: it does not (or it waits on its peers or its
        GPU, where its CPU says nothing); None: the OS has not been read over them yet."""
        last = samples[-1]
        if last.category in (Category.COLLECTIVE, Category.HOST_SYNC):
            return False
        recent_t0 = max(samples[0].ts, now - CPU_WINDOW_S)
        mine = {pid: tasks[pid]} if tasks and tasks.get(pid) else {}
        recent = progress(mine, recent_t0, now, main_tid=pid) if mine else None
        cpu_t0 = max(samples[0].ts + CPU_READING_S, now - CPU_WINDOW_S)
        cores = tree_cores({pid: procs[pid]}, pid, cpu_t0, now)[0] if procs and procs.get(pid) else None
        if recent is None and cores is None:
            return None
        return between_samples(samples, last.category, "unknown", recent, cores) is not None
    return works


def _unread_ranks(pid_rank: Mapping[int, int], stacks: Sequence[StackSample], since: float, target: int,
                  between) -> list[int]:
    """The ranks (not ``target``) whose samples since ``since`` sit outside collectives and whose
    OS readings over them have not come yet (``between`` answers None)."""
    by_pid: dict[int, list[StackSample]] = {}
    for s in stacks:
        if s.is_main and s.pid in pid_rank and s.pid != target and s.ts >= since:
            by_pid.setdefault(s.pid, []).append(s)
    out = []
    for p, ss in by_pid.items():
        ss.sort(key=lambda s: s.ts)
        if between(p, ss) is None:
            out.append(pid_rank[p])
    return sorted(out)


def across_ranks(v: StuckVerdict, pid_rank: Mapping[int, int], stacks: Sequence[StackSample],
                 target: int, spin_pids: frozenset[int] = frozenset(),
                 nccl: Sequence[CommVerdict] = (), tasks: Mapping[int, Sequence[TaskSample]] | None = None,
                 procs: Mapping[int, Sequence[ProcSample]] | None = None,
                 now: float | None = None) -> StuckVerdict:
    """A multi-rank job's verdict seen across its ranks: a rank waiting in a collective while
    another rank works is not stuck; each step it waits again, for a straggler (the rank-straggler
    rule's case). ``stacks``: every sampled process's stacks, reaching back to ``v.since``.
    ``nccl``: NCCL's RAS verdicts. A rank whose collective count has stood still while the others
    are ahead (HANG) is not working towards the next step however its stacks move: a loop in its
    own code that never returns (a livelock) looks busy to the sampler, and only the counts tell
    it from a slow step. ``tasks``/``procs`` (with ``now``): the OS's view of the ranks, so a
    straggler asleep in its own code in every one of its sparse samples still counts as moving
    when it works between them."""
    # The target's own wait decides, not only the diagnosis's kind: its main thread in a collective
    # waits for its peers, whichever kind the parties' states made of the hang.
    in_collective = v.category is Category.COLLECTIVE or (v.diagnosis is not None and v.diagnosis.kind == COLLECTIVE)
    if not (v.stuck and pid_rank and v.since and in_collective):
        return v
    between = rank_works_between(tasks, procs, now) if now is not None and (tasks or procs) else None
    moving = moving_ranks(pid_rank, stacks, v.since, target, spin_pids,
                          works_between=(lambda p, ss: between(p, ss) is True) if between else None)
    frozen = {r.rank for c in nccl if c.verdict == HANG for r in c.ranks}
    if v.early and between is not None and not moving:
        # At attach, a rank outside any collective whose samples sit in its own code and whose OS
        # readings have not come yet (an exporter polls every 5 s) is not known to stand still:
        # the target waiting for it is weighed until it is read, not called stuck on its own wait.
        unread = _unread_ranks(pid_rank, stacks, v.since, target, between)
        if unread:
            return replace(v, stuck=False, reason=f"main thread waits in a collective; rank {unread[0]} is outside it "
                           "and not read by the OS yet: a straggler or a hang, weighed", early=False, confidence=0.0,
                           evidence=(), diagnosis=None)
    if not moving or all(r in frozen for r in moving):
        if moving:
            # The communicator that names a moving rank as the one behind (there may be several).
            c = next(c for c in nccl if c.verdict == HANG and any(r.rank in moving for r in c.ranks))
            return replace(v, evidence=v.evidence + (
                f"rank {', '.join(str(r) for r in moving)} moves but launches no collective: {c.detail} "
                "(NCCL RAS): busy in its own code, it never arrives",))
        return v
    return replace(v, stuck=False, reason=f"main thread waits in a collective while rank {moving[0]} moves: "
                   "a straggler, not a hang", early=False, confidence=0.0, evidence=(), diagnosis=None)


def family_tasks(tasks: Mapping[int, Sequence[TaskSample]], pid: int) -> dict[int, Sequence[TaskSample]]:
    """The /proc readings of ``pid`` and its descendants."""
    parent = {p: ss[-1].ppid for p, ss in tasks.items() if ss}
    out = {}
    for p, ss in tasks.items():
        q, seen = p, set()
        while q is not None and q not in seen:
            if q == pid:
                out[p] = ss
                break
            seen.add(q)
            q = parent.get(q)
    return out
