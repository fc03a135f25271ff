"""Distributed training: the GPU waits on collectives (slow transport, a straggler, no overlap).

It uses only the shared cost bar (``base``); rules that reason across ranks belong here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ...analysis import Bucket, short_path
from ...model import Category, Frame, Severity
from ...analysis import STRAGGLER, STRAGGLER_MIN_GAP_OPS, ras_line
from ...analysis import AFTER_UPDATE, BEFORE_FORWARD, Straggler, hot_line, straggler
from ..context import AnalysisContext
from .nccl import multi_node
from .base import (
    MIN_COST_FRACTION, MIN_COST_S, MIN_MAIN_SAMPLES, MIN_RECURRENCES, WORTHWHILE_GAIN, Hit, ShareLimit, Withdraw, bounded,
    confidence, gain,
    idle_line, labels_line, pct, sampled_upper, significant, uses, worst,
)
from .threshold import DERIVED, JUDGEMENT, Threshold


@uses(MIN_COST_FRACTION, MIN_COST_S, MIN_RECURRENCES)
def check_collective_wait(ctx: AnalysisContext) -> Hit | None:
    found = worst(ctx, lambda g: g.breakdown.get(Bucket.COLLECTIVE), gpu_only=True)
    if found is None or not significant(found[0], found[1], buckets=(Bucket.COLLECTIVE,)):
        return None
    g, cost = found
    if g.breakdown.recurrences(Bucket.COLLECTIVE) < 2 and ctx.main_stacks and \
            ctx.main_stacks[-1].category is Category.COLLECTIVE:
        # One wait so far, and the main thread still in it: one long wait or a hang forming (the
        # stuck verdict and its weighing judge it), not yet a wait of every step (a rank alone in a
        # checkpoint barrier its peer never calls was "waits on collectives 56 %" at its third second).
        return None
    frac = cost / g.breakdown.total_s
    ev = [idle_line(g, [Bucket.COLLECTIVE])]
    line = labels_line(g, Bucket.COLLECTIVE)
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
        expected_gain=gain(frac),
        cost_s=cost,
        confidence=confidence(g.breakdown.idle_sample_share(Bucket.COLLECTIVE) or frac, g.breakdown.idle_samples),
        gpu_index=g.index,
        title=f"{g.name} waits on collectives {pct(frac)} of the time",
    )


# rank-straggler: every other rank spends at least this share of its main thread's samples in
# collectives ...
OTHERS_WAIT_MIN = Threshold(
    0.30, "share", JUDGEMENT,
    "Every other rank waits in collectives at least this share of its samples: a third of the time waiting is "
    "a pattern, not jitter.")
# ... and the straggler's share is this much below the least-waiting of them ...
STRAGGLER_GAP = Threshold(
    0.25, "share", JUDGEMENT,
    "The straggler waits this much less than the least-waiting other rank: ranks doing the same work wait alike "
    "within a few points; a quarter apart is a rank doing something else while the others wait.")
# ... resolved by the samples, not only seen in them. Each share is k of n main-thread samples: at
# the 10-25 per rank of a session's first seconds, two ranks doing the same work (each waiting
# 45 %) are a quarter apart by chance at one look in 4 (10 samples) to 7 (20), and the rule looks
# every second: a healthy 2-rank gloo DDP job on a loaded 2-core box was named in 3 of 6 runs
# (bench/multi_rank.py's healthy job, 30 s watches past its warm-up; final shares within 0.2 of
# each other, the same CPU and run-queue time per rank from /proc). So the gap counts at the
# lower limit of its confidence interval (analysis.ranks.gap_lower: Newcombe's score interval of
# a difference of two shares), one-sided at this level, Bonferroni-shared among the ranks the
# slow one is picked from (the least-waiting, picked after looking): z 1.96 for 2 ranks, 2.50 for
# 8. 95 % is judgement (the level of the advisor's stated bounds); samples 0.1-0.2 s
# apart are not independent draws, so the real coverage is below the nominal. What it costs: a
# straggler at 0.8 against 0.0 resolves at the first 10 samples per rank, one at 0.7 against 0.2
# at about 30.
STRAGGLER_LEVEL = Threshold(
    0.95, "confidence", JUDGEMENT,
    "The gap counts at its one-sided lower confidence limit at this level, shared among the ranks: a healthy "
    "2-rank job was named in 3 of 6 runs on the gap as seen.", "bench/multi_rank.py (its healthy job)")
# On the GPUs (NCCL: the waiting ranks' GPUs spin in the collective) the bars are the advisor's
# own health bar: the others wait at least a tenth of the time, and the gap's lower limit is a
# tenth, i.e. the job would run at least 1.1x with the straggler as fast as the rest. The host's
# quarter above is a margin for its samples, 0.1-0.2 s apart and far from independent (real
# healthy gloo counts sit 0.18 apart at their lower limit: tests/test_straggler_stats.py); each
# GPU poll is already a mean over its second, paired with its peer's poll of the same second and
# judged with Student's t. Measured on 2 x H200: a rank evaluating the dev set alone held the
# other's GPU 42 % in the all-reduce (lower limit 0.21 after 13 polls; sharing the evaluation
# measured 1.24x), under the quarter; the healthy Lightning DDP job stayed silent at a tenth.
GPU_OTHERS_WAIT_MIN = Threshold(
    0.10, "share", DERIVED,
    "On the GPUs (NCCL), the others wait at least the advisor's health bar (MIN_COST_FRACTION): each GPU poll "
    "is already a mean over its second.")
GPU_STRAGGLER_GAP = Threshold(
    0.10, "share", DERIVED,
    "On the GPUs, the gap's lower limit is the health bar: the job would run at least 1.1x with the straggler "
    "as fast as the rest.")

# What the straggler does instead, told from its own GPU and stacks (straggler_phase):
COMPUTE_STRAGGLER_UTIL = Threshold(
    70.0, "%", JUDGEMENT,
    "The straggler's own GPU this busy (mean utilisation): its extra time is GPU work; a rank whose host is the "
    "slow part leaves its GPU idle (0-2 % measured for a Python straggler on an H100).", "bench/multi_rank.py")
STRAGGLER_DATA_WAIT = Threshold(
    0.30, "share", JUDGEMENT,
    "The straggler waits for its own DataLoader this share of its samples: its input pipeline is the slow "
    "part; a third, as OTHERS_WAIT_MIN.")
# The straggler's main thread is in a checkpoint save in at least this share of its samples: the
# save is what the others wait for. Judgement: a fifth, as a rank's own work (analysis.ranks
# OWN_WORK_MIN_SHARE); a save long enough to hold a peer back shows in many samples.
STRAGGLER_SAVE_SHARE = Threshold(
    0.2, "share", JUDGEMENT,
    "The straggler saves a checkpoint this share of its samples: the save is what the others wait for; a fifth, "
    "as a rank's own work.")


def _judge_straggler(ctx: AnalysisContext) -> Straggler | None:
    return straggler(ctx.ranks, OTHERS_WAIT_MIN, STRAGGLER_GAP, min_samples=MIN_MAIN_SAMPLES, level=STRAGGLER_LEVEL,
                     gpu_bars=(GPU_OTHERS_WAIT_MIN, GPU_STRAGGLER_GAP))


def rank_straggler(ctx: AnalysisContext) -> Straggler | None:
    """The rank straggler by this module's bars, worked out once per evaluation: the straggler
    rule names it, and the communication-bound and by-hand-sync rules leave a job with one to it."""
    return ctx.once(_judge_straggler)


# An arrival this close after the waiting rank's stillness began is not after it: the stillness
# began somewhere between two samples, and a GPU poll is a mean over the second before it (a
# rank spinning in its Dataset since before the attach read "arrived" 0.3 s after the other
# rank's first still sample, from the first poll's mean). Judgement: one poll or sample apart.
ARRIVAL_SLACK_S = Threshold(
    1.0, "s", JUDGEMENT,
    "A straggler's arrival within this of the waiting rank's stillness beginning is not after it: the stillness "
    "began between two samples, and a GPU poll is a mean over the second before it.")


@uses(OTHERS_WAIT_MIN, STRAGGLER_GAP, STRAGGLER_LEVEL, GPU_OTHERS_WAIT_MIN, GPU_STRAGGLER_GAP, COMPUTE_STRAGGLER_UTIL,
      STRAGGLER_SAVE_SHARE, STRAGGLER_DATA_WAIT, MIN_MAIN_SAMPLES, ARRIVAL_SLACK_S)
def check_rank_straggler(ctx: AnalysisContext) -> Hit | None:
    """One rank does something else while the other ranks wait for it in collectives."""
    found = rank_straggler(ctx)
    if found is None:
        return None
    if never_arrived_since_still(ctx, found.slow):
        return Withdraw(f"rank {found.slow.rank} has not arrived since the others stopped: a hang is weighed")
    if unexplained_on_gpu(found):
        return Withdraw(f"nothing says why rank {found.slow.rank} is waited for: its GPU computes no longer")
    slow, waiting = found.slow, found.waiting
    names = ", ".join(str(v.rank) for v in waiting)
    if found.on_gpu:
        fn = "NCCL collectives (on their GPUs)"
        least = min(waiting, key=lambda v: v.gpu_wait or 0.0)
        wait_share = least.gpu_wait or 0.0
        # NVML's polls, each a mean over its second: no sampling interval to state.
        upper = ShareLimit(wait_share, 0)
    else:
        fn = next((v.collective_fn for v in waiting if v.collective_fn), None) or "collectives"
        least = min(waiting, key=lambda v: v.collective)
        wait_share = least.collective
        # Read from that rank's stack samples: its upper confidence limit bounds the gain.
        upper = sampled_upper(wait_share, least.samples)
    phase, fix = straggler_phase(ctx, found)
    ev = [f"rank {slow.rank} (pid {slow.pid}) {phase} while rank{'s' if len(waiting) > 1 else ''} {names} "
          f"wait{'' if len(waiting) > 1 else 's'} in {fn} {pct(wait_share)}"]
    for v in (slow, *waiting):
        top = ", ".join(f"{c.value} {pct(sh)}" for c, sh in v.shares[:3])
        gpu = f", GPU {v.gpu}" if v.gpu is not None else ""
        # The rank's hot place as the Ranks tab and the report name it (a rank sleeping in its own
        # `load_batch` read "hot: <module> 2 %" here beside "spends 90 % in load_batch").
        place, share, own = hot_line(v)
        line = (f"rank {v.rank} (pid {v.pid}{gpu}): {top} of {v.samples} samples"
                + (f"; hot: {place} {pct(share)}" if place and own else f"; waits at: {place} {pct(share)}" if place else ""))
        if found.on_gpu:
            line += (f"; its GPU waited {pct(v.gpu_wait or 0.0)} (utilisation {v.gpu_util or 0:.0f} %"
                     + (f", SMs active {v.gpu_sm:.0f} %" if v.gpu_sm is not None else "") + ")")
        ev.append(line)
    if found.on_gpu and found.own_low is not None:
        ev.append(f"rank {slow.rank} runs `{slow.only_here}`, which no other rank runs, in {pct(slow.only_here_share)} "
                  f"of its samples (at least {pct(found.own_low)} at {100 * STRAGGLER_LEVEL:.0f} % confidence), while "
                  f"the other ranks' GPUs wait {pct(wait_share)} spinning in a NCCL kernel for a peer over "
                  f"{found.polls} polls and its own waits {pct(slow.gpu_wait or 0.0)}")
    elif found.on_gpu:
        ev.append("a GPU 'busy' with few SMs active and no tensor-core work spins in a NCCL kernel waiting for a peer: "
                  f"the gap is at least {pct(found.gap_low)} of the time at {100 * STRAGGLER_LEVEL:.0f} % confidence "
                  f"over {found.polls} paired GPU polls")
    else:
        ev.append(f"the gap is at least {pct(found.gap_low)} of the time at {100 * STRAGGLER_LEVEL:.0f} % confidence "
                  f"(from {min(v.samples for v in (slow, *waiting))}+ samples per rank), beyond sampling noise")
    ev.extend(ras_line(r) for r in ctx.nccl if r.verdict == STRAGGLER)
    # What the other ranks lose is their wait: the straggler's extra time is the job's step time.
    cost = wait_share * (ctx.t1 - ctx.t0) * len(waiting)
    return Hit(
        evidence=tuple(ev),
        action=f"{fix}; then compare: gputop stacks --pid {slow.pid}",
        # What the job gets back is the time the other ranks wait for this one, the cost above:
        # the ranks step together, so with the straggler as fast as they are their wait goes.
        # Bounded by the straggler's busiest line instead, the gain read 1.03x from a hot line of
        # 3 % (the loop's own) while the others waited 95 % (gloo, rank 1 sleeping 0.1 s in
        # load_batch each step: removing the sleep measured 21-30x).
        expected_gain=gain(wait_share, upper=upper),
        gain_bound=bounded(wait_share, upper=upper),
        cost_s=cost,
        confidence=confidence(min(1.0, found.gap_low + 0.5), min(v.samples for v in (slow, *waiting))),
        gpu_index=slow.gpu,
        title=f"rank {slow.rank} is the straggler: the other ranks wait {pct(wait_share)} in {fn} for it",
    )


def _computing(v) -> float | None:
    """The share of the window its GPU computed, in %: busy less the time it spun waiting."""
    if v.gpu_util is None:
        return None
    return max(0.0, v.gpu_util - 100.0 * (v.gpu_wait or 0.0))


def unexplained_on_gpu(found) -> bool:
    """The GPUs say one rank is waited for, but nothing says why: its GPU computes no longer than
    the waiting ranks' (their busy time less their spin), it shares no GPU, is not throttled, and
    runs nothing the others do not. Such a gap is a moment's, not a cause's: a healthy, balanced
    DDP ResNet on two H200s read "rank 1 is the straggler" from its first four polls after the
    attach (rank 0 waiting 16-24 %, then the other way round), a warning for 10 s."""
    slow = found.slow
    if not found.on_gpu or slow.gpu_guests or slow.gpu_throttled or slow.only_here:
        return False
    if slow.gpu_util is None or slow.gpu_util < COMPUTE_STRAGGLER_UTIL:
        return False  # its GPU idles: its host is the slow part, named by its stacks
    mine = _computing(slow)
    theirs = [c for c in (_computing(v) for v in found.waiting) if c is not None]
    return mine is not None and bool(theirs) and mine < min(theirs) + 100.0 * GPU_STRAGGLER_GAP


def never_arrived_since_still(ctx: AnalysisContext, slow) -> bool:
    """While the waiting rank stands still (a hang forming) and has not moved since it was first
    seen, the rank it waits for has shown no sign of taking part in the step since it stopped: no
    sample of it in the model, a collective or a sync, no kernel on its GPU. "Slow" and "never
    arrives" are then the two answers weighed, and the weighing says so; a straggler goes on
    arriving, step after step. (NCCL, 2 x H200: a rank spinning for ever in an unbounded rejection
    sampler in its Dataset was "the straggler", a warning, for 6 s before the stuck verdict.)"""
    if ctx.forming is None or not ctx.main_stacks:
        return False
    still_since = ctx.now - ctx.forming.held_s
    if still_since - ctx.main_stacks[0].ts > ARRIVAL_SLACK_S:
        # It moved earlier in the window: each move of a waiting rank is a collective completed,
        # the slow rank arrived. A rank sampled once a second in its own code 95 % of the time (a
        # batch built in slow Python) shows no arrival of its own for many seconds, and the
        # waiting rank's host, blocked at the same line every step, reads still in between.
        return False
    return slow.arrived is None or slow.arrived < still_since + ARRIVAL_SLACK_S


def gil_phase(gil) -> tuple[str, str]:
    """(what a process whose training thread waits for the GIL does, the change that fits)."""
    return (f"waits for the GIL in its training thread ({pct(gil.main_waits)} of its samples not running) while its "
            f"thread `{gil.thread}` holds it in {pct(gil.held)} of that thread's samples, in `{gil.where}`",
            f"stop `{gil.where.split(' (')[0]}` spinning in Python: block instead (queue.Queue.get(timeout=...), "
            "threading.Event.wait(...)) or sleep between polls (time.sleep(0.01)); work that needs the CPU belongs in "
            "a process of its own (multiprocessing), not a thread beside the training loop")


def straggler_phase(ctx: AnalysisContext, found) -> tuple[str, str]:
    """(what the straggler does, the change that fits) from its own
    stacks and GPU: its GPU computing while the others wait is a compute straggler (more work per
    step, or a slower GPU: throttled or shared); else its host's hottest line."""
    slow = found.slow
    gil = ctx.gil_holders.get(slow.pid)
    if gil is not None:
        # Its training thread waits for the GIL another of its threads holds: the line its own
        # samples sit at (a forward, wherever the wait caught it) is not where its time goes.
        return gil_phase(gil)
    if found.on_gpu and slow.gpu_util is not None and slow.gpu_util >= COMPUTE_STRAGGLER_UTIL:
        sm = f", SMs active {slow.gpu_sm:.0f} %" if slow.gpu_sm is not None else ""
        doing = f"computes on GPU {slow.gpu} (utilisation {slow.gpu_util:.0f} %{sm})"
        # Throttled for a good share of its busy time (its own GPU's polls): the same work takes it longer.
        throttled = ", ".join(slow.gpu_throttled)
        if slow.gpu_guests:
            who = ", ".join(f"PID {p}" for p in slow.gpu_guests[:3])
            return (f"{doing}, a GPU it shares with {who}",
                    f"move {who} off GPU {slow.gpu} (or give rank {slow.rank} a GPU of its own): the ranks step "
                    "together, so the job runs at the pace of the slowest GPU")
        if slow.only_here:
            # Work the other ranks do not do at all (an evaluation or a metric on one rank): the
            # GPU is busy with it while they wait; its clocks held at the power cap follow from it.
            name = slow.only_here.split(" (")[0]
            return (f"{doing} in `{slow.only_here}` ({pct(slow.only_here_share)} of its samples), which the other "
                    "ranks do not run",
                    f"the other ranks wait while rank {slow.rank} alone runs `{name}`: share it (every rank its part "
                    "of the data, the results combined with dist.all_reduce), run it less often, or on a process "
                    "of its own off the training ranks")
        if throttled:
            return (f"{doing}, throttled ({throttled})",
                    f"see why GPU {slow.gpu} throttles (nvidia-smi -q -d PERFORMANCE): the job runs at its pace")
        return (f"{doing} for longer than the others each step: more work per step (an uneven batch or shard, "
                "longer sequences) or a slower GPU",
                f"give every rank the same work per step: equal per-rank batches and shards (DistributedSampler "
                f"with drop_last=True, the same sequence length or token budget per rank); if the work is even, "
                f"check GPU {slow.gpu}'s clocks and neighbours: nvidia-smi -q -d PERFORMANCE")
    saving = slow.share(Category.CHECKPOINT_IO)
    if saving >= STRAGGLER_SAVE_SHARE:
        # It writes checkpoints while the others wait: the save is the straggler's extra time
        # (rank 0 saving alone, synchronously, inside the loop, is the usual shape).
        where = f" (`{slow.hot}`)" if slow.hot else ""
        return (f"saves checkpoints in {pct(saving)} of its samples{where}",
                f"take the save off rank {slow.rank}'s training thread: "
                "torch.distributed.checkpoint.async_save(state_dict, checkpoint_id=path) (torch >= 2.3), or copy "
                "the state to CPU and torch.save it in a background thread; or save less often. The other ranks "
                "wait in their next collective for as long as the save takes")
    data_wait = slow.share(Category.DATA_WAIT)
    if data_wait >= STRAGGLER_DATA_WAIT:
        # Its main thread waits for its own DataLoader: the input pipeline is the slow part.
        workers = f"; its DataLoader workers spend their time in `{slow.worker_hot}`" if slow.worker_hot else ""
        return (f"waits for its DataLoader in {pct(data_wait)} of its samples{workers}",
                f"make rank {slow.rank}'s input pipeline keep up: more DataLoader workers for it (num_workers, "
                f"persistent_workers=True{_pin(slow)})"
                + (f", or pre-decode / cache what `{slow.worker_hot}` does" if slow.worker_hot else "")
                + "; every rank should read data that costs the same to load")
    # What only this rank runs says more than its busiest line (often the loop's own): the choice
    # the Ranks tab and the report make (analysis.hot_line).
    hot, hot_share, own = hot_line(slow)
    if not own:
        hot, hot_share = None, 0.0
    where = f"`{hot}`" if hot else f"rank {slow.rank}'s non-collective work"
    doing = (f"spends {pct(hot_share)} in `{hot}`" if hot
             else f"spends {pct(1 - slow.collective)} outside collectives ({slow.shares[0][0].value} first)")
    if found.on_gpu and slow.gpu_util is not None:
        doing += f", its GPU {slow.gpu_util:.0f} % busy"
    if slow.hot_when == AFTER_UPDATE and hot:
        # Work of its own after the backward (an EMA of the weights, a metric): no DataLoader
        # takes it; the change is to where and how often it runs.
        name = hot.split(" (")[0]
        # A rank with a GPU can do it there; a CPU rank (gloo) has no device to move it to: only
        # less often, off the thread, vectorised or shared (a pure-Python loop on a CPU rank was
        # told to keep "its tensors on the GPU").
        faster = ("Keep its tensors on the GPU and update them there (torch._foreach_* ops: one fused kernel, no "
                  "copy to the host and no sync), run it every N steps, or in a background thread on a copy"
                  if slow.gpu is not None else
                  "Run it every N steps, vectorise it (tensor ops over the whole set instead of a Python loop), or "
                  "run it in a background thread on a copy")
        return (doing + f", {AFTER_UPDATE} each step",
                f"take `{name}` off rank {slow.rank}'s step: it runs {AFTER_UPDATE} on this rank while the others "
                f"wait in their next collective. {faster}; if every rank should run it, give each its share")
    if slow.hot_when == BEFORE_FORWARD or not hot:
        return (doing,
                f"make {where} on rank {slow.rank} as fast as on the others: move the slow input work into "
                f"DataLoader workers (num_workers>0{_pin(slow)}) or precompute it, and give every rank the same "
                "amount of work")
    return (doing,
            f"make {where} on rank {slow.rank} as fast as on the others: if it prepares the batch, in DataLoader "
            f"workers (num_workers>0{_pin(slow)}) or precomputed; if it is work of its own on the step's tensors, "
            "on the GPU without host copies, or every N steps; and give every rank the same amount of work")


def _pin(v) -> str:
    """", pin_memory=True" for a rank with a GPU: pinned memory speeds only host-to-GPU copies, so
    a rank with no GPU (gloo on CPUs) is not told to pin."""
    return ", pin_memory=True" if v.gpu is not None else ""


# communication-bound: every rank's GPU sits in NCCL's kernels at least this share of the window
# (analysis.spin) ...
COMM_BOUND_MIN = Threshold(
    0.30, "share", JUDGEMENT,
    "Every rank's GPU in NCCL's kernels at least this share of the window: the straggler rule's own bar for "
    "'waiting is a pattern' (OTHERS_WAIT_MIN).")
# ... and alike on every rank (a straggler is the other shape: one rank far below the rest).
COMM_BOUND_SPREAD = Threshold(
    0.25, "share", JUDGEMENT,
    "The most- and least-waiting ranks within this of each other: alike, as the straggler's gap (STRAGGLER_GAP).")

@uses(COMM_BOUND_MIN, COMM_BOUND_SPREAD, OTHERS_WAIT_MIN, STRAGGLER_GAP, STRAGGLER_LEVEL, GPU_OTHERS_WAIT_MIN,
      GPU_STRAGGLER_GAP, MIN_MAIN_SAMPLES)
def check_collective_bound(ctx: AnalysisContext) -> Hit | None:
    """Every rank spends a large, equal share of the step in collectives: not waiting for one
    of them (a straggler) but moving gradients: the job is communication-bound."""
    views = [v for v in ctx.ranks if v.samples >= MIN_MAIN_SAMPLES]
    if len(views) < 2 or len(views) < len(ctx.ranks):
        return None
    # On the GPUs only: a GPU sitting in NCCL's kernels instead of computing is the cost itself.
    # A host blocked in a collective (gloo, or a blocking call) waits for its peers' compute and
    # scheduling as much as for the bytes: a balanced gloo DDP job on two busy cores waits 42 % in
    # all_reduce with nothing to change (bench/multi_rank.py's healthy job, CPU).
    if any(v.gpu_wait is None for v in views):
        return None
    waits = [v.gpu_wait or 0.0 for v in views]
    low, high = min(waits), max(waits)
    if low < COMM_BOUND_MIN or high - low > COMM_BOUND_SPREAD:
        return None
    if rank_straggler(ctx):
        return None  # one rank holds the others back: the straggler rule's
    if any(not v.works for v in views):
        return None  # a rank blocked in one place: a hang forming, the stuck verdict's
    if any(r.gap_ops is not None and r.gap_ops >= STRAGGLER_MIN_GAP_OPS for r in ctx.nccl):
        # NCCL's own counts have a rank behind by a straggler's gap: the ranks are not in step,
        # one is waited for (FSDP2, a rank looping in its own code 33 AllGathers behind, was
        # called communication-bound while its hang formed).
        return None
    where = "NCCL kernels on their GPUs (few SMs active, no tensor-core work)"
    spread = pct(low) if pct(low) == pct(high) else f"{pct(low)}-{pct(high)}"
    ev = [f"every rank spends {spread} of the window in {where}, alike: no rank is waited for"]
    for v in views:
        gpu = f", GPU {v.gpu}" if v.gpu is not None else ""
        top = ", ".join(f"{c.value} {pct(sh)}" for c, sh in v.shares[:3])
        line = f"rank {v.rank} (pid {v.pid}{gpu}): {top} of {v.samples} samples"
        if v.gpu_wait is not None:
            line += (f"; its GPU in collectives {pct(v.gpu_wait)} (utilisation {v.gpu_util or 0:.0f} %"
                     + (f", SMs active {v.gpu_sm:.0f} %" if v.gpu_sm is not None else "") + ")")
        ev.append(line)
    wrapper = next((v.wrapper for v in views if v.wrapper), None)
    if wrapper:
        ev.append(f"the model is wrapped in {wrapper} (its frames in the stacks)")
    ev.extend(ras_line(r) for r in ctx.nccl)
    if wrapper == "FSDP":
        first = ("with gradient accumulation, skip the reduce-scatter on all but the last micro-batch: "
                 "model.set_requires_gradient_sync(False) (fully_shard) or `with model.no_sync():` (FSDP1)")
    else:
        first = ("with gradient accumulation, all-reduce once per optimizer step: run every micro-batch but the "
                 "last under `with model.no_sync():` (accelerate: `with accelerator.accumulate(model):`; "
                 "Lightning and the HF Trainer do this themselves)")
    action = (f"communicate less per sample: {first}; otherwise a larger per-rank batch (fewer all-reduces per "
              "sample), DDP(..., gradient_as_bucket_view=True) with "
              "model.register_comm_hook(None, torch.distributed.algorithms.ddp_comm_hooks.default_hooks."
              "bf16_compress_hook) (half the bytes), and NCCL_DEBUG=INFO to check the transport "
              "(NET/Socket between GPUs of one node means P2P/NVLink is off)")
    cost = low * (ctx.t1 - ctx.t0) * len(views)
    hit = Hit(
        evidence=tuple(ev),
        action=action,
        # Communication removed entirely gives back at most its share of the step; accumulation
        # over k micro-batches keeps 1/k of it, so the bound is an upper one.
        expected_gain=gain(low),
        gain_bound=bounded(low),
        cost_s=cost,
        confidence=confidence(low, min(v.samples for v in views)),
        gpu_index=views[0].gpu,
        title=f"Communication-bound: every rank spends {pct(low)} or more in collectives",
    )
    if not any(multi_node(dict(v.env)) for v in views):
        return hit
    # The job has ranks on other nodes, which this host does not see: every local rank waiting
    # alike is also what a straggler elsewhere looks like from here. Say what is weighed.
    return replace(
        hit,
        evidence=hit.evidence + ("the job spans nodes (WORLD_SIZE above LOCAL_WORLD_SIZE): a slower rank on another "
                                 "node looks the same from here",),
        action=("see every node before changing anything: gputop job --prometheus URL (the exporters' view of all "
                f"ranks), or gputop advise --pid PID on each node; if the ranks wait alike everywhere, {action}"),
        confidence=0.4,
        severity=Severity.INFO,
        title=f"Every local rank waits {pct(low)} or more in NCCL alike: a rank on another node, or the bytes",
    )


# gradients by hand: every rank spends at least this share of its samples in all_reduce calls from
# one function of the user's code, with no DDP or FSDP in any rank's stacks.
MANUAL_SYNC_MIN = Threshold(
    0.10, "share", JUDGEMENT,
    "Every rank in all_reduce at least this share of its samples: the advisor's 10 % bar (what bucketing and "
    "overlap can give back is at most this wait).")
MANUAL_SYNC_CALLER_SHARE = Threshold(
    0.5, "share", JUDGEMENT, "Most of those all_reduce samples (this share) come from one function of the user's.")


@uses(MANUAL_SYNC_MIN, MANUAL_SYNC_CALLER_SHARE, OTHERS_WAIT_MIN, STRAGGLER_GAP, STRAGGLER_LEVEL,
      GPU_OTHERS_WAIT_MIN, GPU_STRAGGLER_GAP, MIN_MAIN_SAMPLES)
def check_manual_gradient_sync(ctx: AnalysisContext) -> Hit | None:
    """Gradients averaged by hand (tutorial code: a dist.all_reduce per parameter after backward):
    one small collective per tensor, one after another, none overlapped with backward. DDP
    buckets them (25 MB) and starts each bucket while backward still runs."""
    views = [v for v in ctx.ranks if v.samples >= MIN_MAIN_SAMPLES]
    if len(views) < 2 or len(views) < len(ctx.ranks) or any(v.wrapper for v in views):
        return None
    if any(v.collective < MANUAL_SYNC_MIN or v.collective_fn != "all_reduce" or not v.collective_caller
           or v.collective_caller_share < MANUAL_SYNC_CALLER_SHARE for v in views):
        return None
    callers = {v.collective_caller.split(" (")[0] for v in views if v.collective_caller}
    if len(callers) != 1:
        return None  # each rank reduces from a different place: not one gradient-averaging loop
    if all(v.collective_once_per_step for v in views):
        # One all-reduce a step from the training loop itself (a flat buffer, a metric): not one
        # call per tensor, and its wait on a busy host is the ranks' jitter, not bucketing to win
        # (a healthy 2-rank gloo job on a loaded machine was told to wrap its model in DDP).
        return None
    if rank_straggler(ctx):
        return None  # the others wait for one rank: the straggler rule's
    caller = callers.pop()
    least = min(views, key=lambda v: v.collective)
    low = least.collective
    # The bound from the most-waiting rank at its upper limit (as accumulation-sync's: every rank's
    # step lasts until the slowest sync ends); the evidence says what every rank spends at least.
    most = max(views, key=lambda v: v.collective)
    upper = sampled_upper(most.collective, most.samples)
    ev = [f"every rank spends {pct(low)} or more of its samples in dist.all_reduce called from `{caller}`, "
          "and no rank's stacks show DistributedDataParallel or FSDP"]
    for v in views:
        ev.append(f"rank {v.rank} (pid {v.pid}): all_reduce {pct(v.collective)} of {v.samples} samples, "
                  f"{pct(v.collective_caller_share)} of them from `{v.collective_caller}`")
    return Hit(
        evidence=tuple(ev),
        action=(f"wrap the model in DistributedDataParallel(model, device_ids=[local_rank]) and drop `{caller}`: "
                "DDP all-reduces the gradients in 25 MB buckets, each started while backward still runs; "
                "to keep it by hand, all-reduce one flat buffer per step "
                "(torch._utils._flatten_dense_tensors of the grads) instead of one call per tensor"),
        expected_gain=gain(most.collective, upper=upper),
        gain_bound=bounded(most.collective, upper=upper),
        cost_s=low * (ctx.t1 - ctx.t0) * len(views),
        confidence=confidence(low, min(v.samples for v in views)),
        gpu_index=views[0].gpu,
        title=f"Gradients all-reduced by hand in `{caller}`: every rank spends {pct(low)} or more in all_reduce",
    )


def _loop_with(ctx: AnalysisContext, fact: str) -> tuple[Frame, float, Counter] | None:
    """The commonest loop frame of the main thread's samples that carries ``fact`` (a
    ``Frame`` field read from the loop's source: "accum", "shard"), the share of the samples
    under it, and the lines it was sampled at."""
    seen: Counter = Counter()
    frames: dict[tuple, Frame] = {}
    at: dict[tuple, Counter] = {}
    for s in ctx.main_stacks:
        f = next((f for f in s.frames if getattr(f, fact)), None)
        if f is not None:
            k = (f.filename, f.loop, getattr(f, fact))
            seen[k] += 1
            frames[k] = f
            at.setdefault(k, Counter())[f.line] += 1
    if not seen:
        return None
    k, n = seen.most_common(1)[0]
    return frames[k], n / len(ctx.main_stacks), at[k]


def _accumulating_loop(ctx: AnalysisContext) -> tuple[Frame, float] | None:
    """The training loop's frame where it accumulates gradients with a backward that syncs every
    micro-batch (``Frame.accum``, read from its source), and the share of the main thread's samples
    under it; None where no sampled loop does, or where the samples show the loop running a
    backward that skips the sync and never one that does (a file holding both, a flag's two
    branches: the stacks say which runs)."""
    found = _loop_with(ctx, "accum")
    if found is None:
        return None
    f, share, lines = found
    syncing, quiet = f.accum[3], f.accum[4]
    if quiet and not any(lines[ln] for ln in syncing):
        return None  # only a skipping backward seen running, or no backward seen to tell which
    return f, share


# accumulation-sync: the accumulating loop is under this share of the main thread's samples at
# least: the training loop itself, not a loop the job passed through once.
ACCUM_LOOP_SHARE = Threshold(
    0.5, "share", JUDGEMENT,
    "The accumulating loop is under at least half of the main thread's samples: the training loop, not a loop "
    "passed through once (set-up, evaluation).")


@uses(ACCUM_LOOP_SHARE, WORTHWHILE_GAIN, MIN_MAIN_SAMPLES, OTHERS_WAIT_MIN, STRAGGLER_GAP, STRAGGLER_LEVEL,
      GPU_OTHERS_WAIT_MIN, GPU_STRAGGLER_GAP)
def check_accumulation_sync(ctx: AnalysisContext) -> Hit | None:
    """Gradient accumulation under DDP or FSDP that all-reduces every micro-batch: the optimizer
    steps once every k micro-batches (``if (i + 1) % k == 0:``), but every ``backward`` starts the
    wrapper's gradient all-reduce (reduce-scatter), so k collectives run where one is used; the
    file never skips them (``no_sync()``). What it costs: the ranks' time in collectives, of which
    all but one micro-batch's in k goes."""
    views = [v for v in ctx.ranks if v.samples >= MIN_MAIN_SAMPLES]
    if len(views) < 2 or len(views) < len(ctx.ranks) or len(ctx.main_stacks) < MIN_MAIN_SAMPLES:
        return None
    wrapper = next((v.wrapper for v in views if v.wrapper), None)
    if wrapper is None:
        return None  # gradients all-reduced by hand, or no data parallelism: nothing syncs per backward
    found = _accumulating_loop(ctx)
    if found is None or found[1] < ACCUM_LOOP_SHARE:
        return None
    if rank_straggler(ctx):
        return None  # the others wait for one rank: fewer collectives would not make it faster
    loop, _ = found
    gate_line, k, cond = loop.accum[:3]
    # Each rank's time in collectives (host or GPU). The bound is the most-waiting rank's at its
    # upper confidence limit: every rank's step takes as long as the slowest to sync, and on CPU
    # ranks the reduction's own work (gloo's threads) competes with the compute as well, so the
    # least-waiting rank's share undershot (42 % stated 2.3x; measured 2.45x, bench/results/
    # accumulation_sync_cpu.md).
    low = min(v.wait for v in views)
    most = max(views, key=lambda v: v.wait)
    # k-1 of every k collectives go; k unread: all but one of many (the bound).
    kept = (k - 1) / k if k else 1.0
    upper = sampled_upper(most.wait, most.samples)
    saved = most.wait * kept
    lim = ShareLimit(min(1.0, upper.upper * kept), upper.samples)  # the bound: at the share's upper limit
    if bounded(saved, upper=lim) < WORTHWHILE_GAIN:
        return None
    where = f"{loop.name} ({short_path(loop.filename)}:{loop.loop})"
    every = f"every {k} micro-batches" if k else "every few micro-batches"
    lines = ", ".join(str(ln) for ln in loop.accum[3])
    ev = [f"the loop at {where} steps the optimizer only when `{cond}` (line {gate_line}: {every}) while "
          f"`.backward()` runs every micro-batch (line {lines}), not under no_sync()",
          f"the model is wrapped in {wrapper}: each backward "
          + ("all-reduces every gradient" if wrapper != "FSDP" else "reduce-scatters every gradient")
          + (f", {k} collectives per optimizer step where the last one alone is used" if k else
             ", one collective per micro-batch where the last one alone is used")]
    for v in views:
        gpu = f", GPU {v.gpu}" if v.gpu is not None else ""
        ev.append(f"rank {v.rank} (pid {v.pid}{gpu}): in collectives {pct(v.wait)} of {v.samples} samples")
    if wrapper == "FSDP":
        skip = ("call model.set_requires_gradient_sync(is_last) before each micro-batch's backward, is_last true only "
                "for the one before optimizer.step() (fully_shard); FSDP1: `with model.no_sync():` around the others")
    else:
        skip = ("run the backward of every micro-batch but the last of each optimizer step under `with "
                f"model.no_sync():`: the last is the one whose turn reaches optimizer.step(), so decide it with "
                f"the test at line {gate_line} (`{cond}`) as it will read there, after any counter update in "
                "between (sync = that test; with contextlib.nullcontext() if sync else model.no_sync(): "
                "loss.backward()); accelerate: `with accelerator.accumulate(model):`")
    share = f"{k - 1} of {k}" if k else "all but one"
    return Hit(
        evidence=tuple(ev),
        action=f"all-reduce once per optimizer step: {skip}; the gradients still sum over the micro-batches locally",
        expected_gain=gain(saved, upper=lim) + f" ({share} collectives go)",
        gain_bound=bounded(saved, upper=lim),
        cost_s=saved * (ctx.t1 - ctx.t0) * len(views),
        confidence=confidence(low, min(v.samples for v in views)),
        gpu_index=views[0].gpu,
        title=f"Gradients synced every micro-batch: accumulation in `{loop.name}` without no_sync()",
    )


_LOADING = (Category.DATA_WAIT, Category.DATA_FETCH)


@uses(ACCUM_LOOP_SHARE, WORTHWHILE_GAIN, MIN_MAIN_SAMPLES)
def check_batch_loaded_on_every_rank(ctx: AnalysisContext) -> Hit | None:
    """Every rank loads the whole global batch and keeps its part (``x.chunk(world)[rank]``): the
    same samples read, decoded and augmented world-size times over, where a DistributedSampler
    gives each rank its own. What it costs: the rank's time loading data, of which all but its own
    part goes."""
    views = [v for v in ctx.ranks if v.samples >= MIN_MAIN_SAMPLES]
    if len(views) < 2 or len(views) < len(ctx.ranks) or len(ctx.main_stacks) < MIN_MAIN_SAMPLES:
        return None
    found = _loop_with(ctx, "shard")
    if found is None or found[1] < ACCUM_LOOP_SHARE:
        return None
    loop = found[0]
    try:
        world = max(len(views), int(ctx.env.get("WORLD_SIZE", "0")))
    except ValueError:
        world = len(views)
    shares = ctx.main_shares()
    load = sum(shares.get(c, 0.0) for c in _LOADING)
    n = len(ctx.main_stacks)
    kept = (world - 1) / world

    def loading(v) -> float:
        return sum(sh for c, sh in v.shares if c in _LOADING)

    # The bound from the most-loading rank at its upper limit: the others wait for it in the
    # all-reduce (rank 0's own share stated "at most 1.2x"; a new user measured 1.26x, rank 1
    # loading 29 % to rank 0's 20 %).
    most = max(views, key=loading)
    top = max(load, loading(most))
    upper = sampled_upper(top, most.samples if loading(most) > load else n)
    lim = ShareLimit(min(1.0, upper.upper * kept), upper.samples)
    saved = top * kept
    if bounded(saved, upper=lim) < WORTHWHILE_GAIN:
        return None
    line, code = loop.shard
    where = f"{loop.name} ({short_path(loop.filename)}:{loop.loop})"
    ev = [f"the loop at {where} keeps this rank's part of each batch it loaded: `{code}` (line {line})",
          f"so every one of the {world} ranks loads the whole global batch, {world}x the samples it trains on: "
          f"{world - 1} of every {world} loaded for nothing",
          f"the main thread loads or waits for data in {pct(load)} of its {n} samples"]
    for v in views:
        ev.append(f"rank {v.rank} (pid {v.pid}): data {pct(loading(v))} of {v.samples} samples")
    return Hit(
        evidence=tuple(ev),
        action=(f"give each rank its own samples: DataLoader(dataset, batch_size=<per-rank batch>, "
                "sampler=DistributedSampler(dataset, shuffle=True), ...) with sampler.set_epoch(epoch) at each "
                f"epoch, and drop line {line} (`{code}`): each rank then loads only what it trains on"),
        expected_gain=gain(saved, upper=lim) + f" ({world - 1} of {world} loads go)",
        gain_bound=bounded(saved, upper=lim),
        cost_s=saved * (ctx.t1 - ctx.t0) * len(views),
        confidence=confidence(load, n),
        gpu_index=views[0].gpu,
        title=f"Every rank loads the whole batch and keeps 1/{world}: `{code}`",
    )
