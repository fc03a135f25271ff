"""Summaries the busy-but-inefficient and system checks read: per GPU (GPM activity, memory,
clocks, PCIe link, ECC) and per job (host CPU, loader workers, environment).

Pure functions over samples from one window; each summary keeps ``None`` where the device or
platform gave nothing, so a rule can tell "not measured" from "zero".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from statistics import fmean
from typing import Iterable, Mapping, Sequence

from ..model import GpuInfo, GpuSample, HostSample, ProcSample, StackSample
from .spin import is_spin
from .throttle import decode_throttle, is_performance_limiting
from .threshold import IntThreshold, JUDGEMENT, Threshold

# GPM activity is averaged over the polls where the GPU was at least this busy: "tensor cores
# idle while the GPU is busy" is a statement about busy time, and idle polls would dilute it.
BUSY_UTIL_PCT = Threshold(
    50.0, "%", JUDGEMENT,
    "GPM activity is averaged over the polls at least this busy: 'tensor cores idle while the GPU is busy' speaks "
    "of busy time, and idle polls would dilute it.")
# A loader worker above this share of one core is computing flat out (psutil's per-process CPU
# reads 95-100 % for a pure-Python loop; 80 leaves room for the sampling jitter).
WORKER_SATURATED_PCT = Threshold(
    80.0, "% of a core", JUDGEMENT,
    "A loader worker above this computes flat out: psutil reads 95-100 % for a pure-Python loop; 80 leaves room "
    "for the sampling jitter.")
# "Now" for the host's rates: the last few 1 s polls.
RECENT_POLLS = IntThreshold(
    3, "polls", JUDGEMENT,
    "'Now' for the host's rates: the last few 1 s polls.")


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return fmean(vals) if vals else None


@dataclass(frozen=True)
class GpuEfficiency:
    gpu_index: int
    polls: int = 0
    busy_polls: int = 0
    # Busy polls that were a kernel spinning (analysis.spin: a NCCL collective waiting for a peer):
    # left out of the GPM means below, which describe the work the GPU did.
    spin_polls: int = 0
    # GPM means over busy polls that were not spins (None: no GPM, or nothing but spins)
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    fp32_active: float | None = None
    fp16_active: float | None = None
    dram_active: float | None = None
    dfma_active: float | None = None  # the FP64 tensor cores (a float64 matmul)
    fp64_active: float | None = None  # the FP64 pipes
    util_busy_mean: float | None = None  # utilisation over the same busy polls
    mem_used_peak: int | None = None
    mem_total: int | None = None
    # clocks held down by power, heat or hardware, over busy polls
    throttle_fraction: float = 0.0
    throttle_reasons: tuple[tuple[str, float], ...] = ()  # (reason, share of busy polls)
    throttle_mask: int = 0  # OR of the limiting reasons seen
    clock_ratio: float | None = None  # SM clock / max clock while limited
    temperature_max: float | None = None
    power_mean: float | None = None
    power_limit: float | None = None
    # PCIe link below its maximum while busy (links downshift when idle: that is power saving)
    pcie_degraded_fraction: float = 0.0
    pcie_link: tuple[int | None, int | None] = (None, None)  # gen, width while degraded
    pcie_max: tuple[int | None, int | None] = (None, None)
    pcie_rx_mean: float | None = None  # bytes/s the GPU receives (host to device)
    pcie_tx_mean: float | None = None  # bytes/s it sends (device to host)
    ecc_uncorrected: int | None = None
    ecc_corrected_delta: int | None = None
    compute_capability: tuple[int, int] | None = None
    # SM activity per point of utilisation over every poll that ran a kernel (GPM): how full the
    # GPU is while it runs at all, whatever the share of the time it runs. A loop of tiny kernels
    # reads near 0 (0.1 % SM at 16 % busy, H100), a model's real kernels between idle gaps near 1.
    sm_fill: float | None = None

    @property
    def mem_peak_fraction(self) -> float | None:
        if self.mem_used_peak is None or not self.mem_total:
            return None
        return self.mem_used_peak / self.mem_total


def gpu_efficiency(index: int, samples: Sequence[GpuSample], info: GpuInfo | None = None) -> GpuEfficiency:
    ok = [s for s in samples if s.error is None]
    busy = [s for s in ok if (s.util_gpu or 0.0) >= BUSY_UTIL_PCT]
    # A spinning kernel's few SMs, idle pipes and low power are a wait's, not the work's: kept out
    # of what the kernels are said to do (a rank spinning in a collective for the first seconds
    # of a hang read "SMs active 33 %: kernels too small" and was told it was launch-bound).
    spun = {id(s) for s in ok if is_spin(s)}
    spins = [s for s in busy if id(s) in spun]
    work = [s for s in busy if id(s) not in spun] if spins else busy
    limited = [s for s in busy if is_performance_limiting(s.throttle_reasons)]
    reasons: Counter[str] = Counter()
    mask = 0
    for s in limited:
        mask |= s.throttle_reasons or 0
        for w in decode_throttle(s.throttle_reasons, limiting_only=True):
            reasons[w] += 1
    ratios = [
        s.sm_clock_mhz / s.sm_clock_max_mhz
        for s in limited
        if s.sm_clock_mhz is not None and s.sm_clock_max_mhz
    ]
    degraded = [s for s in busy if _link_below_max(s, info)]
    mems = [s.mem_used for s in ok if s.mem_used is not None]
    totals = [s.mem_total for s in ok if s.mem_total]
    corrected = [s.ecc_corrected for s in ok if s.ecc_corrected is not None]
    uncorrected = [s.ecc_uncorrected for s in ok if s.ecc_uncorrected is not None]
    last = degraded[-1] if degraded else (ok[-1] if ok else None)
    return GpuEfficiency(
        gpu_index=index,
        polls=len(ok),
        busy_polls=len(busy),
        spin_polls=len(spins),
        sm_active=_mean(s.sm_active for s in work),
        sm_occupancy=_mean(s.sm_occupancy for s in work),
        tensor_active=_mean(s.tensor_active for s in work),
        fp32_active=_mean(s.fp32_active for s in work),
        fp16_active=_mean(s.fp16_active for s in work),
        dram_active=_mean(s.dram_active for s in work),
        dfma_active=_mean(s.dfma_active for s in work),
        fp64_active=_mean(s.fp64_active for s in work),
        util_busy_mean=_mean(s.util_gpu for s in work),
        mem_used_peak=max(mems) if mems else None,
        mem_total=(totals[-1] if totals else (info.memory_total if info else None)),
        throttle_fraction=len(limited) / len(busy) if busy else 0.0,
        throttle_reasons=tuple((w, c / len(busy)) for w, c in reasons.most_common()),
        throttle_mask=mask,
        clock_ratio=_mean(ratios),
        temperature_max=max((s.temperature_c for s in ok if s.temperature_c is not None), default=None),
        power_mean=_mean(s.power_w for s in work),
        power_limit=_mean(s.power_limit_w for s in ok) or (info.power_limit_w if info else None),
        pcie_degraded_fraction=len(degraded) / len(busy) if busy else 0.0,
        pcie_link=(last.pcie_gen, last.pcie_width) if last else (None, None),
        pcie_max=_pcie_max(last, info),
        pcie_rx_mean=_mean(s.pcie_rx_bps for s in ok),
        pcie_tx_mean=_mean(s.pcie_tx_bps for s in ok),
        ecc_uncorrected=max(uncorrected) if uncorrected else None,
        ecc_corrected_delta=(corrected[-1] - corrected[0]) if len(corrected) >= 2 else None,
        compute_capability=info.compute_capability if info else None,
        sm_fill=_fill([s for s in ok if id(s) not in spun]),
    )


def _fill(samples: Sequence[GpuSample]) -> float | None:
    ran = [s for s in samples if s.sm_active is not None and (s.util_gpu or 0.0) > 0]
    util = sum(s.util_gpu or 0.0 for s in ran)
    return min(1.0, sum(s.sm_active or 0.0 for s in ran) / util) if ran and util > 0 else None


def _pcie_max(s: GpuSample | None, info: GpuInfo | None) -> tuple[int | None, int | None]:
    gen = (s.pcie_max_gen if s else None) or (info.pcie_max_gen if info else None)
    width = (s.pcie_max_width if s else None) or (info.pcie_max_width if info else None)
    return gen, width


def _link_below_max(s: GpuSample, info: GpuInfo | None) -> bool:
    max_gen, max_width = _pcie_max(s, info)
    if s.pcie_gen is not None and max_gen and s.pcie_gen < max_gen:
        return True
    return bool(s.pcie_width is not None and max_width and s.pcie_width < max_width)


# --------------------------------------------------------------------------- the job and host


@dataclass(frozen=True)
class HostLoad:
    cores: int
    samples: int = 0
    cpu_mean: float | None = None  # % of all cores
    iowait_cores: float | None = None  # mean iowait, in cores
    load1_max: float | None = None
    disk_read_mean: float | None = None  # bytes/s
    disk_write_recent: float | None = None  # bytes/s, mean of the last few polls
    shm_total: int | None = None
    shm_used_max: int | None = None

    @property
    def busy_cores(self) -> float | None:
        return None if self.cpu_mean is None else self.cpu_mean / 100.0 * self.cores

    @property
    def spare_cores(self) -> float | None:
        b = self.busy_cores
        return None if b is None else max(0.0, self.cores - b)


def host_load(samples: Sequence[HostSample], cores: int | None = None) -> HostLoad:
    n = cores or (len(samples[-1].cores) if samples and samples[-1].cores else 0) or 1
    shm = [s for s in samples if s.shm_total]
    return HostLoad(
        cores=n,
        samples=len(samples),
        cpu_mean=_mean(s.cpu_percent for s in samples),
        iowait_cores=_mean(s.iowait_percent / 100.0 * n for s in samples),
        load1_max=max((s.load1 for s in samples if s.load1 is not None), default=None),
        disk_read_mean=_mean(s.disk_read_bps for s in samples),
        disk_write_recent=_mean(s.disk_write_bps for s in samples[-RECENT_POLLS:]),
        shm_total=shm[-1].shm_total if shm else None,
        shm_used_max=max((s.shm_used or 0 for s in shm), default=None) if shm else None,
    )


@dataclass(frozen=True)
class ProcStats:
    pid: int
    samples: int
    cpu_mean: float | None  # % of one core
    threads: int | None  # latest
    status: str | None  # latest
    create_time: float | None
    ppid: int | None = None  # latest: whose child it is (a DataLoader worker's is the training process)

    @property
    def saturated(self) -> bool:
        return self.cpu_mean is not None and self.cpu_mean >= WORKER_SATURATED_PCT


def proc_stats(samples: Sequence[ProcSample]) -> ProcStats:
    last = samples[-1]
    return ProcStats(
        pid=last.pid,
        samples=len(samples),
        # psutil's first reading of a process is 0 by construction; skip it when there are more.
        cpu_mean=_mean(s.cpu_percent for s in (samples[1:] if len(samples) > 1 else samples)),
        threads=last.num_threads,
        status=last.status,
        create_time=last.create_time,
        ppid=last.ppid,
    )


@dataclass(frozen=True)
class Workers:
    """The target's data-loader workers (its child processes) over the window."""

    current: tuple[ProcStats, ...] = ()  # alive at the end of the window
    seen: int = 0  # distinct worker pids in the window (more than current: workers respawned)
    births: tuple[float, ...] = ()  # every worker's start time seen in the window, sorted

    def pool_starts(self, within_s: float = 1.0) -> tuple[float, ...]:
        """When a pool of workers started: births closer than ``within_s`` are one pool (a
        DataLoader starts its workers together at each epoch's iter())."""
        starts: list[float] = []
        for b in self.births:
            if not starts or b - starts[-1] > within_s:
                starts.append(b)
        return tuple(starts)

    @property
    def count(self) -> int:
        return len(self.current)

    @property
    def saturated(self) -> int:
        return sum(1 for w in self.current if w.saturated)

    @property
    def cpu_mean(self) -> float | None:
        return _mean(w.cpu_mean for w in self.current)

    @property
    def respawned(self) -> int:
        return max(0, self.seen - self.count)


# torch names a DataLoader worker's main thread (so the process) after its job, and its stack
# runs the worker loop; a child of the job that has neither is something else (a logging
# service such as wandb's, a compile worker, multiprocessing's resource tracker).
WORKER_PROC_NAME = "pt_data_worker"
WORKER_LOOP_FRAME = "_worker_loop"


# A DataLoader worker is the job's child, or its grandchild under a forkserver: a few hops at most.
WORKER_MAX_HOPS = IntThreshold(
    4, "hops", JUDGEMENT,
    "A DataLoader worker is the job's child, or its grandchild under a forkserver: a few hops at most.")


def descends_from(p: ProcSample, ancestor: int, parents: Mapping[int, int]) -> bool:
    """Whether ``p`` runs under ``ancestor``: its parent chain (``parents``: pid -> ppid, as the
    host's readings give it) reaches it within WORKER_MAX_HOPS."""
    cur: int | None = p.ppid
    for _ in range(WORKER_MAX_HOPS):
        if cur == ancestor:
            return True
        if cur is None or cur <= 1:
            return False
        cur = parents.get(cur)
    return False


def parents_of(latest: Iterable[ProcSample]) -> dict[int, int]:
    """pid -> ppid from each process's newest reading."""
    return {p.pid: p.ppid for p in latest if p.ppid is not None}


def is_worker(p: ProcSample, target_pid: int | None, stacks: Iterable[StackSample] = (),
              parents: Mapping[int, int] | None = None) -> bool:
    """Whether ``p`` is one of the target's DataLoader workers, by what it is, not whose child.

    ``stacks``: that process's stack samples, if any were taken. The name decides when torch set
    it; otherwise the worker loop in a stack does (torch before the thread name, or a name psutil
    could not read). A child the source could read nothing about (no name, no stack) is taken at
    the source's word (``role``), as before: there is no evidence either way.
    """
    if p.pid == target_pid or p.role == "target":
        return False
    if target_pid is not None and parents is not None and not descends_from(p, target_pid, parents):
        # Another job's workers carry the same name and worker loop: on a shared machine they
        # are not this job's (a CPU job with num_workers=0 was told it oversubscribed its cores
        # with the two workers of a job beside it).
        return False
    if p.name.startswith(WORKER_PROC_NAME):
        return True
    stacks = tuple(stacks)
    if any(f.name == WORKER_LOOP_FRAME for s in stacks for f in s.frames):
        return True
    if p.name or stacks:
        return False
    return p.role == "worker" or (target_pid is not None and p.ppid == target_pid)


def worker_stats(
    windows: Mapping[int, Sequence[ProcSample]], target_pid: int | None, now: float, stale_s: float = 3.0,
    stacks: Mapping[int, Sequence[StackSample]] | None = None,
) -> Workers:
    """``windows``: per pid, that process's samples in the window; ``stacks``: per pid, its stack
    samples (what tells a worker from another child). A worker whose newest sample is older than
    ``stale_s`` has exited (a poll is ~1 s)."""
    current: list[ProcStats] = []
    seen = 0
    births: list[float] = []
    parents = parents_of(ss[-1] for ss in windows.values() if ss)
    for pid, samples in windows.items():
        if not samples or not is_worker(samples[-1], target_pid, (stacks or {}).get(pid, ()), parents):
            continue
        seen += 1
        if samples[-1].create_time:
            births.append(samples[-1].create_time)
        if now - samples[-1].ts <= stale_s:
            current.append(proc_stats(samples))
    current.sort(key=lambda w: w.pid)
    return Workers(current=tuple(current), seen=seen, births=tuple(sorted(births)))
