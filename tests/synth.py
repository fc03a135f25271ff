"""Synthetic timelines for the analysis and advisor tests: a scripted job, sample by sample.

A ``Job`` writes what the sources would (NVML's 200 ms points and 1 s polls, py-spy's 5 Hz
main-thread stacks, psutil's host and process polls) into a real ``Store``, from functions of
time the test chooses, so a test states the situation ("GPU idle whenever the main thread waits
for data") and checks what the analysis makes of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from gputop.model import (
    Category,
    CoreTimes,
    Frame,
    GpuInfo,
    GpuProcess,
    GpuSample,
    HostSample,
    ProcSample,
    StackSample,
    SystemInfo,
    UtilPoint,
)
from gputop.store import Store

T0 = 1_700_000_000.0
GiB = 1024**3
TARGET = 4242

LIB = "/usr/lib/python3.11/site-packages/torch"
# A representative stack per category, newest frame first, the user's loop at the bottom.
_USER = Frame("train", "/home/u/train.py", 40)
STACKS: dict[Category, tuple[Frame, ...]] = {
    Category.DATA_WAIT: (
        Frame("wait", "/usr/lib/python3.11/threading.py", 331),
        Frame("_MultiProcessingDataLoaderIter._try_get_data", f"{LIB}/utils/data/dataloader.py", 1133),
        Frame("_BaseDataLoaderIter.__next__", f"{LIB}/utils/data/dataloader.py", 630),
        _USER,
    ),
    Category.DATA_FETCH: (
        Frame("Images.__getitem__", "/home/u/data.py", 52),
        Frame("_MapDatasetFetcher.fetch", f"{LIB}/utils/data/_utils/fetch.py", 52),
        Frame("_BaseDataLoaderIter.__next__", f"{LIB}/utils/data/dataloader.py", 630),
        _USER,
    ),
    Category.HOST_SYNC: (Frame("step", "/home/u/train.py", 70, code="history.append(loss.item())"), _USER),
    Category.H2D_COPY: (Frame("step", "/home/u/train.py", 61, code="x = host[i % 2].to(device)"), _USER),
    Category.FORWARD: (Frame("Linear.forward", f"{LIB}/nn/modules/linear.py", 116), Frame("step", "/home/u/train.py", 55), _USER),
    Category.BACKWARD: (Frame("_engine_run_backward", f"{LIB}/autograd/graph.py", 768), Frame("step", "/home/u/train.py", 57), _USER),
    Category.OPTIMIZER: (Frame("AdamW.step", f"{LIB}/optim/adamw.py", 200), Frame("step", "/home/u/train.py", 58), _USER),
    Category.CHECKPOINT_IO: (Frame("save", f"{LIB}/serialization.py", 900), Frame("train", "/home/u/train.py", 80)),
    Category.COLLECTIVE: (Frame("all_reduce", f"{LIB}/distributed/distributed_c10d.py", 2000), _USER),
    Category.IDLE: (Frame("sleep", "/home/u/train.py", 90),),
    Category.OTHER: (Frame("log", "/home/u/train.py", 95),),
    Category.GC: (Frame("collect", "/home/u/train.py", 96),),
}
BLOCKED = {Category.DATA_WAIT, Category.HOST_SYNC, Category.COLLECTIVE, Category.IDLE}


def stack(ts: float, cat: Category, pid: int = TARGET, main: bool = True, active: bool | None = None,
          frames: tuple[Frame, ...] | None = None) -> StackSample:
    return StackSample(
        ts=ts, pid=pid, thread_id=pid, thread_name="MainThread" if main else "Thread-1",
        frames=frames if frames is not None else STACKS[cat],
        active=(cat not in BLOCKED) if active is None else active,
        is_main=main, category=cat,
    )


@dataclass
class Job:
    """A scripted job of ``seconds`` from T0. Every callable takes the time since the start."""

    seconds: float = 20.0
    gpus: int = 1
    util: Callable[[float], float] | None = lambda t: 100.0  # None: no GPU at all
    main: Callable[[float], Category] | None = lambda t: Category.FORWARD  # None: no stacks
    cores: int = 16
    host_cpu: Callable[[float], float] = lambda t: 20.0
    iowait: Callable[[float], float] = lambda t: 0.0  # percent of all cores
    disk_read: float = 0.0
    workers: int = 0
    worker_cpu: float = 50.0
    target_cpu: float = 100.0  # % of one core
    worker_threads: int = 1
    env: tuple[tuple[str, str], ...] = ()
    gpu: dict = field(default_factory=dict)  # extra GpuSample fields (GPM, memory, clocks ...)
    gpu_info: dict = field(default_factory=dict)
    shm_total: int | None = 32 * GiB
    shm_used: int = 0
    stack_rate: float = 5.0
    stack_start: float = 0.0  # py-spy attaches this long after the GPU history starts
    target_on_gpu: bool = True
    target_role: str = "target"  # "gpu": the process is on the GPU but gputop is not attached to it
    worker_stack: Callable[[float], StackSample | None] | None = None
    main_frames: Callable[[float], tuple[Frame, ...]] | None = None  # real frames for the main thread
    # Another thread of the target sampled in the same dumps as the main thread (autograd's engine
    # thread on a GPU): its frames at each main-thread sample, None where it shows nothing.
    thread_frames: Callable[[float], tuple[Frame, ...] | None] | None = None
    main_active: Callable[[float], bool] | None = None  # py-spy's active flag (default: by category)
    proc_mem: Callable[[float], float] | None = None  # the target's NVML memory, bytes (None: 8 GiB)
    host_mem_total: int = 0  # bytes; 0: the host's memory not read
    host_available: Callable[[float], float] = lambda t: 0.0
    cgroup_limit: int | None = None  # the job's control group's memory limit (None: none)
    cgroup_used: Callable[[float], float] | None = None
    worker_rss: Callable[[float], float] | None = None
    # Each worker's private memory, read as the host source reads it: every 12 s, the workers'
    # reads spread over those 12 s (None: not read).
    worker_uss: Callable[[float], float] | None = None
    target_rss: Callable[[float], float] | None = None

    def store(self) -> Store:
        st = Store()
        st.add([SystemInfo(ts=T0, gpu_count=self.gpus if self.util else 0, cpu_count=self.cores)])
        if self.util is not None:
            st.add([
                GpuInfo(ts=T0, index=i, **{**dict(
                    name="Test GPU", memory_total=80 * GiB, pcie_max_gen=5, pcie_max_width=16,
                    compute_capability=(9, 0), gpm_supported=True, persistence_mode=True), **self.gpu_info})
                for i in range(self.gpus)
            ])
        n_points = int(round(self.seconds / 0.2))
        n_stacks = int(round((self.seconds - self.stack_start) * self.stack_rate))
        events: list[tuple[float, object]] = []
        if self.util is not None:
            for k in range(1, n_points + 1):
                t = k * 0.2
                for i in range(self.gpus):
                    events.append((T0 + t, UtilPoint(T0 + t, i, self.util(t))))
        if self.main is not None:
            for k in range(1, n_stacks + 1):
                t = self.stack_start + k / self.stack_rate
                frames = self.main_frames(t) if self.main_frames is not None else None
                active = self.main_active(t) if self.main_active is not None else None
                events.append((T0 + t, stack(T0 + t, self.main(t), frames=frames, active=active)))
                other = self.thread_frames(t) if self.thread_frames is not None else None
                if other is not None:
                    events.append((T0 + t, StackSample(ts=T0 + t, pid=TARGET, thread_id=TARGET + 100, frames=other,
                                                       active=True, is_main=False, category=Category.OTHER)))
        for sec in range(1, int(self.seconds) + 1):
            t = float(sec)
            ts = T0 + t
            if self.util is not None:
                mean = sum(self.util(t - j * 0.2) for j in range(5)) / 5
                for i in range(self.gpus):
                    fields = dict(util_gpu=mean, mem_used=8 * GiB, mem_total=80 * GiB, pcie_gen=5,
                                  pcie_width=16, pcie_max_gen=5, pcie_max_width=16, sm_clock_mhz=1980,
                                  sm_clock_max_mhz=1980, throttle_reasons=0, ecc_corrected=0, ecc_uncorrected=0)
                    fields.update({k: (v(t) if callable(v) else v) for k, v in self.gpu.items()})
                    events.append((ts, GpuSample(ts=ts, index=i, **fields)))
                    if self.target_on_gpu:
                        used = int(self.proc_mem(t)) if self.proc_mem is not None else 8 * GiB
                        events.append((ts, GpuProcess(ts=ts, gpu_index=i, pid=TARGET, used_memory=used)))
            cpu = self.host_cpu(t)
            events.append((ts, HostSample(
                ts=ts, cpu_percent=cpu, cores=tuple(CoreTimes(cpu, 0.0, self.iowait(t)) for _ in range(self.cores)),
                iowait_percent=self.iowait(t), load1=cpu / 100 * self.cores, disk_read_bps=self.disk_read,
                shm_total=self.shm_total, shm_used=self.shm_used if self.shm_total else None,
                mem_total=self.host_mem_total, mem_available=int(self.host_available(t)),
                mem_used=self.host_mem_total - int(self.host_available(t)),
                cgroup_limit=self.cgroup_limit,
                cgroup_used=int(self.cgroup_used(t)) if self.cgroup_used is not None else None,
            )))
            events.append((ts, ProcSample(ts=ts, pid=TARGET, ppid=1, name="python", cpu_percent=self.target_cpu,
                                          num_threads=20, status="sleeping", role=self.target_role, env=self.env,
                                          rss=int(self.target_rss(t)) if self.target_rss else None)))
            for w in range(self.workers):
                events.append((ts, ProcSample(ts=ts, pid=TARGET + 1 + w, ppid=TARGET, name="pt_data_worker",
                                              cpu_percent=self.worker_cpu, num_threads=self.worker_threads,
                                              rss=int(self.worker_rss(t)) if self.worker_rss else None,
                                              uss=int(self.worker_uss(t)) if self.worker_uss and sec % 12 == w * 3 % 12
                                              else None,
                                              status="running", role="worker")))
                if self.worker_stack is not None:
                    s = self.worker_stack(t)
                    if s is not None:
                        events.append((ts, replace(s, pid=TARGET + 1 + w, ts=ts)))
        events.sort(key=lambda e: e[0])
        # One batch per distinct time, as the pipeline would deliver them.
        batch: list[object] = []
        last = None
        for ts, s in events:
            if last is not None and ts != last:
                st.add(batch)
                batch = []
            batch.append(s)
            last = ts
        if batch:
            st.add(batch)
        return st


def periodic(period: float, busy_for: float, busy: float = 100.0, idle: float = 0.0) -> Callable[[float], float]:
    return lambda t: busy if (t % period) < busy_for - 1e-9 else idle


def phases(period: float, busy_for: float, busy_cat: Category, idle_cat: Category) -> Callable[[float], Category]:
    """The main thread's category in step with ``periodic``: computing while the GPU is busy."""
    return lambda t: busy_cat if (t % period) < busy_for - 1e-9 else idle_cat


def rule_findings(job: Job, window_s: float = 60.0, stuck_after_s: float = 30.0):
    """Every rule's raw finding on ``job``'s store (no hysteresis), by id, and the context; no
    rule may raise."""
    from gputop.advisor.context import build_context
    from gputop.advisor.engine import Advisor

    ctx = build_context(job.store(), window_s=window_s, stuck_after_s=stuck_after_s)
    adv = Advisor()
    found = {f.id: f for f in adv.run_rules(ctx)}
    assert adv.errors == {}
    return found, ctx
