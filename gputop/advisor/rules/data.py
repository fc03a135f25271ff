"""The input pipeline: the GPU waits for batches. No loader workers, workers flat out, workers
fighting over the cores, storage too slow, a pool restarted every epoch, a small /dev/shm.

Every rule here reads the same idle time (data + IO buckets of the breakdown) and tells the
causes apart by the workers' CPU and stacks, the host's CPU and the disk.
"""

from __future__ import annotations

from collections import Counter

import math
import re
from dataclasses import dataclass

from ...analysis import CPU_DEVICE, WORKER_LOOP_FRAME, Bucket
from ...units import fmt_bytes, fmt_rate
from ...model import Category, Severity
from ...analysis import PerRowFetch, hot_place, loader_knob, per_row_fetch
from ..context import AnalysisContext, GpuView, ThreadUse
from .base import (
    loop_wait,
    loop_wait_lower,
    loop_wait_upper,
    MIN_COST_FRACTION,
    MIN_COST_S,
    MIN_MAIN_SAMPLES,
    MIN_RECURRENCES,
    WORTHWHILE_GAIN,
    Hit,
    bounded,
    confidence,
    DATA_BUCKETS,
    data_wait_s,
    device_name,
    device_upper,
    enough_stacks,
    gain,
    gpu_index,
    idle_line,
    labels_line,
    main_share,
    pct,
    secs,
    share_upper,
    significant,
    SHARE_UPPER_LEVEL,
    wait_bound,
    uses,
    workers_cpu_line,
    worst,
)
from .threshold import DOCUMENTED, JUDGEMENT, IntThreshold, Threshold

# --------------------------------------------------------------------------- sizing the pool

# Defaults for num_workers: half of the cores that fall to one GPU (the other half stays with
# the main process' intra-op threads, the pin-memory thread and the system), and no more than 8
# before memory (every worker holds the dataset object and prefetch_factor batches) bites. The
# guides this advisor follows say to size num_workers from the cores and memory but give no
# number: the half and the 8 are judgement.
MAX_DEFAULT_WORKERS = IntThreshold(
    8, "workers", JUDGEMENT,
    "num_workers is half the cores that fall to one GPU, and no more than this before memory bites (every "
    "worker holds the dataset and its prefetched batches).")
ASSUMED_CORES_PER_GPU = IntThreshold(
    8, "cores", JUDGEMENT, "Cores per GPU assumed when the host's core count is unknown.")
MAX_IO_WORKERS = IntThreshold(
    32, "workers", JUDGEMENT, "Workers blocked on reads use no CPU: more of them than cores is fine, up to this.")
WORKER_MARGIN = Threshold(
    1.25, "x", JUDGEMENT, "Margin on the worker count computed from the idle share: the rate estimate is rough.")
MIN_SPARE_CORES = Threshold(
    2.0, "cores", JUDGEMENT,
    "Spare cores needed before more workers are the advice rather than cheaper samples: new workers need cores "
    "of their own.")
# A training process above this (% of one core) runs more than its Python thread: torch's
# intra-op threads. Judgement: one Python thread reads at most 100 %; the data-starved workload's
# process (num_workers=0) read 1,597 % (bench/results/harness.md, job CPU).
MULTI_CORE_PCT = Threshold(
    150.0, "% of a core", JUDGEMENT,
    "A training process above this runs torch's intra-op threads beside its Python thread (which reads at "
    "most 100 %).", "bench/results/harness.md")


def _job_gpus(ctx: AnalysisContext) -> int:
    return max(1, sum(1 for g in ctx.gpus if g.index != CPU_DEVICE))


def cores_per_gpu(ctx: AnalysisContext) -> int | None:
    return ctx.cores // _job_gpus(ctx) if ctx.cores else None


def default_workers(ctx: AnalysisContext) -> int:
    per_gpu = cores_per_gpu(ctx) or ASSUMED_CORES_PER_GPU
    return max(2, min(MAX_DEFAULT_WORKERS, per_gpu // 2))


def workers_for(current: int, wait_fraction: float, cap: int) -> int:
    """Workers needed so the loader keeps up: today's pool delivers (1 - wait) of what the GPU
    consumes, and throughput scales with the pool while CPU or IO have room."""
    need = math.ceil(max(1, current) / max(0.05, 1.0 - wait_fraction) * WORKER_MARGIN)
    return max(current + 1, min(need, cap))


def loader_line(workers: int, prefetch: int = 2, pin: bool = True, ctx: AnalysisContext | None = None) -> str:
    """The DataLoader settings; for a job the stacks show runs under HF Trainer (which builds the
    DataLoader itself), its TrainingArguments first and the plain form beside them."""
    pin_arg = "pin_memory=True, " if pin else ""
    plain = f"DataLoader(..., num_workers={workers}, {pin_arg}persistent_workers=True, prefetch_factor={prefetch})"
    knob = loader_knob(ctx.framework.name, workers, pin) if ctx is not None else None
    return f"{knob}; in plain PyTorch: {plain}" if knob else plain


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


# What to do when more workers cannot help: the cores are the limit.
CHEAPER_SAMPLES = (
    "the CPUs are the limit: make each sample cheaper - decode/augment on the GPU "
    "(torchvision.transforms.v2 on CUDA tensors, or NVIDIA DALI), cache decoded samples "
    "(e.g. uint8 tensors in a memory-mapped file), or use a host with more cores per GPU"
)

# --------------------------------------------------------------------------- no workers


# The training thread's own loading seen off the CPU in this share of its samples waits in its
# fetch (a sleep, a remote read, a disk): workers would wait side by side, not take a core each.
# Judgement: a loading that computes is on the CPU in most samples (py-spy's idle flag).
FETCH_OFF_CPU_SHARE = Threshold(
    0.8, "share", JUDGEMENT,
    "The training thread's loading off the CPU in this share of its samples waits in its fetch (a sleep, a "
    "remote read): workers then wait side by side, more of them than cores.")


def _fetch_waits(ctx: AnalysisContext) -> bool:
    """The training thread's own loading (num_workers=0) mostly waits off the CPU."""
    fetching = [s for s in ctx.main_stacks if s.category is Category.DATA_FETCH]
    return len(fetching) >= MIN_MAIN_SAMPLES and \
        sum(1 for s in fetching if not s.active) / len(fetching) >= FETCH_OFF_CPU_SHARE


@uses(MAX_DEFAULT_WORKERS, ASSUMED_CORES_PER_GPU, MULTI_CORE_PCT, WORTHWHILE_GAIN, MIN_MAIN_SAMPLES, MIN_COST_FRACTION,
      MIN_COST_S, MIN_RECURRENCES, FETCH_OFF_CPU_SHARE, MAX_IO_WORKERS, WORKER_MARGIN)
def check_data_starved(ctx: AnalysisContext) -> Hit | None:
    """num_workers=0: the training thread loads every batch itself."""
    if ctx.workers.count or not enough_stacks(ctx):
        return None
    if main_share(ctx, Category.DATA_FETCH) < main_share(ctx, Category.DATA_WAIT):
        return None  # it waits on a queue: there are workers we cannot see
    found = worst(ctx, data_wait_s)
    if found is None or not significant(found[0], found[1], buckets=DATA_BUCKETS):
        return None
    g, cost = found
    frac = loop_wait(ctx, cost / g.breakdown.total_s, Category.DATA_FETCH, Category.DATA_WAIT)
    # The stated bound only: the loop's share at its upper confidence limit. The worker count,
    # the workers' own limit and whether that limit is worth naming use the share itself.
    upper = loop_wait_upper(ctx, cost / g.breakdown.total_s, Category.DATA_FETCH, Category.DATA_WAIT)
    n = default_workers(ctx)
    ev = [idle_line(g, [Bucket.DATA, Bucket.IO])]
    line = labels_line(g, Bucket.DATA)
    if line:
        ev.append(line)
    ev.append("no DataLoader worker processes: the training process loads every batch itself (num_workers=0)")
    device_share = cost / g.breakdown.total_s
    if frac - device_share >= 0.02:
        # The title's figure and the line above measure different things: said, not left to puzzle.
        ev.append(f"the training loop's own stack samples load data {pct(frac)} of the time (the figure in the title); "
                  f"the {pct(device_share)} above is {'the GPU' if g.index != CPU_DEVICE else 'the loop'}'s time "
                  "not computing, read from " + ("NVML's polls, where a trailing kernel counts as busy"
                                                 if g.index != CPU_DEVICE else "the time breakdown"))
    threads = _loader_threads_line(ctx)
    if threads:
        ev.append(threads)
    host = _host_line(ctx)
    if host:
        ev.append(host)
    # What n workers can give: each runs the loading on one core, so at best as fast as the
    # training thread loads today, and no more of them at once than there are cores. The
    # training thread loads for ``frac`` of the time, so n in parallel bound the rate at n / frac.
    cores = cores_per_gpu(ctx) or ASSUMED_CORES_PER_GPU
    parallel = max(1, min(n, cores))
    waits = _fetch_waits(ctx)
    if waits:
        # A fetch that waits off the CPU: workers wait side by side, as many as keep up.
        n = workers_for(0, frac, MAX_IO_WORKERS)
        parallel = n
    limit = parallel / max(frac, 0.01)
    # The limit stated takes the loading share at its lower confidence limit (a share read from
    # samples near 1 as 100 % made "at most 2.0x" for 2 workers; the new user's starved job
    # measured 2.0-2.3x with them); whether workers are worth naming keeps the share itself.
    stated = parallel / max(loop_wait_lower(ctx, g, cost / g.breakdown.total_s, Category.DATA_FETCH,
                                            Category.DATA_WAIT), 0.01)
    t = ctx.target
    if waits:
        ev.append("the training thread's loading waits off the CPU (a sleep, a remote read) in most of its samples: "
                  "workers would wait side by side, more of them than cores")
        today = "the loading waits off the CPU, so they wait side by side; fewer if the source limits concurrent reads"
    elif t is not None and t.cpu_mean is not None and t.cpu_mean >= MULTI_CORE_PCT:
        today = f"today's loading uses {t.cpu_mean / 100:.1f} cores, so less if those threads do real work"
    else:
        today = "each loads at most as fast as the training thread does today"
    per_gpu = " per GPU" if g.index != CPU_DEVICE else ""
    if limit < WORTHWHILE_GAIN:
        # Workers cannot load faster than the training thread already does on these cores.
        action = CHEAPER_SAMPLES
        expected = gain(frac, stated, f"{cores} core{'s' if cores != 1 else ''}{per_gpu}: workers would only move "
                        "the loading, not speed it up", upper=upper) + "; cheaper samples are bounded by how much cheaper they get"
        ev.append(f"{cores} core{'s' if cores != 1 else ''}{per_gpu}: DataLoader workers cannot load faster than "
                  "the training thread does")
    else:
        why = ("workers that wait in their fetch, more than the " if waits else "workers for ") + \
            f"{cores_per_gpu(ctx) or '?'} cores"
        action = f"{loader_line(n, pin=g.index != CPU_DEVICE, ctx=ctx)}  # {n} {why}" + per_gpu
        expected = gain(frac, stated, f"{n} workers on {cores} cores, {parallel} loading at once ({today})", upper=upper)
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain=expected,
        gain_bound=bounded(frac, stated, upper),
        cost_s=cost,
        confidence=confidence(g.breakdown.idle_sample_share(Bucket.DATA) or frac, g.breakdown.idle_samples),
        gpu_index=gpu_index(g),
        title=f"{device_name(g)} waits for data {pct(frac)} of the time: no DataLoader workers",
    )


# --------------------------------------------------------------------------- workers flat out

# Loader workers: at least this share of them saturated (each above
# analysis.efficiency.WORKER_SATURATED_PCT of a core) means the pool is flat out. Judgement: most
# of the pool, so one busy worker among idle ones is not the pool's limit. The workers-saturated
# workload's 2 workers read 100 % each (bench/results/advisor_bench.json).
SATURATED_WORKER_SHARE = Threshold(
    0.75, "share", JUDGEMENT,
    "The pool is flat out when most of its workers are at a full core: one busy worker among idle ones is "
    "not the pool's limit.", "bench/results/advisor_bench.json")
MIN_WORKER_SAMPLES = IntThreshold(
    4, "samples", JUDGEMENT,
    "Worker stacks come one worker per second: this many before their running share counts.")
# Oversubscription: the loader workers' threads that compete for a CPU above this multiple of
# the cores, with the CPUs at least this busy. The guides' rule is workers x threads <= cores; the
# 1.5x margin and the 85 % are judgement. The oversubscribed workload ran 16 workers x ~18
# threads on 16 cores at 100 % CPU, load 155-187 (bench/results/harness.md, advisor_bench.json).
# Competing threads are counted from the procfs source's per-thread readings: each thread's share
# of readings in state R (on a CPU or queued for one), summed: the mean number of the workers'
# threads that want a CPU. No threshold of its own: an idle helper thread (multiprocessing's
# QueueFeederThread, torch's _ResourceSharer) sleeps in every reading and counts 0, a worker
# computing a sample counts ~1. Counting every thread a worker holds (ProcSample.num_threads)
# named a 2-worker job on 2 cores, one busy thread and two idle helpers per worker, "6 threads
# on 2 cores".
OVERSUB_RATIO = Threshold(
    1.5, "threads/core", JUDGEMENT,
    "The guides' rule is workers x threads <= cores; oversubscribed is the workers' threads that want a CPU "
    "above 1.5x the cores.", "bench/results/harness.md, bench/results/advisor_bench.json")
CPU_SATURATED_PCT = Threshold(
    85.0, "%", JUDGEMENT, "Oversubscription counts only on a host's CPUs this busy.",
    "bench/results/harness.md, bench/results/advisor_bench.json")
MIN_THREAD_READINGS = IntThreshold(
    3, "readings", JUDGEMENT,
    "Per-thread readings (1 s apart) before they count: fewer, and the share of R readings is a coin toss.")

# Starting a pool of workers (fork, dataset copy, first batches) stalls the GPU for this long at
# most; idle time later than that is not the restart's (workers-saturated, loader-respawn).
RESPAWN_STALL_S = Threshold(
    5.0, "s", JUDGEMENT, "A new worker pool stalls the GPU this long at most; idle time later is not the restart's.")


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


# Worker stacks waiting for their next index (torch's worker loop, classified idle) in at least
# this share of samples: the pool has its batches ready and waits for the trainer to ask, so the
# trainer's data wait is not the pool's throughput and more workers cannot shorten it. Judgement:
# most of the samples, as SATURATED_WORKER_SHARE.
WORKERS_IDLE_SHARE = Threshold(
    0.5, "share", JUDGEMENT,
    "Workers waiting for their next index this share of samples have batches ready: more of them cannot "
    "shorten the trainer's wait.")


def workers_waiting_for_work(ctx: AnalysisContext) -> bool:
    xs = ctx.worker_stacks
    if len(xs) < MIN_WORKER_SAMPLES:
        return False
    return sum(1 for s in xs if s.category is Category.IDLE) / len(xs) >= WORKERS_IDLE_SHARE


@dataclass(frozen=True)
class Oversubscription:
    threads: float  # the workers' threads competing for a CPU (mean runnable), or held (no readings)
    cores: int
    measured: bool  # from per-thread readings; False: every thread the workers hold
    per_worker: float  # competing threads per worker
    wait_share: float | None = None  # share of the workers' runnable time spent queued for a CPU
    held: int = 0  # threads the workers hold, idle ones included


def _worker_threads(ctx: AnalysisContext) -> list[ThreadUse]:
    pids = {w.pid for w in ctx.workers.current}
    return [t for t in ctx.threads if t.pid in pids and t.readings >= MIN_THREAD_READINGS]


def _env_threads(ctx: AnalysisContext, key: str) -> int | None:
    v = (ctx.env.get(key) or "").strip()
    return int(v) if v.isdigit() else None


def oversubscription(ctx: AnalysisContext) -> Oversubscription | None:
    """The loader workers' threads when those competing for a CPU oversubscribe a busy host."""
    h, w = ctx.host, ctx.workers
    if h is None or h.cpu_mean is None or w.count == 0 or h.cpu_mean < CPU_SATURATED_PCT:
        return None
    held = sum(max(1, c.threads or 1) for c in w.current)
    mine = _worker_threads(ctx)
    read = Counter(t.pid for t in mine)
    # Readings of every worker's threads: a recording keeps each process's main thread only, which
    # is no reading of the rest of a worker holding several (those then count as held).
    if all(read[c.pid] > 1 or (read[c.pid] == 1 and (c.threads or 1) <= 1) for c in w.current):
        # Per-thread readings of every worker: the threads that want a CPU, not those that exist.
        demand = sum(t.runnable for t in mine)
        if demand <= OVERSUB_RATIO * h.cores:
            return None
        # Queued for a CPU: runnable in a reading but not on a CPU, the runnable share less the
        # CPU-time share (both per thread, the readings' sampling error averaging over threads).
        wait = sum(max(0.0, t.runnable - min(t.cpu, 1.0)) for t in mine)
        return Oversubscription(demand, h.cores, True, demand / w.count, wait / demand if demand else None, held)
    # No readings: every thread the workers hold. torch runs one intra-op thread in its workers
    # and OpenMP/MKL pools follow OMP_NUM_THREADS: with that at 1 the held threads are helpers,
    # not a pool, and their count is no evidence of oversubscription.
    omp = _env_threads(ctx, "OMP_NUM_THREADS")
    if omp is not None and omp <= 1 and (_env_threads(ctx, "MKL_NUM_THREADS") or 1) <= 1:
        return None
    if held > OVERSUB_RATIO * h.cores:
        return Oversubscription(float(held), h.cores, False, held / w.count, None, held)
    return None


# Per-row fetching: the saturated workers' samples inside the map-style fetch that sit in its
# per-row machinery (the per-index __getitem__ calls in their own lines, default_collate stacking
# the rows; analysis.loader_fetch) rather than in per-sample work below __getitem__ (a decode, a
# transform, a read). The two classes sit far apart, not around a number: a row sliced from
# tensors in memory costs microseconds of work beside microseconds of per-call Python, so nearly
# all of such a worker's time is the machinery; an image decoded and augmented costs
# milliseconds beside the same microseconds, so nearly none of it is. Half is judgement between
# the two: from there fetching the batch in one call can give 2x or more (1 / (1 - share)), as
# much as the more workers that would otherwise come first; below it the per-sample work is the
# larger part and the pool's size or cheaper samples come first.
PER_ROW_FETCH_SHARE = Threshold(
    0.5, "share", JUDGEMENT,
    "Saturated loader workers with this share of their fetch samples in the per-row machinery (per-index "
    "__getitem__ calls, default_collate) rather than per-sample work (decode, transforms) pay per-row "
    "overhead: fetching a batch in one call removes it, up to 1 / (1 - share).")
# Worker stacks come one worker per second at best, fewer on a busy host (the per-row recording
# holds 2 over 10 s): the per-row reading needs this many agreeing, as workers-blocked names a
# place from two (MIN_BLOCKED_WORKER_STACKS), so one stray sample does not change the action.
# What so few samples cannot say is how large the share is: the stated bound takes it at its
# upper confidence limit, which with two samples bounds nothing but the wait itself.
MIN_PER_ROW_STACKS = IntThreshold(
    2, "samples", JUDGEMENT,
    "Worker stacks in the per-row fetch machinery before the action becomes fetching a batch in one call: "
    "two, so one stray sample does not change it.")


def _per_row(ctx: AnalysisContext) -> PerRowFetch | None:
    """The workers' fetch when most of it is per-row overhead: the fetch calls the Dataset per
    index (default_collate or the fetch's comprehension seen), no __getitems__, and most samples
    in the per-row machinery."""
    pr = per_row_fetch(ctx.worker_stacks)
    if (not pr.per_index or pr.batched or pr.per_row < MIN_PER_ROW_STACKS
            or pr.per_row < PER_ROW_FETCH_SHARE * pr.samples):
        return None
    return pr


def _per_row_lines(pr: PerRowFetch) -> str:
    parts = []
    if pr.in_getitem:
        parts.append(f"{pr.in_getitem} in `{pr.getitem}` called once per index" if pr.getitem else
                     f"{pr.in_getitem} in the Dataset's __getitem__ called once per index")
    if pr.in_collate:
        parts.append(f"{pr.in_collate} in default_collate stacking the rows")
    if pr.in_loop:
        parts.append(f"{pr.in_loop} in the fetch's per-index loop")
    rest = pr.samples - pr.per_row
    return (f"worker stacks in the per-row fetch machinery in {pr.per_row} of {pr.samples} samples in their fetch ("
            + ", ".join(parts) + ")" + (f"; {rest} in per-sample work or waits" if rest else
                                        "; none in per-sample work (decoding, transforms, reads)"))


def _batched_fetch_line(pr: PerRowFetch) -> str:
    name = pr.getitem.split(" (")[0] if pr.getitem else "__getitem__"
    if name.startswith("TensorDataset."):
        then = f"{name} then gets the batch's indices and indexes each tensor once"
    else:
        then = f"{name} then takes the list of indices (tensors in memory: indexed with the whole index tensor at once)"
    return ("fetch each batch with one index operation, not one call per row: DataLoader(ds, "
            "sampler=BatchSampler(RandomSampler(ds), batch_size=B, drop_last=False), batch_size=None) with B "
            f"today's batch size: {then}; or implement __getitems__(self, indices) (torch >= 2.2 calls it with the "
            "whole batch's indices) with a collate_fn that does not stack the rows again")


@uses(SATURATED_WORKER_SHARE, MIN_WORKER_SAMPLES, WORKERS_IDLE_SHARE, OVERSUB_RATIO, CPU_SATURATED_PCT,
      MIN_THREAD_READINGS, RESPAWN_STALL_S, MIN_SPARE_CORES, WORKER_MARGIN, MIN_MAIN_SAMPLES, MIN_COST_FRACTION,
      MIN_COST_S, MIN_RECURRENCES, PER_ROW_FETCH_SHARE, MIN_PER_ROW_STACKS)
def check_workers_saturated(ctx: AnalysisContext) -> Hit | None:
    w = ctx.workers
    if not w.count or not enough_stacks(ctx) or oversubscription(ctx) or not workers_busy(ctx):
        return None
    if workers_waiting_for_work(ctx):
        return None  # the pool is ahead of the trainer: more workers cannot help
    found = worst(ctx, data_wait_s)
    if found is None or not significant(found[0], found[1], buckets=DATA_BUCKETS):
        return None
    g, cost = found
    starts = respawns(ctx)
    if starts and respawn_idle_s(g, starts) >= cost / 2:
        # Most of the wait follows a pool's restart: the workers' CPU is their start-up (fork,
        # imports, the dataset's copy), not loading, and more of them start slower still
        # (measured on short epochs: persistent_workers=True 15.6x, 8 workers instead of 4 0.68x).
        return None
    frac = loop_wait(ctx, cost / g.breakdown.total_s, Category.DATA_WAIT)
    upper = loop_wait_upper(ctx, cost / g.breakdown.total_s, Category.DATA_WAIT)  # the stated bound's only
    ev = [idle_line(g, [Bucket.DATA, Bucket.IO])]
    line = labels_line(g, Bucket.DATA)
    if line:
        ev.append(line)
    ev.append(f"{workers_cpu_line(ctx)}: the pool is flat out")
    host = _host_line(ctx)
    if host:
        ev.append(host)
    spare = ctx.host.spare_cores if ctx.host else None
    if spare is not None and spare >= MIN_SPARE_CORES:
        # room for the main process and its pin-memory thread
        cap = max(w.count + 1, min(w.count + int(spare), (cores_per_gpu(ctx) or w.count + int(spare)) - 2))
        n = workers_for(w.count, frac, cap)
        action = f"{loader_line(n, pin=g.index != CPU_DEVICE, ctx=ctx)}  # was {w.count}; {spare:.0f} cores are idle"
        # A saturated pool delivers in proportion to its workers at best: w.count -> n.
        limit = n / w.count
        expected = gain(frac, limit, f"the pool growing from {w.count} to {n} workers (its rate at most in proportion)",
                        upper=upper)
    else:
        # No spare cores: more workers would share the same cores; only cheaper samples help.
        action = CHEAPER_SAMPLES
        limit = None
        expected = gain(frac, upper=upper) + "; cheaper samples get at most that, bounded by how much cheaper each one gets"
    title = f"{device_name(g)} waits for data {pct(frac)} of the time: loader workers saturated"
    pr = _per_row(ctx)
    if pr is not None:
        # The workers' time is per-row overhead: more of them only spread it over more cores;
        # one index operation a batch removes it. What that gives is bounded by the share it
        # removes, taken at its upper confidence limit (few worker samples: a loose bound), and
        # by the wait. The workers' action stays as the second, weaker option.
        ev.append(_per_row_lines(pr))
        removed = share_upper(pr.per_row, pr.samples)
        limit = wait_bound(removed)
        second = (f". Second, weaker (more workers only spread the per-row Python over more cores): {action}"
                  if action is not CHEAPER_SAMPLES else "")
        action = _batched_fetch_line(pr) + second
        expected = gain(frac, limit, f"the per-row overhead batching removes ({pr.per_row} of {pr.samples} worker "
                        f"fetch samples, up to {pct(removed)} at {100 * SHARE_UPPER_LEVEL:.0f} % confidence)",
                        upper=upper)
        if limit >= bounded(frac, upper=upper):
            expected += (f"; the per-row share, read from {pr.samples} worker samples, bounds nothing tighter "
                         "than the wait")
        title += ", fetching one row at a time"
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain=expected,
        gain_bound=bounded(frac, limit, upper),
        cost_s=cost,
        confidence=confidence(g.breakdown.idle_sample_share(Bucket.DATA) or frac, g.breakdown.idle_samples),
        gpu_index=gpu_index(g),
        title=title,
    )


@uses(OVERSUB_RATIO, CPU_SATURATED_PCT, MIN_THREAD_READINGS, WORTHWHILE_GAIN, MIN_MAIN_SAMPLES, MIN_COST_FRACTION,
      MIN_COST_S)
def check_cpu_oversubscribed(ctx: AnalysisContext) -> Hit | None:
    over = oversubscription(ctx)
    if over is None or not enough_stacks(ctx):
        return None
    cores = over.cores
    found = worst(ctx, lambda g: data_wait_s(g) + g.breakdown.get(Bucket.CPU))
    # No recurrence waiver (base.significant): the threads are read from 1 s readings (or the
    # configuration) and the host's CPU from its load, both at their least certain in a young window (a job's own
    # start-up fills the cores), so the cost must add up to seconds first.
    if found is None or not significant(found[0], found[1]):
        return None
    g, cost = found
    frac = cost / g.breakdown.total_s
    w = ctx.workers
    n = max(1, cores // (w.count + 1))
    # What the action asks for, less what is already in place: the environment's thread counts
    # as the target's environment shows them; set_num_threads(n) in the workers only while they
    # run more than n threads that want a CPU.
    omp, mkl = _env_threads(ctx, "OMP_NUM_THREADS"), _env_threads(ctx, "MKL_NUM_THREADS")
    env_needed = omp is None or omp > n or (mkl is not None and mkl > n)
    init_needed = over.per_worker > n + 0.5
    if not env_needed and not init_needed:
        return None  # nothing to change: the threads come from elsewhere than the pools' sizes
    ev = [idle_line(g, [Bucket.DATA, Bucket.IO, Bucket.CPU])]
    host = f" (host CPU {ctx.host.cpu_mean:.0f} %)" if ctx.host and ctx.host.cpu_mean is not None else ""
    if over.measured:
        ev.append(f"{w.count} loader workers run ~{over.threads:.0f} threads that want a CPU "
                  f"(~{over.per_worker:.1f} each, of {over.held} they hold) on {cores} cores{host}")
        if over.wait_share is not None:
            ev.append(f"the workers' threads wait for a CPU {pct(over.wait_share)} of the time they are runnable")
    else:
        ev.append(f"{w.count} loader workers x ~{over.per_worker:.0f} threads = {over.held} threads on {cores} cores{host}")
        ev.append("threads counted as held: no per-thread readings to tell those that compute from idle helpers")
    ev.append(f"OMP_NUM_THREADS={omp} in the target's environment" if omp is not None else "OMP_NUM_THREADS is not set")
    if ctx.host and ctx.host.load1_max is not None:
        ev.append(f"load average {ctx.host.load1_max:.0f} on {cores} cores")
    parts = []
    if env_needed:
        parts.append(f"OMP_NUM_THREADS={n} MKL_NUM_THREADS={n} in the job's environment")
    if init_needed:
        parts.append(f"in the loader DataLoader(..., worker_init_fn=lambda _: torch.set_num_threads({n}))")
    # The bound: what fewer threads can give back is the time the workers' threads are queued
    # for a CPU, and no more than the share of it their own excess causes (demand / cores: the
    # rest is other processes' load). Without readings, the excess alone.
    limit = over.threads / cores
    why = f"~{over.threads:.0f} competing threads sharing {cores} cores"
    if over.wait_share is not None:
        queued = 1.0 / max(1.0 - over.wait_share, 0.01)
        if queued < limit:
            limit, why = queued, f"the {pct(over.wait_share)} of their runnable time the workers' threads wait for a CPU"
        if limit < WORTHWHILE_GAIN:
            return None  # the threads get a CPU when they want one: fewer of them cannot be faster
    return Hit(
        evidence=tuple(e for e in ev if e),
        action=", and ".join(parts) + f"  # {w.count + 1} processes x {n} thread{'s' if n != 1 else ''} for {cores} cores",
        expected_gain=gain(frac, limit, why, upper=device_upper(ctx, g, frac))
        + "; threads stop evicting each other from the cores",
        gain_bound=bounded(frac, limit, device_upper(ctx, g, frac)),
        cost_s=cost,
        confidence=confidence(min(1.0, over.threads / (cores * 4)), len(ctx.main_stacks)),
        gpu_index=gpu_index(g),
        title=f"CPU oversubscribed: {over.threads:.0f} loader threads on {cores} cores",
    )


# --------------------------------------------------------------------------- storage

# IO: any one of three signals, each judgement; the io-bound workload is far past all of them
# (bench/results/harness.md and advisor_bench.json: 85 % of the window in the IO bucket, iowait
# 1.4 cores and disk reads 1.8-2.0 GB/s, worker stacks blocked in a read in 100 % of samples).
# - this share of the data wait fell into IO-wait slices;
IO_SHARE = Threshold(0.30, "share", JUDGEMENT, "IO signal: this share of the data wait fell into IO-wait slices.",
                     "bench/results/harness.md, bench/results/advisor_bench.json")
# - iowait of this many cores on average, together with this disk read rate (20 MB/s: far above a
#   loader that reads from the page cache);
IOWAIT_CORES = Threshold(0.5, "cores", JUDGEMENT, "IO signal: iowait of this many cores on average, with "
                         "DISK_READ_BPS of disk reads.", "bench/results/harness.md")
DISK_READ_BPS = Threshold(20e6, "bytes/s", JUDGEMENT, "With IOWAIT_CORES: disk reads far above a loader that "
                          "reads from the page cache.", "bench/results/harness.md")
# - loader-worker samples blocked in a read (not in a lock or queue) in at least this share.
WORKER_READ_BLOCKED_SHARE = Threshold(
    0.5, "share", JUDGEMENT, "IO signal: loader workers blocked in a read (not a lock or a queue) in this share "
    "of their samples.", "bench/results/advisor_bench.json")

# A blocked worker whose innermost frame is in one of these waits on a lock, a queue or the
# network, not a read from storage.
_WAIT_FILES = ("threading.py", "synchronize.py", "queues.py", "queue.py", "connection.py", "selectors.py",
               "socket.py", "ssl.py")
# A worker blocked on a line calling one of these waits on a peer (a socket, an HTTP server), not
# on storage: workers hung on socket.recv were called "waits for storage" with iowait 0.
_NETWORK_CODE = re.compile(r"\.(recv|recv_into|recvfrom|accept|connect|sendall|getresponse)\(|urlopen\(|requests\.")


def _worker_read_blocked_share(ctx: AnalysisContext) -> tuple[float, int]:
    """Share of loader-worker samples blocked inside the fetch outside any lock or queue:
    waiting on a read."""
    xs = ctx.worker_stacks
    if not xs:
        return 0.0, 0
    blocked = sum(1 for s in xs if s.category is Category.DATA_FETCH and not s.active and not _in_wait(s))
    return blocked / len(xs), len(xs)


def _in_wait(s) -> bool:
    f = s.frames[0] if s.frames else None
    if f is None:
        return False
    name = f.filename.replace("\\", "/").rsplit("/", 1)[-1]
    return name in _WAIT_FILES or bool(f.code and ("sleep(" in f.code or ".wait(" in f.code or _NETWORK_CODE.search(f.code)))


def _io_signals(ctx: AnalysisContext, g: GpuView, cost: float):
    """io-bound's evidence: (the IO-wait share of the data wait, iowait cores, disk reads, the
    workers' read-blocked share and its sample count, [each of the three signals])."""
    io_share = g.breakdown.get(Bucket.IO) / cost if cost else 0.0
    h = ctx.host
    iowait = h.iowait_cores if h else None
    disk = h.disk_read_mean if h else None
    blocked, nw = _worker_read_blocked_share(ctx)
    signals = [
        io_share >= IO_SHARE,
        iowait is not None and iowait >= IOWAIT_CORES and (disk or 0) >= DISK_READ_BPS,
        nw >= MIN_WORKER_SAMPLES and blocked >= WORKER_READ_BLOCKED_SHARE,
    ]
    return io_share, iowait, disk, blocked, nw, signals


@uses(IO_SHARE, IOWAIT_CORES, DISK_READ_BPS, WORKER_READ_BLOCKED_SHARE, MIN_WORKER_SAMPLES, SATURATED_WORKER_SHARE,
      WORKERS_IDLE_SHARE, MAX_IO_WORKERS, WORKER_MARGIN, MIN_MAIN_SAMPLES, MIN_COST_FRACTION, MIN_COST_S,
      MIN_RECURRENCES)
def check_io_bound(ctx: AnalysisContext) -> Hit | None:
    if not enough_stacks(ctx):
        return None
    w = ctx.workers
    if workers_busy(ctx):
        return None  # CPU-bound workers: see workers-saturated
    if workers_waiting_for_work(ctx):
        return None  # the workers have batches ready: not waiting on reads
    found = worst(ctx, data_wait_s)
    if found is None or not significant(found[0], found[1], buckets=DATA_BUCKETS):
        return None
    g, cost = found
    bd = g.breakdown
    io_share, iowait, disk, blocked, nw, signals = _io_signals(ctx, g, cost)
    h = ctx.host
    if not any(signals):
        return None
    if (signals == [True, False, False] and blocked == 0.0 and iowait is not None and iowait < IOWAIT_CORES
            and (disk or 0) < DISK_READ_BPS):
        # The IO-wait share alone (a job's process seen in disk sleep at some polls: a page fault,
        # a library loaded), with no iowait, hardly a disk read and no worker stack in a read: the
        # workers wait on something else (a new user's workers sleeping in __getitem__ were told
        # "input is IO-bound" with "no storage evidence" in the finding's own lines).
        return None
    frac = loop_wait(ctx, cost / bd.total_s, Category.DATA_WAIT)
    upper = loop_wait_upper(ctx, cost / bd.total_s, Category.DATA_WAIT)  # the stated bound's only
    ev = [idle_line(g, [Bucket.DATA, Bucket.IO])]
    line = labels_line(g, Bucket.DATA)
    if line:
        ev.append(line)
    if w.count:
        ev.append(f"{workers_cpu_line(ctx)}: they wait, they do not compute")
    if nw:
        ev.append(f"worker stacks blocked in a read in {pct(blocked)} of {nw} samples")
    if iowait is not None:
        ev.append(f"iowait {iowait:.1f} cores on average, disk reads {fmt_rate(disk)}")
    n = workers_for(w.count, frac, MAX_IO_WORKERS)
    # Storage advice needs storage evidence: iowait or a disk read rate. With neither (iowait
    # near 0, hardly any reads) the blocked reads wait on something else (a socket, a remote
    # service, a pipe), which a faster disk does not change.
    storage = h is None or iowait is None or iowait >= IOWAIT_CORES or (disk or 0) >= DISK_READ_BPS
    if storage:
        closer = ("Then move the data closer: copy the dataset to local NVMe or RAM (/dev/shm if it fits), "
                  "and pack small files into large shards (WebDataset tar shards, one memory-mapped array)")
    else:
        closer = ("Local storage is not the wait (little iowait, few disk reads): see in the worker stacks what "
                  "the reads block on (a socket, a remote store) and speed that up or cache its answers")
        ev.append("no storage evidence: the blocked reads are not waiting on a local disk")
    # Blocked reads overlap at most in proportion to the readers: w.count (or the one training
    # thread) -> n.
    limit = n / max(1, w.count)
    return Hit(
        evidence=tuple(ev),
        action=f"{loader_line(n, 4, pin=g.index != CPU_DEVICE, ctx=ctx)}  # reads overlap; blocked workers cost no CPU. " + closer,
        expected_gain=gain(frac, limit, f"{n} readers instead of {max(1, w.count)} (reads overlap at most in proportion)",
                           upper=upper),
        gain_bound=bounded(frac, limit, upper),
        cost_s=cost,
        confidence=confidence(max(io_share, blocked, 1.0 if signals[1] else 0.0), bd.idle_samples),
        gpu_index=gpu_index(g),
        title=f"{device_name(g)} waits for storage {pct(frac)} of the time: input is IO-bound",
    )


# --------------------------------------------------------------------------- workers blocked

# Loader workers that wait rather than compute: each at most this much of a core on average
# (its /proc readings, one a second) while the trainer waits for data. Judgement: half a core;
# a worker computing its batches reads near 100 % (workers-saturated's workload: 100 % each,
# bench/results/advisor_bench.json), the new user's workers sleeping 4 ms per sample in
# __getitem__ read 3-5 %.
WORKER_OFF_CPU_PCT = Threshold(
    50.0, "% of a core", JUDGEMENT,
    "A loader worker at most this much of a core while the trainer waits for data is not computing its "
    "batches: it waits (a sleep, a read, a remote call); a computing worker reads near 100 %.",
    "bench/results/advisor_bench.json")
# The workers' CPU readings (many: one a second each) say they are off the CPU; their stacks (one
# worker a second at best, fewer on a loaded host) only say where: inside the fetch, in the
# Dataset's own code, not in a lock or queue shared between workers (where more of them would
# queue behind the same lock). This many stacks agreeing, and none against, is judgement: two, so
# one stray sample does not name the place.
MIN_BLOCKED_WORKER_STACKS = IntThreshold(
    2, "samples", JUDGEMENT,
    "Worker stacks that place the workers' wait inside the fetch's own code (not a lock or queue): the CPU "
    "readings say they wait, the stacks only where.")
# A worker's threads runnable at least this share of their readings want a CPU: off the CPU
# because queued for one, not because it waits on its own calls (cpu-oversubscribed's class).
# Judgement: half.
WORKER_QUEUED_SHARE = Threshold(
    0.5, "share", JUDGEMENT,
    "Workers' threads runnable this share of their readings are queued for a CPU, not waiting on their own "
    "calls; judged only on a host whose CPUs are saturated (CPU_SATURATED_PCT).")
# The files where a blocked worker waits on something the workers share (a lock, a queue, a
# pipe to the trainer): more workers queue behind it. A sleep, a socket or a read in the
# Dataset's own code is a wait each worker has alone, and overlaps across workers.
_SHARED_WAIT_FILES = ("threading.py", "synchronize.py", "queues.py", "queue.py", "connection.py")


def _blocked_in_fetch(ctx: AnalysisContext) -> tuple[list, int]:
    """(worker stacks blocked inside the fetch in code of their own, the worker fetch stacks)."""
    fetch = [s for s in ctx.worker_stacks if s.category is Category.DATA_FETCH]
    blocked = []
    for s in fetch:
        leaf = s.frames[0].filename.replace("\\", "/").rsplit("/", 1)[-1] if s.frames else ""
        if not s.active and leaf not in _SHARED_WAIT_FILES:
            blocked.append(s)
    return blocked, len(fetch)


def _queued_for_cpu(ctx: AnalysisContext) -> bool | None:
    """Whether the workers' threads are queued for a CPU (runnable, not running), from the
    per-thread readings; None without readings for every worker."""
    mine = _worker_threads(ctx)
    if not mine or {t.pid for t in mine} < {c.pid for c in ctx.workers.current}:
        return None
    queued = sum(max(0.0, t.runnable - min(t.cpu, 1.0)) for t in mine)
    return queued / len(mine) >= WORKER_QUEUED_SHARE


@uses(WORKER_OFF_CPU_PCT, MIN_BLOCKED_WORKER_STACKS, WORKER_QUEUED_SHARE, CPU_SATURATED_PCT, MIN_THREAD_READINGS,
      IO_SHARE, IOWAIT_CORES, DISK_READ_BPS, WORKER_READ_BLOCKED_SHARE, MIN_WORKER_SAMPLES, SATURATED_WORKER_SHARE,
      WORKERS_IDLE_SHARE, OVERSUB_RATIO, MAX_IO_WORKERS, WORKER_MARGIN, MIN_MAIN_SAMPLES, MIN_COST_FRACTION,
      MIN_COST_S, MIN_RECURRENCES)
def check_workers_blocked(ctx: AnalysisContext) -> Hit | None:
    """The trainer waits for data while its loader workers wait too: off the CPU inside their
    fetch, in the Dataset's own code (a sleep, a remote or network read, a slow call that does not
    compute), on no storage the host sees saturated. Each worker has one batch in hand at a time,
    so the pool delivers in proportion to its workers: more of them overlap the waits. Not
    workers-saturated's class (workers at a full core: the CPU is the limit), nor
    cpu-oversubscribed's (workers queued for a CPU), nor io-bound's (storage evidence)."""
    w, h = ctx.workers, ctx.host
    if not w.count or not enough_stacks(ctx) or h is None or h.cpu_mean is None:
        return None
    if workers_busy(ctx) or oversubscription(ctx) or workers_waiting_for_work(ctx):
        return None
    cpus = [c.cpu_mean for c in w.current if c.cpu_mean is not None]
    if len(cpus) < w.count or max(cpus) > WORKER_OFF_CPU_PCT:
        return None
    if h.cpu_mean >= CPU_SATURATED_PCT and _queued_for_cpu(ctx) is not False:
        return None  # on a saturated host a worker off the CPU may be waiting for one
    blocked, fetch = _blocked_in_fetch(ctx)
    if len(blocked) < MIN_BLOCKED_WORKER_STACKS or len(blocked) < fetch:
        return None
    found = worst(ctx, data_wait_s)
    if found is None or not significant(found[0], found[1], buckets=DATA_BUCKETS):
        return None
    g, cost = found
    if any(_io_signals(ctx, g, cost)[-1]):
        return None  # storage or reads: io-bound's
    frac = loop_wait(ctx, cost / g.breakdown.total_s, Category.DATA_WAIT)
    upper = loop_wait_upper(ctx, cost / g.breakdown.total_s, Category.DATA_WAIT)  # the stated bound's only
    place = hot_place(blocked)
    where = place[0] if place else "the Dataset's fetch"
    name = where.split(" (")[0]
    code = next((f.code for s in reversed(blocked) for f in s.frames if f.name == name and f.code), None)
    # The pool's own CPU bounds it too: today's workers use ``used`` cores for today's rate, so
    # with the host's spare cores the rate can grow at most (used + spare) / used.
    used = sum(cpus) / 100
    spare = max(0.0, h.spare_cores or 0.0)
    cpu_factor = (used + spare) / used if used > 0 else float(MAX_IO_WORKERS)
    cap = max(w.count + 1, min(MAX_IO_WORKERS, int(w.count * cpu_factor)))
    n = workers_for(w.count, frac, cap)
    limit = n / w.count
    ev = [idle_line(g, [Bucket.DATA, Bucket.IO])]
    line = labels_line(g, Bucket.DATA)
    if line:
        ev.append(line)
    ev.append(f"{workers_cpu_line(ctx)}: they wait, they do not compute")
    ev.append(f"worker stacks blocked (off the CPU) in `{where}`" + (f": `{code}`" if code else "")
              + f" in {len(blocked)} of {fetch} samples in their fetch, outside any lock or queue")
    host = _host_line(ctx)
    if host:
        ev.append(host + ", no storage wait (iowait, disk reads) to explain it")
    return Hit(
        evidence=tuple(ev),
        action=(f"{loader_line(n, pin=g.index != CPU_DEVICE, ctx=ctx)}  # was {w.count}: each worker has one batch "
                f"in hand and waits in `{name}`, so more workers overlap the waits; or make that wait concurrent "
                "within a worker (fetch a batch's samples with a thread pool or asyncio in __getitem__/a batch "
                "sampler), or cache what it fetches"),
        expected_gain=gain(frac, limit, f"{n} workers instead of {w.count} (their waits overlap at most in "
                           "proportion)", upper=upper),
        gain_bound=bounded(frac, limit, upper),
        cost_s=cost,
        confidence=confidence(min(1.0, frac), len(ctx.main_stacks)),
        gpu_index=gpu_index(g),
        title=f"{device_name(g)} waits for data {pct(frac)} of the time: loader workers blocked in `{name}`, not "
              "computing",
    )


# --------------------------------------------------------------------------- the pool's life

# Docker's default /dev/shm is 64 MiB (Docker's `docker run --shm-size` reference); PyTorch's
# README warns that loaders need more, and the guides this advisor follows ask for --shm-size of
# 1g or more. Below 1 GiB is reported...
SMALL_SHM_BYTES = IntThreshold(
    1 << 30, "bytes", DOCUMENTED, "Docker's default /dev/shm is 64 MiB and loaders need more: the guides ask for "
    "--shm-size of 1g or more.", "Docker's `docker run --shm-size` reference; PyTorch's README")
# ...as a warning once it is at least this full in the window, else as a note.
SHM_FILLING = Threshold(0.5, "share", JUDGEMENT, "A small /dev/shm this full is a warning, else a note.")


def respawns(ctx: AnalysisContext) -> tuple[float, ...]:
    """When a new pool of workers started in the window, replacing one that exited (none unless a
    whole pool was replaced: persistent_workers=False at an epoch's end). A pool started before
    the window is not a restart seen."""
    w = ctx.workers
    if not w.count or w.respawned < w.count:
        return ()
    first = ctx.now - ctx.window_s
    starts = [t for t in w.pool_starts() if t >= first]
    # The oldest pool seen may be the job's first (no restart: persistent workers start once too).
    starts = starts[1:] if len(starts) > 1 else starts
    if not starts:  # start times unread: the current pool's start, as before
        born = min((c.create_time for c in w.current if c.create_time), default=None)
        starts = [born] if born else []
    return tuple(starts)


def respawn_idle_s(g: GpuView, starts: tuple[float, ...]) -> float:
    """The GPU's idle time in the RESPAWN_STALL_S after any pool start (each slice once)."""
    return sum(s.idle_s for s in g.slices if any(b <= s.mid <= b + RESPAWN_STALL_S for b in starts))


@uses(RESPAWN_STALL_S, MIN_COST_S, MIN_COST_FRACTION)
def check_loader_respawn(ctx: AnalysisContext) -> Hit | None:
    """The whole worker pool was replaced in the window: a new epoch started new workers
    (persistent_workers=False), and the GPU waited while they started."""
    w = ctx.workers
    starts = respawns(ctx)
    if not starts:
        return None
    found = worst(ctx, lambda g: respawn_idle_s(g, starts))
    if found is None or found[1] < MIN_COST_S:
        return None
    g, c = found
    epochs = (f"{len(starts)} times in the window (every epoch)" if len(starts) > 1 else "in the window (a new epoch)")
    return Hit(
        evidence=(
            f"{w.respawned} loader workers exited and new ones started {epochs}",
            f"{device_name(g)} idle {secs(c)} in the {RESPAWN_STALL_S:.0f} s after the new workers started",
        ),
        action=loader_line(w.count, pin=g.index != CPU_DEVICE, ctx=ctx) + "  # persistent_workers=True keeps the workers across epochs",
        expected_gain=f"about {secs(c)} of GPU time back at every epoch start: "
        + gain(c / g.breakdown.total_s, upper=device_upper(ctx, g, c / g.breakdown.total_s)).replace(
            "steps/s", "steps/s over this window"),
        gain_bound=bounded(c / g.breakdown.total_s, upper=device_upper(ctx, g, c / g.breakdown.total_s)),
        cost_s=c,
        confidence=0.7,
        gpu_index=gpu_index(g),
        # Worth a warning when what it costs is a share of the window that any other cause would
        # be warned of (short epochs re-spawn their workers often: measured 65x from
        # persistent_workers=True on such a job); a rare epoch boundary stays a note.
        severity=Severity.WARNING if significant(g, c) else Severity.INFO,
        title="DataLoader workers restart every epoch",
    )


@uses(SMALL_SHM_BYTES, SHM_FILLING)
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



# --------------------------------------------------------------------------- attached to a worker

# The attached process's main thread inside DataLoader's worker loop in at least this share of its
# samples: it is one of a job's workers, not the training process. Judgement: a training process
# never runs the worker loop on its main thread (num_workers=0 fetches in the loop itself).
WORKER_TARGET_SHARE = Threshold(
    0.9, "share", JUDGEMENT,
    "The attached process's main thread in DataLoader's _worker_loop at least this share of its samples: it is a "
    "worker, not the training process (whose main thread never runs that loop).")


def _in_worker_loop(frames) -> bool:
    return any(f.name == WORKER_LOOP_FRAME for f in frames)  # as analysis.is_worker reads a stack


@uses(WORKER_TARGET_SHARE, MIN_MAIN_SAMPLES)
def check_attached_to_worker(ctx: AnalysisContext) -> Hit | None:
    """``gputop --pid`` given a DataLoader worker's PID: what it sees is the worker's fetch, and
    its silence says nothing of the job (a new user was told "no findings" for a job that slept
    92 % of its time: the worker waited for it)."""
    main = ctx.main_stacks
    if len(main) < MIN_MAIN_SAMPLES:
        return None
    share = sum(1 for s in main if _in_worker_loop(s.frames)) / len(main)
    if share < WORKER_TARGET_SHARE:
        return None
    parent = ctx.target.ppid if ctx.target is not None else None
    to = f"gputop --pid {parent} (its parent)" if parent else "gputop --pid <the training process> (its parent)"
    return Hit(
        evidence=(f"PID {ctx.target_pid}'s main thread is inside DataLoader's _worker_loop in {pct(share)} of its "
                  f"samples: it is a DataLoader worker" + (f" of PID {parent}" if parent else ""),
                  "a worker fetches batches for the training process; the job's step, its GPU use and its causes "
                  "are that process's"),
        action=f"attach to the training process: {to}; its workers are followed from it",
        cost_s=0.0,
        confidence=1.0,
        title=f"PID {ctx.target_pid} is a DataLoader worker, not the training process",
    )
