"""What a report says about a run, as plain data. Pure: built from samples, no I/O.

``RunAccumulator`` is fed the run chunk by chunk (an hour at a time, so a day-long recording
never sits in memory at once) and produces a ``Summary``: per-GPU busy/idle time and where the
idle time went (``analysis.breakdown``), the longest idle periods with their likely cause,
memory/power/efficiency figures, host load, chart series, and the findings.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Collection, Iterable, Mapping, Sequence

from ..analysis import BUCKET_LABELS, CPU_DEVICE, Breakdown, Bucket, attribute, bucket_of
from ..analysis import PRIVATE_GONE_S, Growth, MemoryView, WorkerMemory, WorkersPrivate, growth
from ..analysis import IDLE_UTIL_PCT, Slice, idle_intervals
from ..units import fmt_length
from ..model import Event, Finding, GpuInfo, GpuProcess, GpuSample, HostSample, ProcSample, StackSample, SystemInfo

# An idle stretch shorter than this is part of the loop's rhythm (a data stall between steps),
# not an "idle period" worth a line in the report; the breakdown still counts every second.
MIN_IDLE_PERIOD_S = 5.0
# Longest idle periods listed per GPU.
TOP_IDLE_PERIODS = 10
# The CPU device's time line may fall short of the recorded span by this share (and a second)
# before the report says which part it covers.
CPU_COVER_SLACK = 0.02
# Points per chart over the whole run: enough for a page-wide SVG, few enough to stay small.
CHART_POINTS = 600


@dataclass
class ChartBucket:
    covered_s: float = 0.0
    busy_s: float = 0.0
    low_s: float = 0.0
    util_min: float | None = None
    mem_max: int | None = None  # the whole card's used memory
    job_mem_max: float | None = None  # the attached job's own (its processes' NVML figures summed)
    power_sum: float = 0.0
    power_n: int = 0
    tensor_sum: float = 0.0
    tensor_n: int = 0

    @property
    def util(self) -> float | None:
        return 100.0 * self.busy_s / self.covered_s if self.covered_s > 0 else None

    @property
    def idle_fraction(self) -> float | None:
        return self.low_s / self.covered_s if self.covered_s > 0 else None

    @property
    def power(self) -> float | None:
        return self.power_sum / self.power_n if self.power_n else None

    @property
    def tensor(self) -> float | None:
        return self.tensor_sum / self.tensor_n if self.tensor_n else None


@dataclass
class HostBucket:
    cpu_sum: float = 0.0
    iowait_sum: float = 0.0
    n: int = 0
    mem_max: float | None = None  # the host's used memory, its highest in the bucket

    @property
    def cpu(self) -> float | None:
        return self.cpu_sum / self.n if self.n else None

    @property
    def iowait(self) -> float | None:
        return self.iowait_sum / self.n if self.n else None


@dataclass(frozen=True)
class IdlePeriodSummary:
    gpu: int
    start: float
    end: float
    cause: str  # a BUCKET_LABELS value
    detail: str = ""  # the commonest main-thread stack label during it

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class GpuSummary:
    index: int
    name: str
    memory_total: int | None
    power_limit_w: float | None
    breakdown: Breakdown
    idle_periods: list[IdlePeriodSummary]
    idle_period_count: int
    idle_period_s: float
    mem_max: int | None
    mem_mean: float | None
    power_mean: float | None
    temp_max: float | None
    tensor_mean: float | None
    sm_active_mean: float | None
    throttled_fraction: float | None  # polls with a slowdown reason other than idle
    chart: list[tuple[float, ChartBucket]]
    # False: NVML never listed the attached job (its target, workers, ranks) on this GPU while it
    # was recorded: its busy and idle time are measured, its idle time not put down to the job's
    # stacks (someone else's GPU, or a spare one, is not idle because of the job's CPU work).
    job_used: bool = True

    @property
    def busy_fraction(self) -> float:
        t = self.breakdown.total_s
        return self.breakdown.busy_s / t if t > 0 else 0.0


@dataclass(frozen=True)
class WorkerUss:
    """One DataLoader worker's private memory (USS) over its readings in the recording."""

    pid: int
    first: float  # bytes at its first reading
    last: float  # at its last
    peak: float
    growth: Growth  # as the memory view judges a series (its recent half: how it was at the end)
    start: float = 0.0  # its first reading's time
    end: float = 0.0  # its last


@dataclass(frozen=True)
class WorkersMemory:
    """The attached job's DataLoader workers' private memory (USS) over the recording: each
    worker's, their sum per chart bucket, and the judgement the live memory view makes (how many
    grow, their median rate, copy-on-read or a leak in the main process)."""

    workers: tuple[WorkerUss, ...]
    chart: list[tuple[float, float | None]]  # the workers' USS summed (each one's latest reading), per bucket
    private: WorkersPrivate

    def _total(self) -> list[float]:
        return [v for _, v in self.chart if v is not None]

    @property
    def total_first(self) -> float | None:
        vals = self._total()
        return vals[0] if vals else None

    @property
    def total_last(self) -> float | None:
        vals = self._total()
        return vals[-1] if vals else None

    @property
    def total_peak(self) -> float | None:
        return max(self._total(), default=None)


# A GPU the attached job never used (GpuSummary.job_used), said in place of its idle breakdown.
NOT_THE_JOBS = "not used by the attached job: NVML listed none of its processes on it"


# CpuSummary.why when the job ran beside GPUs NVML listed only others on (analysis.window.holds_no_gpu).
HELD_NO_GPU = "the job held none of the GPUs"


@dataclass
class CpuSummary:
    """The job's own time line when it used no GPU: its main thread stands in for the device
    (``analysis.breakdown.stack_slices``), the analysis advise and the live view use for the
    "CPU (no GPU)" device, run here over the whole recording."""

    breakdown: Breakdown
    samples: int  # main-thread stack samples it rests on
    why: str  # why the job is judged on its own time line
    # What of the recorded span the time line covers (``breakdown.total_s``) and what it leaves
    # out: before the first main-thread sample, after the last, and between samples further apart
    # than the stack time line joins (``stack_slices``: taken for lost data, as advise takes it).
    span_s: float = 0.0
    before_s: float = 0.0  # per session: from its start to its first sample, summed
    after_s: float = 0.0  # per session: from its last sample to its end, summed
    between_s: float = 0.0  # between appended sessions: nothing was recorded then
    unsampled_s: float = 0.0  # sessions with no main-thread sample of their target at all
    gaps: int = 0
    gap_s: float = 0.0
    gap_min_s: float = 0.0
    gap_max_s: float = 0.0

    @property
    def covered_s(self) -> float:
        return self.breakdown.total_s

    @property
    def left_out_s(self) -> float:
        return max(0.0, self.span_s - self.covered_s)

    @property
    def partial(self) -> bool:
        """The breakdown leaves out a visible part of the recording (more than a second, or 2 %)."""
        return self.left_out_s > max(1.0, CPU_COVER_SLACK * self.span_s)


@dataclass
class SessionSummary:
    """One recording session (``record --append`` adds one, each with its own target): its span,
    what it followed, the main-thread stack samples of that target, and, when the job used no GPU,
    where that target's time went (the CPU device's breakdown over this session alone)."""

    index: int  # 1, 2, ...
    start: float
    end: float
    target_pid: int | None
    target_cmdline: str | None
    stack_samples: int = 0
    cpu: Breakdown | None = None

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def target(self) -> tuple[int | None, str | None]:
        return self.target_pid, self.target_cmdline


@dataclass
class _SessionCpu:
    """The CPU time line's extent within one session, while it is read."""

    summary: SessionSummary
    first: float | None = None  # the first main-thread slice's start
    last: float | None = None  # the last main-thread sample


@dataclass
class FindingSummary:
    finding: Finding
    first_seen: float
    last_seen: float  # the last time it was written (it is re-written every RECORD_REFRESH_S)
    reports: int
    max_cost_s: float
    titles: set[str] = field(default_factory=set)  # every wording recorded (a clear names the latest)
    cleared: float | None = None  # when it stopped showing (the advisor's "cleared: ..." event)
    until_end: bool = False  # still showing when the recording (its session) ended
    session_end: float | None = None  # that end, when until_end

    @property
    def shown_until(self) -> float:
        """When it stopped showing: cleared, the end it lasted to, else the last time written."""
        if self.cleared is not None:
            return self.cleared
        if self.until_end and self.session_end is not None:
            return self.session_end
        return self.last_seen


@dataclass
class Summary:
    path: str
    host: str
    system: SystemInfo | None
    start: float
    end: float
    target_pid: int | None
    target_cmdline: str | None
    source: str
    gpus: list[GpuSummary]
    host_cpu_mean: float | None
    host_cpu_max: float | None
    host_iowait_mean: float | None
    host_mem_max: int | None
    host_mem_total: int | None
    host_cores: int | None
    host_chart: list[tuple[float, HostBucket]]
    findings: list[FindingSummary]
    events: list[Event]
    damage: str | None
    size_bytes: int
    attributed: bool  # stack samples of the target's main thread were recorded
    chart_step: float = 1.0  # seconds per chart bucket
    sample_interval: float | None = None  # the recorder's poll interval, when recorded
    backfill_s: float = 0.0  # GPU history in the file from before recording started (not in the span)
    ranks: tuple = ()  # report.ranks.RankSummary per local rank of a multi-rank job
    cpu: CpuSummary | None = None  # the job used no GPU: where its main thread's time went
    gain_predicted_recorded: bool = False  # the file keeps the findings' gain_predicted
    # Tables a cut copy lost, whole or past the cut (Reader.lost_tables): what the report must not
    # present as "none recorded".
    lost_tables: tuple[str, ...] = ()
    # The job's phases the advisor named (warming up): when they were, never counted as findings.
    phases: list[FindingSummary] = field(default_factory=list)
    # The findings were judged again from the samples (report.rejudge: the file's were another
    # advisor's, or lost in a cut), one evaluation every this many seconds; None: as recorded.
    judged_step_s: float | None = None
    recorded_ids: tuple[str, ...] = ()  # judged again: the ids the file's own findings held
    # The attached job's DataLoader workers' private memory (None: no worker's USS recorded, as in
    # a recording from before schema version 2 or of a job without workers).
    workers_memory: WorkersMemory | None = None
    # Every recording session with its span and target (one, unless the file was appended to).
    sessions: list[SessionSummary] = field(default_factory=list)

    @property
    def targets(self) -> list[tuple[int | None, str | None]]:
        """The processes the sessions followed, each once, in order."""
        return list(dict.fromkeys(x.target for x in self.sessions))

    @property
    def judged_again(self) -> bool:
        return self.judged_step_s is not None

    @property
    def findings_lost(self) -> bool:
        return "findings" in self.lost_tables

    @property
    def stacks_lost(self) -> bool:
        return bool({"stack_samples", "stacks", "frames", "threads"} & set(self.lost_tables))

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def chart_max_gap(self) -> float:
        """Chart points at most this far apart are joined by a line: a poll interval longer than
        a bucket leaves empty buckets between samples that are not missing data. A missed poll
        is bridged too; a longer silence is drawn as a gap."""
        return 2.0 * max(self.chart_step, self.sample_interval or 0.0)


# --------------------------------------------------------------------------- accumulation


def _merge(a: Breakdown | None, b: Breakdown) -> Breakdown:
    if a is None:
        return b
    seconds: Counter[Bucket] = Counter(dict(a.seconds))
    seconds.update(dict(b.seconds))
    labels: Counter[tuple[Bucket, str]] = Counter(dict(a.idle_labels))
    labels.update(dict(b.idle_labels))
    return Breakdown(
        gpu_index=a.gpu_index,
        t0=min(a.t0, b.t0) if a.total_s else b.t0,
        t1=max(a.t1, b.t1),
        seconds=dict(seconds),
        attributed=a.attributed or b.attributed,
        idle_samples=a.idle_samples + b.idle_samples,
        idle_labels=dict(labels),
    )


def cause_of(stacks: Sequence[StackSample]) -> tuple[str, str]:
    """The commonest idle bucket among main-thread samples, and its commonest stack label."""
    from ..analysis import stack_label

    if not stacks:
        return BUCKET_LABELS[Bucket.UNKNOWN], ""
    counts = Counter(bucket_of(s) for s in stacks)
    top = max(counts, key=lambda b: (counts[b], -list(Bucket).index(b)))
    labels = Counter(stack_label(s) for s in stacks if bucket_of(s) is top)
    return BUCKET_LABELS[top], (labels.most_common(1)[0][0] if labels else "")


@dataclass
class _GpuAcc:
    breakdown: Breakdown | None = None
    idle: list[IdlePeriodSummary] = field(default_factory=list)
    mem_sum: float = 0.0
    mem_n: int = 0
    mem_max: int | None = None
    power_sum: float = 0.0
    power_n: int = 0
    temp_max: float | None = None
    tensor_sum: float = 0.0
    tensor_n: int = 0
    sm_sum: float = 0.0
    sm_n: int = 0
    throttled: int = 0
    polls: int = 0
    job_used: bool = False  # a chunk took it for one of the job's GPUs (``add_chunk``'s job_gpus)


# NVML clocks-event bits that mean "slowed down" rather than "nothing to do" (0x1 is GPU idle,
# 0x2 application clocks setting; see nvmlClocksEventReasons).
_IDLE_REASON = 0x1
_APP_CLOCKS = 0x2


class RunAccumulator:
    """Feed chunks of a run in time order; ``summary()`` at the end."""

    def __init__(self, start: float, end: float, chart_points: int = CHART_POINTS) -> None:
        self.start = start
        self.end = end
        self.step = max(1.0, (end - start) / max(1, chart_points))
        self.n_buckets = max(1, math.ceil((end - start) / self.step))
        self.gpus: dict[int, _GpuAcc] = {}
        self.charts: dict[int, list[ChartBucket]] = {}
        self.host_chart = [HostBucket() for _ in range(self.n_buckets)]
        self.cpu_sum = 0.0
        self.cpu_n = 0
        self.cpu_max: float | None = None
        self.iowait_sum = 0.0
        self.host_mem_max: int | None = None
        self.host_mem_total: int | None = None
        self.cores: int | None = None
        self.attributed = False
        self.cpu_breakdown: Breakdown | None = None
        self.cpu_samples = 0
        # The CPU time line's extent and the gaps inside it (``CpuSummary``).
        self.cpu_first: float | None = None
        self.cpu_last_ts: float | None = None
        self.cpu_gaps: list[float] = []  # spacings between main-thread samples left out
        # The recording sessions read so far (``begin_session``), the current one last.
        self.sessions: list[_SessionCpu] = []
        # The workers' USS readings (ts, USS, RSS) per worker, and the main process's RSS, the
        # last reading per chart bucket (all the judgement needs of a series read every second).
        self.worker_uss: dict[int, list[tuple[float, float, float | None]]] = {}
        self.worker_seen: dict[int, list[float]] = {}  # pid -> [first, last] sample of any kind
        self.main_rss: list[float | None] = [None] * self.n_buckets

    def begin_session(self, session: SessionSummary) -> None:
        """The chunks fed from now on are ``session``'s (read for its own target): the time line
        does not join its first sample to the previous session's last (the time between them was
        not recorded, not lost)."""
        self.sessions.append(_SessionCpu(session))
        self.cpu_last_ts = None

    def _session(self) -> _SessionCpu:
        if not self.sessions:  # fed without sessions: the whole run is one
            self.sessions.append(_SessionCpu(SessionSummary(1, self.start, self.end, None, None)))
        return self.sessions[-1]

    def add_main_samples(self, main_stacks: Sequence[StackSample]) -> None:
        """The current session's target's main-thread samples in this chunk (for its count)."""
        self._session().summary.stack_samples += len(main_stacks)

    def add_cpu_chunk(
        self,
        slices: Sequence[Slice],
        main_stacks: Sequence[StackSample],
        host: Sequence[HostSample],
        job_procs: Sequence[ProcSample] = (),
    ) -> None:
        """The target's main-thread time line (``stack_slices``) for this chunk, attributed as
        advise attributes the CPU device: the same ``attribute`` call, on the job's processes."""
        sess = self._session()
        # Each sample stands for the time since the one before it; one without a slice of its
        # own was too far from it, and that spacing is left out of the time line.
        ends = {round(sl.end, 6) for sl in slices}
        for x in main_stacks:
            if self.cpu_last_ts is not None and x.ts > self.cpu_last_ts and round(x.ts, 6) not in ends:
                self.cpu_gaps.append(x.ts - self.cpu_last_ts)
            self.cpu_last_ts = x.ts
            sess.last = x.ts
        if not slices:
            return
        self.cpu_samples += len(main_stacks)
        self.cpu_first = slices[0].start if self.cpu_first is None else self.cpu_first
        sess.first = slices[0].start if sess.first is None else sess.first
        bd = attribute(CPU_DEVICE, slices, main_stacks, host=host, procs=job_procs, cores=self.cores)
        self.cpu_breakdown = _merge(self.cpu_breakdown, bd)
        sess.summary.cpu = _merge(sess.summary.cpu, bd)

    def add_job_memory(self, procs: Sequence[GpuProcess], family: Iterable[int]) -> None:
        """The job's own memory per GPU: its processes' NVML figures summed per poll, the
        highest per chart bucket (the series the live forecast was fitted to)."""
        family = set(family)
        per_poll: dict[tuple[int, float], float] = {}
        for p in procs:
            if p.pid in family and p.used_memory is not None:
                key = (p.gpu_index, p.ts)
                per_poll[key] = per_poll.get(key, 0.0) + p.used_memory
        for (gpu, ts), used in per_poll.items():
            cb = self._chart(gpu)[self._bucket(ts)]
            cb.job_mem_max = used if cb.job_mem_max is None else max(cb.job_mem_max, used)

    def add_worker_memory(self, procs: Sequence[ProcSample], workers: Iterable[int], main: int | None) -> None:
        """The workers' private memory (USS) readings of this chunk (``workers``: the pids whose
        readings count: the job's), when each was seen, and the main process's RSS."""
        workers = set(workers) | set(self.worker_uss)
        for p in procs:
            if p.pid in workers:
                seen = self.worker_seen.setdefault(p.pid, [p.ts, p.ts])
                seen[0], seen[1] = min(seen[0], p.ts), max(seen[1], p.ts)
                if p.uss is not None:
                    rss = None if p.rss is None else float(p.rss)
                    self.worker_uss.setdefault(p.pid, []).append((p.ts, float(p.uss), rss))
            elif p.pid == main and p.rss is not None:
                self.main_rss[self._bucket(p.ts)] = float(p.rss)

    def _workers_memory(self) -> WorkersMemory | None:
        if not self.worker_uss:
            return None
        ends = [self.start + (i + 1) * self.step for i in range(self.n_buckets)]
        mids = [self.start + (i + 0.5) * self.step for i in range(self.n_buckets)]
        total: list[float | None] = [None] * self.n_buckets
        per: list[WorkerUss] = []
        memories: list[WorkerMemory] = []
        for pid, reads in sorted(self.worker_uss.items()):
            reads.sort()
            ts = [r[0] for r in reads]
            uss = [(t, u) for t, u, _ in reads]
            g = growth(uss)
            per.append(WorkerUss(pid, uss[0][1], uss[-1][1], max(u for _, u in uss), g, ts[0], ts[-1]))
            rss = [(t, r) for t, _, r in reads if r is not None]
            memories.append(WorkerMemory(pid, growth(rss), g))
            # In the sum while the worker is seen, at its latest reading (before its first, at
            # that: its USS is read every 12 s, the workers' reads spread over them); one still
            # seen at the recording's end, to the end (its last samples may be its reads alone).
            first, last = self.worker_seen.get(pid, (ts[0], ts[-1]))
            if last >= self.end - PRIVATE_GONE_S:
                last = self.end
            for i in range(self._bucket(first), self._bucket(last) + 1):
                k = max(0, bisect.bisect_right(ts, ends[i]) - 1)
                total[i] = (total[i] or 0.0) + reads[k][1]
        main_pts = [(t, v) for t, v in zip(mids, self.main_rss) if v is not None]
        view = MemoryView(workers=tuple(memories), main=growth(main_pts) if main_pts else None)
        private = view.private
        assert private is not None  # every worker here has USS readings
        return WorkersMemory(tuple(per), list(zip(mids, total)), private)

    def _bucket(self, t: float) -> int:
        return min(self.n_buckets - 1, max(0, int((t - self.start) / self.step)))

    def _chart(self, gpu: int) -> list[ChartBucket]:
        c = self.charts.get(gpu)
        if c is None:
            c = self.charts[gpu] = [ChartBucket() for _ in range(self.n_buckets)]
        return c

    def add_chunk(
        self,
        gpu_slices: Mapping[int, Sequence[Slice]],
        gpu_samples: Mapping[int, Sequence[GpuSample]],
        main_stacks: Sequence[StackSample],
        host: Sequence[HostSample],
        procs: Sequence[ProcSample] = (),
        job_gpus: Collection[int] | None = None,
    ) -> None:
        """One chunk of the run. ``job_gpus``: the GPUs that were the job's in it (None: not
        known, every GPU taken for the job's); the others' time is only measured, busy or idle."""
        if main_stacks:
            self.attributed = True
        for h in host:
            self.cpu_sum += h.cpu_percent
            self.iowait_sum += h.iowait_percent
            self.cpu_n += 1
            self.cpu_max = h.cpu_percent if self.cpu_max is None else max(self.cpu_max, h.cpu_percent)
            if h.mem_used:
                self.host_mem_max = h.mem_used if self.host_mem_max is None else max(self.host_mem_max, h.mem_used)
            self.host_mem_total = h.mem_total or self.host_mem_total
            if h.cores:
                self.cores = len(h.cores)
            b = self.host_chart[self._bucket(h.ts)]
            b.cpu_sum += h.cpu_percent
            b.iowait_sum += h.iowait_percent
            b.n += 1
            if h.mem_used:
                b.mem_max = float(h.mem_used) if b.mem_max is None else max(b.mem_max, float(h.mem_used))
        for gpu in sorted(set(gpu_slices) | set(gpu_samples)):
            acc = self.gpus.setdefault(gpu, _GpuAcc())
            slices = list(gpu_slices.get(gpu, ()))
            samples = list(gpu_samples.get(gpu, ()))
            chart = self._chart(gpu)
            mine = job_gpus is None or gpu in job_gpus
            acc.job_used = acc.job_used or mine
            if slices:
                # Not the job's: busy or idle alone. Neither its stacks nor the host's or this
                # GPU's own evidence (iowait, PCIe traffic) say why another process's GPU was idle.
                bd = (attribute(gpu, slices, main_stacks, host, samples, procs, self.cores) if mine
                      else attribute(gpu, slices))
                acc.breakdown = _merge(acc.breakdown, bd)
                for s in slices:
                    cb = chart[self._bucket(s.mid)]
                    cb.covered_s += s.duration
                    cb.busy_s += s.busy_s
                    if s.util < IDLE_UTIL_PCT:
                        cb.low_s += s.duration
                    cb.util_min = s.util if cb.util_min is None else min(cb.util_min, s.util)
                stack_ts = [x.ts for x in main_stacks]
                for iv in idle_intervals(slices) if mine else ():
                    self._add_idle(gpu, acc, iv.start, iv.end, main_stacks, stack_ts)
            for s in samples:
                acc.polls += 1
                cb = chart[self._bucket(s.ts)]
                if s.mem_used is not None:
                    acc.mem_sum += s.mem_used
                    acc.mem_n += 1
                    acc.mem_max = s.mem_used if acc.mem_max is None else max(acc.mem_max, s.mem_used)
                    cb.mem_max = s.mem_used if cb.mem_max is None else max(cb.mem_max, s.mem_used)
                if s.power_w is not None:
                    acc.power_sum += s.power_w
                    acc.power_n += 1
                    cb.power_sum += s.power_w
                    cb.power_n += 1
                if s.temperature_c is not None:
                    acc.temp_max = s.temperature_c if acc.temp_max is None else max(acc.temp_max, s.temperature_c)
                if s.tensor_active is not None:
                    acc.tensor_sum += s.tensor_active
                    acc.tensor_n += 1
                    cb.tensor_sum += s.tensor_active
                    cb.tensor_n += 1
                if s.sm_active is not None:
                    acc.sm_sum += s.sm_active
                    acc.sm_n += 1
                if s.throttle_reasons is not None and s.throttle_reasons & ~(_IDLE_REASON | _APP_CLOCKS):
                    acc.throttled += 1

    def _add_idle(
        self, gpu: int, acc: _GpuAcc, start: float, end: float, stacks: Sequence[StackSample], ts: list[float]
    ) -> None:
        # Chunks split idle runs at their edges: join a run that starts where the last ended.
        if acc.idle and abs(acc.idle[-1].end - start) < 1e-6:
            prev = acc.idle.pop()
            start = prev.start
        if end - start < MIN_IDLE_PERIOD_S:
            # Short stalls are only counted (the breakdown has their causes); naming each
            # one's cause would cost a stack scan per stall.
            acc.idle.append(IdlePeriodSummary(gpu, start, end, "", ""))
            return
        inside = stacks[bisect.bisect_left(ts, start) : bisect.bisect_right(ts, end)]
        cause, detail = cause_of(inside)
        acc.idle.append(IdlePeriodSummary(gpu, start, end, cause, detail))

    def summary(self, **meta) -> Summary:
        infos: Mapping[int, GpuInfo] = meta.pop("gpu_infos", {})
        # Why the job is judged on its own time line, or None when it is judged by its GPUs.
        cpu_why = meta.pop("cpu_why", None)
        if cpu_why is None and not self.gpus:
            cpu_why = "no GPU in the recording"
        cpu = None
        sessions = [x.summary for x in self.sessions]
        if cpu_why and self.cpu_breakdown is not None and self.cpu_breakdown.total_s > 0:
            gaps = self.cpu_gaps
            # What of each session the time line leaves out: before its first sample, after its
            # last, all of a session without one; and the time between sessions, not recorded.
            before = after = unsampled = 0.0
            for x in self.sessions:
                st, e = x.summary.start, x.summary.end
                if x.first is None:
                    unsampled += max(0.0, e - st)
                    continue
                before += max(0.0, x.first - st)
                after += max(0.0, e - (x.last if x.last is not None else e))
            between = sum(max(0.0, b.start - a.end) for a, b in zip(sessions, sessions[1:]))
            cpu = CpuSummary(
                self.cpu_breakdown, self.cpu_samples, cpu_why,
                span_s=self.end - self.start,
                before_s=before, after_s=after, between_s=between, unsampled_s=unsampled,
                gaps=len(gaps), gap_s=sum(gaps),
                gap_min_s=min(gaps, default=0.0), gap_max_s=max(gaps, default=0.0),
            )
        gpus = []
        for idx in sorted(self.gpus):
            acc = self.gpus[idx]
            info = infos.get(idx)
            periods = [p for p in acc.idle if p.duration >= MIN_IDLE_PERIOD_S]
            bd = acc.breakdown or Breakdown(idx, self.start, self.end, {}, False)
            chart = [(self.start + (i + 0.5) * self.step, b) for i, b in enumerate(self._chart(idx))]
            gpus.append(
                GpuSummary(
                    index=idx,
                    name=info.name if info else f"GPU {idx}",
                    memory_total=info.memory_total if info else None,
                    power_limit_w=info.power_limit_w if info else None,
                    breakdown=bd,
                    idle_periods=sorted(periods, key=lambda p: -p.duration)[:TOP_IDLE_PERIODS],
                    idle_period_count=len(periods),
                    idle_period_s=sum(p.duration for p in periods),
                    mem_max=acc.mem_max,
                    mem_mean=acc.mem_sum / acc.mem_n if acc.mem_n else None,
                    power_mean=acc.power_sum / acc.power_n if acc.power_n else None,
                    temp_max=acc.temp_max,
                    tensor_mean=acc.tensor_sum / acc.tensor_n if acc.tensor_n else None,
                    sm_active_mean=acc.sm_sum / acc.sm_n if acc.sm_n else None,
                    throttled_fraction=acc.throttled / acc.polls if acc.polls else None,
                    chart=chart,
                    job_used=acc.job_used,
                )
            )
        host_chart = [(self.start + (i + 0.5) * self.step, b) for i, b in enumerate(self.host_chart)]
        return Summary(
            gpus=gpus,
            host_cpu_mean=self.cpu_sum / self.cpu_n if self.cpu_n else None,
            host_cpu_max=self.cpu_max,
            host_iowait_mean=self.iowait_sum / self.cpu_n if self.cpu_n else None,
            host_mem_max=self.host_mem_max,
            host_mem_total=self.host_mem_total,
            host_cores=self.cores,
            host_chart=host_chart,
            attributed=self.attributed,
            cpu=cpu,
            chart_step=self.step,
            start=self.start,
            end=self.end,
            workers_memory=self._workers_memory(),
            sessions=sessions,
            **meta,
        )


def coverage_note(s: Summary) -> str:
    """Which part of the recording the CPU device's time line covers, and why, when it is not
    (nearly) all of it; "" otherwise."""
    c = s.cpu
    if c is None or not c.partial:
        return ""
    parts = []
    if c.gaps:
        apart = (f"{c.gap_min_s:.2f} s" if round(c.gap_min_s, 2) == round(c.gap_max_s, 2)
                 else f"{c.gap_min_s:.2f}-{c.gap_max_s:.2f} s")
        parts.append(f"{fmt_length(c.gap_s)} where main-thread stack samples were {apart} apart "
                     f"({c.gaps} spacing{'s' if c.gaps != 1 else ''} longer than the stack time line joins: "
                     "taken for lost data, as advise takes them)")
    whose = "each session's" if len(s.sessions) > 1 else "the"
    if c.between_s >= 1.0:
        parts.append(f"{fmt_length(c.between_s)} between the sessions (nothing was recorded)")
    if c.unsampled_s >= 1.0:
        parts.append(f"{fmt_length(c.unsampled_s)} of sessions without main-thread stack samples")
    if c.before_s >= 1.0:
        parts.append(f"{fmt_length(c.before_s)} before {whose} first sample")
    if c.after_s >= 1.0:
        parts.append(f"{fmt_length(c.after_s)} after {whose} last")
    why = "; ".join(parts) if parts else "time without main-thread stack samples"
    return f"covers {fmt_length(c.covered_s)} of the {fmt_length(c.span_s)} recorded; left out: {why}"


def target_words(x: SessionSummary) -> str:
    """'PID 26624  python healthy.py', or 'no target (no --pid)'."""
    if x.target_pid is None and not x.target_cmdline:
        return "no target (no --pid)"
    return f"PID {x.target_pid or '?'}  {x.target_cmdline or ''}".rstrip()


def session_line(x: SessionSummary, clock) -> str:
    """'session 1  <start> → <end> (0:00:22)  PID 26624  python healthy.py  (59 stack samples)'."""
    samples = f"  ({x.stack_samples} stack samples)" if x.stack_samples else ""
    return (f"session {x.index}  {clock(x.start)} → {clock(x.end)} ({fmt_length(x.duration)})  "
            f"{target_words(x)}{samples}")


def in_session(s: Summary, ts: float) -> str:
    """' (session 2)' for a time in an appended recording's second session; '' with one session."""
    if len(s.sessions) < 2:
        return ""
    k = next((x.index for x in reversed(s.sessions) if x.start <= ts + 1e-6), s.sessions[0].index)
    return f" (session {k})"


def several_targets(s: Summary) -> bool:
    """The sessions followed more than one process: no one target speaks for the recording."""
    return len(s.targets) > 1


def session_cpu_line(x: SessionSummary) -> str:
    """One session's share of the CPU device's breakdown: 'session 2 (PID 1787): busy 80 %, data
    wait 20 % over 0:00:05, 11 stack samples'."""
    from ..present import breakdown_rows

    who = f"PID {x.target_pid}" if x.target_pid is not None else "no target"
    bd = x.cpu
    if bd is None or bd.total_s <= 0:
        return f"session {x.index} ({who}): no main-thread stack samples"
    rows = sorted(breakdown_rows(bd), key=lambda r: -r[1])
    shares = ", ".join(f"{BUCKET_LABELS[b]} {p} %" for b, _sec, p in rows[:3])
    return f"session {x.index} ({who}): {shares} over {fmt_length(bd.total_s)}, {x.stack_samples} stack samples"


def gpus_text(s: Summary) -> str:
    """'2× NVIDIA H100' or, for a run without GPUs, what the job ran on."""
    if not s.gpus:
        return "no GPU (CPU only)"
    return f"{len(s.gpus)}× " + ", ".join(sorted({g.name for g in s.gpus}))


def cost_text(fs: FindingSummary, s: Summary) -> str:
    """A finding's cost: GPU-seconds when it is about a GPU; on a CPU-only run, seconds of the
    job's own time (there are no GPU-seconds to lose)."""
    if not fs.max_cost_s:
        return ""
    # Under a second written with its tenths: "up to 0 GPU-s" reads as no cost at all.
    n = f"{fs.max_cost_s:.0f}" if fs.max_cost_s >= 1 else f"{fs.max_cost_s:.1f}"
    if fs.finding.gpu_index is not None and s.gpus:
        return f"up to {n} GPU-s per window"
    return f"up to {n} s of the job's time per window"


def finding_device(f: Finding) -> str:
    """The GPU to name beside a finding's title: "" when the title already names it (the rules
    write most titles as "GPU 1 busy but ..."), when it is about no GPU, or about the CPU
    standing in for one (``gpu_index`` -1, CPU_DEVICE)."""
    i = f.gpu_index
    if i is None or i < 0 or re.search(rf"\bGPU {i}\b", f.title):
        return ""
    return f"GPU {i}"


def summarise_findings(rows: Iterable[tuple[Finding, float]]) -> list[FindingSummary]:
    """Recorded finding rows (finding, last seen) grouped by (id, GPU), worst first."""
    groups: dict[tuple[str, int | None], FindingSummary] = {}
    for f, last in rows:
        key = (f.id, f.gpu_index)
        g = groups.get(key)
        first = f.first_seen or f.ts
        if g is None:
            g = groups[key] = FindingSummary(f, first, max(last, f.ts), 1, f.cost_s)
        else:
            g.finding = f  # the latest wording
            g.first_seen = min(g.first_seen, first)
            g.last_seen = max(g.last_seen, last, f.ts)
            g.reports += 1
            g.max_cost_s = max(g.max_cost_s, f.cost_s)
        g.titles.add(f.title)
    rank = {"critical": 0, "warning": 1, "info": 2}
    return sorted(groups.values(), key=lambda g: (rank.get(g.finding.severity.value, 3), -g.max_cost_s, g.first_seen))


# The advisor's event when a finding stops showing (advisor.engine.AdvisorSource.advise).
CLEARED_PREFIX = "cleared: "
# A finding showing is re-written at least every RECORD_REFRESH_S (advisor.engine): one last
# written within this much of its session's end, and not cleared, was still showing at the end.
UNTIL_END_SLACK_S = 5.0


def finding_ends(
    findings: Sequence[FindingSummary],
    events: Iterable[Event],
    sessions: Sequence[tuple[float, float]],
) -> None:
    """Say when each finding stopped showing (``cleared``), or that it was still showing when
    the recording ended (``until_end``). ``sessions``: (start, end) of each recording session in
    time order, the last one's end the recording's. A finding neither cleared nor written near
    its session's end keeps only ``last_seen`` (how it ended is not in the file)."""
    from ..advisor import RECORD_REFRESH_S

    clears: dict[str, list[float]] = {}
    for ev in events:
        if ev.source == "advisor" and ev.message.startswith(CLEARED_PREFIX):
            clears.setdefault(ev.message[len(CLEARED_PREFIX):], []).append(ev.ts)
    for fs in findings:
        after = [t for title in fs.titles for t in clears.get(title, ()) if t >= fs.last_seen - 1e-6]
        # The session it was last written in (a later, appended one starts without it).
        ends = [e for st, e in sessions if st <= fs.last_seen + 1e-6]
        end = ends[-1] if ends else (sessions[0][1] if sessions else None)
        if after and (end is None or min(after) <= end + 1e-6):
            fs.cleared = min(after)
        elif end is not None and end - fs.last_seen <= RECORD_REFRESH_S + UNTIL_END_SLACK_S:
            fs.until_end, fs.session_end = True, end


# The advisor's live wording of a job's age (advisor.context.warming_up): "ago" and "old" of the
# moment it was said, which a report (a document read later) says as the time the job started.
_STARTED_AGO = re.compile(r"the job started (\d+(?:\.\d+)?) s ago(?: \(first steps\))?")
_JOB_OLD = re.compile(r", job (\d+(?:\.\d+)?) s old")


def recorded_title(f: Finding, clock) -> str:
    """A recorded title with the job's age said as the time it started: 'Warming up: first steps
    (the job started 2026-11-27 15:08:52)' for 'Warming up: the job started 10 s ago (first steps)'."""
    def started(m: re.Match) -> str:
        return clock(f.ts - float(m.group(1)))

    title = _STARTED_AGO.sub(lambda m: f"first steps (the job started {started(m)})" if "first steps" in m.group(0)
                             else f"the job started {started(m)}", f.title)
    return _JOB_OLD.sub(lambda m: f" (the job started {started(m)})", title)


def phase_text(fs: FindingSummary, clock, last_session_end: float | None = None) -> str:
    """'warming up: torch.compile is compiling, from 04:20:17 to 04:20:31': a phase of the job
    the advisor named, with when it was (a span, where a finding has a first and a clear)."""
    title = recorded_title(fs.finding, clock)
    when = f"from {clock(fs.first_seen)}"
    if fs.cleared is not None:
        when += f" to {clock(fs.cleared)}"
    elif fs.until_end and fs.session_end is not None:
        ended = last_session_end is None or abs(fs.session_end - last_session_end) < 1e-6
        when += f" to the end ({clock(fs.session_end)})" if ended else f" to its session's end ({clock(fs.session_end)})"
    else:
        when += f", last reported {clock(fs.last_seen)}"
    return f"{title[:1].lower()}{title[1:]}, {when}"


def finding_when(fs: FindingSummary, clock, last_session_end: float | None = None) -> str:
    """'first 04:20:17, until the end (04:20:37)' / '..., cleared 04:20:31' / '..., last reported ...'."""
    first = f"first {clock(fs.first_seen)}"
    if fs.cleared is not None:
        return f"{first}, cleared {clock(fs.cleared)}"
    if fs.until_end and fs.session_end is not None:
        if last_session_end is None or abs(fs.session_end - last_session_end) < 1e-6:
            return f"{first}, until the end ({clock(fs.session_end)})"
        return f"{first}, until its recording session ended ({clock(fs.session_end)})"
    return f"{first}, last reported {clock(fs.last_seen)} (no record of when it cleared)"


def judged_note(s: Summary) -> str | None:
    """What a report says of findings it judged again (report.rejudge), one line; None when it
    prints the file's own."""
    if not s.judged_again:
        return None
    why = ("the file's findings were lost in the cut" if s.findings_lost else
           "the file's findings were shown by another version of gputop's advisor")
    every = f", every {s.judged_step_s:g} s" if s.judged_step_s and s.judged_step_s > 1.0 else ""
    was = ", ".join(s.recorded_ids) if s.recorded_ids else "none"
    lost = "" if s.findings_lost else f"; recorded then: {was}"
    return f"judged again from the recorded samples by this gputop (as `gputop replay` judges them{every}): {why}{lost}"

