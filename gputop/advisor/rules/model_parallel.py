"""Tensor parallelism where data parallelism fits (analysis.forward_comm): each layer's
activations all-reduced inside the forward, on the critical path, for a model whose weights,
gradients, optimizer state and activations would fit whole on every GPU.

Both must hold: the collectives seen inside the model's forward (over the ranks together), and memory
to spare on every GPU of the job so that, all of it taken world-size times over (what data
parallelism needs at most: each rank's shard of the weights, gradients and optimizer becomes the
whole, its activations are for a smaller batch), it still fits. The gain's floor is what the
activations' traffic costs at the link's peak rate: NVLink's bytes a second over its documented
peak is the least share of the time the step spends in them, none of it hidden. The work every
rank repeats in full (embeddings, norms, residuals, the loss) comes back on top.
"""

from __future__ import annotations

from ...analysis import CPU_DEVICE
from ...model import Severity
from ...units import fmt_bytes
from ..context import AnalysisContext
from .base import WORTHWHILE_GAIN, Hit, confidence, pct, times, uses, wait_bound
from .nccl import MIN_LINK_POLLS
from .threshold import DOCUMENTED, JUDGEMENT, IntThreshold, Threshold

# Collectives inside the forward seen in at least this many main-thread samples over the ranks.
# Judgement: as for the recomputation (RECOMPUTE_MIN_SAMPLES), one or two instants could be one
# layer caught twice; three separate ones are the steps' pattern.
TP_MIN_SAMPLES = IntThreshold(
    3, "samples", JUDGEMENT,
    "Collectives inside the model's forward are named once seen in this many main-thread samples over the ranks: "
    "one or two could be one layer caught twice.")
# The job's memory taken world-size times over must stay under this share of the smallest card:
# the rest is the caching allocator's slack and DDP's gradient buckets (about the gradients' size
# again, bounded by bucket_cap_mb). Judgement.
TP_FITS_SHARE = Threshold(
    0.80, "share", JUDGEMENT,
    "The fullest rank's peak GPU memory times the number of ranks under this share of the card: the whole model, "
    "its gradients, optimizer state and a smaller batch's activations fit on each GPU, with slack for the allocator "
    "and DDP's buckets.")
# NVLink's documented peak, both directions together (NVML's rates are sent + received), by the
# product's name: NVLink 4 on H100/H200/GH200 SXM 900 GB/s, NVLink 3 on A100 600 GB/s, NVLink 5 on
# B200/GB200 1.8 TB/s, V100 300 GB/s. A card not listed takes the largest: the floor stays a floor.
NVLINK_PEAK_BPS = Threshold(
    1.8e12, "B/s", DOCUMENTED,
    "NVLink's peak, both ways, for a GPU not in the table (NVLink 5's, the largest): the traffic's share of time "
    "at the peak rate stays a floor.", "NVIDIA datasheets (H100/H200 900 GB/s, A100 600 GB/s, B200 1.8 TB/s)")
_PEAKS = (("H100", 900e9), ("H200", 900e9), ("GH200", 900e9), ("H800", 400e9), ("A100", 600e9), ("A800", 400e9),
          ("B200", 1.8e12), ("B100", 1.8e12), ("GB200", 1.8e12), ("B300", 1.8e12), ("V100", 300e9))


def nvlink_peak(name: str | None) -> float:
    for key, peak in _PEAKS:
        if name and key in name:
            return peak
    return float(NVLINK_PEAK_BPS)


@uses(TP_MIN_SAMPLES, TP_FITS_SHARE, NVLINK_PEAK_BPS, MIN_LINK_POLLS, WORTHWHILE_GAIN)
def check_tensor_parallel_fits(ctx: AnalysisContext) -> Hit | None:
    fc = ctx.forward_comm
    # Over the ranks together: a collective is every rank's at once (one rank alone in it would
    # hang), so waiting to catch it on each rank only delays the verdict.
    if fc.seen < TP_MIN_SAMPLES:
        return None
    if ctx.stuck is not None and ctx.stuck.stuck:
        return None
    gpus = [g for g in ctx.gpus if g.index != CPU_DEVICE and g.efficiency.mem_used_peak and g.efficiency.mem_total]
    world = len(fc.procs)
    if not gpus:
        return None  # the GPUs the window reads (the target's) stand for the ranks' alike
    fullest = max(g.efficiency.mem_used_peak for g in gpus)
    card = min(g.efficiency.mem_total for g in gpus)
    if fullest * world > TP_FITS_SHARE * card:
        return None  # the model needs its split: nothing to say
    samples = sum(p.samples for p in fc.procs)
    per = ", ".join(f"rank {p.rank} {p.in_forward} of {p.samples}" if p.rank is not None else
                    f"pid {p.pid} {p.in_forward} of {p.samples}" for p in fc.procs)
    evidence = [f"`{fc.collective}` inside the model's forward, under {fc.where}, seen on {fc.ranks_seen} of {world} ranks "
                f"({per} main-thread samples): activations reduced between layers, tensor parallelism",
                f"each GPU at most {fmt_bytes(fullest)} of {fmt_bytes(card)}: {world} x that is "
                f"{pct(fullest * world / card)} of one card, so the whole model with its gradients, optimizer and a "
                f"{world}x smaller batch fits on each"]
    # Every rank's GPU's links (the ranks' GPUs are not all in the window's views); one host's GPUs
    # are one product, named by the views'.
    indices = sorted({v.gpu for v in ctx.ranks if v.gpu is not None} | {g.index for g in gpus})
    rates = [(i, t.nvlink_bps) for i in indices if (t := ctx.links.get(i)) is not None and t.polls >= MIN_LINK_POLLS
             and t.nvlink_bps]
    peak = nvlink_peak(next((g.info.name for g in gpus if g.info is not None), None))
    floor = None
    if rates:
        i, bps = max(rates, key=lambda x: x[1])
        share = min(1.0, bps / peak)  # wait_bound caps what it gives (MIN_REMAINING)
        floor = wait_bound(share)
        evidence.append(f"GPU {i}'s NVLinks carry {bps / 1e9:.0f} GB/s (sent and received, median): at their "
                        f"{peak / 1e9:.0f} GB/s peak that is at least {pct(share)} of the time in the activations' "
                        "collectives, on the critical path (the next layer needs their result)")
    warn = floor is not None and floor >= WORTHWHILE_GAIN
    return Hit(
        evidence=tuple(evidence),
        action=("data parallel instead: the whole model on each GPU, each rank a share of the batch (DDP(model, "
                "device_ids=[local_rank]), or FSDP2's fully_shard if the optimizer state is what does not fit), "
                "one gradient all-reduce a step overlapped with the backward; keep tensor parallelism for models "
                "that do not fit on one GPU"),
        expected_gain=((f"at least {times(floor)}: the activations' collectives leave the critical path; the work "
                        "every rank repeats in full (embeddings, norms, the loss) halves on top")
                       if floor is not None else
                       "the activations' collectives leave the critical path and the repeated work halves; how much "
                       "is not read here (no NVLink counters)"),
        gain_bound=None,
        cost_s=0.0 if floor is None else (1.0 - 1.0 / floor) * max(g.breakdown.total_s for g in gpus),
        confidence=confidence(0.8, samples),
        gpu_index=gpus[0].index,
        severity=Severity.WARNING if warn else Severity.INFO,
        title=f"Tensor parallelism over {world} GPUs for a model that fits on one: data parallelism avoids the "
              "forward's all-reduces",
    )
