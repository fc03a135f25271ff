"""The advisor's rules: a table, one function per rule, each reading one ``AnalysisContext``.

A rule's function returns a ``Hit`` (the evidence in numbers, the exact change, what it should
bring, and the GPU-seconds the cause cost in the window) or ``None``; ``Rule.evaluate`` turns it
into a ``Finding``. Adding a rule means writing one function and one row of ``RULES``.

Thresholds are named constants; each comment says where the number comes from. Shares of the
window ("idle 41 %") are shares of the time the breakdown covers: since the stack sampler
attached, up to the window length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ...analysis.breakdown import BUCKET_LABELS, CPU_DEVICE, Bucket
from ...analysis.idle import periodicity
from ...format import fmt_bytes, fmt_rate
from ...model import Category, Finding, Severity
from ...progress import CPU_WINDOW_S, TREE_BUSY_CORES
from ...throttle import POWER_MASK, THERMAL_MASK
from ..context import AnalysisContext, GpuView

# --------------------------------------------------------------------------- thresholds

# A cause must cost at least this share of the covered time, and this many seconds, to be
# reported: below ~10 % a fix is not worth a user's attention next to run-to-run noise (step
# rates vary by about ±5 % between windows on the H100 box, facts file), and a couple of
# seconds is one or two stalls, not a pattern.
MIN_COST_FRACTION = 0.10
MIN_COST_S = 1.0
# Checkpoint stalls are periodic and short; a few % of the time (one save of ~1 s every 30 s)
# is already a clear, cheap win to reclaim; 0.3 s is a save long enough for two stack samples.
CHECKPOINT_MIN_FRACTION = 0.03
CHECKPOINT_MIN_S = 0.3
# Stack-based claims need this many main-thread samples: 2 s at py-spy's default 5 Hz.
MIN_MAIN_SAMPLES = 10
# Confidence reaches its full weight at this many samples (~5 s at 5 Hz).
FULL_CONFIDENCE_SAMPLES = 25
# Host syncs: the main thread in .item()/.cpu()/synchronize in this share of its samples (all
# of them, not only during idle: while it waits, the GPU is busy draining the queue it could
# not refill) is a sync problem however the samples are spread.
HOST_SYNC_MIN_SHARE = 0.20
# Below that, a sync in every step still is one when it is steady. The host-sync workload on the
# H100 (a ~4 ms step with .item()/.cpu()/synchronize each step) spent 19 % of its wall time in
# the syncs, by its own accounting, and its breakdown read busy 41 %, sync 11 %, cpu 48 %: the
# GPU also idles while the CPU dispatches the next step, since nothing was queued ahead. The
# launch-bound workload (no syncs) had none of its samples there. A healthy loop syncs once
# per logging step (every 10-100 steps): well under 5 % of the samples.
HOST_SYNC_STEADY_SHARE = 0.05
# "Steady": the window (first to last main-thread sample) cut into stretches that should hold
# about this many sync samples each if the syncs were spread evenly (then a stretch is empty by
# chance ~5 % of the time: e^-3)...
SYNC_SAMPLES_PER_STRETCH = 3
MIN_STRETCHES, MAX_STRETCHES = 2, 20
# ...and syncs seen in at least this share of the stretches. A burst (an evaluation pass, one
# save) fills a few adjacent stretches; a per-step sync fills nearly all of them.
HOST_SYNC_STEADY_COVERAGE = 0.6
# Fewer sync samples than this say nothing about a pattern (0.8 s at py-spy's 5 Hz).
MIN_SYNC_SAMPLES = 4
# The main thread dispatching (forward/backward/optimizer/other Python) in this share of its
# samples: it is the one thing the GPU waits for.
DISPATCH_MIN_SHARE = 0.50
# GPM: a GPU "busy" (utilisation, i.e. some kernel running) at or above this...
GPM_BUSY_UTIL_PCT = 60.0
# ...whose SMs are active at most this share of the time runs kernels too small to fill it
# (launch-bound). The fp32 matmul loop on the H100 read 97 % SM activity; a healthy bf16
# trainer stays well above 50 %.
LAUNCH_BOUND_SM_ACTIVE_PCT = 40.0
# Tensor-core activity at or below this while busy is "not used" (the fp32 loop read 0.0 %).
TENSOR_IDLE_PCT = 2.0
# ...with the fp32 pipes at least this busy: the math is running, in fp32 (the loop read 77 %).
FP32_BUSY_PCT = 20.0
# Saved share of busy time when fp32 matmuls move to tensor cores. H100 SXM peaks: 67 TFLOPS
# fp32 vs 495 TFLOPS dense TF32 (~7x); real steps are part matmul, so half of the busy time is
# a conservative estimate of what TF32/bf16 gives back.
TENSOR_CORE_SAVING = 0.5
# TF32 needs Ampere (8.0); tensor cores exist from Volta (7.0).
TF32_MIN_CC = (8, 0)
TENSOR_CORE_MIN_CC = (7, 0)
# Memory: above this share of the card the caching allocator has no slack: one larger batch or
# fragmentation means an OOM or cudaMalloc retries that flush the cache (each a full sync).
MEM_NEAR_LIMIT = 0.95
# Below this share, a batch twice as large fits with room to spare (activations scale with it).
MEM_HEADROOM = 0.35
# Raising the batch helps a GPU that is not already full: SM activity below this (GPM).
HEADROOM_SM_ACTIVE_PCT = 60.0
# Clocks: throttled (power, heat, hardware) in at least this share of busy polls is a pattern.
THROTTLE_MIN_FRACTION = 0.20
# The power cap alone is how a fully loaded GPU runs (the H100 fp32 loop sat at 698 of 700 W,
# SM clock 96 % of max; dense bf16 work runs lower still at its normal limit); only clocks far
# below max under it point at a lowered power limit, and even then it is a note, not a fault.
POWER_CAP_CLOCK_RATIO = 0.6
# Clock share assumed when the clocks were not read.
DEFAULT_THROTTLED_CLOCK_RATIO = 0.85
# PCIe: below max in this share of busy polls (links downshift when idle: that is normal).
PCIE_DEGRADED_FRACTION = 0.5
MIN_BUSY_POLLS = 3
# Loader workers: more than this share of them at WORKER_SATURATED_PCT means the pool is flat out.
SATURATED_WORKER_SHARE = 0.75
# Worker stacks come one worker per second: this many before their running share counts.
MIN_WORKER_SAMPLES = 4
# Spare cores needed before more workers are the advice rather than cheaper samples.
MIN_SPARE_CORES = 2.0
# Margin on the worker count computed from the idle share (the rate estimate is rough).
WORKER_MARGIN = 1.25
# Defaults for num_workers: half of the cores that fall to one GPU (the other half stays with
# the main process' intra-op threads, the pin-memory thread and the system), and no more than 8
# before memory (every worker holds the dataset object and prefetch_factor batches) bites.
MAX_DEFAULT_WORKERS = 8
MAX_IO_WORKERS = 32  # workers blocked on reads use no CPU: more of them than cores is fine
# Oversubscription: runnable compute threads (workers x threads each) above this multiple of
# the cores, with the CPUs saturated.
OVERSUB_RATIO = 1.5
CPU_SATURATED_PCT = 85.0
# IO: iowait of this many cores on average, or this disk read rate, with workers waiting.
IOWAIT_CORES = 0.5
DISK_READ_BPS = 20e6  # 20 MB/s: far above a loader that reads from the page cache
IO_SHARE = 0.30  # of the data wait that fell into IO-wait slices
# Worker samples blocked in a read (not in a lock or queue) in at least half of them.
WORKER_READ_BLOCKED_SHARE = 0.5
# A worker at or below this CPU is not computing (blocked on something).
WORKER_BLOCKED_PCT = 50.0
# Starting a pool of workers (fork, dataset copy, first batches) stalls the GPU for this long
# at most; idle time later than that is not the restart's.
RESPAWN_STALL_S = 5.0
# Docker's default /dev/shm is 64 MiB; the guides ask for --shm-size of 1g or more for loaders.
SMALL_SHM_BYTES = 1 << 30
SHM_FILLING = 0.5


# --------------------------------------------------------------------------- rule plumbing


@dataclass(frozen=True)
class Hit:
    evidence: tuple[str, ...]
    action: str
    expected_gain: str = ""
    cost_s: float = 0.0
    confidence: float = 0.8
    gpu_index: int | None = None
    severity: Severity | None = None  # overrides the rule's default
    title: str | None = None  # overrides the rule's default


Check = Callable[[AnalysisContext], "Hit | None"]


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    severity: Severity
    check: Check
    # Seconds a finding must hold before it is shown; None: the engine's default. Zero for
    # conditions that are facts, not rates (an environment variable) or that already include
    # their own duration (stuck).
    appear_after_s: float | None = None
    # Findings this one makes moot: a hung job is not a slow one.
    supersedes: tuple[str, ...] = ()

    def evaluate(self, ctx: AnalysisContext) -> Finding | None:
        hit = self.check(ctx)
        if hit is None:
            return None
        return Finding(
            id=self.id,
            title=hit.title or self.title,
            severity=hit.severity or self.severity,
            confidence=round(min(1.0, max(0.0, hit.confidence)), 2),
            evidence=hit.evidence,
            action=hit.action,
            expected_gain=hit.expected_gain,
            cost_s=round(max(0.0, hit.cost_s), 2),
            gpu_index=hit.gpu_index,
            ts=ctx.now,
        )


# --------------------------------------------------------------------------- helpers


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def secs(x: float) -> str:
    return f"{x:.0f} s" if x >= 10 else f"{x:.1f} s"


def _confidence(dominance: float, samples: int) -> float:
    """How sure: the evidence's dominance (0..1), scaled down while samples are few."""
    weight = 0.5 + 0.5 * min(1.0, samples / FULL_CONFIDENCE_SAMPLES)
    return (0.5 + 0.45 * min(1.0, max(0.0, dominance))) * weight


def _device(g: GpuView) -> str:
    return "the training loop (no GPU)" if g.index == CPU_DEVICE else g.name


def _idle_line(g: GpuView, parts: Sequence[Bucket]) -> str:
    bd = g.breakdown
    share = sum(bd.get(b) for b in parts) / bd.total_s if bd.total_s else 0.0
    what = " + ".join(BUCKET_LABELS[b] for b in parts if bd.get(b) > 0) or BUCKET_LABELS[parts[0]]
    if g.index == CPU_DEVICE:
        return (
            f"{_device(g)} not computing {pct(bd.idle_fraction)} of the last {secs(bd.total_s)}; "
            f"{pct(share)} {what}"
        )
    return f"{g.name} idle {pct(bd.idle_fraction)} of the last {secs(bd.total_s)}; {pct(share)} {what}"


def _labels_line(g: GpuView, bucket: Bucket, what: str = "main thread in") -> str | None:
    top = g.breakdown.top_labels(bucket, 2)
    if not top:
        return None
    when = "while computing nothing" if g.index == CPU_DEVICE else "during idle"
    return f"{when}, {what} " + ", ".join(f"{lab} {pct(sh)} of samples" for lab, sh in top)


def _gain(fraction: float) -> str:
    if fraction >= 0.95:
        return f"the device waits {pct(fraction)} of the time: steps/s could rise 20x or more"
    return f"up to {1 / (1 - fraction):.1f}x steps/s if this wait disappeared ({pct(fraction)} of the time back)"


def _worst(ctx: AnalysisContext, cost: Callable[[GpuView], float], gpu_only: bool = False) -> tuple[GpuView, float] | None:
    best: tuple[GpuView, float] | None = None
    for g in ctx.gpus:
        if gpu_only and g.index == CPU_DEVICE:
            continue
        if g.breakdown.total_s <= 0:
            continue
        c = cost(g)
        if best is None or c > best[1]:
            best = (g, c)
    return best


def _significant(g: GpuView, cost_s: float, min_fraction: float = MIN_COST_FRACTION, min_s: float = MIN_COST_S) -> bool:
    total = g.breakdown.total_s
    return total > 0 and cost_s >= min_s and cost_s / total >= min_fraction


def _enough_stacks(ctx: AnalysisContext) -> bool:
    return len(ctx.main_stacks) >= MIN_MAIN_SAMPLES


def _data_s(g: GpuView) -> float:
    return g.breakdown.get(Bucket.DATA) + g.breakdown.get(Bucket.IO)


def _job_gpus(ctx: AnalysisContext) -> int:
    return max(1, sum(1 for g in ctx.gpus if g.index != CPU_DEVICE))


# A training process above this (% of one core) runs more than its Python thread: torch's threads.
MULTI_CORE_PCT = 150.0


def cores_per_gpu(ctx: AnalysisContext) -> int | None:
    return ctx.cores // _job_gpus(ctx) if ctx.cores else None


def default_workers(ctx: AnalysisContext) -> int:
    per_gpu = cores_per_gpu(ctx) or 8
    return max(2, min(MAX_DEFAULT_WORKERS, per_gpu // 2))


def workers_for(current: int, wait_fraction: float, cap: int) -> int:
    """Workers needed so the loader keeps up: today's pool delivers (1 - wait) of what the GPU
    consumes, and throughput scales with the pool while CPU or IO have room."""
    need = math.ceil(max(1, current) / max(0.05, 1.0 - wait_fraction) * WORKER_MARGIN)
    return max(current + 1, min(need, cap))


def loader_line(workers: int, prefetch: int = 2, pin: bool = True) -> str:
    pin_arg = "pin_memory=True, " if pin else ""
    return f"DataLoader(..., num_workers={workers}, {pin_arg}persistent_workers=True, prefetch_factor={prefetch})"


def _host_line(ctx: AnalysisContext) -> str | None:
    h = ctx.host
    if h is None or h.cpu_mean is None:
        return None
    return f"{h.cores}-core host at {h.cpu_mean:.0f} % CPU (~{h.spare_cores:.0f} cores spare)"


def _loader_threads_line(ctx: AnalysisContext) -> str | None:
    """With num_workers=0 and a busy host, say why workers still help: the host's CPU is the
    training process's own intra-op threads, and each worker runs torch on one thread."""
    t = ctx.target
    if t is None or t.cpu_mean is None or t.cpu_mean < MULTI_CORE_PCT:
        return None
    return (
        f"the training process itself uses {t.cpu_mean / 100:.1f} cores: torch's intra-op threads run the "
        "loading code; DataLoader workers run torch on one thread each, so the work moves to them"
    )


def _workers_cpu_line(ctx: AnalysisContext) -> str:
    w = ctx.workers
    cpus = [c.cpu_mean for c in w.current if c.cpu_mean is not None]
    if not cpus:
        return f"{w.count} loader workers"
    lo, hi = min(cpus), max(cpus)
    span = f"{lo:.0f} %" if abs(hi - lo) < 5 else f"{lo:.0f}-{hi:.0f} %"
    return f"{w.count} loader worker{'s' if w.count != 1 else ''} at {span} CPU each"


def oversubscription(ctx: AnalysisContext) -> tuple[int, int] | None:
    """(compute threads of the loader workers, cores) when they oversubscribe a busy host."""
    h, w = ctx.host, ctx.workers
    if h is None or h.cpu_mean is None or w.count == 0:
        return None
    threads = sum(max(1, c.threads or 1) for c in w.current)
    if threads > OVERSUB_RATIO * h.cores and h.cpu_mean >= CPU_SATURATED_PCT:
        return threads, h.cores
    return None


def _main_share(ctx: AnalysisContext, *cats: Category) -> float:
    shares = ctx.main_shares()
    return sum(shares.get(c, 0.0) for c in cats)


def _env_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


# --------------------------------------------------------------------------- rules: hangs


def check_stuck(ctx: AnalysisContext) -> Hit | None:
    v = ctx.stuck
    if v is None or not v.stuck:
        return None
    if v.category is Category.CHECKPOINT_IO and ctx.host and (ctx.host.disk_write_recent or 0) > 0:
        return None  # a long save that is still writing: see checkpoint-stall
    held = f"{'' if v.held_exact else '≥ '}{v.held_s:.0f} s"
    cat = v.category.value if v.category else "unknown"
    ev = [f"main thread of PID {ctx.target_pid} unchanged for {held} at {v.where} ({cat})"]
    gpus = [g for g in ctx.gpus if g.index != CPU_DEVICE]
    if gpus:
        ev.append(", ".join(f"{g.name} at {_recent_util(g):.0f} %" for g in gpus) + " over the last 5 s")
    if ctx.workers.count:
        ev.append(_workers_cpu_line(ctx))
    if v.tree_cores is not None:
        # The progress check's own number: why an unchanged stack is a hang, not a slow step.
        idle = v.tree_cores < TREE_BUSY_CORES  # else a collective, spinning without progress
        ev.append(f"the job's processes at {v.tree_cores * 100:.0f} % CPU over the last "
                  f"{min(CPU_WINDOW_S, v.held_s):.0f} s{': nothing is computing' if idle else ' (spinning)'}")
    if v.category in (Category.DATA_WAIT, Category.DATA_FETCH):
        action = (
            f"see where the workers wait: py-spy dump --pid {ctx.target_pid} --subprocesses; "
            "make a hang fail instead of waiting forever: DataLoader(..., timeout=120)"
        )
    elif v.category is Category.COLLECTIVE:
        action = (
            f"see which rank is missing: py-spy dump --pid {ctx.target_pid} on every rank; "
            "NCCL_DEBUG=INFO TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and "
            "dist.init_process_group(..., timeout=datetime.timedelta(minutes=10)) so a hang raises"
        )
    else:
        action = f"see every thread: py-spy dump --pid {ctx.target_pid} --locals (the deadlock is usually visible)"
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain="the job makes progress again",
        cost_s=v.held_s * max(1, len(gpus)),
        confidence=0.9 if v.held_exact else 0.8,
        gpu_index=gpus[0].index if gpus else None,
        title=f"Job stuck: no progress for {held}",
    )


def _recent_util(g: GpuView, seconds: float = 5.0) -> float:
    xs = [s for s in g.slices if s.end >= g.breakdown.t1 - seconds]
    return sum(s.util for s in xs) / len(xs) if xs else 0.0


# --------------------------------------------------------------------------- rules: input pipeline


def check_data_starved(ctx: AnalysisContext) -> Hit | None:
    """num_workers=0: the training thread loads every batch itself."""
    if ctx.workers.count or not _enough_stacks(ctx):
        return None
    if _main_share(ctx, Category.DATA_FETCH) < _main_share(ctx, Category.DATA_WAIT):
        return None  # it waits on a queue: there are workers we cannot see
    found = _worst(ctx, _data_s)
    if found is None or not _significant(found[0], found[1]):
        return None
    g, cost = found
    frac = cost / g.breakdown.total_s
    n = default_workers(ctx)
    ev = [_idle_line(g, [Bucket.DATA, Bucket.IO])]
    line = _labels_line(g, Bucket.DATA)
    if line:
        ev.append(line)
    ev.append("no DataLoader worker processes: the training process loads every batch itself (num_workers=0)")
    threads = _loader_threads_line(ctx)
    if threads:
        ev.append(threads)
    host = _host_line(ctx)
    if host:
        ev.append(host)
    return Hit(
        evidence=tuple(ev),
        action=f"{loader_line(n, pin=g.index != CPU_DEVICE)}  # {n} workers for {cores_per_gpu(ctx) or '?'} cores"
        + (" per GPU" if g.index != CPU_DEVICE else ""),
        expected_gain=_gain(frac),
        cost_s=cost,
        confidence=_confidence(g.breakdown.idle_sample_share(Bucket.DATA) or frac, g.breakdown.idle_samples),
        gpu_index=_gpu_index(g),
        title=f"{_device(g)} waits for data {pct(frac)} of the time: no DataLoader workers",
    )


def _gpu_index(g: GpuView) -> int | None:
    return None if g.index == CPU_DEVICE else g.index


def workers_busy(ctx: AnalysisContext) -> bool:
    """The loader is CPU-bound: most workers at a full core, or (on a host too busy to give
    them one) their stacks, whenever they are working on a batch, running rather than blocked
    (blocked in a fetch is IO or a lock; waiting for the next index is not work)."""
    w = ctx.workers
    if not w.count:
        return False
    if w.saturated >= max(1, SATURATED_WORKER_SHARE * w.count):
        return True
    fetching = [s for s in ctx.worker_stacks if s.category is Category.DATA_FETCH]
    if len(fetching) < MIN_WORKER_SAMPLES:
        return False
    return sum(1 for s in fetching if s.active) / len(fetching) >= SATURATED_WORKER_SHARE


def check_workers_saturated(ctx: AnalysisContext) -> Hit | None:
    w = ctx.workers
    if not w.count or not _enough_stacks(ctx) or oversubscription(ctx) or not workers_busy(ctx):
        return None
    found = _worst(ctx, _data_s)
    if found is None or not _significant(found[0], found[1]):
        return None
    g, cost = found
    frac = cost / g.breakdown.total_s
    ev = [_idle_line(g, [Bucket.DATA, Bucket.IO])]
    line = _labels_line(g, Bucket.DATA)
    if line:
        ev.append(line)
    ev.append(f"{_workers_cpu_line(ctx)}: the pool is flat out")
    host = _host_line(ctx)
    if host:
        ev.append(host)
    spare = ctx.host.spare_cores if ctx.host else None
    if spare is not None and spare >= MIN_SPARE_CORES:
        # room for the main process and its pin-memory thread
        cap = max(w.count + 1, min(w.count + int(spare), (cores_per_gpu(ctx) or w.count + int(spare)) - 2))
        n = workers_for(w.count, frac, cap)
        action = f"{loader_line(n, pin=g.index != CPU_DEVICE)}  # was {w.count}; {spare:.0f} cores are idle"
        gain = _gain(frac)
    else:
        action = (
            "the CPUs are the limit: make each sample cheaper - decode/augment on the GPU "
            "(torchvision.transforms.v2 on CUDA tensors, or NVIDIA DALI), cache decoded samples "
            "(e.g. uint8 tensors in a memory-mapped file), or use a host with more cores per GPU"
        )
        gain = _gain(frac) + " (bounded by how much cheaper each sample gets)"
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain=gain,
        cost_s=cost,
        confidence=_confidence(g.breakdown.idle_sample_share(Bucket.DATA) or frac, g.breakdown.idle_samples),
        gpu_index=_gpu_index(g),
        title=f"{_device(g)} waits for data {pct(frac)} of the time: loader workers saturated",
    )


def check_cpu_oversubscribed(ctx: AnalysisContext) -> Hit | None:
    over = oversubscription(ctx)
    if over is None or not _enough_stacks(ctx):
        return None
    threads, cores = over
    found = _worst(ctx, lambda g: _data_s(g) + g.breakdown.get(Bucket.CPU))
    if found is None or not _significant(found[0], found[1]):
        return None
    g, cost = found
    frac = cost / g.breakdown.total_s
    w = ctx.workers
    per = max(1, round(threads / max(1, w.count)))
    n = max(1, cores // (w.count + 1))
    omp = ctx.env.get("OMP_NUM_THREADS")
    ev = [
        _idle_line(g, [Bucket.DATA, Bucket.IO, Bucket.CPU]),
        f"{w.count} loader workers x ~{per} threads = {threads} threads on {cores} cores "
        f"(host CPU {ctx.host.cpu_mean:.0f} %)" if ctx.host and ctx.host.cpu_mean is not None else "",
        f"OMP_NUM_THREADS={omp} in the target's environment" if omp else "OMP_NUM_THREADS is not set",
    ]
    if ctx.host and ctx.host.load1_max is not None:
        ev.append(f"load average {ctx.host.load1_max:.0f} on {cores} cores")
    return Hit(
        evidence=tuple(e for e in ev if e),
        action=(
            f"OMP_NUM_THREADS={n} MKL_NUM_THREADS={n} in the job's environment, and in the loader "
            f"DataLoader(..., worker_init_fn=lambda _: torch.set_num_threads({n}))  "
            f"# {w.count + 1} processes x {n} thread{'s' if n != 1 else ''} for {cores} cores"
        ),
        expected_gain=_gain(frac) + "; threads stop evicting each other from the cores",
        cost_s=cost,
        confidence=_confidence(min(1.0, threads / (cores * 4)), len(ctx.main_stacks)),
        gpu_index=_gpu_index(g),
        title=f"CPU oversubscribed: {threads} loader threads on {cores} cores",
    )


def _worker_read_blocked_share(ctx: AnalysisContext) -> tuple[float, int]:
    """Share of loader-worker samples blocked inside the fetch outside any lock or queue:
    waiting on a read."""
    xs = ctx.worker_stacks
    if not xs:
        return 0.0, 0
    blocked = sum(1 for s in xs if s.category is Category.DATA_FETCH and not s.active and not _in_wait(s))
    return blocked / len(xs), len(xs)


_WAIT_FILES = ("threading.py", "synchronize.py", "queues.py", "queue.py", "connection.py", "selectors.py")


def _in_wait(s) -> bool:
    f = s.frames[0] if s.frames else None
    if f is None:
        return False
    name = f.filename.replace("\\", "/").rsplit("/", 1)[-1]
    return name in _WAIT_FILES or bool(f.code and ("sleep(" in f.code or ".wait(" in f.code))


def check_io_bound(ctx: AnalysisContext) -> Hit | None:
    if not _enough_stacks(ctx):
        return None
    w = ctx.workers
    if workers_busy(ctx):
        return None  # CPU-bound workers: see workers-saturated
    found = _worst(ctx, _data_s)
    if found is None or not _significant(found[0], found[1]):
        return None
    g, cost = found
    bd = g.breakdown
    io_share = bd.get(Bucket.IO) / cost if cost else 0.0
    h = ctx.host
    iowait = h.iowait_cores if h else None
    disk = h.disk_read_mean if h else None
    blocked, nw = _worker_read_blocked_share(ctx)
    signals = [
        io_share >= IO_SHARE,
        iowait is not None and iowait >= IOWAIT_CORES and (disk or 0) >= DISK_READ_BPS,
        nw >= MIN_WORKER_SAMPLES and blocked >= WORKER_READ_BLOCKED_SHARE,
    ]
    if not any(signals):
        return None
    frac = cost / bd.total_s
    ev = [_idle_line(g, [Bucket.DATA, Bucket.IO])]
    line = _labels_line(g, Bucket.DATA)
    if line:
        ev.append(line)
    if w.count:
        ev.append(f"{_workers_cpu_line(ctx)}: they wait, they do not compute")
    if nw:
        ev.append(f"worker stacks blocked in a read in {pct(blocked)} of {nw} samples")
    if iowait is not None:
        ev.append(f"iowait {iowait:.1f} cores on average, disk reads {fmt_rate(disk)}")
    n = workers_for(w.count, frac, MAX_IO_WORKERS)
    return Hit(
        evidence=tuple(ev),
        action=(
            f"{loader_line(n, 4, pin=g.index != CPU_DEVICE)}  # reads overlap; blocked workers cost no CPU. "
            "Then move the data closer: copy the dataset to local NVMe or RAM (/dev/shm if it fits), "
            "and pack small files into large shards (WebDataset tar shards, one memory-mapped array)"
        ),
        expected_gain=_gain(frac),
        cost_s=cost,
        confidence=_confidence(max(io_share, blocked, 1.0 if signals[1] else 0.0), bd.idle_samples),
        gpu_index=_gpu_index(g),
        title=f"{_device(g)} waits for storage {pct(frac)} of the time: input is IO-bound",
    )


# --------------------------------------------------------------------------- rules: the training step


@dataclass(frozen=True)
class SyncPattern:
    """How the main thread's host-sync samples fall over the window."""

    share: float  # of all main-thread samples
    samples: int
    stretches: int  # the window cut into this many equal parts...
    covered: int  # ...of which this many hold a sync sample

    @property
    def coverage(self) -> float:
        return self.covered / self.stretches if self.stretches else 0.0

    @property
    def steady(self) -> bool:
        """A sync in (nearly) every step: frequent enough, and all through the window."""
        return (
            self.share >= HOST_SYNC_STEADY_SHARE
            and self.samples >= MIN_SYNC_SAMPLES
            and self.coverage >= HOST_SYNC_STEADY_COVERAGE
        )

    @property
    def dominant(self) -> bool:
        return self.share >= HOST_SYNC_MIN_SHARE

    @property
    def claims_dispatch(self) -> bool:
        """The syncs serialise the step: the GPU idles while the CPU dispatches after each one,
        so that idle time is theirs (and not launch overhead) until they are gone."""
        return self.steady or self.dominant


def sync_pattern(ctx: AnalysisContext) -> SyncPattern:
    xs = ctx.main_stacks
    syncs = [s.ts for s in xs if s.category is Category.HOST_SYNC]
    n = len(syncs)
    share = n / len(xs) if xs else 0.0
    k = max(MIN_STRETCHES, min(MAX_STRETCHES, n // SYNC_SAMPLES_PER_STRETCH))
    t0, t1 = (xs[0].ts, xs[-1].ts) if xs else (0.0, 0.0)
    if n == 0 or t1 <= t0:
        return SyncPattern(share, n, k, 1 if n else 0)
    width = (t1 - t0) / k
    covered = len({min(k - 1, int((t - t0) / width)) for t in syncs})
    return SyncPattern(share, n, k, covered)


def check_host_sync(ctx: AnalysisContext) -> Hit | None:
    if not _enough_stacks(ctx):
        return None
    pat = sync_pattern(ctx)
    if not pat.claims_dispatch:
        return None
    # The cost: the GPU idle while the thread waits in the sync, and while it then dispatches
    # the next step (forward/backward/optimizer with nothing queued): without the sync that
    # dispatch would overlap the GPU's work on the step before.
    found = _worst(ctx, lambda g: g.breakdown.get(Bucket.SYNC) + g.breakdown.get(Bucket.CPU), gpu_only=True)
    if found is None or not _significant(found[0], found[1]):
        return None
    g, cost = found
    bd = g.breakdown
    frac = cost / bd.total_s
    places = ctx.main_labels([Category.HOST_SYNC], 3)
    ev = [
        _idle_line(g, [Bucket.SYNC, Bucket.CPU]),
        f"main thread waiting on the GPU in {pct(pat.share)} of its samples: "
        + ", ".join(f"{lab} {pct(sh)}" for lab, sh in places),
    ]
    if pat.steady:
        ev.append(
            f"syncs all through the window (in {pat.covered} of {pat.stretches} equal stretches): "
            "every step, not a burst"
        )
    ev.append(
        f"{g.name} idle {pct(bd.get(Bucket.SYNC) / bd.total_s)} while the thread waits in the sync and "
        f"{pct(bd.get(Bucket.CPU) / bd.total_s)} while it then dispatches the next step: "
        "each sync drains the queue, so the CPU cannot launch ahead"
    )
    first = f" (first: {places[0][0]})" if places else ""
    return Hit(
        evidence=tuple(ev),
        action=(
            f"remove the per-step .item()/.cpu()/.tolist()/print(loss) from the loop{first}; accumulate on "
            "the GPU and read it every 100 steps: `running += loss.detach()` each step, then "
            "`if step % 100 == 0: log(running.item() / 100); running.zero_()`; no torch.cuda.synchronize() "
            "in the loop (time with torch.cuda.Event(enable_timing=True) if needed); keep CUDA_LAUNCH_BLOCKING unset"
        ),
        expected_gain=_gain(frac) + ": the CPU queues steps ahead again",
        cost_s=cost,
        confidence=_confidence(
            max(min(1.0, pat.share * 2), 0.8 * pat.coverage if pat.steady else 0.0), len(ctx.main_stacks)
        ),
        gpu_index=g.index,
        title=f"Host-device syncs every step: {g.name} idle {pct(bd.idle_fraction)}",
    )


def check_pageable_h2d(ctx: AnalysisContext) -> Hit | None:
    found = _worst(ctx, lambda g: g.breakdown.get(Bucket.H2D), gpu_only=True)
    if found is None or not _significant(found[0], found[1]):
        return None
    g, cost = found
    frac = cost / g.breakdown.total_s
    ev = [_idle_line(g, [Bucket.H2D])]
    line = _labels_line(g, Bucket.H2D)
    if line:
        ev.append(line)
    if g.efficiency.pcie_rx_mean is not None:
        ev.append(f"PCIe receive {fmt_rate(g.efficiency.pcie_rx_mean)} on average")
    if ctx.pin_memory_thread is False and ctx.workers.count:
        ev.append("no pin-memory thread in the process: batches are copied from pageable memory")
    return Hit(
        evidence=tuple(ev),
        action=(
            "copy from pinned memory, asynchronously: DataLoader(..., pin_memory=True) and "
            "x = x.to(device, non_blocking=True); for a host tensor built in the loop, allocate it "
            "once pinned: buf = torch.empty(shape, dtype=dtype, pin_memory=True); buf.copy_(src)"
        ),
        expected_gain=_gain(frac) + "; pinned copies run at full PCIe speed and overlap compute",
        cost_s=cost,
        confidence=_confidence(g.breakdown.idle_sample_share(Bucket.H2D) or frac, g.breakdown.idle_samples),
        gpu_index=g.index,
        title=f"{g.name} waits for host-to-device copies {pct(frac)} of the time",
    )


def check_checkpoint_stall(ctx: AnalysisContext) -> Hit | None:
    found = _worst(ctx, lambda g: g.breakdown.get(Bucket.CHECKPOINT))
    if found is None or not _significant(found[0], found[1], CHECKPOINT_MIN_FRACTION, CHECKPOINT_MIN_S):
        return None
    g, cost = found
    frac = cost / g.breakdown.total_s
    saves = _runs(ctx, Category.CHECKPOINT_IO)
    ev = [_idle_line(g, [Bucket.CHECKPOINT])]
    if saves:
        longest = max(b - a for a, b in saves)
        ev.append(f"{len(saves)} save{'s' if len(saves) != 1 else ''} seen, the longest {secs(longest)}")
    every = periodicity([iv for iv in g.idle if iv.duration >= CHECKPOINT_MIN_S])
    if every is not None and g.index != CPU_DEVICE:
        ev.append(f"{g.name} goes idle in bursts about every {secs(every)}")
    line = _labels_line(g, Bucket.CHECKPOINT)
    if line:
        ev.append(line)
    return Hit(
        evidence=tuple(ev),
        action=(
            "save in the background: torch.distributed.checkpoint.async_save(state_dict, "
            "checkpoint_id=path) (torch >= 2.3), or copy the state to CPU "
            "({k: v.detach().cpu() for k, v in sd.items()}) and torch.save it in a thread; "
            "or save less often"
        ),
        expected_gain=_gain(frac),
        cost_s=cost,
        confidence=_confidence(g.breakdown.idle_sample_share(Bucket.CHECKPOINT) or frac * 5, g.breakdown.idle_samples + 10),
        gpu_index=_gpu_index(g),
        title=f"Checkpoint saves stall {_device(g)} {pct(frac)} of the time",
    )


def _runs(ctx: AnalysisContext, cat: Category, gap: float = 1.0) -> list[tuple[float, float]]:
    """Spans of consecutive main-thread samples in ``cat`` (a save, a sync)."""
    out: list[list[float]] = []
    for s in ctx.main_stacks:
        if s.category is not cat:
            continue
        if out and s.ts - out[-1][1] <= gap:
            out[-1][1] = s.ts
        else:
            out.append([s.ts, s.ts])
    return [(a, b) for a, b in out]


def check_collective_wait(ctx: AnalysisContext) -> Hit | None:
    found = _worst(ctx, lambda g: g.breakdown.get(Bucket.COLLECTIVE), gpu_only=True)
    if found is None or not _significant(found[0], found[1]):
        return None
    g, cost = found
    frac = cost / g.breakdown.total_s
    ev = [_idle_line(g, [Bucket.COLLECTIVE])]
    line = _labels_line(g, Bucket.COLLECTIVE)
    if line:
        ev.append(line)
    nccl = {k: v for k, v in ctx.env.items() if k.startswith("NCCL_")}
    if nccl:
        ev.append("NCCL settings: " + " ".join(f"{k}={v}" for k, v in sorted(nccl.items())))
    return Hit(
        evidence=tuple(ev),
        action=(
            "NCCL_DEBUG=INFO shows the transport (NET/Socket between GPUs of one node means P2P/NVLink "
            "is off: check NCCL_P2P_DISABLE, NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE); compare step times "
            "across ranks for a straggler; overlap communication: DDP(..., bucket_cap_mb=25, gradient_as_bucket_view=True)"
        ),
        expected_gain=_gain(frac),
        cost_s=cost,
        confidence=_confidence(g.breakdown.idle_sample_share(Bucket.COLLECTIVE) or frac, g.breakdown.idle_samples),
        gpu_index=g.index,
        title=f"{g.name} waits on collectives {pct(frac)} of the time",
    )


def check_launch_bound(ctx: AnalysisContext) -> Hit | None:
    if not _enough_stacks(ctx):
        return None
    dispatch = _main_share(ctx, Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER, Category.OTHER)
    if dispatch < DISPATCH_MIN_SHARE:
        return None
    # With a sync in every step the idle dispatch time is the sync's (host-sync counts it): the
    # same loop without the sync queues ahead. Only kernels too small for the SMs remain ours.
    synced = sync_pattern(ctx).claims_dispatch

    def cost(g: GpuView) -> float:
        e, bd = g.efficiency, g.breakdown
        starved_sms = 0.0
        if e.sm_active is not None and e.util_busy_mean and e.util_busy_mean >= GPM_BUSY_UTIL_PCT:
            if e.sm_active <= LAUNCH_BOUND_SM_ACTIVE_PCT:
                starved_sms = bd.busy_s * max(0.0, 1.0 - e.sm_active / e.util_busy_mean)
        return starved_sms + (0.0 if synced else bd.get(Bucket.CPU))

    found = _worst(ctx, cost, gpu_only=True)
    if found is None or not _significant(found[0], found[1]):
        return None
    g, c = found
    e, bd = g.efficiency, g.breakdown
    frac = c / bd.total_s
    ev = [f"main thread dispatching (forward/backward/optimizer Python) in {pct(dispatch)} of its samples"]
    if e.sm_active is not None and e.util_busy_mean is not None:
        ev.append(
            f"{g.name} 'busy' {e.util_busy_mean:.0f} % but SMs active only {e.sm_active:.0f} %: "
            "kernels too small to fill the GPU"
        )
    if bd.get(Bucket.CPU) > 0 and not synced:
        ev.append(_idle_line(g, [Bucket.CPU]))
    mem = e.mem_peak_fraction
    bigger = f"; GPU memory {pct(mem)} used, so a 4x batch fits" if mem is not None and mem < MEM_HEADROOM else ""
    return Hit(
        evidence=tuple(ev),
        action=(
            'model = torch.compile(model, mode="reduce-overhead")  # fuses kernels and replays the step '
            "as a CUDA graph; or raise batch_size so each launch does more work; "
            "optimizers: torch.optim.AdamW(..., fused=True)" + bigger
        ),
        expected_gain=f"up to {pct(frac)} of the GPU time back: fewer, larger kernels per step",
        cost_s=c,
        confidence=_confidence(dispatch, len(ctx.main_stacks)),
        gpu_index=g.index,
        title=f"Launch-bound: the CPU cannot keep {g.name} fed with kernels",
    )


def check_no_tensor_cores(ctx: AnalysisContext) -> Hit | None:
    def cost(g: GpuView) -> float:
        e = g.efficiency
        if e.tensor_active is None or e.util_busy_mean is None or e.util_busy_mean < GPM_BUSY_UTIL_PCT:
            return 0.0
        if e.tensor_active > TENSOR_IDLE_PCT or (e.fp32_active or 0.0) < FP32_BUSY_PCT:
            return 0.0
        cc = e.compute_capability
        if cc is not None and tuple(cc) < TENSOR_CORE_MIN_CC:
            return 0.0
        return g.breakdown.busy_s * TENSOR_CORE_SAVING

    found = _worst(ctx, cost, gpu_only=True)
    if found is None or found[1] <= 0:
        return None
    g, c = found
    e = g.efficiency
    cc = e.compute_capability
    tf32 = cc is None or tuple(cc) >= TF32_MIN_CC
    ev = [
        f"{g.name} busy {e.util_busy_mean:.0f} % while tensor cores are active {e.tensor_active:.1f} % "
        f"and the fp32 pipes {e.fp32_active:.0f} % (GPM, {e.busy_polls} busy polls)",
        f"compute capability {cc[0]}.{cc[1]}: tensor cores{' with TF32' if tf32 else ''} available"
        if cc else "tensor cores available on this GPU",
    ]
    if tf32:
        action = (
            'with torch.autocast("cuda", dtype=torch.bfloat16): around forward and loss; or at least '
            "torch.backends.cuda.matmul.allow_tf32 = True and torch.backends.cudnn.allow_tf32 = True "
            '(= torch.set_float32_matmul_precision("high"))'
        )
    else:
        action = (
            'with torch.autocast("cuda", dtype=torch.float16): around forward and loss, with '
            'scaler = torch.amp.GradScaler("cuda"); scaler.scale(loss).backward(); scaler.step(opt); scaler.update()'
        )
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain="matmuls move to the tensor cores (several times the fp32 rate): "
        f"roughly {pct(TENSOR_CORE_SAVING)} of the busy time back in matmul-heavy steps",
        cost_s=c,
        confidence=0.9 if e.busy_polls >= 5 else 0.7,
        gpu_index=g.index,
        title=f"{g.name} busy but tensor cores idle: fp32 math",
    )


# --------------------------------------------------------------------------- rules: memory


def check_memory_near_limit(ctx: AnalysisContext) -> Hit | None:
    cands = [g for g in ctx.gpus if (g.efficiency.mem_peak_fraction or 0.0) >= MEM_NEAR_LIMIT]
    if not cands:
        return None
    g = max(cands, key=lambda x: x.efficiency.mem_peak_fraction or 0.0)
    e = g.efficiency
    alloc = ctx.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    first = (
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less fragmentation); "
        if "expandable_segments" not in alloc
        else ""
    )
    return Hit(
        evidence=(
            f"{g.name} memory peaked at {fmt_bytes(e.mem_used_peak)} of {fmt_bytes(e.mem_total)} "
            f"({pct(e.mem_peak_fraction)}) in the window",
            f"PYTORCH_CUDA_ALLOC_CONF={alloc}" if alloc else "PYTORCH_CUDA_ALLOC_CONF is not set",
        ),
        action=(
            first + "activation checkpointing of the largest blocks: "
            "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False); bf16 autocast halves "
            "activations; or halve the batch and accumulate: (loss / 2).backward() with "
            "optimizer.step() every 2 micro-batches"
        ),
        expected_gain="room for the peak: no OOM and no allocator retries (each flushes the cache and syncs)",
        cost_s=0.0,
        confidence=0.9,
        gpu_index=g.index,
        title=f"{g.name} memory near its limit ({pct(e.mem_peak_fraction)})",
    )


def check_memory_headroom(ctx: AnalysisContext) -> Hit | None:
    def fits(g: GpuView) -> bool:
        e = g.efficiency
        frac = e.mem_peak_fraction
        if frac is None or frac >= MEM_HEADROOM or e.busy_polls < MIN_BUSY_POLLS:
            return False
        # A bigger batch helps a GPU that is not full; one starved of data it does not help.
        if _data_s(g) > MIN_COST_FRACTION * g.breakdown.total_s:
            return False
        return e.sm_active is not None and e.sm_active < HEADROOM_SM_ACTIVE_PCT

    cands = [g for g in ctx.gpus if g.index != CPU_DEVICE and fits(g)]
    if not cands:
        return None
    g = min(cands, key=lambda x: x.efficiency.mem_peak_fraction or 1.0)
    e = g.efficiency
    factor = max(2, int(MEM_NEAR_LIMIT * 0.8 / max(0.01, e.mem_peak_fraction or 0.01)))
    factor = min(factor, 8)
    return Hit(
        evidence=(
            f"{g.name} memory peaked at {fmt_bytes(e.mem_used_peak)} of {fmt_bytes(e.mem_total)} "
            f"({pct(e.mem_peak_fraction)})",
            f"SMs active {e.sm_active:.0f} % while busy: the GPU is not full",
        ),
        action=f"raise batch_size {factor}x (and scale the learning rate, e.g. linearly with warm-up)",
        expected_gain="more work per kernel launch and per step: higher throughput while memory allows",
        cost_s=0.0,
        confidence=0.6,
        gpu_index=g.index,
        title=f"{g.name} has memory to spare: a larger batch fits",
    )


# --------------------------------------------------------------------------- rules: the machine


def check_throttling(ctx: AnalysisContext) -> Hit | None:
    def cost(g: GpuView) -> float:
        e = g.efficiency
        if e.busy_polls < MIN_BUSY_POLLS or e.throttle_fraction < THROTTLE_MIN_FRACTION:
            return 0.0
        ratio = e.clock_ratio if e.clock_ratio is not None else DEFAULT_THROTTLED_CLOCK_RATIO
        power_only = not (e.throttle_mask & ~POWER_MASK)
        if power_only and ratio >= POWER_CAP_CLOCK_RATIO:
            return 0.0  # running at the power limit at near-full clocks: how a loaded GPU works
        return g.breakdown.busy_s * e.throttle_fraction * max(0.01, 1.0 - ratio)

    found = _worst(ctx, cost, gpu_only=True)
    if found is None or found[1] <= 0:
        return None
    g, c = found
    e = g.efficiency
    reasons = ", ".join(f"{w} {pct(f)}" for w, f in e.throttle_reasons)
    ev = [f"{g.name} clocks held down in {pct(e.throttle_fraction)} of busy polls: {reasons}"]
    if e.clock_ratio is not None:
        ev.append(f"SM clock at {pct(e.clock_ratio)} of its maximum while limited")
    if e.temperature_max is not None:
        ev.append(f"temperature up to {e.temperature_max:.0f} °C")
    if e.power_mean is not None and e.power_limit:
        ev.append(f"power {e.power_mean:.0f} W of a {e.power_limit:.0f} W limit while busy")
    if e.throttle_mask & THERMAL_MASK:
        action = (
            "cooling: check airflow, fans and inlet temperature (nvidia-smi -q -d TEMPERATURE,PERFORMANCE "
            "shows the slowdown temperature); keep the GPU below it"
        )
    elif e.throttle_mask & ~POWER_MASK:
        action = (
            "hardware slowdown or power brake: check the power supply and cables, and "
            "nvidia-smi -q -d PERFORMANCE for the active reason; report to the machine's operator"
        )
    else:
        action = (
            "the power limit holds the clocks far below max: compare nvidia-smi -q -d POWER "
            "(Current vs Default Power Limit) and restore it: sudo nvidia-smi -pl <default W>"
        )
    power_only = not (e.throttle_mask & ~POWER_MASK)
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain=f"clocks back to maximum: about {secs(c)} of GPU time in this window",
        cost_s=c,
        confidence=0.9,
        gpu_index=g.index,
        severity=Severity.INFO if power_only else None,
        title=f"{g.name} throttled: {e.throttle_reasons[0][0] if e.throttle_reasons else 'clocks limited'}",
    )


def check_pcie_degraded(ctx: AnalysisContext) -> Hit | None:
    cands = [
        g for g in ctx.gpus
        if g.index != CPU_DEVICE
        and g.efficiency.busy_polls >= MIN_BUSY_POLLS
        and g.efficiency.pcie_degraded_fraction >= PCIE_DEGRADED_FRACTION
    ]
    if not cands:
        return None
    g = max(cands, key=lambda x: x.breakdown.get(Bucket.H2D))
    e = g.efficiency
    (gen, width), (mgen, mwidth) = e.pcie_link, e.pcie_max
    return Hit(
        evidence=(
            f"{g.name} PCIe link gen {gen} x{width} while busy in {pct(e.pcie_degraded_fraction)} of busy polls; "
            f"the link can do gen {mgen} x{mwidth}",
            "links slow down when idle to save power; this one stays slow under load",
        ),
        action=(
            "check the link: nvidia-smi -q -d PCIE and sudo lspci -vv | grep -E 'LnkCap|LnkSta'; "
            "reseat the card or use a x16 slot, and check the BIOS PCIe generation setting"
        ),
        expected_gain="full host-device bandwidth for copies and data loading",
        cost_s=g.breakdown.get(Bucket.H2D),
        confidence=0.85,
        gpu_index=g.index,
        title=f"{g.name} PCIe link below its maximum (gen {gen} x{width} of gen {mgen} x{mwidth})",
    )


def check_persistence_off(ctx: AnalysisContext) -> Hit | None:
    off = [g for g in ctx.gpus if g.info is not None and g.info.persistence_mode is False]
    if not off:
        return None
    names = ", ".join(g.name for g in off)
    return Hit(
        evidence=(f"persistence mode is off on {names}",
                  "the driver tears the GPU down when no process holds it: every job start pays seconds of init"),
        action="sudo nvidia-smi -pm 1  (or enable the nvidia-persistenced service)",
        expected_gain="faster job starts and steadier clocks between jobs",
        cost_s=0.0,
        confidence=1.0,
        gpu_index=off[0].index,
    )


def check_ecc_errors(ctx: AnalysisContext) -> Hit | None:
    bad = [g for g in ctx.gpus if (g.efficiency.ecc_uncorrected or 0) > 0]
    if bad:
        g = bad[0]
        return Hit(
            evidence=(f"{g.name}: {g.efficiency.ecc_uncorrected} uncorrectable ECC errors since the driver loaded",),
            action=(
                "stop using this GPU for training until checked: nvidia-smi -q -d ECC,ROW_REMAPPER; "
                "drain the node, reset the GPU (sudo nvidia-smi -r -i "
                f"{g.index}) or reboot; report it to the provider if it recurs"
            ),
            expected_gain="results you can trust: uncorrectable errors can corrupt training silently or crash it",
            cost_s=0.0,
            confidence=1.0,
            gpu_index=g.index,
            severity=Severity.CRITICAL,
        )
    rising = [g for g in ctx.gpus if (g.efficiency.ecc_corrected_delta or 0) > 0]
    if rising:
        g = rising[0]
        return Hit(
            evidence=(f"{g.name}: {g.efficiency.ecc_corrected_delta} corrected ECC errors in the window",),
            action="watch it: nvidia-smi -q -d ECC,ROW_REMAPPER; a steady rise precedes row remapping or failure",
            expected_gain="early warning of a failing memory",
            cost_s=0.0,
            confidence=0.8,
            gpu_index=g.index,
            severity=Severity.INFO,
            title=f"{g.name} corrected ECC errors rising",
        )
    return None


def check_cuda_launch_blocking(ctx: AnalysisContext) -> Hit | None:
    if not _env_true(ctx.env.get("CUDA_LAUNCH_BLOCKING")):
        return None
    idle = sum(g.breakdown.idle_s for g in ctx.gpus if g.index != CPU_DEVICE)
    return Hit(
        evidence=(
            f"CUDA_LAUNCH_BLOCKING={ctx.env.get('CUDA_LAUNCH_BLOCKING')} in the environment of PID {ctx.target_pid}",
            "every kernel launch waits for the kernel to finish: the CPU can never queue work ahead",
        ),
        action="unset CUDA_LAUNCH_BLOCKING (remove it from the launch script or job spec): it is for debugging only",
        expected_gain="asynchronous launches: often 1.5-3x steps/s for small and medium kernels",
        cost_s=idle,
        confidence=1.0,
    )


# Environment settings that slow a job; (variable, bad values or None for any, why, fix).
SLOW_ENV: tuple[tuple[str, tuple[str, ...] | None, str, str], ...] = (
    ("PYTORCH_NO_CUDA_MEMORY_CACHING", ("1",), "disables the caching allocator: every tensor is a cudaMalloc/cudaFree",
     "unset PYTORCH_NO_CUDA_MEMORY_CACHING"),
    ("TORCH_DISTRIBUTED_DEBUG", ("DETAIL", "INFO"), "wraps every collective in consistency checks",
     "unset TORCH_DISTRIBUTED_DEBUG (or OFF) outside debugging"),
    ("NCCL_DEBUG", ("TRACE",), "logs every NCCL call", "NCCL_DEBUG=WARN (INFO only while diagnosing)"),
    ("CUDA_CACHE_DISABLE", ("1",), "recompiles PTX kernels at every start", "unset CUDA_CACHE_DISABLE"),
    ("TORCH_COMPILE_DEBUG", ("1",), "dumps every compiled graph to disk", "unset TORCH_COMPILE_DEBUG"),
    ("TORCH_USE_CUDA_DSA", ("1",), "device-side assertions add checks to kernels", "unset TORCH_USE_CUDA_DSA"),
)


def check_slow_env(ctx: AnalysisContext) -> Hit | None:
    found = []
    for key, bad, why, fix in SLOW_ENV:
        v = ctx.env.get(key)
        if v is None or (bad is not None and v.strip().upper() not in {b.upper() for b in bad}):
            continue
        found.append((key, v, why, fix))
    if not found:
        return None
    return Hit(
        evidence=tuple(f"{k}={v}: {why}" for k, v, why, _ in found),
        action="; ".join(fix for *_, fix in found),
        expected_gain="the debugging overhead goes away",
        cost_s=0.0,
        confidence=1.0,
        title="Debug settings in the job's environment: " + ", ".join(k for k, *_ in found),
    )


def check_small_shm(ctx: AnalysisContext) -> Hit | None:
    h = ctx.host
    if h is None or h.shm_total is None or h.shm_total >= SMALL_SHM_BYTES or not ctx.workers.count:
        return None
    used = (h.shm_used_max or 0) / h.shm_total if h.shm_total else 0.0
    return Hit(
        evidence=(
            f"/dev/shm is {fmt_bytes(h.shm_total)} (used up to {pct(used)}) with {ctx.workers.count} loader workers",
            "workers hand every batch to the trainer through /dev/shm; when it fills they die with 'Bus error'",
        ),
        action="docker run --shm-size=8g ... (or --ipc=host); Kubernetes: mount an emptyDir with medium: Memory at /dev/shm",
        expected_gain="no loader crashes as batches or workers grow",
        cost_s=0.0,
        confidence=0.9,
        severity=Severity.WARNING if used >= SHM_FILLING else Severity.INFO,
    )


def check_loader_respawn(ctx: AnalysisContext) -> Hit | None:
    """The whole worker pool was replaced in the window: a new epoch started new workers
    (persistent_workers=False), and the GPU waited while they started."""
    w = ctx.workers
    if not w.count or w.respawned < w.count:
        return None
    born = min((c.create_time for c in w.current if c.create_time), default=None)
    if born is None:
        return None

    def cost(g: GpuView) -> float:
        return sum(
            s.idle_s for s in g.slices if born <= s.mid <= born + RESPAWN_STALL_S
        )

    found = _worst(ctx, cost)
    if found is None or found[1] < MIN_COST_S:
        return None
    g, c = found
    return Hit(
        evidence=(
            f"{w.respawned} loader workers exited and {w.count} new ones started in the window (a new epoch)",
            f"{_device(g)} idle {secs(c)} in the {RESPAWN_STALL_S:.0f} s after the new workers started",
        ),
        action=loader_line(w.count, pin=g.index != CPU_DEVICE) + "  # persistent_workers=True keeps the workers across epochs",
        expected_gain=f"about {secs(c)} of GPU time back at every epoch start",
        cost_s=c,
        confidence=0.7,
        gpu_index=_gpu_index(g),
        severity=Severity.INFO,
        title="DataLoader workers restart every epoch",
    )


def check_idle_unattributed(ctx: AnalysisContext) -> Hit | None:
    """Idle GPU time and no stacks to say why: the first step is to attach."""
    found = _worst(ctx, lambda g: 0.0 if g.breakdown.attributed else g.breakdown.idle_s, gpu_only=True)
    if found is None or not _significant(found[0], found[1]):
        return None
    g, cost = found
    ev = [f"{g.name} idle {pct(g.breakdown.idle_fraction)} of the last {secs(g.breakdown.total_s)}"]
    fault = next((e for e in reversed(ctx.events) if e.source == "stacks" and e.level in ("warning", "error")), None)
    if fault is not None:
        ev.append(f"no stacks of the training process: {fault.message}")
        action = "fix stack sampling (see above), then: gputop advise --pid PID"
    else:
        pids = sorted({p.pid for p in g.processes})
        ev.append("not attached to the training process, so the idle time cannot be attributed")
        if pids:
            ev.append(f"processes on {g.name}: " + ", ".join(str(p) for p in pids[:5]))
        action = f"attach to see why it waits: gputop --pid {pids[0] if pids else 'PID'} (or gputop advise --pid {pids[0] if pids else 'PID'})"
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain="the cause of the idle time, and its fix",
        cost_s=cost,
        confidence=0.5,
        gpu_index=g.index,
        title=f"{g.name} idle {pct(g.breakdown.idle_fraction)} of the time, cause unknown",
    )


# --------------------------------------------------------------------------- the table

THROUGHPUT_IDS = (
    "data-starved",
    "workers-saturated",
    "cpu-oversubscribed",
    "io-bound",
    "host-sync",
    "pageable-h2d",
    "checkpoint-stall",
    "collective-wait",
    "launch-bound",
    "no-tensor-cores",
    "memory-headroom",
)

W, I, C = Severity.WARNING, Severity.INFO, Severity.CRITICAL

# Order breaks ties between equal costs: the more specific cause first.
RULES: tuple[Rule, ...] = (
    Rule("stuck", "Job stuck: no progress", C, check_stuck, appear_after_s=0.0, supersedes=THROUGHPUT_IDS),
    Rule("cuda-launch-blocking", "CUDA_LAUNCH_BLOCKING=1 makes every launch synchronous", W,
         check_cuda_launch_blocking, appear_after_s=0.0, supersedes=("host-sync", "launch-bound")),
    Rule("data-starved", "GPU waits for data: no DataLoader workers", W, check_data_starved),
    Rule("cpu-oversubscribed", "CPU oversubscribed by loader threads", W, check_cpu_oversubscribed,
         supersedes=("workers-saturated",)),
    Rule("workers-saturated", "GPU waits for data: loader workers saturated", W, check_workers_saturated),
    Rule("io-bound", "GPU waits for storage: input is IO-bound", W, check_io_bound),
    Rule("pageable-h2d", "GPU waits for host-to-device copies", W, check_pageable_h2d),
    Rule("host-sync", "Host-device syncs every step", W, check_host_sync),
    Rule("checkpoint-stall", "Checkpoint saves stall the GPU", W, check_checkpoint_stall),
    Rule("collective-wait", "GPU waits on collectives", W, check_collective_wait),
    Rule("launch-bound", "Launch-bound: the CPU cannot keep the GPU fed", W, check_launch_bound),
    Rule("no-tensor-cores", "GPU busy but tensor cores idle", W, check_no_tensor_cores),
    Rule("throttling", "GPU clocks throttled", W, check_throttling),
    Rule("ecc-errors", "Uncorrectable ECC errors", C, check_ecc_errors, appear_after_s=0.0),
    Rule("memory-near-limit", "GPU memory near its limit", W, check_memory_near_limit),
    Rule("pcie-link-degraded", "PCIe link below its maximum", W, check_pcie_degraded),
    Rule("small-shm", "Small /dev/shm for DataLoader workers", W, check_small_shm, appear_after_s=0.0),
    Rule("slow-env", "Debug settings in the job's environment", I, check_slow_env, appear_after_s=0.0),
    Rule("persistence-off", "Persistence mode off", I, check_persistence_off, appear_after_s=0.0),
    Rule("memory-headroom", "GPU memory to spare: a larger batch fits", I, check_memory_headroom),
    Rule("loader-respawn", "DataLoader workers restart every epoch", I, check_loader_respawn),
    Rule("idle-unattributed", "GPU idle, cause unknown: attach to the job", I, check_idle_unattributed),
)

RULES_BY_ID = {r.id: r for r in RULES}

