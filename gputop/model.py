"""The vocabulary every layer shares: immutable samples and results.

Standard library only. Timestamps are float seconds since the epoch (``time.time()``);
NVML's µs sample timestamps are converted at the source so everything shares one clock.
A field that a device or platform cannot give is ``None``, never a made-up zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


# --------------------------------------------------------------------------- static info


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """What does not change while a GPU is attached (re-emitted if it does)."""

    ts: float
    index: int
    name: str
    uuid: str = ""
    memory_total: int | None = None  # bytes
    power_limit_w: float | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    compute_capability: tuple[int, int] | None = None
    sm_count: int | None = None
    gpm_supported: bool = False
    persistence_mode: bool | None = None
    numa_cpus: str | None = None  # CPU affinity list as text, e.g. "0-15"


@dataclass(frozen=True, slots=True)
class SystemInfo:
    """The machine as the monitor sees it; emitted once per source start."""

    ts: float
    hostname: str = ""
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None
    gpu_count: int = 0
    cpu_count: int | None = None
    nvml_error: str | None = None  # why NVML is unavailable, one line
    source: str = "live"  # live | fake | replay


# --------------------------------------------------------------------------- GPU samples


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One poll of one GPU. Every metric is optional: ``None`` means not available."""

    ts: float
    index: int
    util_gpu: float | None = None  # %
    util_mem: float | None = None  # % (memory controller busy)
    mem_used: int | None = None  # bytes
    mem_total: int | None = None  # bytes
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    throttle_reasons: int | None = None  # NVML clocks-event bitmask
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    pcie_rx_bps: float | None = None  # bytes/s
    pcie_tx_bps: float | None = None
    ecc_corrected: int | None = None  # volatile counts since driver load
    ecc_uncorrected: int | None = None
    # GPM (Hopper and newer), percentages over the last interval
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    fp32_active: float | None = None
    fp16_active: float | None = None
    # set when the GPU could not be read at all this poll (e.g. fell off the bus)
    error: str | None = None
    # NVLink data (payload, not protocol overhead) bytes/s over all links since the previous poll:
    # GPM's NVLink rates where GPM is read, else NVML's link counters; None on a GPU with no link
    # up or when neither could be read. Last, so that a recording's older rows decode as a prefix.
    nvlink_tx_bps: float | None = None
    nvlink_rx_bps: float | None = None
    # GPM's FP64 readings: the FP64 tensor cores (DMMA, a float64 matmul on Hopper) and the FP64
    # pipes. After the NVLink rates, for the same reason.
    dfma_active: float | None = None
    fp64_active: float | None = None

    @property
    def mem_fraction(self) -> float | None:
        if self.mem_used is None or not self.mem_total:
            return None
        return self.mem_used / self.mem_total


@dataclass(frozen=True, slots=True)
class UtilPoint:
    """One entry of NVML's ~200 ms utilisation sample buffer (sub-poll resolution)."""

    ts: float
    index: int
    util: float  # % GPU busy over the sample period


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding a context on a GPU, as NVML sees it."""

    ts: float
    gpu_index: int
    pid: int
    used_memory: int | None = None  # bytes
    sm_util: float | None = None  # %
    mem_util: float | None = None  # %
    kind: str = "C"  # C compute, G graphics, C+G


# --------------------------------------------------------------------------- host samples


@dataclass(frozen=True, slots=True)
class CoreTimes:
    """Percent of one core's time in the last interval."""

    user: float
    system: float
    iowait: float = 0.0
    steal: float = 0.0

    @property
    def busy(self) -> float:
        return self.user + self.system


@dataclass(frozen=True, slots=True)
class HostSample:
    ts: float
    cpu_percent: float  # all cores, 0..100
    cores: tuple[CoreTimes, ...] = ()
    iowait_percent: float = 0.0
    steal_percent: float = 0.0
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None
    mem_total: int = 0
    mem_used: int = 0
    mem_available: int = 0
    swap_total: int = 0
    swap_used: int = 0
    disk_read_bps: float | None = None
    disk_write_bps: float | None = None
    net_rx_bps: float | None = None
    net_tx_bps: float | None = None
    shm_total: int | None = None  # /dev/shm size, bytes (small in containers)
    shm_used: int | None = None
    # The attached job's control group: the memory limit that binds it (a container's: the OOM
    # killer acts there first) and what the group uses; None: no limit, or no job attached.
    cgroup_limit: int | None = None
    cgroup_used: int | None = None


# Linux's largest pid_max (PID_MAX_LIMIT, 2^22 on 64-bit kernels): no real process has a larger PID,
# which is where the fake source numbers its processes.
PID_MAX_LIMIT = 1 << 22

# A performance setting the job's script makes for itself (``os.environ["CUDA_LAUNCH_BLOCKING"] = "1"``
# at its top) is not in /proc/PID/environ: it is kept in ``ProcSample.env`` as KEY (the value the
# script sets) and KEY + SET_IN_SCRIPT (where: ``"train.py:25"``).
SET_IN_SCRIPT = "@script"


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One process as the OS sees it (a GPU user, the target, or one of its workers)."""

    ts: float
    pid: int
    ppid: int | None = None
    name: str = ""
    user: str | None = None
    cmdline: str = ""  # already redacted
    cpu_percent: float | None = None  # of one core
    rss: int | None = None
    num_threads: int | None = None
    status: str | None = None
    create_time: float | None = None
    io_read_bps: float | None = None
    io_write_bps: float | None = None
    role: str = "gpu"  # gpu | target | worker
    env: tuple[tuple[str, str], ...] = ()  # performance-relevant keys, redacted
    # A worker's private memory (pages no other process maps) and its proportional share of the
    # shared ones, bytes. Read only for the target's workers, every few seconds each (the read
    # walks the process's page tables): None on the polls it was not read. Copy-on-read shows
    # here, not in RSS: a forked worker's RSS counts the parent's pages it shares from the start.
    uss: int | None = None
    pss: int | None = None


# --------------------------------------------------------------------------- stacks


class Category(str, Enum):
    """What a thread was doing in one stack sample (see the classifier in gputop.analysis.classify)."""

    DATA_WAIT = "data-wait"
    DATA_FETCH = "data-fetch"
    HOST_SYNC = "host-sync"
    H2D_COPY = "h2d-copy"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    COLLECTIVE = "collective"
    CHECKPOINT_IO = "checkpoint-io"
    GC = "gc"
    IDLE = "idle"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    filename: str
    line: int = 0
    module: str | None = None
    # The source line's text where it could be read: C calls such as ``.item()`` have no Python
    # frame of their own, so the caller's line is the only trace of them.
    code: str | None = None
    # For a frame of the user's code: what the innermost loop around its line adds to from one
    # turn to the next ((line, statement) pairs, read from the source by sources.loop_source):
    # the line a leak comes from runs too briefly to be sampled, the loop around it is.
    keeps: tuple[tuple[int, str], ...] = ()
    # The first line of that loop (0: none, or not read): which of a function's loops the sample
    # is in (loading shards, training, validating).
    loop: int = 0
    # Those of ``keeps``' lines that add the tensor a backward ran on in the same turn
    # (``total_loss += loss`` after ``loss.backward()``): its activations were freed, so the line
    # keeps the graph's nodes, not the step's activations.
    freed: tuple[int, ...] = ()
    # That loop's gradient accumulation where a backward of it all-reduces every micro-batch: the
    # optimizer steps under ``if ... % k`` while ``.backward()`` runs every turn, not under
    # ``no_sync()``: (the gate's line, k (0: not read), the gate's condition, the lines of the
    # backwards that sync, those that skip); () otherwise. Whether it runs and what it costs (DDP
    # or FSDP, the time in collectives) is the advisor's.
    accum: tuple = ()
    # That loop's statement keeping this rank's part of a batch it split (``x.chunk(world)[rank]``,
    # ``x[rank::world]``): every rank loads the whole global batch. (line, statement); () otherwise.
    shard: tuple = ()
    # The line of this frame's file that turns cuDNN off (``torch.backends.cudnn.enabled = False``);
    # 0: none, or not read. A fact of the file (read once with its loops), carried by its frames.
    cudnn_off: int = 0


@dataclass(frozen=True, slots=True)
class StackSample:
    """One thread's stack at one instant; frames newest first."""

    ts: float
    pid: int
    thread_id: int
    thread_name: str = ""
    frames: tuple[Frame, ...] = ()
    active: bool = True  # False: py-spy saw it blocked in a syscall or lock
    owns_gil: bool = False
    is_main: bool = False
    category: Category = Category.OTHER
    os_thread_id: int | None = None  # the kernel's thread id (py-spy's thread_id is pthread's)


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Event:
    """Something the user should be told, in one line (GPU lost, target exited, ...)."""

    ts: float
    source: str
    message: str
    level: str = "info"  # info | warning | error | debug (data for the analysis, not shown)


# --------------------------------------------------------------------------- analysis results


@dataclass(frozen=True, slots=True)
class IdleInterval:
    gpu_index: int
    start: float
    end: float
    cause: str | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True)
class Finding:
    id: str
    title: str
    severity: Severity
    confidence: float  # 0..1
    evidence: tuple[str, ...]
    action: str
    expected_gain: str = ""
    cost_s: float = 0.0  # GPU-seconds this cause cost in the window; ranks findings
    gpu_index: int | None = None
    ts: float = 0.0
    first_seen: float = 0.0
    # The most steps/s (samples/s where a finding says so) could rise, as a factor, if the
    # change worked perfectly: an upper bound from the finding's own evidence; None: no
    # throughput claim (a crash avoided, a fault reported).
    gain_predicted: float | None = None


@dataclass(frozen=True, slots=True)
class Evidence:
    """What an evaluation had to go on against what a first verdict needs (advisor.engine):
    until an evaluation has enough, "no findings" would be a verdict on nothing."""

    stacks: int | None = None  # the target's main-thread stacks in the window (None: no job attached)
    stacks_needed: int = 0
    gpu_s: float | None = None  # seconds of GPU samples in the window (None: no GPU)
    gpu_needed_s: float = 0.0

    def enough(self, stacks_readable: bool = True) -> bool:
        """``stacks_readable``: False where the job's stacks cannot be sampled (they never come)."""
        stacks_ok = self.stacks is None or not stacks_readable or self.stacks >= self.stacks_needed
        return stacks_ok and (self.gpu_s is None or self.gpu_s >= self.gpu_needed_s)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the advisor concluded at ``ts``: the findings to show, ranked, and where each device's
    time went over its window (``analysis.breakdown.Breakdown`` objects). A derived stage
    returns it through the pipeline like any sample: the store keeps the latest for the panes,
    the exporter reads it; it is not recorded (a replay derives it again from the samples)."""

    ts: float
    findings: tuple[Finding, ...] = ()
    breakdowns: tuple[object, ...] = ()
    pending: tuple[Finding, ...] = ()  # fired, not yet held long enough to be shown
    # What the advisor is still collecting: set until an evaluation since the attach (or a
    # replay's jump) has had enough evidence for a verdict; None from then on.
    collecting: Evidence | None = None
    # The attached job it speaks of (None: none attached). Just after the user attaches to another
    # job, the latest verdict is still the previous job's: a pane must not show it as this one's.
    target_pid: int | None = None


@dataclass(frozen=True, slots=True)
class PaneViews:
    """What the Stacks and Ranks panes show at ``ts``, computed from the store by a derived stage
    (``analysis.views``) on the pipeline's thread, so the UI only lays it out. Like ``Verdict``,
    the store keeps the latest and it is not recorded (a replay derives it again)."""

    ts: float
    target_pid: int | None = None  # whose stacks ``stacks`` shows (None: no target)
    stacks: object | None = None  # analysis.stacks_summary.StacksView of the target
    job: object | None = None  # analysis.ranks.JobView; None: not a multi-rank job
    # analysis.memory_window.MemoryView of the target (growth and forecast per GPU, for the GPU
    # panels); None without a target.
    memory: object | None = None


@dataclass(frozen=True, slots=True)
class Reset:
    """Forget everything held so far: a replay jumping in time sends it first in the batch that
    refills the store at the new position."""

    ts: float


# --------------------------------------------------------------------------- threads as /proc sees them


@dataclass(frozen=True, slots=True)
class ThreadState:
    """One thread of a process at one instant, from /proc/PID/task/TID (the procfs source)."""

    tid: int
    name: str = ""  # the kernel's comm (Python sets it for named threads only on request)
    state: str = "?"  # R running, S sleeping, D uninterruptible (disk, NFS), T stopped, Z zombie
    cpu_ns: int | None = None  # CPU time used since the thread started (schedstat, else stat ticks)
    runs: int | None = None  # times it was scheduled onto a CPU (schedstat); None: unknown
    # Times it gave up its CPU to wait (status's voluntary_ctxt_switches): its wakes, which a busy
    # host's preemptions do not inflate as they do ``runs``. Read for a process's main thread only.
    wakes: int | None = None
    wchan: str | None = None  # kernel function it sleeps in; None: unknown or running
    syscall: str | None = None  # the syscall it is blocked in ("read", "futex", ...); None: unknown
    fd_path: str | None = None  # what that syscall's fd points at: a path, "socket:[N]", "pipe:[N]"
    fs: str | None = None  # for a path: "TYPE on MOUNTPOINT" of the filesystem holding it


@dataclass(frozen=True, slots=True)
class TaskSample:
    """A process's threads and IO counters at one instant (the target and each child of it)."""

    ts: float
    pid: int
    ppid: int | None = None
    threads: tuple[ThreadState, ...] = ()
    rchar: int | None = None  # bytes read through syscalls (files, sockets, pipes) since start
    wchar: int | None = None  # bytes written likewise


@dataclass(frozen=True, slots=True)
class SamplingCost:
    """What attached stack sampling costs, measured by the sampler on the live target over its
    last ``window_s``. Not a stored sample: the sampler keeps its latest reading (``cost``) and
    says it once as an Event."""

    ts: float
    pid: int
    window_s: float
    stacks_per_s: float  # main-thread stacks per second over the window
    sampler_cpu_pct: float  # % of one core: the sampling thread and its py-spy processes
    pause_pct: float  # % of the target's wall time it was stopped (blocking dumps, upper bound)
    job_cost_pct: float  # the estimate shown: pause plus the sampler's share of the cores
    blocking: int = 0  # blocking dumps in the window
    dumps: int = 0  # all dumps in the window, workers included
    asked_per_s: float | None = None  # the main-thread stacks per second asked for (--sample-rate)
    # Set when far fewer stacks came than asked, to why: "host-busy" (the host's CPUs are saturated:
    # py-spy runs at idle priority and takes no blocking dump), "cpu-budget" (py-spy costs more
    # CPU per stack here than the budget allows at the asked rate), "faults" (py-spy failing).
    held_back: str | None = None
    load1: float | None = None  # the host's 1-minute load when measured
    cpus: int | None = None  # the CPUs gputop may run on
    cpu_pressure_pct: float | None = None  # % of the last 10 s a runnable task waited for a CPU
    job_cpu_pct: float | None = None  # % of a core the job used over the window: the target and its ranks/workers


class TargetStatus(str, Enum):
    """Whether the attached job's stacks are being sampled."""

    ALIVE = "alive"  # sampled (or, after a passing py-spy fault, about to be again)
    EXITED = "exited"  # the process is gone: nothing is sampled, nothing is cost
    UNTRACEABLE = "untraceable"  # not Python, no permission, no py-spy: process details only

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class TargetState:
    """The attached job as its sampler (or, when none could start, the session) knows it: the one
    place the UI and the commands read whether it is sampled, when it exited and what sampling it
    costs, instead of each deriving it from the sampler's fields. Not a stored sample."""

    pid: int
    status: TargetStatus = TargetStatus.ALIVE
    exited_at: float | None = None  # when the sampler found it gone
    exit_status: str | None = None  # "code N" / "signal NAME" when it could be read
    reason: str | None = None  # why its stacks cannot be sampled (UNTRACEABLE)
    cost: SamplingCost | None = None  # the latest measured cost of sampling it

    @property
    def running_cost(self) -> SamplingCost | None:
        """The cost while the job runs: a job that exited is sampled no more and costs nothing."""
        return self.cost if self.exited_at is None else None


# Everything a source may emit; the store and the recorder dispatch on these types.
SAMPLE_TYPES = (
    SystemInfo,
    GpuInfo,
    GpuSample,
    UtilPoint,
    GpuProcess,
    HostSample,
    ProcSample,
    StackSample,
    Event,
    Finding,
    Verdict,
    Reset,
    TaskSample,
)

__all__ = [
    "Category",
    "CoreTimes",
    "Event",
    "Finding",
    "Frame",
    "GpuInfo",
    "GpuProcess",
    "GpuSample",
    "HostSample",
    "IdleInterval",
    "ProcSample",
    "Reset",
    "SAMPLE_TYPES",
    "SamplingCost",
    "Severity",
    "StackSample",
    "SystemInfo",
    "TargetState",
    "TargetStatus",
    "TaskSample",
    "ThreadState",
    "UtilPoint",
    "Verdict",
]
