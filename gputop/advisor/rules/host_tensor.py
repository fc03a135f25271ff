"""A tensor made on the CPU in every step and copied to the GPU (analysis.made_on_cpu): the GPU
waits while the main thread computes it and copies it. Making it on the GPU, or once, removes
both; pinning the copy (pageable-h2d's change), removing syncs (host-sync's) or graphs
(launch-bound's) touch neither."""

from __future__ import annotations

from ...analysis import built_on_cpu
from ..context import AnalysisContext
from .base import (
    MIN_MAIN_SAMPLES, Hit, bounded, confidence, enough_stacks, gain, idle_unless_spinning, pct, sampled_upper,
    significant, uses, worst,
)
from .threshold import JUDGEMENT, Threshold

# The main thread making or copying the tensor in at least this share of its samples. Judgement:
# a fifth, the bar of a one-place cause elsewhere (the loader's per-row fetch, an EMA).
BUILT_ON_CPU_MIN_SHARE = Threshold(
    0.20, "share", JUDGEMENT,
    "The main thread making a tensor on the CPU and copying it to the GPU in at least this share of its samples: a "
    "fifth, as for other one-place causes.")


@uses(BUILT_ON_CPU_MIN_SHARE, MIN_MAIN_SAMPLES)
def check_tensor_built_on_cpu(ctx: AnalysisContext) -> Hit | None:
    if not enough_stacks(ctx):
        return None
    b = built_on_cpu(ctx.main_stacks)
    if b is None or b.share < BUILT_ON_CPU_MIN_SHARE:
        return None
    found = worst(ctx, lambda g: min(b.share * g.breakdown.total_s, idle_unless_spinning(g)), gpu_only=True)
    if found is None or not significant(found[0], found[1]):
        return None
    g, cost = found
    frac = cost / g.breakdown.total_s
    n = b.samples
    upper = sampled_upper(frac, n)
    fn = b.fn.rsplit(".", 1)[-1]
    builtin = b.fn.startswith("torch.")
    made = (f"`{b.fn}` makes it from host data on the line itself" if builtin
            else f"inside `{fn}` in {pct(b.building / n)} of the samples (its torch calls on CPU tensors)")
    return Hit(
        evidence=(f"main thread making a tensor on the CPU and copying it to {g.name} in {pct(b.share)} of its "
                  f"samples: {made}, on the copy at {b.site} in {pct(b.copying / n)}: `{b.code}`",
                  f"{g.name} idle {pct(g.breakdown.idle_s / g.breakdown.total_s)} of the window: it waits while the "
                  "CPU makes and copies what the step needs"),
        action=(f"make it on the GPU: pass device= to the factory calls in `{fn}` (torch.arange, torch.ones, "
                "torch.tensor, torch.triu ...) and drop the .to() at "
                f"{b.site}; if it does not change from step to step (a mask, a position bias, a table), make it once "
                "and keep it: self.register_buffer(name, tensor, persistent=False) in __init__, or a dict keyed by "
                "its shape" + ("; for data (a batch built from Python lists), build it in the Dataset or a "
                               "collate_fn so DataLoader workers make it" if builtin else "")),
        expected_gain=gain(frac, upper=upper) + ": the step no longer waits for the CPU to make and copy it",
        gain_bound=bounded(frac, upper=upper),
        cost_s=cost,
        confidence=confidence(b.share, n),
        gpu_index=g.index,
        title=f"A tensor made on the CPU every step: `{fn}`, copied to {g.name} at {b.site} ({pct(b.share)} of the time)",
    )
