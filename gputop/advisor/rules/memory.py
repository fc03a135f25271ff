"""GPU memory: too close to the card's limit, or so much to spare that a larger batch fits."""

from __future__ import annotations

from ...analysis import CPU_DEVICE
from ...units import fmt_bytes
from ..context import AnalysisContext, GpuView
from .base import MIN_BUSY_POLLS, MIN_COST_FRACTION, Hit, data_wait_s, pct, spinning, times

# Above this share of the card the caching allocator has no slack: one larger batch or
# fragmentation means an OOM or cudaMalloc retries that flush the cache (each a full sync).
# Judgement.
MEM_NEAR_LIMIT = 0.95
# Below this share, a batch twice as large fits with room to spare (activations scale with it).
# Judgement. launch-bound also reads it to say a larger batch fits.
MEM_HEADROOM = 0.35
# Raising the batch helps a GPU that is not already full: SM activity below this (GPM).
# Judgement; the healthy bf16 trainer ran at 92.6 % (bench/results/harness.md).
HEADROOM_SM_ACTIVE_PCT = 60.0
# The batch factor suggested aims the peak at this share of MEM_NEAR_LIMIT (activations are not
# all of the memory, so the scaling is rough), and is never above MAX_BATCH_FACTOR. Judgement.
BATCH_TARGET_SHARE = 0.8
MAX_BATCH_FACTOR = 8


def larger_batch(g: GpuView) -> tuple[int, float] | None:
    """The batch factor that fits in ``g``'s spare memory, and the samples/s it can give at most;
    None without a memory reading that says it fits.

    The bound: a step of factor x the samples takes at least as long as the work that does not
    grow with the batch (the time the GPU idled per step: launching, waiting; the CPU may
    overlap it with the GPU's work, so it is a floor, not a sum) and at least as long as the
    GPU's busy time grown by the batch (factor x the share of it the SMs were active, SMs full
    at best; without GPM, at least what it was)."""
    e = g.efficiency
    frac = e.mem_peak_fraction
    if frac is None or frac >= MEM_HEADROOM:
        return None
    factor = max(2, int(MEM_NEAR_LIMIT * BATCH_TARGET_SHARE / max(0.01, frac)))
    factor = min(factor, MAX_BATCH_FACTOR)
    bd = g.breakdown
    busy = bd.busy_s / bd.total_s if bd.total_s else 1.0
    growth = max(1.0, factor * e.sm_active / 100.0) if e.sm_active is not None else 1.0
    bound = factor / max(1e-9, 1.0 - busy, busy * growth)
    return factor, bound


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
        if frac is None or frac >= MEM_HEADROOM or e.busy_polls < MIN_BUSY_POLLS or spinning(g):
            return False
        # A bigger batch helps a GPU that is not full; one starved of data it does not help.
        if data_wait_s(g) > MIN_COST_FRACTION * g.breakdown.total_s:
            return False
        return e.sm_active is not None and e.sm_active < HEADROOM_SM_ACTIVE_PCT

    cands = [g for g in ctx.gpus if g.index != CPU_DEVICE and fits(g)]
    if not cands:
        return None
    g = min(cands, key=lambda x: x.efficiency.mem_peak_fraction or 1.0)
    e = g.efficiency
    found = larger_batch(g)
    if found is None:
        return None
    factor, bound = found
    return Hit(
        evidence=(
            f"{g.name} memory peaked at {fmt_bytes(e.mem_used_peak)} of {fmt_bytes(e.mem_total)} "
            f"({pct(e.mem_peak_fraction)})",
            f"SMs active {e.sm_active:.0f} % while busy: the GPU is not full",
        ),
        action=f"raise batch_size {factor}x (and scale the learning rate, e.g. linearly with warm-up)",
        gain_bound=bound,
        expected_gain=f"more work per kernel launch and per step: at most {times(bound)} samples/s (an upper bound: "
        f"{factor}x the samples per step, with SMs active {e.sm_active:.0f} % while busy, can at best fill them, "
        "and the step's idle time stays)",
        cost_s=0.0,
        confidence=0.6,
        gpu_index=g.index,
        title=f"{g.name} has memory to spare: a larger batch fits",
    )

