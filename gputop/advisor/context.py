"""Everything the rules read, from one evidence window (analysis.window) per evaluation.

The window is the only reader of the store; ``context_of`` lays its evidence out for the rules,
which see a frozen ``AnalysisContext`` and nothing else, so they are tested with contexts built
from synthetic timelines (``context_from_samples``) exactly as they run live or on a replay.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence, TypeVar

from ..analysis import GilHolder, MemoryView
from ..analysis import (
    DEFAULT_STUCK_AFTER_S,
    DEFAULT_WINDOW_S,  # the findings' window, the panes' too: defined once, beside the window
    CommVerdict,
    Forming,
    FrameworkSeen,
    ForwardComm,
    GpuView,
    HostLoad,
    JobWindow,
    LinkTraffic,
    ProcStats,
    RankView,
    Recompute,
    StepModel,
    StuckVerdict,
    WORKER_LOOP_FRAME,
    Workers,
    compiling,
    framework_of,
    holds_no_gpu,
    host_load,
    importing_at,
    proc_stats,
    ras_verdicts,
    read_window,
    stack_label,
)
from ..model import (
    Category,
    Event,
    GpuInfo,
    GpuProcess,
    GpuSample,
    HostSample,
    ProcSample,
    StackSample,
    SystemInfo,
    TaskSample,
    UtilPoint,
)

# torch's pin-memory thread runs this function; its presence says pin_memory=True.
PIN_MEMORY_FRAME = "_pin_memory_loop"

V = TypeVar("V")


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
    forming: Forming | None = None  # a hang forming: the main thread still, not yet stuck
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
    # Activation checkpointing: the job's processes' instants spent recomputing a checkpointed
    # forward inside backward (analysis.recompute), and which API checkpoints.
    recompute: Recompute = Recompute()
    # Collectives inside the model's forward on the ranks (analysis.forward_comm): tensor parallelism.
    forward_comm: ForwardComm = ForwardComm()
    # Each GPU's link traffic over the window (NVLink, PCIe each way), by index: every GPU's, for
    # the ranks' GPUs that are not the target's.
    links: Mapping[int, LinkTraffic] = field(default_factory=dict)
    # Per process of the job (the target, or each rank), a thread of its own holding the GIL while
    # its main thread waits (analysis.gil_holder): pid -> the holder.
    gil_holders: Mapping[int, GilHolder] = field(default_factory=dict)
    # Verdicts several rules read, each worked out by the first rule that asks (``once``) and kept
    # for the rest of this evaluation; a context made from this one (``replace``) starts empty.
    _once: dict[Callable[["AnalysisContext"], object], object] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def once(self, judge: Callable[["AnalysisContext"], V]) -> V:
        """``judge(self)``, worked out the first time a rule asks in this context and kept: for a
        verdict several rules read with the same bars (the rank straggler: the straggler rule, and
        the communication-bound and by-hand-sync rules that leave a straggler to it), whose bars
        live beside the rules (a rules module names them; the context cannot import it)."""
        if judge not in self._once:
            self._once[judge] = judge(self)
        return self._once[judge]  # type: ignore[return-value]

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


def context_of(w: JobWindow) -> AnalysisContext:
    """The rules' view of one evidence window: each field is a piece of the window's evidence
    (computed there once a tick, shared with the stuck watch and the panes) or read from it here.
    A new piece of evidence for a rule is a property of the window and one line below."""
    target_pid = w.target_pid
    target_window = w.target_procs
    others = [s for s in w.stacks if s.pid == target_pid and not s.is_main and s.ts >= w.t0]
    pin = any(any(f.name.endswith(PIN_MEMORY_FRAME) for f in s.frames) for s in others) if others else None
    return AnalysisContext(
        now=w.now,
        t0=w.win_t0,
        t1=w.now,
        gpus=w.gpus,
        host=host_load(w.host, w.cores) if w.host else None,
        target_pid=target_pid,
        target=proc_stats(target_window) if target_window else None,
        env=dict(_latest_env(target_window)),
        workers=w.workers,
        main_stacks=tuple(w.main),
        worker_stacks=tuple(s for s in w.worker_history if s.ts >= w.t0),
        pin_memory_thread=pin,
        gil_holders=w.gil_holders,
        stuck=w.stuck,
        forming=w.forming,
        # The history, not w.main: the window's main-thread evidence starts after the imports.
        warmup=warming_up(w.now, target_window, w.main_history, w.worker_history),
        system=w.system,
        events=w.events,
        stuck_after_s=w.stuck_after_s,
        window_s=w.window_s,
        ranks=w.rank_views,
        framework=framework_of(w.main),
        job_tasks=w.job_tasks,
        nccl=w.nccl,
        step=w.step,
        links=w.links,
        memory=w.memory,
        recompute=w.recompute,
        forward_comm=w.forward_comm,
    )


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
    """The context from plain samples (tests, the report): a window of them, then ``context_of``.

    ``stacks`` may reach further back than the window (the stuck verdict looks back
    ``stuck_after_s``); everything else is cut to the window there.
    """
    procs = procs or {}
    return context_of(JobWindow(
        now=now, window_s=window_s, stuck_after_s=stuck_after_s, named_target=target_pid,
        gpu_info=dict(gpu_info or {}), gpu_polls=dict(gpu_samples or {}), util_points=dict(util_points or {}),
        gpu_processes=tuple(gpu_processes), host_polls=tuple(host), proc_history=dict(procs),
        raw_stacks=tuple(stacks), system=system, all_events=tuple(events), tasks=dict(tasks or {}),
        procs_latest={pid: ss[-1] for pid, ss in procs.items() if ss},
    ))


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
    started = any(f.name.endswith(WORKER_LOOP_FRAME) for f in s.frames)
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
    if target and target[-1].status in ("exited", "zombie"):
        return None  # a job that has ended warms up no more (its age would count on for ever)
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
        # "First steps" only where the stacks show a Python job at all: a target whose stacks are
        # not read (not Python, or not yet) is young, and no more is known (a report of a `sleep`
        # said "warming up: first steps").
        return f"the job started {age:.0f} s ago" + (" (first steps)" if main else "")
    return None


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
    """The context for the window ending at the store's clock (a window of its own)."""
    return context_of(read_window(store, target_pid, stuck_after_s, window_s, now))
