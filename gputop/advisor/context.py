"""Everything the rules read, computed once per evaluation from one window of the store.

``build_context`` is the only place that queries the store; the rules see a frozen
``AnalysisContext`` and nothing else, so they are tested with contexts built from synthetic
timelines (``context_from_samples``) exactly as they run live or on a replay.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from ..analysis import importing_at
from ..analysis import CPU_DEVICE, STACK_JOIN_S, Breakdown, attribute, stack_label, stack_slices
from ..analysis import (
    GpuEfficiency,
    HostLoad,
    ProcStats,
    Workers,
    gpu_efficiency,
    host_load,
    is_worker,
    proc_stats,
    worker_stats,
)
from ..analysis import FrameworkSeen, framework_of
from ..analysis import Slice, idle_intervals, poll_slices, util_slices
from ..analysis import RankView, as_ranks, rank_map, rank_views
from ..analysis import CommVerdict, ras_verdicts
from ..analysis import spin_share
from ..analysis import MEMORY_WINDOW_S, MemoryView, exit_cause, exit_status_of, leak_lines, memory_view
from ..analysis import StepModel, compiling, step_model
from ..analysis import (
    DEFAULT_STUCK_AFTER_S,
    GPU_IDLE_PCT,
    GPU_IDLE_WINDOW_S,
    LOOKBACK_EXTRA_S,
    StuckVerdict,
    across_ranks,
    family_tasks,
    idle_reach,
    judge,
    latest_others,
    spinning_pids,
)
from ..model import (
    Category,
    Event,
    GpuInfo,
    GpuProcess,
    GpuSample,
    HostSample,
    IdleInterval,
    ProcSample,
    StackSample,
    SystemInfo,
    TaskSample,
    UtilPoint,
)

# The findings speak of the last minute: long enough for periodic stalls (a checkpoint a minute)
# to show, short enough that a fix shows within a minute. The one default every command uses.
DEFAULT_WINDOW_S = 60.0
# torch's pin-memory thread runs this function; its presence says pin_memory=True.
PIN_MEMORY_FRAME = "_pin_memory_loop"


@dataclass(frozen=True)
class GpuView:
    index: int  # CPU_DEVICE (-1): no GPU, the training thread stands in for the device
    info: GpuInfo | None
    breakdown: Breakdown
    efficiency: GpuEfficiency
    idle: tuple[IdleInterval, ...]
    slices: tuple[Slice, ...]
    processes: tuple[GpuProcess, ...]
    used_by_target: bool  # NVML lists the target (or a worker) on this GPU
    # The share of the window the GPU was 'busy' spinning (analysis.spin): a kernel waiting for a
    # peer or a flag, not work. Its few active SMs say nothing of kernel size or precision.
    spin: float = 0.0

    @property
    def name(self) -> str:
        return "CPU" if self.index == CPU_DEVICE else f"GPU {self.index}"


@dataclass(frozen=True)
class ThreadUse:
    """One thread of the job (the target or a child) over the window, from /proc readings."""

    pid: int
    tid: int
    name: str
    cpu: float  # CPU time it used over the readings' span, as a share of one core
    runnable: float  # share of its readings in state R (on a CPU or waiting for one)
    readings: int


def thread_use(tasks: Mapping[int, Sequence[TaskSample]], t0: float) -> tuple[ThreadUse, ...]:
    """Per thread of ``tasks`` (pid -> readings), its CPU use and runnable share since ``t0``;
    threads read fewer than twice are left out (one reading has no CPU-time growth)."""
    out: list[ThreadUse] = []
    for pid, samples in tasks.items():
        seen: dict[int, list] = {}
        for s in samples:
            if s.ts < t0:
                continue
            for th in s.threads:
                seen.setdefault(th.tid, []).append((s.ts, th))
        for tid, xs in seen.items():
            if len(xs) < 2:
                continue
            (ta, a), (tb, b) = xs[0], xs[-1]
            if a.cpu_ns is None or b.cpu_ns is None or tb <= ta:
                continue
            cpu = max(0.0, (b.cpu_ns - a.cpu_ns) / 1e9 / (tb - ta))
            runnable = sum(1 for _, th in xs if th.state == "R") / len(xs)
            out.append(ThreadUse(pid, tid, b.name, cpu, runnable, len(xs)))
    return tuple(out)


@dataclass(frozen=True)
class AnalysisContext:
    now: float
    t0: float  # start of the time the breakdowns cover
    t1: float
    gpus: tuple[GpuView, ...]  # the job's devices
    host: HostLoad | None = None
    target_pid: int | None = None
    target: ProcStats | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    workers: Workers = field(default_factory=Workers)
    main_stacks: tuple[StackSample, ...] = ()  # the target's main thread, in time order
    worker_stacks: tuple[StackSample, ...] = ()  # the workers' main threads
    pin_memory_thread: bool | None = None  # None: no stacks of the other threads to tell
    stuck: StuckVerdict | None = None
    warmup: str | None = None  # what the job is warming up on (see warming_up); None: steady
    system: SystemInfo | None = None
    events: tuple[Event, ...] = ()
    stuck_after_s: float = DEFAULT_STUCK_AFTER_S
    window_s: float = DEFAULT_WINDOW_S
    ranks: tuple[RankView, ...] = ()  # a multi-rank job's local ranks, each from its own stacks
    # The framework the main thread's stacks show and the precision they say it trains in, read
    # once per evaluation for every rule that writes a framework's knob or weighs precision.
    framework: FrameworkSeen = FrameworkSeen(None, None)
    # The job's /proc thread readings (target and children: pid -> readings), which ``threads``
    # reads; empty without them (not Linux, a recording without them).
    job_tasks: Mapping[int, Sequence[TaskSample]] = field(default_factory=dict, repr=False)
    # What NCCL's RAS service says of the job's communicators (analysis.nccl_ras), when it answers.
    nccl: tuple[CommVerdict, ...] = ()
    # The training step as the main thread's samples in the window show it (analysis.step).
    step: StepModel = StepModel(0, None, (), ())
    # The job's memory over the last minutes (analysis.memory_view): growth, forecast, leak lines
    # and, once the target has exited, what likely ended it. None: not worked out (a context
    # built from samples alone).
    memory: MemoryView | None = None

    @functools.cached_property
    def threads(self) -> tuple[ThreadUse, ...]:
        """The job's threads over the window (CPU and runnable shares), worked out when a rule
        first asks: a job with 600 threads has ~36,000 readings a minute, the largest pass in the
        context, and most evaluations never need it."""
        return thread_use(self.job_tasks, self.t0)

    @property
    def cores(self) -> int | None:
        if self.host is not None:
            return self.host.cores
        return self.system.cpu_count if self.system else None

    def main_shares(self) -> dict[Category, float]:
        """Share of the main thread's samples per category."""
        if not self.main_stacks:
            return {}
        c = Counter(s.category for s in self.main_stacks)
        return {k: v / len(self.main_stacks) for k, v in c.items()}

    def main_labels(self, categories: Iterable[Category], n: int = 2) -> list[tuple[str, float]]:
        """The commonest places the main thread was in ``categories``: (label, share of all)."""
        cats = set(categories)
        if not self.main_stacks:
            return []
        c = Counter(stack_label(s) for s in self.main_stacks if s.category in cats)
        total = len(self.main_stacks)
        return [(lab, k / total) for lab, k in c.most_common(n)]


def holds_no_gpu(target_pid: int | None, family: set[int], pid_rank: Mapping[int, object],
                 gpu_processes: Sequence[GpuProcess], procs: Mapping[int, Sequence[ProcSample]],
                 main: Sequence[StackSample]) -> bool:
    """Whether the attached job demonstrably uses none of the GPUs: NVML lists processes on
    them, read since the job's stacks began (the list is read every few seconds), and every one
    of them is a process this machine's /proc shows (the same PID namespace: from another one
    no PID would match, and the job's GPUs cannot be told), none of them the job's own (itself,
    its workers, its ranks, or a child of it: a launcher's ranks). Then the GPUs' idle time is
    someone else's, and the job's stacks would explain it wrongly."""
    if target_pid is None or not main or not gpu_processes:
        return False
    if max(p.ts for p in gpu_processes) < main[0].ts:
        return False
    for pid in {p.pid for p in gpu_processes}:
        seen = procs.get(pid)
        if not seen or pid in family or pid in pid_rank or seen[-1].ppid == target_pid:
            return False
    return True


def context_from_samples(
    *,
    now: float,
    window_s: float = DEFAULT_WINDOW_S,
    gpu_info: Mapping[int, GpuInfo] | None = None,
    gpu_samples: Mapping[int, Sequence[GpuSample]] | None = None,
    util_points: Mapping[int, Sequence[UtilPoint]] | None = None,
    gpu_processes: Sequence[GpuProcess] = (),
    host: Sequence[HostSample] = (),
    procs: Mapping[int, Sequence[ProcSample]] | None = None,
    stacks: Sequence[StackSample] = (),
    target_pid: int | None = None,
    system: SystemInfo | None = None,
    events: Sequence[Event] = (),
    stuck_after_s: float = DEFAULT_STUCK_AFTER_S,
    tasks: Mapping[int, Sequence[TaskSample]] | None = None,
) -> AnalysisContext:
    """The pure core of ``build_context``: everything from plain samples.

    ``stacks`` may reach further back than the window (the stuck verdict looks back
    ``stuck_after_s``); everything else is cut to the window here.
    """
    gpu_info = dict(gpu_info or {})
    gpu_samples = dict(gpu_samples or {})
    util_points = dict(util_points or {})
    procs = {pid: [s for s in ss if s.ts >= now - window_s] for pid, ss in (procs or {}).items()}
    t0 = now - window_s

    # A multi-rank job's ranks are judged as ranks (a CPU rank off the CPU in backward waits in
    # DDP's gradient all-reduce): the target's breakdown, the ranks' views and the stuck verdict
    # all read these stacks.
    pid_rank = rank_map(events)
    stacks = as_ranks(stacks, pid_rank, gpu_processes, bool(gpu_info or gpu_samples or util_points))
    if target_pid is None:
        target_pid = next((pid for pid, ss in procs.items() if ss and ss[-1].role == "target"), None)
    all_main = sorted((s for s in stacks if s.is_main), key=lambda s: s.ts)
    if target_pid is None and all_main:
        # No target named: the process sampled most is the one being watched.
        target_pid = Counter(s.pid for s in all_main).most_common(1)[0][0]
    family = {target_pid} if target_pid is not None else set()
    # A child is a worker by its name or its worker loop, not by being a child.
    stacks_by_pid: dict[int, list[StackSample]] = {}
    for s in stacks:
        if s.is_main:
            stacks_by_pid.setdefault(s.pid, []).append(s)
    family |= {pid for pid, ss in procs.items() if ss and is_worker(ss[-1], target_pid, stacks_by_pid.get(pid, ()))}
    main_history = [s for s in all_main if s.pid == target_pid]
    main = [s for s in main_history if s.ts >= t0]
    # Idle time before the stack sampler attached cannot be attributed: with stacks, the
    # breakdown starts at the first sample (one join distance early).
    win_t0 = max(t0, main[0].ts - STACK_JOIN_S) if main else t0

    host_samples = [h for h in host if h.ts >= t0]
    cores = (system.cpu_count if system and system.cpu_count else None) or (
        len(host_samples[-1].cores) if host_samples and host_samples[-1].cores else None
    )
    job_procs = [s for pid in family for s in procs.get(pid, ())]

    # Which GPUs are the job's: those NVML lists the target on; failing that (no target, another
    # PID namespace, a fake GPU) those with any process, or any activity in the window.
    gpu_idx = sorted(set(gpu_info) | set(gpu_samples) | set(util_points))
    samples_by = {i: [s for s in gpu_samples.get(i, ()) if s.ts >= t0] for i in gpu_idx}
    slices_by = {
        i: (util_slices(util_points[i], win_t0, now) if util_points.get(i) else poll_slices(samples_by[i], win_t0, now))
        for i in gpu_idx
    }
    target_gpus = {p.gpu_index for p in gpu_processes if p.pid in family}
    if holds_no_gpu(target_pid, family, pid_rank, gpu_processes, procs, main):
        # Other people's GPUs: their idle time is not this job's to explain, and its stacks
        # are not theirs. The job is judged on its own time line (the CPU device, below).
        job_gpus: set[int] = set()
    else:
        job_gpus = (
            target_gpus
            or {p.gpu_index for p in gpu_processes}
            or {i for i in gpu_idx if any(s.util > 0 for s in slices_by[i])}
        )

    views: list[GpuView] = []
    for i in gpu_idx:
        if i not in job_gpus:
            continue
        bd = attribute(i, slices_by[i], main, host=host_samples, gpu_samples=samples_by[i], procs=job_procs, cores=cores)
        views.append(
            GpuView(
                index=i,
                info=gpu_info.get(i),
                breakdown=bd,
                efficiency=gpu_efficiency(i, samples_by[i], gpu_info.get(i)),
                idle=tuple(idle_intervals(slices_by[i])),
                slices=tuple(slices_by[i]),
                processes=tuple(p for p in gpu_processes if p.gpu_index == i),
                used_by_target=i in target_gpus,
                spin=spin_share(samples_by[i], win_t0, now),
            )
        )
    if not views and main:
        # No GPU at work: the training thread's own time line is the device.
        sl = stack_slices(main, win_t0, now)
        views.append(
            GpuView(
                index=CPU_DEVICE,
                info=None,
                breakdown=attribute(CPU_DEVICE, sl, main, host=host_samples, procs=job_procs, cores=cores),
                efficiency=gpu_efficiency(CPU_DEVICE, []),
                idle=tuple(idle_intervals(sl)),
                slices=tuple(sl),
                processes=(),
                used_by_target=False,
            )
        )

    target_window = procs.get(target_pid, []) if target_pid is not None else []
    others = [s for s in stacks if s.pid == target_pid and not s.is_main and s.ts >= t0]
    pin = None
    if others:
        pin = any(any(f.name.endswith(PIN_MEMORY_FRAME) for f in s.frames) for s in others)
    stuck = None
    if target_pid is not None and main_history:
        gpu_views = [v for v in views if v.index != CPU_DEVICE]
        # NVML's buffer reaches back before the attach: how long the job's GPUs have been idle.
        reaches = [idle_reach([(p.ts, p.util) for p in util_points.get(v.index, ())]
                              or [(g.ts, g.util_gpu) for g in samples_by[v.index] if g.util_gpu is not None], now)
                   for v in gpu_views]
        spin_pids = spinning_pids(list(pid_rank) or [target_pid], gpu_processes, samples_by, util_points, now)
        gpu = "spin" if target_pid in spin_pids else _gpu_state(gpu_views, now)
        stuck = judge(
            main_history,
            now,
            stuck_after_s,
            gpu=gpu,
            others=latest_others([s for s in stacks if s.ts >= now - stuck_after_s - LOOKBACK_EXTRA_S], target_pid),
            history_start=now - stuck_after_s - LOOKBACK_EXTRA_S,
            exited=bool(target_window) and target_window[-1].status in ("exited", "zombie"),
            procs=procs,
            tasks=family_tasks(tasks or {}, target_pid),
            gpu_idle_s=min(reaches) if reaches else 0.0,
            ranks=pid_rank or None,
            spin_pids=spin_pids,
        )
        # The decision the stuck watch makes too: a rank waiting while another works is a straggler.
        stuck = across_ranks(stuck, pid_rank, stacks, target_pid, spin_pids)
    return AnalysisContext(
        now=now,
        t0=win_t0,
        t1=now,
        gpus=tuple(views),
        host=host_load(host_samples, cores) if host_samples else None,
        target_pid=target_pid,
        target=proc_stats(target_window) if target_window else None,
        env=dict(_latest_env(target_window)),
        workers=worker_stats(procs, target_pid, now, stacks=stacks_by_pid),
        main_stacks=tuple(main),
        worker_stacks=tuple(s for s in stacks if s.is_main and s.pid in family and s.pid != target_pid and s.ts >= t0),
        pin_memory_thread=pin,
        stuck=stuck,
        warmup=warming_up(now, target_window, main, [s for s in stacks if s.is_main and s.pid in family and s.pid != target_pid]),
        system=system,
        events=tuple(e for e in events if e.ts >= t0),
        stuck_after_s=stuck_after_s,
        window_s=window_s,
        ranks=rank_views(pid_rank, stacks, t0, gpu_processes, procs, gpu_samples=samples_by, t1=now) if pid_rank else (),
        framework=framework_of(main),
        job_tasks=family_tasks(tasks or {}, target_pid) if target_pid is not None else {},
        nccl=ras_verdicts(events, now) if pid_rank else (),
        step=step_model(main),
    )


# --------------------------------------------------------------------------- warm-up

# A job this young (its process's create_time) is warming up whatever its stacks say: the first
# steps after imports allocate, initialise CUDA and tune kernels (cuDNN benchmark). Judgement:
# importing torch takes 2-5 s, 15 s on a loaded 2-core machine (measured on the test box for the
# CPU dataloader-starved workload: ready at 14.9 s), and the import itself shows in the stacks.
WARMUP_AGE_S = 10.0
# The main thread's (or the workers') stacks of the last few seconds in import machinery, a
# torch.compile compilation or DataLoader worker start-up in at least this share: warming up,
# at any age up to WARMUP_MAX_AGE_S. Judgement: 5 s is 25 samples at the sampler's 5 Hz; half
# of them, so one lazy import mid-run does not hold the findings.
WARMUP_RECENT_S = 5.0
WARMUP_SHARE = 0.5
# Past this age a job is not warming up, whatever it compiles: a recompile at every step (dynamic
# shapes) is a cost to report. Judgement: compiling a large model takes minutes.
WARMUP_MAX_AGE_S = 600.0

_WORKER_LOOP = "_worker_loop"  # torch/utils/data/_utils/worker.py
_SPAWN_FILES = ("multiprocessing/popen_fork.py", "multiprocessing/popen_spawn_posix.py",
                "multiprocessing/popen_forkserver.py")
# An import is warm-up only when it is near the top of the stack (analysis.classify.importing_at).


def warmup_of(s: StackSample) -> str | None:
    """What warm-up work one stack sample shows, if any: by what runs. Importing a compiler's
    modules is importing, not compiling (the first optimizer step imports ``torch._dynamo`` in
    jobs that never compile): compiling is dynamo's or inductor's functions running, below any
    import."""
    names = [f.filename.replace("\\", "/") for f in s.frames]
    imp = importing_at(s.frames)
    if compiling(s.frames):
        return "compiling (torch.compile)"
    # A forked worker keeps its parent's frames below its own, the fork and the loader's
    # __init__ among them, for as long as it lives: once it runs its worker loop it has started.
    started = any(f.name.endswith(_WORKER_LOOP) for f in s.frames)
    if not started and (any(n.endswith(c) for n in names for c in _SPAWN_FILES) or any(
        f.name.endswith("_MultiProcessingDataLoaderIter.__init__") for f in s.frames
    )):
        return "starting DataLoader workers"
    if imp is not None:
        return "importing modules"
    return None


def warming_up(now: float, target: Sequence[ProcSample], main: Sequence[StackSample],
               workers: Sequence[StackSample]) -> str | None:
    """What the job is warming up on ("compiling (torch.compile)", "started 3 s ago"), or None
    once it runs steadily. Throughput findings wait for it (advisor.engine)."""
    born = next((p.create_time for p in reversed(target) if p.create_time), None)
    age = None if born is None else now - born
    if age is not None and age > WARMUP_MAX_AGE_S:
        return None
    for who, xs in (("", main), ("workers ", workers)):
        recent = [s for s in xs if s.ts >= now - WARMUP_RECENT_S]
        kinds = Counter(k for k in map(warmup_of, recent) if k)
        if recent and sum(kinds.values()) / len(recent) >= WARMUP_SHARE:
            what = kinds.most_common(1)[0][0]
            return (f"DataLoader workers {what}" if who else what) + (f", job {age:.0f} s old" if age is not None else "")
    if age is not None and age < WARMUP_AGE_S:
        return f"the job started {age:.0f} s ago (first steps)"
    return None


def _gpu_state(views: Sequence[GpuView], now: float) -> str:
    """'busy', 'idle' or 'unknown' over the last few seconds of the job's GPUs (the stuck
    verdict's input, from the same slices as the breakdown)."""
    utils = [s.util for v in views for s in v.slices if s.end >= now - GPU_IDLE_WINDOW_S]
    if not utils:
        return "unknown"
    return "busy" if max(utils) > GPU_IDLE_PCT else "idle"


def _latest_env(samples: Sequence[ProcSample]) -> tuple[tuple[str, str], ...]:
    for s in reversed(samples):
        if s.env:
            return s.env
    return ()


def build_context(
    store,
    window_s: float = DEFAULT_WINDOW_S,
    target_pid: int | None = None,
    stuck_after_s: float = DEFAULT_STUCK_AFTER_S,
    now: float | None = None,
) -> AnalysisContext:
    """The context for the window ending at the store's clock."""
    now = store.now if now is None else now
    t0 = now - window_s
    indices = store.gpu_indices()
    ctx = context_from_samples(
        now=now,
        window_s=window_s,
        gpu_info=dict(store.gpu_info),
        gpu_samples={i: store.gpu_window(i, t0, now) for i in indices},
        # one extra second: the first point's period reaches back before the window
        util_points={i: store.util_window(i, t0 - 1.0, now) for i in indices},
        gpu_processes=store.gpu_processes(),
        host=store.host_window(t0, now),
        procs={pid: store.proc_window(pid, t0, now) for pid in store.procs_latest()},
        stacks=store.stack_window(min(t0, now - stuck_after_s - LOOKBACK_EXTRA_S), now),
        target_pid=target_pid,
        system=store.system,
        events=store.events(),
        stuck_after_s=stuck_after_s,
        tasks=store.task_windows(min(t0, now - stuck_after_s - LOOKBACK_EXTRA_S), now),
    )
    return replace(ctx, memory=memory_of(store, ctx))


def memory_of(store, ctx: AnalysisContext) -> MemoryView | None:
    """The job's memory over ``MEMORY_WINDOW_S`` (longer than the findings' window: a forecast
    needs minutes), its leak lines and, once the target has exited, the likely cause."""
    if ctx.target_pid is None:
        return None
    now, t0 = ctx.now, ctx.now - MEMORY_WINDOW_S
    workers = {w.pid for w in ctx.workers.current}
    family = {ctx.target_pid} | workers
    listed = store.gpu_process_window(family, t0, now)
    # The job's GPUs now, and those NVML listed it on before (after an exit, the only record).
    gpus = sorted({g.index for g in ctx.gpus if g.index != CPU_DEVICE} | {p.gpu_index for p in listed})
    samples = {i: store.gpu_window(i, t0, now) for i in gpus}
    host = store.host_window(t0, now)
    view = memory_view(gpus, samples, listed, host,
                       {pid: store.proc_window(pid, t0, now) for pid in workers}, family, workers,
                       dict(store.gpu_info))
    exited = [s for s in store.proc_window(ctx.target_pid, t0, now) if s.status in ("exited", "zombie")]
    cause = None
    if exited:
        said = [e.message for e in ctx.events if e.source == "stacks" and f"PID {ctx.target_pid} exited" in e.message]
        cause = exit_cause(exited[0].ts, exit_status_of(said[-1]) if said else None, samples, host, gpus)
    return replace(view, leaks=leak_lines(ctx.main_stacks), exit_cause=cause)
