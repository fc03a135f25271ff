"""The job's memory over the last minutes, as series for ``memory_growth``: per GPU the job's own
NVML memory (its processes summed per poll), and on the host the used memory and each
DataLoader worker's RSS. Pure: samples in, a ``MemoryView`` out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

from ..model import GpuInfo, GpuProcess, GpuSample, HostSample, ProcSample
from .memory_cause import LeakLine
from .memory_growth import Growth, growth
from .threshold import JUDGEMENT, Threshold

# The forecast looks back this far: long enough that a leak of a few MB a step stands out of an
# allocator's steps, as far as the store keeps processes (10 min). Judgement.
MEMORY_WINDOW_S = Threshold(
    600.0, "s", JUDGEMENT,
    "The memory forecast looks back this far: a leak of a few MB a step stands out of an allocator's steps, as far"
    " as the store keeps processes (10 min).")

PROCESS, DEVICE = "process", "device"


@dataclass(frozen=True)
class GpuMemory:
    index: int
    growth: Growth
    # What the series is: the job's processes as NVML lists them (PROCESS), or the whole card's
    # used memory where NVML gives no per-process figure (DEVICE: other processes count in it).
    source: str


@dataclass(frozen=True)
class WorkerMemory:
    pid: int
    growth: Growth  # of its RSS


@dataclass(frozen=True)
class MemoryView:
    gpus: tuple[GpuMemory, ...] = ()
    host: Growth | None = None  # the host's used memory against its total
    workers: tuple[WorkerMemory, ...] = ()
    # Lines of the job's own code seen in its stacks that keep a step's tensor with its graph.
    leaks: tuple[LeakLine, ...] = ()
    # What likely ended the target, with its evidence, once it has exited (memory_cause).
    exit_cause: str | None = None

    def gpu(self, index: int) -> GpuMemory | None:
        return next((g for g in self.gpus if g.index == index), None)

    def growing_on(self, index: int) -> bool:
        g = self.gpu(index)
        return g is not None and g.growth.growing


def job_gpu_series(index: int, processes: Sequence[GpuProcess], family: Collection[int]) -> list[tuple[float, float]]:
    """The job's memory on GPU ``index`` per poll: its processes' used memory summed (a poll
    where NVML gave none of them a figure is left out)."""
    by_ts: dict[float, float] = {}
    for p in processes:
        if p.gpu_index == index and p.pid in family and p.used_memory is not None:
            by_ts[p.ts] = by_ts.get(p.ts, 0.0) + p.used_memory
    return sorted(by_ts.items())


def memory_view(gpus: Collection[int], gpu_samples: Mapping[int, Sequence[GpuSample]],
                gpu_processes: Sequence[GpuProcess], host: Sequence[HostSample],
                procs: Mapping[int, Sequence[ProcSample]], family: Collection[int],
                workers: Collection[int] = (), gpu_info: Mapping[int, GpuInfo] | None = None) -> MemoryView:
    """``gpus``: the job's GPUs; ``gpu_processes``: NVML's process lists over the window (every
    poll's); ``family``: the target and its workers; ``workers``: the DataLoader workers."""
    out: list[GpuMemory] = []
    for i in sorted(gpus):
        samples = gpu_samples.get(i, ())
        last = next((s for s in reversed(samples) if s.mem_used is not None), None)
        info = (gpu_info or {}).get(i)
        limit = (last.mem_total if last is not None and last.mem_total else None) or (info.memory_total if info else None)
        series = job_gpu_series(i, gpu_processes, family)
        source = PROCESS
        if not series:
            series = [(s.ts, float(s.mem_used)) for s in samples if s.mem_used is not None]
            source = DEVICE
        if not series:
            continue
        # The card fills with everyone's memory: the headroom is what the whole card has left.
        used_now = float(last.mem_used) if last is not None and last.mem_used is not None else None
        out.append(GpuMemory(i, growth(series, limit, used_now), source))
    host_growth = None
    hs = [(h.ts, float(h.mem_total - h.mem_available)) for h in host if h.mem_total]
    if hs:
        host_growth = growth(hs, float(host[-1].mem_total))
    ws = []
    for pid in sorted(workers):
        series = [(s.ts, float(s.rss)) for s in procs.get(pid, ()) if s.rss is not None]
        if series:
            ws.append(WorkerMemory(pid, growth(series)))
    return MemoryView(tuple(out), host_growth, tuple(ws))


__all__ = ["DEVICE", "GpuMemory", "MEMORY_WINDOW_S", "MemoryView", "PROCESS", "WorkerMemory", "job_gpu_series",
           "memory_view"]
