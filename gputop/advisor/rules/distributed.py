"""Distributed training: the GPU waits on collectives (slow transport, a straggler, no overlap).

It uses only the shared cost bar (``base``); rules that reason across ranks belong here.
"""

from __future__ import annotations

from ...analysis.breakdown import Bucket
from ...analysis.ranks import straggler
from ..context import AnalysisContext
from .base import MIN_MAIN_SAMPLES, Hit, confidence, gain, idle_line, labels_line, pct, significant, worst


def check_collective_wait(ctx: AnalysisContext) -> Hit | None:
    found = worst(ctx, lambda g: g.breakdown.get(Bucket.COLLECTIVE), gpu_only=True)
    if found is None or not significant(found[0], found[1], buckets=(Bucket.COLLECTIVE,)):
        return None
    g, cost = found
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
# collectives (judgement: a third of the time waiting is a pattern, not jitter) ...
OTHERS_WAIT_MIN = 0.30
# ... and the straggler's share is this much below the least-waiting of them (judgement: ranks
# doing the same work wait alike within a few points; a quarter of the time apart is a rank that
# does something else while the others wait for it).
STRAGGLER_GAP = 0.25
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
STRAGGLER_LEVEL = 0.95


def check_rank_straggler(ctx: AnalysisContext) -> Hit | None:
    """One rank does something else while the other ranks wait for it in collectives."""
    found = straggler(ctx.ranks, OTHERS_WAIT_MIN, STRAGGLER_GAP, min_samples=MIN_MAIN_SAMPLES, level=STRAGGLER_LEVEL)
    if found is None:
        return None
    slow, waiting = found.slow, found.waiting
    names = ", ".join(str(v.rank) for v in waiting)
    fn = next((v.collective_fn for v in waiting if v.collective_fn), None) or "collectives"
    wait_share = min(v.collective for v in waiting)
    doing = (f"spends {pct(slow.hot_share)} in `{slow.hot}`" if slow.hot
             else f"spends {pct(1 - slow.collective)} outside collectives ({slow.shares[0][0].value} first)")
    ev = [f"rank {slow.rank} (pid {slow.pid}) {doing} while rank{'s' if len(waiting) > 1 else ''} {names} "
          f"wait{'' if len(waiting) > 1 else 's'} in {fn} {pct(wait_share)}"]
    for v in (slow, *waiting):
        top = ", ".join(f"{c.value} {pct(sh)}" for c, sh in v.shares[:3])
        gpu = f", GPU {v.gpu}" if v.gpu is not None else ""
        ev.append(f"rank {v.rank} (pid {v.pid}{gpu}): {top} of {v.samples} samples"
                  + (f"; hot: {v.hot} {pct(v.hot_share)}" if v.hot else ""))
    ev.append(f"the gap is at least {pct(found.gap_low)} of the time at {100 * STRAGGLER_LEVEL:.0f} % confidence "
              f"(from {min(v.samples for v in (slow, *waiting))}+ samples per rank), beyond sampling noise")
    where = f"`{slow.hot}`" if slow.hot else f"rank {slow.rank}'s non-collective work"
    # What the other ranks lose is their wait: the straggler's extra time is the job's step time.
    cost = wait_share * (ctx.t1 - ctx.t0) * len(waiting)
    return Hit(
        evidence=tuple(ev),
        action=(f"make {where} on rank {slow.rank} as fast as on the others: move the slow input work into "
                "DataLoader workers (num_workers>0, pin_memory=True) or precompute it, and give every rank the "
                f"same amount of work; then compare: gputop stacks --pid {slow.pid}"),
        expected_gain=gain(wait_share),
        cost_s=cost,
        confidence=confidence(min(1.0, wait_share - slow.collective + 0.5), min(v.samples for v in (slow, *waiting))),
        gpu_index=slow.gpu,
        title=f"rank {slow.rank} is the straggler: the other ranks wait {pct(wait_share)} in {fn} for it",
    )
