"""The host side of the training step: syncs that drain the GPU's queue, copies from pageable
memory, and a CPU that cannot launch kernels as fast as the GPU runs them.

All three show as idle GPU time while the main thread is busy; the main thread's stacks (in a
sync, in a copy, dispatching) and GPM's SM activity tell them apart.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ...analysis import AFTER_UPDATE, BEFORE_FORWARD, CPU_DEVICE, Bucket, when_in_step
from ...analysis import hot_place, project_frame, short_path, stack_label
from ...units import fmt_rate
from ...model import Category, Severity, StackSample
from ..context import AnalysisContext, GpuView
from .distributed import GPU_OTHERS_WAIT_MIN, OTHERS_WAIT_MIN
from .base import (
    GPM_BUSY_UTIL_PCT,
    LAUNCH_BOUND_SM_ACTIVE_PCT,
    MIN_COST_FRACTION,
    MIN_COST_S,
    MIN_MAIN_SAMPLES,
    MIN_RECURRENCES,
    SPIN_EXPLAINS,
    Hit,
    Withdraw,
    bounded,
    device_name,
    confidence,
    enough_stacks,
    gain,
    idle_line,
    in_evaluation,
    labels_line,
    pct,
    sampled_upper,
    significant,
    spinning,
    starved_sm_s,
    times,
    training_share,
    uses,
    waits_for_peers,
    window_text,
    worst,
)
from .threshold import DERIVED, JUDGEMENT, IntThreshold, Threshold
from .data import WORKER_MARGIN, workers_for
from .memory import BATCH_TARGET_SHARE, MAX_BATCH_FACTOR, MEM_HEADROOM, MEM_NEAR_LIMIT, larger_batch
from .optimizer import OPTIMIZER_LEADS_SHARE, UNFUSED_MIN_SHARE, optimizer_leads

# --------------------------------------------------------------------------- host syncs

# The main thread in .item()/.cpu()/synchronize in this share of its samples (all of them, not
# only during idle: while it waits, the GPU is busy draining the queue it could not refill) is a
# sync problem however the samples are spread.
HOST_SYNC_MIN_SHARE = Threshold(
    0.20, "share", JUDGEMENT,
    "The main thread in .item()/.cpu()/synchronize this share of its samples is a sync problem however they are "
    "spread.")
# Below that, a sync in every step still is one when it is steady. Measured: the host-sync
# workload (a ~4 ms step with .item()/.cpu()/synchronize each step) spent 19 % of its wall time
# in the syncs by its own accounting, yet its breakdown read busy 41 %, sync 11 %, cpu 48 %: the
# GPU also idles while the CPU dispatches the next step, since nothing was queued ahead; it was
# taken for launch-bound (bench/results/harness.md). Its main thread sat in a sync in 13 % of the
# samples, spread over the whole window (bench/results/advisor_bench.json); the launch-bound
# workload (no syncs) had none of its samples there. Judgement: a healthy loop syncs once per
# logging step (every 10-100 steps), well under 5 % of the samples.
HOST_SYNC_STEADY_SHARE = Threshold(
    0.05, "share", JUDGEMENT,
    "Below HOST_SYNC_MIN_SHARE, syncs in this share of the samples, steady through the window, are a sync in "
    "every step; a healthy loop syncs once per logging step, well under 5 %.",
    "bench/results/harness.md, bench/results/advisor_bench.json")
# "Steady": the window (first to last main-thread sample) cut into stretches that should hold
# about this many sync samples each if the syncs were spread evenly (then a stretch is empty by
# chance ~5 % of the time: e^-3, Poisson)...
SYNC_SAMPLES_PER_STRETCH = IntThreshold(
    3, "samples", DERIVED,
    "The window is cut into stretches of about this many sync samples each: evenly spread syncs leave a stretch "
    "empty by chance ~5 % of the time (e^-3, Poisson).")
# ...but never fewer than 2 stretches (one says nothing of spread) nor more than 20 (judgement)...
MIN_STRETCHES, MAX_STRETCHES = (
    IntThreshold(2, "stretches", DERIVED, "Never fewer stretches than two: one says nothing of spread."),
    IntThreshold(20, "stretches", JUDGEMENT, "Never more stretches than this."),
)
# ...and syncs seen in at least this share of the stretches. A burst (an evaluation pass, one
# save) fills a few adjacent stretches; a per-step sync fills nearly all of them (the host-sync
# workload: 4 of 4, bench/results/advisor_bench.json).
HOST_SYNC_STEADY_COVERAGE = Threshold(
    0.6, "share", JUDGEMENT,
    "Syncs in at least this share of the stretches are steady: a burst (an evaluation, a save) fills a few "
    "adjacent ones, a per-step sync nearly all.", "bench/results/advisor_bench.json")
MIN_SYNC_SAMPLES = IntThreshold(
    4, "samples", JUDGEMENT, "Fewer sync samples than this say nothing about a pattern (0.8 s at the sampler's 5 Hz).")


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


# torch.distributed's object collectives. On a GPU's process group (NCCL) each pickles its object
# into a tensor, copies it to the GPU, reads the gathered sizes back with .item() and copies the
# results to the host: a host-device sync inside a collective, every call. A held-out DDP job
# averaging its per-step metrics through all_gather_object (1.25x once they were summed in one
# device tensor all-reduced every N steps; 2 x H200) sat in them in 7-10 % of its samples beside
# 7 % in .item(), each alone short of the steady bar. On gloo (no GPU) they are collectives only.
_OBJECT_COLLECTIVES = frozenset({"all_gather_object", "gather_object", "broadcast_object_list",
                                 "scatter_object_list", "send_object_list", "recv_object_list"})
_C10D_FILE = "torch/distributed/distributed_c10d.py"


def object_collective(s: StackSample) -> bool:
    """The sample waits inside one of torch.distributed's object collectives."""
    return s.category is Category.COLLECTIVE and any(
        f.name in _OBJECT_COLLECTIVES and f.filename.replace("\\", "/").endswith(_C10D_FILE) for f in s.frames)


def syncs_host(ctx: AnalysisContext, s: StackSample) -> bool:
    """The sample waits for the GPU: a sync of its own, or an object collective on a job with GPUs."""
    return s.category is Category.HOST_SYNC or (any(g.index != CPU_DEVICE for g in ctx.gpus) and object_collective(s))


def sync_pattern(ctx: AnalysisContext) -> SyncPattern:
    """The training's syncs: an evaluation's `.item()` reads are its own (eval-every-step)."""
    xs = ctx.main_stacks
    syncs = [s.ts for s, ev in zip(xs, in_evaluation(ctx)) if syncs_host(ctx, s) and not ev]
    n = len(syncs)
    share = n / len(xs) if xs else 0.0
    k = max(MIN_STRETCHES, min(MAX_STRETCHES, n // SYNC_SAMPLES_PER_STRETCH))
    t0, t1 = (xs[0].ts, xs[-1].ts) if xs else (0.0, 0.0)
    if n == 0 or t1 <= t0:
        return SyncPattern(share, n, k, 1 if n else 0)
    width = (t1 - t0) / k
    covered = len({min(k - 1, int((t - t0) / width)) for t in syncs})
    return SyncPattern(share, n, k, covered)


@uses(HOST_SYNC_MIN_SHARE, HOST_SYNC_STEADY_SHARE, MIN_SYNC_SAMPLES, HOST_SYNC_STEADY_COVERAGE,
      SYNC_SAMPLES_PER_STRETCH, MIN_STRETCHES, MAX_STRETCHES, MIN_MAIN_SAMPLES, MIN_COST_FRACTION, MIN_COST_S,
      MIN_RECURRENCES)
def check_host_sync(ctx: AnalysisContext) -> Hit | None:
    if not enough_stacks(ctx):
        return None
    pat = sync_pattern(ctx)
    if not pat.claims_dispatch:
        return None
    # The cost: the GPU idle while the thread waits in the sync, and while it then dispatches
    # the next step (forward/backward/optimizer with nothing queued): without the sync that
    # dispatch would overlap the GPU's work on the step before.
    found = worst(ctx, lambda g: g.breakdown.get(Bucket.SYNC) + g.breakdown.get(Bucket.CPU), gpu_only=True)
    if found is None or not significant(found[0], found[1], buckets=(Bucket.SYNC, Bucket.CPU)):
        return None
    g, cost = found
    bd = g.breakdown
    frac = cost / bd.total_s
    places = sync_labels(ctx, 3)
    ev = [
        idle_line(g, [Bucket.SYNC, Bucket.CPU]),
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
    action, title = (
        f"remove the per-step .item()/.cpu()/.tolist()/print(loss) from the loop{first}; accumulate on "
        "the GPU and read it every 100 steps: `running += loss.detach()` each step, then "
        "`if step % 100 == 0: log(running.item() / 100); running.zero_()`; no torch.cuda.synchronize() "
        "in the loop (time with torch.cuda.Event(enable_timing=True) if needed); keep CUDA_LAUNCH_BLOCKING unset",
        f"Host-device syncs every step: {g.name} idle {pct(bd.idle_fraction)}")
    site = sync_site_kind(places[0][0]) if places else None
    if site is not None:
        action, title = site[0].format(where=places[0][0]), site[1].format(gpu=g.name, idle=pct(bd.idle_fraction))
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain=gain(frac) + ": the CPU queues steps ahead again",
        gain_bound=bounded(frac),
        cost_s=cost,
        confidence=confidence(
            max(min(1.0, pat.share * 2), 0.8 * pat.coverage if pat.steady else 0.0), len(ctx.main_stacks)
        ),
        gpu_index=g.index,
        title=title,
    )


def sync_labels(ctx: AnalysisContext, n: int) -> list[tuple[str, float]]:
    """The commonest places the training's main thread waited for the GPU (syncs_host), with their
    share of all its samples; an object collective's place says which it is."""
    xs = ctx.main_stacks
    if not xs:
        return []
    c = Counter(_sync_label(s) for s, ev in zip(xs, in_evaluation(ctx)) if syncs_host(ctx, s) and not ev)
    return [(lab, k / len(xs)) for lab, k in c.most_common(n)]


def _sync_label(s: StackSample) -> str:
    """stack_label's place; for an object collective called from a function of the user's (not
    its own line), with the collective's name after it."""
    lab = stack_label(s)
    if object_collective(s):
        call = next(f.name for f in s.frames if f.name in _OBJECT_COLLECTIVES)
        if not lab.strip("`").startswith(call):
            lab += f" in {call}"
    return lab


def training_labels(ctx: AnalysisContext, category: Category, n: int) -> list[tuple[str, float]]:
    """``ctx.main_labels`` for the training's samples only (not an evaluation's): the commonest
    places the main thread was in ``category``, with their share of all its samples."""
    xs = ctx.main_stacks
    if not xs:
        return []
    c = Counter(stack_label(s) for s, ev in zip(xs, in_evaluation(ctx)) if s.category is category and not ev)
    return [(lab, k / len(xs)) for lab, k in c.most_common(n)]


# The sync's own call, where it is one that is not a read of a value: the action that fits it.
# (label word, action, title); the label is analysis.breakdown.stack_label's ("empty_cache (train.py:40)").
_SYNC_SITES: tuple[tuple[str, str, str], ...] = (
    ("empty_cache",
     "remove torch.cuda.empty_cache() from the loop ({where}): it hands the caching allocator's free blocks back "
     "to the driver, so the next step allocates them again (cudaMalloc) and every call waits for the GPU; if "
     "it is there against out-of-memory errors or fragmentation, set "
     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True instead (torch.cuda.memory_summary() shows the "
     "fragmentation); at most call it between epochs",
     "torch.cuda.empty_cache() every step: {gpu} idle {idle}"),
    ("synchronize",
     "remove torch.cuda.synchronize() from the loop ({where}): the CPU stops queueing until the GPU drains; "
     "to time a step, record torch.cuda.Event(enable_timing=True) pairs and read them every 100 steps",
     "torch.cuda.synchronize() every step: {gpu} idle {idle}"),
    *((name,
       f"take {name} out of the step ({{where}}): on NCCL it pickles the object, copies it through the GPU and "
       "reads sizes and results back to the host, a sync every call; keep the per-step values in one device "
       "tensor (`stats += torch.stack([loss.detach(), acc])`) and every 100 steps dist.all_reduce it and read "
       "it once, or log rank 0's own values",
       f"{name} every step syncs the host with {{gpu}}: idle {{idle}}")
      for name in sorted(_OBJECT_COLLECTIVES)),
)


def sync_site_kind(label: str) -> tuple[str, str] | None:
    """(action, title) templates for a sync site whose call says what it is, else None."""
    name = label.split(" (", 1)[0].strip("`")
    if ") in " in label:  # an object collective's place: "gather_metrics (train.py:50) in all_gather_object"
        name = label.rsplit(") in ", 1)[1]
    for word, action, title in _SYNC_SITES:
        if name == word or name.endswith("." + word) or f".{word}(" in name or name.startswith(word + "("):
            return action, title
    return None


# --------------------------------------------------------------------------- copies


# The GPU sends at least this many times what it receives over PCIe: the copies the main thread
# waits in go to the host, not to the GPU. A training step's uploads (its batches) dwarf its
# downloads (a loss scalar), so a step that downloads three times what it uploads is copying
# tensors back: a held-out job keeping its EMA weights on the host sent 16x what it received
# (2.4 GB/s against 0.15); the uploading jobs recorded send 0.01-0.5x. Judgement between them.
COPY_DOWNLOAD_RATIO = Threshold(
    3.0, "x", JUDGEMENT,
    "PCIe transmit (device to host) at least this many times receive: the copies waited in go to the host (an EMA "
    "kept on the host 16x; uploading jobs 0.01-0.5x).", "bench/results/real_jobs_fresh8.md")


def copies_to_host(g: GpuView) -> bool:
    """Whether the copies the window sees go from the GPU to the host (PCIe says which way)."""
    e = g.efficiency
    if e.pcie_tx_mean is None or e.pcie_rx_mean is None:
        return False
    return e.pcie_tx_mean >= COPY_DOWNLOAD_RATIO * max(e.pcie_rx_mean, 1.0)


def _copy_wait(g: GpuView) -> float:
    return 0.0 if small_copies(g) else g.breakdown.get(Bucket.H2D)


# While the main thread sits on a copy's line, PCIe carries at least this much: a pageable copy
# runs at 2-13 GB/s (PCIe gen3-5, staged through a bounce buffer), a pinned one faster. A line
# whose "copy" moves less is spending its time on the rest of the line: the tensor the copy
# takes is made there (a held-out job's `torch.randperm(2.5M)[:1024].to(device)` each step:
# 56 MB/s over the time on that line, 3.12x when the permutation moved to the GPU; it was told
# to pin its batches). Judgement: half the slowest pageable copy.
COPY_MIN_RATE_BPS = Threshold(
    1e9, "B/s", JUDGEMENT,
    "PCIe moves at least this much over the time the main thread sits on copy lines, or the time is the rest "
    "of the line's (pageable copies run at 2-13 GB/s; a CPU randperm on the copy's line: 56 MB/s).",
    "bench/results/real_jobs_fresh9.md")


def small_copies(g: GpuView) -> bool:
    """The copy lines' time moves too few bytes over PCIe to be the copy's (either way): the
    line does other work (COPY_MIN_RATE_BPS). Unknown without PCIe counters: False."""
    e, bd = g.efficiency, g.breakdown
    share = bd.get(Bucket.H2D) / bd.total_s if bd.total_s else 0.0
    if share <= 0.0 or e.pcie_rx_mean is None or e.pcie_tx_mean is None:
        return False
    return max(e.pcie_rx_mean, e.pcie_tx_mean) / share < COPY_MIN_RATE_BPS


@uses(MIN_COST_FRACTION, MIN_COST_S, MIN_RECURRENCES, COPY_DOWNLOAD_RATIO, COPY_MIN_RATE_BPS)
def check_pageable_h2d(ctx: AnalysisContext) -> Hit | None:
    found = worst(ctx, lambda g: 0.0 if copies_to_host(g) else _copy_wait(g), gpu_only=True)
    if found is None or not significant(found[0], found[1], buckets=(Bucket.H2D,)):
        return None
    g, cost = found
    frac = cost / g.breakdown.total_s
    ev = [idle_line(g, [Bucket.H2D])]
    line = labels_line(g, Bucket.H2D)
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
        expected_gain=gain(frac) + "; pinned copies run at full PCIe speed and overlap compute",
        gain_bound=bounded(frac),
        cost_s=cost,
        confidence=confidence(g.breakdown.idle_sample_share(Bucket.H2D) or frac, g.breakdown.idle_samples),
        gpu_index=g.index,
        title=f"{g.name} waits for host-to-device copies {pct(frac)} of the time",
    )


# A weight average kept beside the model (EMA, SWA): its update's function names say so.
_AVERAGE = re.compile(r"(?i)(^|[._])((model_?)?ema(v\d)?|swa)([._]|$)|modelema|averagedmodel|update_parameters|"
                      r"exponential_?moving|moving_?average")


def _averaging(samples: Sequence[StackSample]) -> bool:
    return any(_AVERAGE.search(f.name) for s in samples for f in s.frames)


@uses(MIN_COST_FRACTION, MIN_COST_S, MIN_RECURRENCES, COPY_DOWNLOAD_RATIO, COPY_MIN_RATE_BPS)
def check_copies_to_host(ctx: AnalysisContext) -> Hit | None:
    found = worst(ctx, lambda g: _copy_wait(g) if copies_to_host(g) else 0.0, gpu_only=True)
    if found is None or not significant(found[0], found[1], buckets=(Bucket.H2D,)):
        return None
    g, cost = found
    e, bd = g.efficiency, g.breakdown
    frac = cost / bd.total_s
    copying = [s for s in ctx.main_stacks if s.category is Category.H2D_COPY]
    place = hot_place(copying) if copying else None
    ev = [f"{g.name} idle {pct(bd.idle_fraction)} of {window_text(g)}; {pct(frac)} while the main thread copies",
          f"PCIe transmit (GPU to host) {fmt_rate(e.pcie_tx_mean)} against receive {fmt_rate(e.pcie_rx_mean)}: "
          "the copies bring GPU tensors to the host, not batches to the GPU"]
    line = labels_line(g, Bucket.H2D)
    if line:
        ev.append(line)
    where = f" ({place[0]})" if place else ""
    if _averaging(copying):
        what = "a weight average (EMA) kept on the host"
        action = (f"keep the EMA on the GPU{where}: timm ModelEmaV3(model, decay) without device='cpu' (or "
                  "AveragedModel / your EMA's copy built on the model's device), updated with torch._foreach_lerp_ "
                  "on GPU tensors; if GPU memory is short, update it every N steps instead of every step")
    else:
        what = "GPU tensors copied to the host"
        action = (f"keep these tensors on the GPU{where}: do the math there and copy only what must leave, every N "
                  "steps; a copy that must run each step goes into a pinned buffer with non_blocking=True "
                  "(buf = torch.empty(shape, pin_memory=True); buf.copy_(t, non_blocking=True)) and is read after "
                  "a later step")
    idle = bd.idle_s / bd.total_s
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain=(gain(frac) + f"; up to {times(bounded(idle))} if the CPU work around the copies (the "
                       "host-side math on them) goes with them"),
        gain_bound=bounded(idle),
        cost_s=cost,
        confidence=confidence(bd.idle_sample_share(Bucket.H2D) or frac, bd.idle_samples),
        gpu_index=g.index,
        title=f"{g.name} waits while the loop copies {what}, {pct(frac)} of the time",
    )


# --------------------------------------------------------------------------- CPU work in the loop

# The main thread's CPU work outside the model (its "other" samples: on a CPU, in the user's own
# code, under no nn.Module, optimizer or loader frame) in at least this share of its samples ...
CPU_WORK_MIN_SHARE = Threshold(
    0.30, "share", JUDGEMENT,
    "The main thread's CPU work outside the model (the user's own code) in at least this share of its samples.")
# ... one function of the user's holding at least this share of that work (it is one place to
# change, not Python spread over the whole step, which a plain loop of torch ops also is) ...
CPU_WORK_ONE_PLACE = Threshold(
    0.50, "share", JUDGEMENT, "One function of the user's holds at least this share of that work: one place to change.")
# ... the GPU busy at most this share of the window: it waits for that work ...
CPU_WORK_GPU_BUSY_MAX = Threshold(
    0.50, "share", JUDGEMENT, "The GPU busy at most half the window: it waits for that work.")
# ... and, where GPM says, the kernels it does run fill it (SM activity per point of utilisation,
# GpuEfficiency.sm_fill): the step's own kernels are real work, the gaps are the CPU's. A plain
# loop of tiny torch ops in one function of the user's looks the same in the stacks (other code,
# one place) but its kernels leave the SMs empty: launch-bound (measured on an H100: SM 0.1 % at
# 16 % busy, a fill of 0.006; a model's kernels fill 0.6-1.0). Judgement: a quarter.
CPU_WORK_SM_FILL_MIN = Threshold(
    0.25, "SM % per util %", JUDGEMENT,
    "Kernels filling the SMs at least this much per point of utilisation are real work; a loop of tiny torch "
    "ops fills 0.006 (launch-bound), a model's kernels 0.6-1.0 (measured on an H100).")


# With no GPU, work whose place in the step is unknown is said only where the model's own work
# (forward, backward, optimizer samples) is at most this fraction of it: a forward or a loss
# written outside any nn.Module is paired with its backward, which is not a quarter of it.
CPU_ONLY_DWARFS = Threshold(
    4.0, "x", JUDGEMENT,
    "With no GPU, work whose place in the step is unknown counts only where it is at least this many times the "
    "model's own work: a forward written outside any nn.Module comes with a backward of like size.")


def cpu_working(s) -> bool:
    """Whether a main-thread sample is CPU work: running, or blocked inside a torch op, whose
    intra-op thread pool does the op's work while the calling thread waits for it (a batch
    resized or normalised on the CPU tensor shows its main thread 'idle' in interpolate or
    normalize for most of the time the pool runs). A sleep or a lock in the user's own code is
    not CPU work: its newest frame is not torch's."""
    if s.active:
        return True
    leaf = s.frames[0].filename.replace("\\", "/") if s.frames else ""
    return "/torch/" in leaf or leaf.startswith("torch/")


def cpu_work_place(ctx: AnalysisContext) -> tuple[str, float, float] | None:
    """(the user's function doing the main thread's CPU work outside the model, its share of the
    main thread's samples, the share of all 'other' work it holds) or None."""
    main = ctx.main_stacks
    # A copy line whose copy PCIe shows too small to take its time does work of its own (the
    # tensor it copies is made there): CPU work like any other (small_copies).
    lines = any(small_copies(g) for g in ctx.gpus)
    other = [s for s, ev in zip(main, in_evaluation(ctx))
             if not ev and cpu_working(s)
             and (s.category is Category.OTHER or (lines and s.category is Category.H2D_COPY and s.active))]
    if not main or len(other) / len(main) < CPU_WORK_MIN_SHARE:
        return None
    found = hot_place(other)
    if found is None:
        return None
    where, k = found
    if k / len(other) < CPU_WORK_ONE_PLACE:
        return None
    return where, k / len(main), k / len(other)


def one_rank_works_while_others_wait(ctx: AnalysisContext, where: str) -> bool:
    """In a job of several ranks, whether the target's CPU work in ``where`` is its own alone
    while every other rank waits in collectives: the job's cost is then the others' wait for this
    rank (a straggler: rank-straggler names it with the function, once its gap resolves), not
    this rank's GPU waiting. A NCCL job's rank 0 running a profiler callback was told
    "CPU work in the loop" 4 s before the straggler it was (bench/results/multi_rank.md)."""
    pid = ctx.main_stacks[-1].pid if ctx.main_stacks else None
    views = [v for v in ctx.ranks if v.samples >= MIN_MAIN_SAMPLES]
    me = next((v for v in views if v.pid == pid), None)
    others = [v for v in views if v is not me]
    if me is None or not others:
        return False
    fn = where.split(" (")[0]
    # The straggler rule's bars for "the others wait": on their GPUs (NCCL) the health bar, on
    # their hosts a third of the samples; and this rank waits less than any of them.
    return all((v.wait >= (GPU_OTHERS_WAIT_MIN if v.gpu_wait is not None else OTHERS_WAIT_MIN))
               and v.wait > me.wait and (v.hot or "").split(" (")[0] != fn for v in others)


@uses(CPU_WORK_MIN_SHARE, CPU_WORK_ONE_PLACE, CPU_WORK_GPU_BUSY_MAX, CPU_WORK_SM_FILL_MIN, WORKER_MARGIN,
      MIN_MAIN_SAMPLES, SPIN_EXPLAINS, MIN_COST_FRACTION, MIN_COST_S, MIN_RECURRENCES, OTHERS_WAIT_MIN,
      GPU_OTHERS_WAIT_MIN, CPU_ONLY_DWARFS, COPY_MIN_RATE_BPS)
def check_cpu_work_in_loop(ctx: AnalysisContext) -> Hit | None:
    """The training loop's own CPU work outside the model (augmentation, decoding, Python
    preprocessing of each batch in the main process) while the GPU waits: its fix is to move that
    work (workers, the GPU, vectorised), which neither CUDA graphs nor a larger batch would do."""
    if not enough_stacks(ctx):
        return None
    found = cpu_work_place(ctx)
    if found is None:
        return None
    where, share, of_other = found
    if one_rank_works_while_others_wait(ctx, where):
        return None
    def parts(v: GpuView) -> list[Bucket]:
        # A copy line's time counts as the CPU work it is when PCIe shows the copy too small to take it.
        return [Bucket.CPU, Bucket.H2D] if small_copies(v) else [Bucket.CPU]

    g = worst(ctx, lambda v: sum(v.breakdown.get(b) for b in parts(v)), gpu_only=True)
    if g is None:
        return _cpu_only_work(ctx, where, share, of_other)
    g, cost = g
    bd = g.breakdown
    if bd.total_s <= 0 or bd.busy_s / bd.total_s > CPU_WORK_GPU_BUSY_MAX or spinning(g):
        return None
    fill = g.efficiency.sm_fill
    if fill is not None and fill < CPU_WORK_SM_FILL_MIN:
        return None  # tiny kernels: the dispatching is the work (launch-bound)
    if not significant(g, cost, buckets=tuple(parts(g))):
        return None
    frac = cost / bd.total_s
    model = training_share(ctx, Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER)
    ev = [f"main thread in `{where}` in {pct(share)} of its samples ({pct(of_other)} of its work outside the "
          f"model), forward/backward/optimizer {pct(model)}",
          idle_line(g, parts(g))]
    if small_copies(g):
        e = g.efficiency
        ev.append(f"PCIe carries {fmt_rate(max(e.pcie_rx_mean or 0.0, e.pcie_tx_mean or 0.0))} while the main thread "
                  "sits on copy lines: the copies are small, the time goes to making what they copy")
    ev += [
          f"{g.name} busy only {pct(bd.busy_s / bd.total_s)}"
          + (f", its kernels filling the SMs while it runs (SM activity {fill:.2f} per point of utilisation)"
             if fill is not None else "")
          + ": it waits for that CPU work, not for kernel launches"]
    # Sized as the loader rules size a pool: from none today, to carry the share the GPU waits.
    workers = workers_for(0, frac, max(2, (ctx.cores or 4) - 1))
    return Hit(
        evidence=tuple(ev),
        action=(f"move the work in `{where}` out of the training loop's thread: into the Dataset's __getitem__ "
                f"or a collate_fn, so DataLoader(..., num_workers={workers}, pin_memory=True, persistent_workers=True) "
                "runs it in parallel with the GPU; or, for tensor math on the batch (resize, flip, noise, "
                "normalise), do it on the GPU after x = x.to(device, non_blocking=True) (torchvision.transforms.v2 "
                "works on CUDA tensors); or vectorise a per-sample Python loop over the whole batch"),
        expected_gain=gain(frac) + ": the GPU no longer waits for it",
        gain_bound=bounded(frac),
        cost_s=cost,
        confidence=confidence(share, len(ctx.main_stacks)),
        gpu_index=g.index,
        title=f"CPU work in the training loop: {g.name} waits {pct(frac)} while the main thread runs `{where.split(' (')[0]}`",
    )


def _statement_share(main: Sequence[StackSample], loop: str | None, fn: str) -> tuple[int | None, float]:
    """The training loop's (``loop``: the step model's, "train (train.py:40)") line that calls
    ``fn`` (the commonest under its samples) and the share of all samples at that line of the
    loop (the statement's whole work); (None, 0) unread."""
    if loop is None or not main:
        return None, 0.0
    name, _, rest = loop.partition(" (")
    path = rest.rsplit(":", 1)[0]
    lines: list[int | None] = []
    calls: Counter = Counter()
    for s in main:
        at = next((f.line for f in s.frames if f.name == name and short_path(f.filename) == path), None)
        lines.append(at)
        if at is not None and any(f.name == fn for f in s.frames if f.name != name):
            calls[at] += 1
    if not calls:
        return None, 0.0
    line = calls.most_common(1)[0][0]
    return line, sum(1 for x in lines if x == line) / len(main)


def _cpu_only_work(ctx: AnalysisContext, where: str, share: float, of_other: float) -> Hit | None:
    """The same work in a job with no GPU: its step runs on the CPU, so the work's share of the
    main thread's samples is the time each step spends on it. Said only for work placed outside
    the model's forward-to-update stretch (before the forward: it prepares the batch; after the
    update: logging, metrics, statistics), since a model written as plain functions outside any
    nn.Module is 'the user's code' too, and is the step itself. A new user's CPU job formatting
    per-parameter statistics every step (87 % of its samples) got "nothing costs a visible share";
    logging every 100 steps measured ~25x."""
    cpu = next((g for g in ctx.gpus if g.index == CPU_DEVICE and g.breakdown.total_s > 0), None)
    if cpu is None or len(ctx.gpus) != 1:
        return None
    model = training_share(ctx, Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER)
    when = when_in_step(ctx.main_stacks, where)
    # Before the forward only where a forward is seen after it (a forward written as plain
    # functions is "before" the backward), after the update only where an update is seen before
    # it (an update written by hand, `p -= lr * p.grad`, is "after" the backward).
    if (when == BEFORE_FORWARD and not training_share(ctx, Category.FORWARD)) or \
            (when == AFTER_UPDATE and not training_share(ctx, Category.OPTIMIZER)):
        when = None
    if when is None and model * CPU_ONLY_DWARFS > share:
        # Its place in the step is unknown and the model's own work is not small beside it: it
        # may be the model (a loss or a forward written outside any nn.Module) between them.
        return None
    n = len(ctx.main_stacks)
    total = cpu.breakdown.total_s
    if share < MIN_COST_FRACTION or share * total < MIN_COST_S:
        return None
    fn = where.split(" (")[0]
    # The change gates the loop's statement that calls it, with what else that statement does
    # (`log.info(json.dumps({..., **param_stats(model)}))`: the dumps and the log call too): the
    # bound is that statement's share (stated "at most 21x" from the function's 90 %; gating the
    # statement measured 31x).
    line, at_line = _statement_share(ctx.main_stacks, ctx.step.loop, fn)
    upper = sampled_upper(max(share, at_line), n)
    place = when or "beside a model step too short to be sampled"
    ev = [f"main thread in `{where}` in {pct(share)} of its samples ({pct(of_other)} of its work outside the "
          f"model), forward/backward/optimizer {pct(model)}",
          f"`{fn}` runs {place}: with no GPU the step runs on this thread, so each step waits for it"]
    if when is None:
        action = (f"run `{fn}` less often if it reports (logging, metrics, statistics: every N steps), move it into "
                  "the Dataset or a collate_fn for DataLoader workers if it prepares the batch, or keep it in torch "
                  "ops on whole tensors (no .tolist(), .item() or Python loops over values)")
    if when == AFTER_UPDATE:
        action = (f"run `{fn}` every N steps instead of every step (logging, metrics, statistics: "
                  "if step % 100 == 0), or hand a copy of what it reads to a background thread; if it must run "
                  "every step, keep it in torch ops on the tensors (no .tolist(), .item() or Python loops over values)")
    limit, limited_by = None, ""
    if when == BEFORE_FORWARD:
        workers = workers_for(0, share, max(2, (ctx.cores or 4) - 1))
        have = len(ctx.workers.current)
        if have >= workers:
            # The job has its workers already (a new user's 2-core job with num_workers=2 was told
            # "num_workers=2 ... with cores to spare"): the change is where the work runs.
            action = (f"move the work in `{where}` into the Dataset's __getitem__ or a collate_fn, so the job's "
                      f"{have} DataLoader workers prepare it beside the step instead of the training thread; or "
                      "vectorise a per-sample Python loop over the whole batch")
        else:
            action = (f"move the work in `{where}` into the Dataset's __getitem__ or a collate_fn, so "
                      f"DataLoader(..., num_workers={workers}, persistent_workers=True) prepares the next batches "
                      "beside the step (with cores to spare); or vectorise a per-sample Python loop over the whole "
                      "batch")
        # Workers prepare batches no faster than the training thread does today, and no more of
        # them at once than there are cores: the bound data-starved states for the same move (a new
        # user's 2-core job was promised "at most 22x" by this finding and 2.9x by data-starved).
        cores = ctx.cores or 4
        parallel = max(1, min(workers, cores))
        limit = parallel / max(share, 0.01)
        limited_by = f"{workers} workers on {cores} cores, {parallel} preparing at once (each as fast as the training thread today)"
    if line is not None and at_line > share:
        ev.append(f"the loop's line {line} that calls it takes {pct(at_line)} of the samples with what else it does")
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain=gain(max(share, at_line), limit, limited_by, upper=upper) + ": the step no longer runs it",
        gain_bound=bounded(max(share, at_line), limit, upper=upper),
        cost_s=share * total,
        confidence=confidence(share, n),
        gpu_index=None,
        title=f"CPU work in the training loop: `{fn}` takes {pct(share)} of the time (no GPU)",
    )


# --------------------------------------------------------------------------- launch-bound

# The main thread dispatching (forward/backward/optimizer/other Python) in this share of its
# samples: it is the one thing the GPU waits for. Judgement; the launch-bound workload dispatched
# in 100 % of them (bench/results/advisor_bench.json).
DISPATCH_MIN_SHARE = Threshold(
    0.50, "share", JUDGEMENT,
    "The main thread dispatching (model or other Python) at least this share of its samples: it is the one "
    "thing the GPU waits for.", "bench/results/advisor_bench.json")


# The GPU idle at least this share of the window (the launch cost the rule reads) while the main
# thread dispatches the model: the CPU is the step's bottleneck whatever the kernels' size. Below
# it, and with kernels that fill the SMs (above LAUNCH_BOUND_SM_ACTIVE_PCT) or no GPM to say, the
# idle time between kernels is as well a framework's per-step sync, the step's other host work or
# a wait for data: the evidence does not tell launch overhead from them, so the finding says what
# it weighs instead of warning. Judgement, from the held-out jobs (bench/results/real_jobs_fresh6.md,
# bench/results/multi_rank.md): three jobs idle 21-30 % between full kernels (SMs 55-62 % active)
# were told launch-bound; on the one measured, the larger batch the warning named gave 1.07x where
# it promised 2.6x. True launch-bound jobs measured idle 55-96 % or ran SMs under 40 % active.
LAUNCH_SURE_SHARE = Threshold(
    0.5, "share", JUDGEMENT,
    "The launch cost (idle or SM-starved share of the window) at least this large, or kernels too small to fill "
    "the SMs, before launch-bound warns; below it, between full kernels, launch overhead is not told from "
    "per-step syncs, the step's other host work or data, and the finding says what it weighs.",
    "bench/results/real_jobs_fresh6.md")


def dispatching_positively(ctx: AnalysisContext, dispatch: float) -> bool:
    """Positive evidence that the main thread's Python is the launching of the GPU's kernels, not
    other CPU work the GPU happens to wait for: most of it inside the model's forward, backward or
    optimizer step, or, where GPM reads the SMs, kernels too small to fill them (a plain loop of
    tiny torch ops outside any nn.Module is 'other' code, and launch-bound: its kernels fill the
    SMs 0.006 per point of utilisation on an H100; a model's fill 0.6-1.0). Without either, a busy
    main thread in the user's own code is CPU work in the loop, data handling or logging, and the
    change that fixes it is not torch.compile or a larger batch (measured: a loop augmenting each
    batch on the CPU was told launch-bound; moving the augmentation to the GPU made it 17x faster)."""
    model = training_share(ctx, Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER)
    if model >= dispatch / 2:
        return True
    fills = [g.efficiency.sm_fill for g in ctx.gpus if g.efficiency.sm_fill is not None]
    return bool(fills) and min(fills) < CPU_WORK_SM_FILL_MIN


# A backward's own launches take about as long as its forward's, or a few times (the autograd
# thread launches them while the main thread waits inside backward): the main thread's backward
# samples over its forward samples were 0.6-3.5 in every healthy and launch-bound recording here.
# A backward waiting this many times longer than its forward, with the GPU idle, waits on
# something that is not its launches: a gradient all-reduce through host memory (a gloo process
# group on GPU tensors: 12-50x; NCCL without P2P: 16x), an object collective, a hook, a rank that
# never arrives (27-52x). torch.compile or a larger batch would not touch it. Judgement, between
# the two groups (tests/fixtures: 3.5 against 5.4 and up).
BACKWARD_WAIT_RATIO = Threshold(
    5.0, "x", JUDGEMENT,
    "The main thread inside backward at least this many times as often as inside forward: the backward waits on "
    "something other than its own launches (healthy and launch-bound recordings 0.6-3.5x, a gloo all-reduce 12-50x).",
    "bench/results/multi_rank.md")
# ... counted over at least this many backward samples (a few seconds at the sampling rate): a
# ratio of 3 to 0 is noise.
BACKWARD_WAIT_MIN_SAMPLES = IntThreshold(
    8, "samples", JUDGEMENT,
    "Backward samples needed before the backward-to-forward ratio is read.")


def backward_waits(ctx: AnalysisContext) -> float | None:
    """How many times longer the main thread sits in backward than in forward, where that says the
    backward waits on something other than its launches; None where it does not."""
    train = [s for s, ev in zip(ctx.main_stacks, in_evaluation(ctx)) if not ev]
    bwd = sum(1 for s in train if s.category is Category.BACKWARD)
    fwd = sum(1 for s in train if s.category is Category.FORWARD)
    if bwd < BACKWARD_WAIT_MIN_SAMPLES:
        return None
    ratio = bwd / max(1, fwd)
    return ratio if ratio >= BACKWARD_WAIT_RATIO else None


_RNN_CELLS = ("LSTMCell", "GRUCell", "RNNCell")
# At least this share of the forward samples inside a recurrent cell's forward: the launches are
# the cell's. Judgement: half; a model with one cell among many layers is not stepped so.
RNN_CELL_SHARE = Threshold(
    0.5, "share", JUDGEMENT,
    "At least this share of the forward samples inside an nn.LSTMCell/GRUCell/RNNCell forward: the step's "
    "launches are a recurrent cell's, stepped from Python (a held-out seq2seq LSTM: 18 of 21).",
    "bench/results/real_jobs_fresh10.md")


def rnn_cells(ctx: AnalysisContext) -> tuple[str, str, float] | None:
    """(the cell's class, the user's place calling it, its share of the forward samples) where a
    recurrent cell stepped from Python holds most of the forward; None otherwise."""
    fwd = [s for s in ctx.main_stacks if s.category is Category.FORWARD]
    if not fwd:
        return None
    seen: Counter = Counter()
    callers: Counter = Counter()
    for s in fwd:
        i = next((k for k, f in enumerate(s.frames) if f.name.split(".")[0] in _RNN_CELLS
                  and f.name.endswith(".forward") and f.filename.replace("\\", "/").endswith("torch/nn/modules/rnn.py")),
                 None)
        if i is None:
            continue
        seen[s.frames[i].name.split(".")[0]] += 1
        f = project_frame(s.frames[i + 1:])
        if f is not None:
            callers[f"{f.name} ({short_path(f.filename)}:{f.line})"] += 1
    if not seen:
        return None
    cell, n = seen.most_common(1)[0]
    if n / len(fwd) < RNN_CELL_SHARE or not callers:
        return None
    return cell, callers.most_common(1)[0][0], n / len(fwd)


@uses(DISPATCH_MIN_SHARE, CPU_WORK_SM_FILL_MIN, HOST_SYNC_MIN_SHARE, HOST_SYNC_STEADY_SHARE, MIN_SYNC_SAMPLES,
      HOST_SYNC_STEADY_COVERAGE, SYNC_SAMPLES_PER_STRETCH, MIN_STRETCHES, MAX_STRETCHES, UNFUSED_MIN_SHARE,
      OPTIMIZER_LEADS_SHARE, MEM_HEADROOM, MEM_NEAR_LIMIT, BATCH_TARGET_SHARE, MAX_BATCH_FACTOR, MIN_MAIN_SAMPLES,
      GPM_BUSY_UTIL_PCT, LAUNCH_BOUND_SM_ACTIVE_PCT, SPIN_EXPLAINS, MIN_COST_FRACTION, MIN_COST_S, MIN_RECURRENCES,
      LAUNCH_SURE_SHARE, RNN_CELL_SHARE, BACKWARD_WAIT_RATIO, BACKWARD_WAIT_MIN_SAMPLES)
def check_launch_bound(ctx: AnalysisContext) -> Hit | None:
    if not enough_stacks(ctx):
        return None
    # The training's dispatching: an evaluation's forward is its own finding's (eval-every-step).
    dispatch = training_share(ctx, Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER, Category.OTHER)
    if dispatch < DISPATCH_MIN_SHARE:
        return None
    if not dispatching_positively(ctx, dispatch):
        return Withdraw("the main thread's Python is not the model's dispatching: CPU work of its own")
    if ctx.target_pid in ctx.gil_holders:
        # Not running in most samples while a thread of its own holds the GIL: its launches wait
        # for that thread, not for their own cost (gil-held names it).
        return Withdraw("the main thread waits for the GIL another of its threads holds")
    waits = backward_waits(ctx)
    # With a sync in every step the idle dispatch time is the sync's (host-sync counts it): the
    # same loop without the sync queues ahead. Only kernels too small for the SMs remain ours.
    pat = sync_pattern(ctx)
    synced = pat.claims_dispatch
    # Syncs seen, too few yet to tell a per-step sync (host-sync's, which would claim this idle
    # time) from an occasional one: no verdict between the two until they are counted (a fresh
    # job with torch.cuda.empty_cache() every step was told launch-bound for its first 4 s, then
    # host-sync; removing the call measured 1.87x). It says what it weighs, as an information: a
    # warning already shown gives way to it at once (a held-out job's launch-bound warning, its
    # rule silent, stayed 9 s with its first second's evidence).
    syncs_unsure = (not synced and pat.samples > 0 and pat.share >= HOST_SYNC_STEADY_SHARE
                    and pat.samples < MIN_SYNC_SAMPLES)

    def cost(g: GpuView) -> float:
        if spinning(g) or waits_for_peers(ctx, g):
            return 0.0  # its SMs are few because a kernel waits, not because kernels are small
        return starved_sm_s(g) + (0.0 if synced else g.breakdown.get(Bucket.CPU))

    found = worst(ctx, cost, gpu_only=True)
    if found is None or not significant(found[0], found[1], buckets=(Bucket.CPU,)):
        return None
    g, c = found
    if waits is not None:
        # Weighed, not warned: the idle time is the backward's wait, whose cause the stacks of the
        # main thread do not name (a gloo job, a collective through host memory, was told
        # launch-bound for 16 s; NCCL measured 4.7x).
        frac = c / g.breakdown.total_s
        return Hit(
            evidence=(f"main thread inside backward {waits:.0f}x as often as inside forward, waiting: a backward's own "
                      "launches take about as long as its forward's (0.6-3.5x in healthy and launch-bound jobs)",
                      idle_line(g, [Bucket.CPU])),
            action=("not launch overhead: the backward waits on something else; in a multi-GPU job, the gradient "
                    "all-reduce (a gloo process group on GPU tensors, NCCL through host memory: the Ranks tab and "
                    "NVLink/PCIe traffic say which), else a backward hook's CPU work or a rank that does not arrive"),
            expected_gain=f"at most {times(bounded(frac))} if all of the idle time were the wait's",
            gain_bound=bounded(frac),
            cost_s=c,
            confidence=0.4,
            gpu_index=g.index,
            severity=Severity.INFO,
            title=f"Weighing: {g.name} idle {pct(frac)} while the backward waits ({waits:.0f}x its forward)",
        )
    # Most of the launching is an unfused optimizer step and no larger batch fits to amortise
    # it: the change is the optimizer's own (unfused-optimizer names it). With memory to spare
    # a larger batch amortises the step as well and fills the SMs: launch-bound stays.
    if optimizer_leads(ctx, dispatch) and larger_batch(g, ctx) is None:
        return Withdraw("the launching is an unfused optimizer step's: unfused-optimizer names the change")
    e, bd = g.efficiency, g.breakdown
    frac = c / bd.total_s
    # The evidence says what the share holds: "other" Python is in it (a plain loop calling
    # torch ops outside any nn.Module shows as other), and a reader weighs that part herself.
    model = training_share(ctx, Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER)
    # On a CPU or not (py-spy's flag): in backward the main thread waits while autograd's thread
    # launches, so a launch-bound step is on a CPU in its forward and optimizer, idle in backward.
    on_cpu = sum(1 for s in ctx.main_stacks if s.active) / len(ctx.main_stacks)
    ev = [f"main thread running Python in {pct(dispatch)} of its samples (on a CPU in {pct(on_cpu)}): "
          f"forward/backward/optimizer {pct(model)}, other code {pct(dispatch - model)}"]
    if e.sm_active is not None and e.util_busy_mean is not None:
        # Said only where it holds: SMs this active while busy are filled by the kernels, and the
        # cost is then the idle time between them (a line calling 63 % "too small" was shown).
        ev.append(
            f"{g.name} 'busy' {e.util_busy_mean:.0f} % but SMs active only {e.sm_active:.0f} %: "
            "kernels too small to fill the GPU" if e.sm_active < LAUNCH_BOUND_SM_ACTIVE_PCT else
            f"{g.name} SMs active {e.sm_active:.0f} % while 'busy' {e.util_busy_mean:.0f} %: its kernels fill it; "
            "the cost is the idle time between them"
        )
    if bd.get(Bucket.CPU) > 0 and not synced:
        ev.append(idle_line(g, [Bucket.CPU]))
    # The change is "fewer, larger kernels": CUDA graphs take the launch overhead away (the
    # idle share's bound), a larger batch also fills SMs that ran small kernels; the bound is
    # the larger of the two when the batch fits.
    batch = larger_batch(g, ctx)
    bigger = ""
    bound, gain_text = bounded(frac), gain(frac) + ": fewer, larger kernels per step"
    if batch is not None:
        factor, batch_bound = batch
        bigger = f"; GPU memory {pct(e.mem_peak_fraction)} used, so a {factor}x batch fits"
        if batch_bound > bound:
            idle_back = bound
            bound = batch_bound
            sms = f", with SMs active {e.sm_active:.0f} % while busy," if e.sm_active is not None else ""
            # The bound takes the SMs as filling in proportion; measured larger batches mostly gave
            # the idle time back and little more (held out: a T5 2.2x with a 4x batch where the idle
            # time said 2.7x and this bound 10.8x; an ASR model 1.17x with 2x): both are said.
            gain_text = (f"at most {times(bound)} samples/s (an upper bound: a {factor}x batch{sms} can at best "
                         f"fill the GPU while the launch overhead per step stays); about {times(idle_back)} from the "
                         "idle time back alone, which larger batches measured on held-out jobs came nearer to")
    if syncs_unsure:
        unsure_bound = bounded(frac)
        places = ", ".join(f"{label} ({pct(share)})" for label, share in sync_labels(ctx, 2))
        return Hit(
            evidence=(*ev, f"the main thread waited for the GPU in {pat.samples} of its samples so far ({places}): "
                      "a sync every step would drain the queue and claim this idle time, an occasional one would "
                      f"not; {int(MIN_SYNC_SAMPLES)} sync samples tell which"),
            action=("not yet told apart; if the line above runs every step (.item(), .cpu(), print(loss), an object "
                    "collective), removing it is the change; if it runs now and then, torch.compile or a larger "
                    "batch is"),
            expected_gain=f"at most {times(unsure_bound)} if all of the idle time were launch overhead",
            gain_bound=unsure_bound,
            cost_s=c,
            confidence=0.4,
            gpu_index=g.index,
            severity=Severity.INFO,
            title=f"Weighing: {g.name} idle {pct(frac)} while the CPU runs the model: launch overhead or a sync "
                  "every step",
        )
    small_kernels = e.sm_active is not None and e.sm_active <= LAUNCH_BOUND_SM_ACTIVE_PCT
    if not small_kernels and frac < LAUNCH_SURE_SHARE:
        # Full kernels (or no GPM to say) and a modest idle share: weighed, not warned.
        sms = "kernels that fill its SMs" if e.sm_active is not None else "kernels (no GPM to say how full)"
        return Hit(
            evidence=(*ev, f"the idle time is {pct(frac)} of the window, between {sms}: launch overhead would "
                      "look like this, and so would a per-step sync in the framework, the step's other host "
                      "work or a wait for data"),
            action=("not yet told apart; where the main thread is while the GPU idles (the Stacks tab's step "
                    "phases) says which: in the model's forward/backward with no sync, torch.compile or a "
                    "larger batch are the change; in a sync, host work or data, that is"),
            expected_gain=f"at most {times(bound)} if all of the idle time were launch overhead",
            gain_bound=bound,
            cost_s=c,
            confidence=0.4,
            gpu_index=g.index,
            severity=Severity.INFO,
            title=f"Weighing: {g.name} idle {pct(frac)} between kernels while the CPU runs the model",
        )
    action = ('model = torch.compile(model, mode="reduce-overhead")  # fuses kernels and replays the step '
              "as a CUDA graph; or raise batch_size so each launch does more work; "
              "optimizers: torch.optim.AdamW(..., fused=True)" + bigger)
    title = f"Launch-bound: the CPU cannot keep {g.name} fed with kernels"
    cells = rnn_cells(ctx)
    if cells is not None:
        # The launches are a recurrent cell's, stepped once per time step from Python: cuDNN's
        # RNN runs the whole sequence in one call per layer (a held-out Lightning seq2seq LSTM:
        # nn.LSTM measured 5.26x; it was given the generic change).
        cell, caller, share = cells
        layer = cell.replace("Cell", "")
        ev.append(f"`{cell}.forward` under {pct(share)} of the forward samples, called from `{caller}`: the "
                  "sequence is stepped one time step at a time from Python, a few small kernels each")
        action = (f"replace the Python loop over `nn.{cell}` ({caller}) with `nn.{layer}` over the whole sequence "
                  f"(batch_first=True, num_layers=...): cuDNN runs every time step of a layer in one call; or, where "
                  "the loop must stay (attention or teacher forcing per step), torch.compile the step" + bigger)
        title = f"Launch-bound: `nn.{cell}` stepped in Python keeps {g.name} waiting for kernels"
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain=gain_text,
        gain_bound=bound,
        cost_s=c,
        confidence=confidence(dispatch, len(ctx.main_stacks)),
        gpu_index=g.index,
        title=title,
    )




# --------------------------------------------------------------------------- blocking in the loop

BLOCKED_MIN_SHARE = Threshold(
    0.10, "share", DERIVED,
    "The main thread blocked (off the CPU) in the user's own code at least this share of its samples: "
    "the advisor's 10 % bar (MIN_COST_FRACTION); a step that waits that long gains that much without it.")
BLOCKED_ONE_PLACE = Threshold(
    0.5, "share", JUDGEMENT,
    "Most of those samples (this share) in one function: one call to move off the loop, not waits spread "
    "over the code.")
# The loop leaves that place and comes back to it at least this many times in the window: a call
# it waits in once and has not left is a hang forming (the stuck verdict's), not a cost of every
# step. A job waiting for ever on a queue nobody fills was told "remove that call from the loop"
# for 2 s before it was called stuck (new user, CPU). Judgement: two waits are a pattern.
BLOCKED_EPISODES = IntThreshold(
    2, "waits", JUDGEMENT,
    "The loop comes back to the blocking place at least this many times in the window: one wait not yet left "
    "is a hang forming, the stuck verdict's, not a per-step cost.")


def _episodes(main: Sequence[StackSample], name: str, path: str) -> int:
    """How many separate stretches of ``main`` (time order) sit blocked in the function ``name``
    of ``path``: the loop coming back to the same wait."""
    n, inside = 0, False
    for s in main:
        f = project_frame(s.frames) if s.category is Category.IDLE and not s.active else None
        here = f is not None and f.name == name and short_path(f.filename) == path
        if here and not inside:
            n += 1
        inside = here
    return n


@dataclass(frozen=True)
class BlockedPlace:
    """Where the main thread waits off the CPU in the user's own code."""

    where: str  # the newest user frame, with its commonest line: "log_metrics (train.py:10)"
    share: float  # of the main thread's samples
    samples: int  # the main thread's samples the share is read from
    code: str | None  # that line's source, where py-spy read it: "time.sleep(0.05)"
    in_loop: bool  # the line is in the training loop's own frame (or at module level)

    @property
    def name(self) -> str:
        return self.where.split(" (")[0]

    @property
    def line(self) -> str:
        """'train.py:10'."""
        return self.where.split(" (", 1)[1].rstrip(")") if " (" in self.where else self.where

    @property
    def call(self) -> str:
        """The blocking line as the text names it: "`time.sleep(0.05)` (train.py:10)"."""
        return f"`{self.code}` ({self.line})" if self.code else f"line {self.line}"


def blocked_place(ctx: AnalysisContext) -> BlockedPlace | None:
    """Where the main thread waits off the CPU in the user's own code (a sleep, a blocking network
    or file call, a lock), or None. Waits the classifier names (data, a sync, a collective, a
    checkpoint) are their rules'."""
    main = ctx.main_stacks
    blocked = [s for s in main if s.category is Category.IDLE and not s.active]
    if not main or len(blocked) < BLOCKED_MIN_SHARE * len(main):
        return None
    found = hot_place(blocked)
    if found is None:
        return None
    where, k = found
    if k < BLOCKED_ONE_PLACE * len(blocked):
        return None
    name = where.split(" (")[0]
    line = where.rsplit(":", 1)[-1].rstrip(")")
    if _episodes(main, name, where.rsplit(":", 1)[0].split(" (", 1)[-1]) < BLOCKED_EPISODES:
        return None
    # The source of the place's own line (the frame py-spy read it from), so the text names the
    # call that blocks, not only the function holding it.
    code = next((f.code for s in reversed(blocked) for f in s.frames
                 if f.name == name and f.code and str(f.line) == line), None)
    code = code or next((f.code for s in reversed(blocked) for f in s.frames if f.name == name and f.code), None)
    # A loop written at module level, or a line in the loop's own function: there is no function
    # to hand to a thread (moving `<module>` or `train` off the loop's thread is moving the loop);
    # the change is to that line. The loop's function is the one that also holds the model's
    # work: its frame is under the forward, backward and optimizer samples too, where a helper
    # it calls (log_metrics) is not. Told from those stacks, not from the step's loop name alone.
    path = where.rsplit(":", 1)[0].split(" (", 1)[-1]
    model = [s for s in main if s.category in (Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER)]
    in_loop = name == "<module>" or any(f.name == name and short_path(f.filename) == path
                                        for s in model for f in s.frames)
    if not model and ctx.step.loop_at == (name, path) and ctx.step.loop_lines >= 2:
        # No model sample to tell by (a step too short to be sampled: a small model on the CPU):
        # the step model's loop frame, seen going round its lines, is this function. A new user's
        # CPU job sleeping in its own `main` loop was told to hand `main` to a background thread.
        in_loop = True
    return BlockedPlace(where, k / len(main), len(main), code, in_loop)


@uses(BLOCKED_MIN_SHARE, BLOCKED_ONE_PLACE, BLOCKED_EPISODES, MIN_MAIN_SAMPLES, MIN_COST_FRACTION, MIN_COST_S, MIN_RECURRENCES)
def check_blocking_in_loop(ctx: AnalysisContext) -> Hit | None:
    """The training loop blocks in a call of the user's own (a sleep, a metrics POST, a file
    write): off the CPU, in the user's code, not a wait any other rule names; the GPU (or, for a
    job on no GPU, the job itself) waits for it. Its fix is to take the call off the loop's thread
    or make it rarer; neither workers nor a larger batch would."""
    if not enough_stacks(ctx):
        return None
    p = blocked_place(ctx)
    if p is None:
        return None
    g = worst(ctx, lambda v: min(v.breakdown.get(Bucket.UNKNOWN), p.share * v.breakdown.total_s))
    if g is None:
        return None
    g, cost = g
    if not significant(g, cost, buckets=(Bucket.UNKNOWN,)):
        return None
    frac = cost / g.breakdown.total_s
    # The stated bound only: the blocked share is read from the main thread's samples, so it is
    # taken at its upper confidence limit (near a share of 1 a small under-estimate makes
    # 1 / (1 - f) far too low: the sleeper job, 95 % blocked in time.sleep(0.05), was told "at
    # most 21x" from 84 samples and measured 77-105x with the sleep removed).
    upper = sampled_upper(p.share, p.samples, frac)
    ev = [f"main thread blocked (off the CPU) in `{p.where}` in {pct(p.share)} of its samples"
          + (f": `{p.code}`" if p.code else ""),
          idle_line(g, [Bucket.UNKNOWN]) + " while it waits"]
    if p.in_loop:
        action = (f"the loop itself blocks at {p.call}: remove that call from the loop, run it every N steps, "
                  "or hand just that call to a background thread (concurrent.futures.ThreadPoolExecutor("
                  "max_workers=1).submit(...)); a sleep in the loop is time lost outright")
        title = f"The training loop blocks at {p.call}: {device_name(g)} waits {pct(frac)}"
    else:
        action = (f"take `{p.name}` (it blocks at {p.call}) off the training loop's thread: hand it to a background "
                  "thread (concurrent.futures.ThreadPoolExecutor(max_workers=1).submit(...), or the logger's own "
                  "async mode), or call it every N steps; a sleep in the loop is time lost outright")
        title = f"The training loop blocks in `{p.name}` at {p.call}: {device_name(g)} waits {pct(frac)}"
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain=gain(frac, upper=upper),
        gain_bound=bounded(frac, upper=upper),
        cost_s=cost,
        confidence=confidence(p.share, p.samples),
        gpu_index=g.index,
        title=title,
    )
