"""One evidence window: everything the analysis of one instant reads, read from the store once.

The advisor's context, the stuck watch's events and the Stacks and Ranks panes' views used to
query the store each on their own every second and rebuild the same evidence (the rank map, the
ranks' stacks, the target's main stacks, the stuck verdict) up to four times a tick, the stuck
verdict from two different sets of inputs. ``read_window`` is the one place in analysis that
queries the store; a ``JobWindow`` holds what it read and works out each piece of evidence the
first time someone asks for it (a cached property), so every reader of one tick sees the same
pieces, computed once. A new piece of evidence is one more property here.
"""

from __future__ import annotations

import functools
import statistics
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Mapping, Sequence

from ..model import Event, GpuInfo, GpuProcess, GpuSample, HostSample, IdleInterval, ProcSample, StackSample, SystemInfo, TaskSample, UtilPoint
from .classify import importing_at
from .breakdown import CPU_DEVICE, STACK_JOIN_S, Breakdown, attribute, stack_slices
from .efficiency import GpuEfficiency, Workers, gpu_efficiency, is_worker, parents_of, worker_stats
from .memory_cause import exit_cause, exit_status_of, leak_lines
from .memory_window import MEMORY_WINDOW_S, MemoryView, memory_view
from .nccl_ras import CommVerdict, ras_verdicts
from .idle import Slice, idle_intervals, poll_slices, util_slices
from .ranks import JobView, RankView, as_ranks, job_view_of, rank_map, rank_views
from .recompute import Recompute, recompute_of
from .forward_comm import ForwardComm, forward_comm_of
from .spin import is_spin, spin_share
from .step import StepModel, compiling, step_model, training_since
from .stacks_summary import StacksView, stacks_view_of
from .gil_holder import GilHolder, gil_holder_of
from .hang_forming import Forming, hang_forming
from .stuck import (
    DEFAULT_STUCK_AFTER_S, GPU_IDLE_PCT, GPU_IDLE_WINDOW_S, LOOKBACK_EXTRA_S, StuckVerdict, across_ranks,
    family_tasks, idle_reach, judge, latest_others, spinning_pids, unchanged_run,
)
from .threshold import JUDGEMENT, IntThreshold, Threshold

if TYPE_CHECKING:
    from ..store import Store

# The window the findings and the panes speak of: the last minute, long enough for periodic stalls
# (a checkpoint a minute) to show and for a few hundred stack samples at 5 Hz, short enough that a
# fix or a change of phase (eval, checkpoint) shows within a minute. The one default every command,
# the advisor and the Stacks pane use.
DEFAULT_WINDOW_S = Threshold(
    60.0, "s", JUDGEMENT,
    "The window the findings and the panes speak of: long enough for a checkpoint a minute to show and for a few "
    "hundred stack samples, short enough that a fix or a change of phase shows within a minute.")


@dataclass(frozen=True)
class GpuView:
    """One of the job's devices over the window."""

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
class LinkTraffic:
    """A GPU's link traffic over the window: medians of the polls that read it (robust to a
    checkpoint's burst). None: not read."""

    nvlink_bps: float | None  # sent and received together; read only on a GPU with NVLinks up
    pcie_tx_bps: float | None
    pcie_rx_bps: float | None
    polls: int  # polls that read NVLink


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def link_traffic(samples: Sequence[GpuSample]) -> LinkTraffic:
    nvl = [s.nvlink_tx_bps + s.nvlink_rx_bps for s in samples
           if s.nvlink_tx_bps is not None and s.nvlink_rx_bps is not None]
    return LinkTraffic(_median(nvl), _median([s.pcie_tx_bps for s in samples if s.pcie_tx_bps is not None]),
                       _median([s.pcie_rx_bps for s in samples if s.pcie_rx_bps is not None]), len(nvl))


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


@dataclass(frozen=True)
class MemoryReads:
    """What the store held of the job's memory over MEMORY_WINDOW_S."""

    gpus: tuple[int, ...]
    gpu_polls: Mapping[int, Sequence[GpuSample]]
    listed: Sequence[GpuProcess]
    host: Sequence[HostSample]
    worker_procs: Mapping[int, Sequence[ProcSample]]
    family: frozenset[int]
    workers: frozenset[int]
    exited_at: float | None


# A stretch of this many main-thread samples in a row importing modules is the job's start-up (one
# lazy import mid-run is a sample or two at the sampler's 1-5 Hz): the window's main-thread
# evidence starts after the last such stretch once the job runs on. Judgement.
STARTUP_STRETCH = IntThreshold(
    3, "samples", JUDGEMENT,
    "Main-thread samples in a row importing modules that make a start-up stretch; the evidence starts after the "
    "last one once the job runs on (one lazy import mid-run is a sample or two).")


def startup_end(main: Sequence[StackSample]) -> int:
    """The index of the first sample after the last start-up stretch of ``main`` (0: none), where
    the job has gone on since (still importing: the warm-up verdict's, the window keeps it all)."""
    end, run = 0, 0
    for k, s in enumerate(main):
        run = run + 1 if importing_at(s.frames) is not None else 0
        if run >= STARTUP_STRETCH:
            end = k + 1
    return end if end < len(main) else 0


@dataclass(frozen=True)
class JobWindow:
    """What the store held for the window ending at ``now``, and the evidence worked out from it.

    The fields are what was read (``stacks`` and ``tasks`` reach back the stuck verdict's look-back
    too, the rest is cut to the window); the properties are the evidence, each computed on first
    use and kept. ``named_target`` is the session's target (None: none attached); ``target_pid``
    is the process the analysis watches, the named one or, with none named, the one it finds."""

    now: float
    window_s: float = DEFAULT_WINDOW_S
    stuck_after_s: float = DEFAULT_STUCK_AFTER_S
    named_target: int | None = None
    gpu_info: Mapping[int, GpuInfo] = field(default_factory=dict)
    gpu_polls: Mapping[int, Sequence[GpuSample]] = field(default_factory=dict)  # as given: may reach back further
    util_points: Mapping[int, Sequence[UtilPoint]] = field(default_factory=dict)
    gpu_processes: Sequence[GpuProcess] = ()
    host_polls: Sequence[HostSample] = ()
    proc_history: Mapping[int, Sequence[ProcSample]] = field(default_factory=dict)
    raw_stacks: Sequence[StackSample] = ()  # as sampled (the Stacks pane shows their own categories)
    system: SystemInfo | None = None
    all_events: Sequence[Event] = ()
    tasks: Mapping[int, Sequence[TaskSample]] = field(default_factory=dict)
    # Each process's newest reading, however old (the Stacks pane's target and workers).
    procs_latest: Mapping[int, ProcSample] = field(default_factory=dict)
    # The job's memory over MEMORY_WINDOW_S (longer than the findings' window: a forecast needs
    # minutes), read by read_window once the job is known; None: not read (samples given).
    memory_reads: "MemoryReads | None" = None

    @functools.cached_property
    def memory(self) -> MemoryView | None:
        """The job's memory: growth and forecast per GPU and for the host, the lines that keep a
        step's tensors, and, once the target has exited, the likely cause."""
        r = self.memory_reads
        if r is None or self.target_pid is None:
            return None
        # Growth is judged early only over the time the job has trained: from its first sample of
        # the step's own work, with the step going round and nothing compiling since (weights
        # loading or kernels compiling grow memory too, then stop).
        main, step = self.main, self.step
        since = None
        if step.stepping and not any(compiling(s.frames) for s in main[-len(main) // 4:]):
            since = training_since(main, step)
        view = memory_view(r.gpus, r.gpu_polls, r.listed, r.host, r.worker_procs, r.family, r.workers,
                           dict(self.gpu_info), early_since=since)
        cause = None
        if r.exited_at is not None:
            said = [e.message for e in self.all_events
                    if e.source == "stacks" and f"PID {self.target_pid} exited" in e.message]
            cause = exit_cause(r.exited_at, exit_status_of(said[-1]) if said else None, r.gpu_polls, r.host, r.gpus)
        return replace(view, leaks=leak_lines(self.main, self.step.loop_at), exit_cause=cause)

    # ----------------------------------------------------------------- the job

    @property
    def t0(self) -> float:
        return self.now - self.window_s

    @functools.cached_property
    def procs(self) -> dict[int, list[ProcSample]]:
        """Every process's readings in the window."""
        return {pid: [s for s in ss if s.ts >= self.t0] for pid, ss in self.proc_history.items()}

    @functools.cached_property
    def pid_rank(self) -> dict[int, int]:
        """pid -> rank of a multi-rank job (empty: one process)."""
        return rank_map(self.all_events)

    @functools.cached_property
    def stacks(self) -> list[StackSample]:
        """Every sampled stack, a multi-rank job's ranks judged as ranks (a CPU rank off the CPU
        in backward waits in DDP's gradient all-reduce): the breakdown, the ranks' views and the
        stuck verdict all read these."""
        return as_ranks(self.raw_stacks, self.pid_rank, self.gpu_processes,
                        bool(self.gpu_info or self.gpu_polls or self.util_points))

    @functools.cached_property
    def _all_main(self) -> list[StackSample]:
        return sorted((s for s in self.stacks if s.is_main), key=lambda s: s.ts)

    @functools.cached_property
    def target_pid(self) -> int | None:
        if self.named_target is not None:
            return self.named_target
        found = next((pid for pid, ss in self.procs.items() if ss and ss[-1].role == "target"), None)
        if found is None and self._all_main:
            # No target named: the process sampled most is the one being watched.
            found = Counter(s.pid for s in self._all_main).most_common(1)[0][0]
        return found

    @functools.cached_property
    def main_by_pid(self) -> dict[int, list[StackSample]]:
        """Every process's main-thread samples."""
        out: dict[int, list[StackSample]] = {}
        for s in self.stacks:
            if s.is_main:
                out.setdefault(s.pid, []).append(s)
        return out

    @functools.cached_property
    def family(self) -> frozenset[int]:
        """The target and its workers (a child is a worker by its name or its worker loop, not by
        being a child)."""
        target = self.target_pid
        fam = {target} if target is not None else set()
        parents = parents_of(ss[-1] for ss in self.procs.values() if ss)
        fam |= {pid for pid, ss in self.procs.items()
                if ss and is_worker(ss[-1], target, self.main_by_pid.get(pid, ()), parents)}
        return frozenset(fam)

    @functools.cached_property
    def workers(self) -> Workers:
        """The target's DataLoader workers over the window (the rules' and the memory read's)."""
        return worker_stats(self.procs, self.target_pid, self.now, stacks=self.main_by_pid)

    @functools.cached_property
    def main_history(self) -> list[StackSample]:
        """The target's main thread, in time order, as far back as the stuck verdict looks."""
        return [s for s in self._all_main if s.pid == self.target_pid]

    @functools.cached_property
    def main(self) -> list[StackSample]:
        """The target's main thread in the window, from the end of its start-up imports: a job
        that spent its first seconds importing (``import torch``, the first optimizer step
        importing ``torch._dynamo``) is judged by what it does after them. A new user's job,
        attached while it imported, was told its `<module>` was 80 % "CPU work in the training
        loop" for 12 s once the loop ran (20 import samples of the attach burst in the window
        against 5 of the loop on a loaded host). The warm-up verdict reads the history, not this."""
        main = [s for s in self.main_history if s.ts >= self.t0]
        return main[startup_end(main):]

    @functools.cached_property
    def step(self) -> StepModel:
        """The training step as the main thread's samples in the window show it: worked out once a
        tick, for the advisor's rules and for the memory read (growth is judged early only in the
        loop)."""
        return step_model(self.main)

    @functools.cached_property
    def worker_history(self) -> list[StackSample]:
        """The workers' main threads, as far back as was read."""
        target = self.target_pid
        return [s for s in self.stacks if s.is_main and s.pid in self.family and s.pid != target]

    @property
    def target_procs(self) -> list[ProcSample]:
        """The target's readings in the window."""
        return self.procs.get(self.target_pid, []) if self.target_pid is not None else []

    @functools.cached_property
    def job_tasks(self) -> dict[int, Sequence[TaskSample]]:
        """/proc readings of the target and its children."""
        return family_tasks(self.tasks, self.target_pid) if self.target_pid is not None else {}

    @functools.cached_property
    def events(self) -> tuple[Event, ...]:
        return tuple(e for e in self.all_events if e.ts >= self.t0)

    # ----------------------------------------------------------------- the devices

    @functools.cached_property
    def win_t0(self) -> float:
        """Where the breakdowns start: idle time before the stack sampler attached cannot be
        attributed, so with stacks the breakdown starts at the first sample (one join early)."""
        main = self.main
        return max(self.t0, main[0].ts - STACK_JOIN_S) if main else self.t0

    @functools.cached_property
    def host(self) -> list[HostSample]:
        return [h for h in self.host_polls if h.ts >= self.t0]

    @functools.cached_property
    def cores(self) -> int | None:
        system, host = self.system, self.host
        return (system.cpu_count if system and system.cpu_count else None) or (
            len(host[-1].cores) if host and host[-1].cores else None)

    @functools.cached_property
    def gpu_indices(self) -> list[int]:
        return sorted(set(self.gpu_info) | set(self.gpu_polls) | set(self.util_points))

    @functools.cached_property
    def gpu_samples(self) -> dict[int, list[GpuSample]]:
        """Each GPU's polls in the window."""
        return {i: [s for s in self.gpu_polls.get(i, ()) if s.ts >= self.t0] for i in self.gpu_indices}

    @functools.cached_property
    def slices(self) -> dict[int, list[Slice]]:
        """Each GPU's busy/idle time line: NVML's 200 ms points, else the polls."""
        t0, now, pts = self.win_t0, self.now, self.util_points
        return {i: (util_slices(pts[i], t0, now) if pts.get(i) else poll_slices(self.gpu_samples[i], t0, now))
                for i in self.gpu_indices}

    @functools.cached_property
    def target_gpus(self) -> frozenset[int]:
        return frozenset(p.gpu_index for p in self.gpu_processes if p.pid in self.family)

    @functools.cached_property
    def job_gpus(self) -> frozenset[int]:
        """Which GPUs are the job's: those NVML lists the target on; failing that (no target,
        another PID namespace, a fake GPU) those with any process, or any activity in the window."""
        if holds_no_gpu(self.target_pid, set(self.family), self.pid_rank, self.gpu_processes, self.procs, self.main):
            # Other people's GPUs: their idle time is not this job's to explain, and its stacks
            # are not theirs. The job is judged on its own time line (the CPU device).
            return frozenset()
        return frozenset(self.target_gpus or {p.gpu_index for p in self.gpu_processes}
                         or {i for i in self.gpu_indices if any(s.util > 0 for s in self.slices[i])})

    @functools.cached_property
    def links(self) -> dict[int, LinkTraffic]:
        """Every GPU's link traffic over the window (a multi-rank job's ranks each have their own
        GPU, not all of them the target's)."""
        return {i: link_traffic([s for s in self.gpu_samples[i] if s.ts >= self.win_t0]) for i in self.gpu_indices}

    @functools.cached_property
    def gpus(self) -> tuple[GpuView, ...]:
        """The job's devices with their breakdowns; the training thread's own time line when no
        GPU is at work."""
        main, host, cores = self.main, self.host, self.cores
        job_procs = [s for pid in self.family for s in self.procs.get(pid, ())]
        views: list[GpuView] = []
        for i in self.gpu_indices:
            if i not in self.job_gpus:
                continue
            samples, sl = self.gpu_samples[i], self.slices[i]
            views.append(GpuView(
                index=i,
                info=self.gpu_info.get(i),
                breakdown=attribute(i, sl, main, host=host, gpu_samples=samples, procs=job_procs, cores=cores),
                efficiency=gpu_efficiency(i, samples, self.gpu_info.get(i)),
                idle=tuple(idle_intervals(sl)),
                slices=tuple(sl),
                processes=tuple(p for p in self.gpu_processes if p.gpu_index == i),
                used_by_target=i in self.target_gpus,
                spin=spin_share(samples, self.win_t0, self.now),
            ))
        if not views and main:
            sl = stack_slices(main, self.win_t0, self.now)
            views.append(GpuView(
                index=CPU_DEVICE,
                info=None,
                breakdown=attribute(CPU_DEVICE, sl, main, host=host, procs=job_procs, cores=cores),
                efficiency=gpu_efficiency(CPU_DEVICE, []),
                idle=tuple(idle_intervals(sl)),
                slices=tuple(sl),
                processes=(),
                used_by_target=False,
            ))
        return tuple(views)

    # ----------------------------------------------------------------- the verdicts

    @functools.cached_property
    def spin_pids(self) -> frozenset[int]:
        """The ranks (or the target) whose every GPU spins now."""
        return spinning_pids(list(self.pid_rank) or [self.target_pid], self.gpu_processes, self.gpu_samples,
                             self.util_points, self.now)

    @functools.cached_property
    def gpu_state(self) -> str:
        """'spin', 'busy', 'idle' or 'unknown': the target's GPUs over the last few seconds (the
        stuck verdict's input): its own SM utilisation where NVML gives it per process, else the
        job's GPUs' time lines (the breakdown's slices)."""
        return self._gpu_state(self.now - GPU_IDLE_WINDOW_S)

    @functools.cached_property
    def gpu_state_while_still(self) -> str:
        """``gpu_state`` over the main thread's current stillness only, where it began inside the
        look-back: work the GPU did before the thread stopped is not work while it waits (a rank
        blocked on a queue read "the GPU is busy" for the 5 s its last kernels stayed in the
        look-back, and its hang could not form)."""
        run = unchanged_run(self.main_history)
        start = self.now - GPU_IDLE_WINDOW_S
        return self._gpu_state(max(start, run[0].ts) if run is not None else start)

    def _gpu_state(self, since: float) -> str:
        if self.target_pid in self.spin_pids:
            return "spin"
        mine = [p for p in self.gpu_processes if p.pid == self.target_pid]
        utils = [s.util for v in self.gpus if v.index != CPU_DEVICE for s in v.slices if s.end >= since]
        if any(p.sm_util is not None for p in mine):
            if utils and max(utils) <= GPU_IDLE_PCT:
                # An idle GPU runs nothing of anyone's: the per-process reading lags (read every
                # few seconds, NVML's own average behind it). A held-out rank blocked on a queue
                # read "the GPU is busy" 6 s into its GPU's idleness, from the last reading (32 %).
                return "idle"
            # Per-process SM utilisation: not confused by other jobs on the same GPU.
            return "busy" if any((p.sm_util or 0) > GPU_IDLE_PCT for p in mine) else "idle"
        if not utils:
            return "unknown"
        return "busy" if max(utils) > GPU_IDLE_PCT else "idle"

    @functools.cached_property
    def stuck(self) -> StuckVerdict | None:
        """The one stuck verdict of this instant (None: no target, or no main-thread stacks of
        it): the advisor's stuck rule, the stuck watch's events and the Stacks pane read it."""
        target, history, now = self.target_pid, self.main_history, self.now
        if target is None or not history:
            return None
        # NVML's buffer reaches back before the attach: how long the job's GPUs have been idle.
        reaches = [idle_reach([(p.ts, p.util) for p in self.util_points.get(v.index, ())]
                              or [(g.ts, g.util_gpu) for g in self.gpu_samples[v.index] if g.util_gpu is not None], now)
                   for v in self.gpus if v.index != CPU_DEVICE]
        start = now - self.stuck_after_s - LOOKBACK_EXTRA_S
        target_procs = self.target_procs
        v = judge(
            history,
            now,
            self.stuck_after_s,
            gpu=self.gpu_state_while_still,
            others=latest_others([s for s in self.stacks if s.ts >= start], target),
            history_start=start,
            exited=bool(target_procs) and target_procs[-1].status in ("exited", "zombie"),
            procs=self.procs,
            tasks=self.job_tasks,
            gpu_idle_s=min(reaches) if reaches else 0.0,
            ranks=self.pid_rank or None,
            spin_pids=self.spin_pids,
        )
        # A rank waiting while another works is a straggler, not a hang, unless NCCL's own counts
        # say the working one has stopped launching collectives.
        return across_ranks(v, self.pid_rank, self.stacks, target, self.spin_pids, nccl=self.nccl,
                            tasks=self.tasks, procs=self.procs, now=now)

    @functools.cached_property
    def forming(self) -> Forming | None:
        """A hang forming: the main thread still longer than its steps' waits, not yet stuck."""
        v = self.stuck
        computing = False
        if v is not None and v.since is not None and self.gpu_state == "busy":
            # Busy with work, or spinning (a kernel that waits): each of the target's GPUs' newest
            # poll since the stillness began says which (a poll's counters cover the interval
            # before it, so the first may still hold the last step's work); none to tell is work.
            mine = {p.gpu_index for p in self.gpu_processes if p.pid == self.target_pid}
            newest = [max((s for s in self.gpu_samples.get(i, ()) if s.ts > v.since and s.error is None),
                          key=lambda s: s.ts, default=None) for i in mine]
            computing = not newest or any(s is None or not is_spin(s) for s in newest)
        f = hang_forming(v, self.main_history, self.stuck_after_s, gpu_computing=computing)
        peers = [p for p in self.pid_rank if p != self.target_pid]
        if f is not None and peers and all(p in self.spin_pids for p in peers):
            f = replace(f, peers_wait=True)
        return f

    @functools.cached_property
    def gil_holders(self) -> dict[int, GilHolder]:
        """Per process of the job (each rank, or the target), a thread of its own holding the GIL
        while its main thread waits (analysis.gil_holder)."""
        recent = [s for s in self.stacks if s.ts >= self.t0]
        pids = list(self.pid_rank) or ([self.target_pid] if self.target_pid is not None else [])
        return {p: h for p in pids if (h := gil_holder_of(recent, p)) is not None}

    @functools.cached_property
    def recompute(self) -> Recompute:
        """Activation checkpointing in the window: each rank's (or the target's) instants spent
        recomputing a checkpointed forward inside backward, read from all its threads."""
        pids = list(self.pid_rank) or ([self.target_pid] if self.target_pid is not None else [])
        return recompute_of(self.stacks, pids, self.t0, self.pid_rank)

    @functools.cached_property
    def forward_comm(self) -> ForwardComm:
        """Collectives inside the model's forward on each rank (analysis.forward_comm): tensor
        parallelism. A job of one process has none to show."""
        pids = list(self.pid_rank)
        return forward_comm_of(self.stacks, pids, self.t0, self.pid_rank) if len(pids) > 1 else ForwardComm()

    @functools.cached_property
    def nccl(self) -> tuple[CommVerdict, ...]:
        """What NCCL's RAS reports say of the job's communicators now (a multi-rank job only)."""
        return ras_verdicts(self.all_events, self.now) if self.pid_rank else ()

    @property
    def verdict(self) -> StuckVerdict:
        """The stuck verdict, or why there is none (no target's stacks yet, the target exited)."""
        if self.stuck is not None:
            return self.stuck
        procs = self.target_procs
        return judge([], self.now, self.stuck_after_s, exited=bool(procs) and procs[-1].status in ("exited", "zombie"))

    @functools.cached_property
    def rank_views(self) -> tuple[RankView, ...]:
        """Each local rank of a multi-rank job over the window, from its own stacks."""
        if not self.pid_rank:
            return ()
        return rank_views(self.pid_rank, self.stacks, self.t0, self.gpu_processes, self.procs,
                          gpu_samples=self.gpu_samples, t1=self.now)

    # ----------------------------------------------------------------- the panes

    @functools.cached_property
    def stacks_view(self) -> StacksView | None:
        """The Stacks pane's view of the named target (None: none attached)."""
        pid = self.named_target
        if pid is None:
            return None
        return stacks_view_of(pid, self.now, self.window_s, [s for s in self.raw_stacks if s.ts >= self.t0],
                              self.procs_latest, self.all_events[-50:], self.verdict)

    @functools.cached_property
    def job_view(self) -> JobView | None:
        """The Ranks pane's view of a multi-rank job (None: not one)."""
        if not self.pid_rank:
            return None
        return job_view_of(self.all_events, self.rank_views, self.window_s)


def read_window(store: Store, target_pid: int | None = None, stuck_after_s: float = DEFAULT_STUCK_AFTER_S,
                window_s: float = DEFAULT_WINDOW_S, now: float | None = None) -> JobWindow:
    """The window ending at ``now`` (the store's clock by default): the one reading of the store."""
    now = store.now if now is None else now
    t0 = now - window_s
    reach = min(t0, now - stuck_after_s - LOOKBACK_EXTRA_S)  # the stuck verdict's look-back
    indices = store.gpu_indices()
    w = JobWindow(
        now=now,
        window_s=window_s,
        stuck_after_s=stuck_after_s,
        named_target=target_pid,
        gpu_info=dict(store.gpu_info),
        gpu_polls={i: store.gpu_window(i, t0, now) for i in indices},
        # one extra second: the first point's period reaches back before the window
        util_points={i: store.util_window(i, t0 - 1.0, now) for i in indices},
        gpu_processes=store.gpu_processes(),
        host_polls=store.host_window(t0, now),
        proc_history={pid: store.proc_window(pid, t0, now) for pid in store.procs_latest()},
        raw_stacks=store.stack_window(reach, now),
        system=store.system,
        all_events=store.events(),
        tasks=store.task_windows(reach, now),
        procs_latest=store.procs_latest(),
    )
    # Read once the job is known (its target and workers say whose memory); set on this window,
    # not a copy, so the evidence worked out to find the job (ranks, stacks) is kept, not redone.
    object.__setattr__(w, "memory_reads", read_memory(store, w))
    return w


def read_memory(store: Store, w: JobWindow) -> MemoryReads | None:
    """The job's memory series over MEMORY_WINDOW_S: its own NVML listings, the GPUs it is or was
    on, the host, its DataLoader workers, and when the target exited (None: no target)."""
    if w.target_pid is None:
        return None
    now, t0 = w.now, w.now - MEMORY_WINDOW_S
    workers = frozenset(c.pid for c in w.workers.current)
    family = frozenset({w.target_pid} | workers)
    listed = store.gpu_process_window(family, t0, now)
    # The job's GPUs now, and those NVML listed it on before (after an exit, the only record).
    gpus = tuple(sorted({g.index for g in w.gpus if g.index != CPU_DEVICE} | {p.gpu_index for p in listed}))
    exited = [s for s in store.proc_window(w.target_pid, t0, now) if s.status in ("exited", "zombie")]
    return MemoryReads(
        gpus=gpus, gpu_polls={i: store.gpu_window(i, t0, now) for i in gpus}, listed=listed,
        # The target's samples too: its RSS growing or not tells a leak in it from the workers' copy-on-read.
        host=store.host_window(t0, now), worker_procs={pid: store.proc_window(pid, t0, now) for pid in family},
        family=family, workers=workers, exited_at=exited[0].ts if exited else None)


# The store's readers that want one piece of a window (a command's one-shot, a test).

def stuck_verdict(store: Store, pid: int, threshold: float, now: float | None = None) -> StuckVerdict:
    """The verdict on ``pid`` from what the store holds."""
    return read_window(store, pid, threshold, now=now).verdict


def stacks_view(store: Store, pid: int, stuck_after: float, window_s: float = DEFAULT_WINDOW_S,
                now: float | None = None) -> StacksView:
    """The Stacks pane's view of ``pid``."""
    view = read_window(store, pid, stuck_after, window_s, now).stacks_view
    assert view is not None  # a target was named
    return view


def job_view(store: Store, window_s: float = DEFAULT_WINDOW_S, now: float | None = None) -> JobView | None:
    """The Ranks pane's view of the multi-rank job the store names, None when there is none."""
    return read_window(store, None, window_s=window_s, now=now).job_view
