"""One graph backwarded once per loss (analysis.backward_calls): the shared layers' backward runs
again for every loss, where one backward of the summed losses gives the same gradients.

The GPU is busy the whole time (the repeated backward is real work), so no idle time tells it:
the evidence is the call itself, ``retain_graph`` on it, and where it sits, in a loop nested in the
training loop. The gain is the backward's share of the step, the host's samples in it standing for
it (the host waits in the backward while the GPU runs it): with two losses at least half of the
repeated part goes, with k losses (k - 1)/k of it.
"""

from __future__ import annotations

from ...analysis import backward_repeats
from ...model import Severity
from ..context import AnalysisContext
from .base import (
    MIN_MAIN_SAMPLES, WORTHWHILE_GAIN, Hit, confidence, enough_stacks, pct, sampled_upper, times, uses,
    wait_bound,
)
from .threshold import JUDGEMENT, IntThreshold

# Backward samples from the one call site before it is named: a few steps' worth, not one
# backward caught twice. Judgement.
REPEAT_MIN_SAMPLES = IntThreshold(
    5, "samples", JUDGEMENT,
    "A backward called once per loss is named once this many of the main thread's samples are in it, from the one "
    "call site: more than one step's backward caught twice.")


@uses(REPEAT_MIN_SAMPLES, MIN_MAIN_SAMPLES, WORTHWHILE_GAIN)
def check_backward_per_loss(ctx: AnalysisContext) -> Hit | None:
    if not enough_stacks(ctx):
        return None
    r = backward_repeats(ctx.main_stacks)
    if r is None or not r.retains or r.backward < REPEAT_MIN_SAMPLES:
        return None
    share = r.share
    # Two passes at least (retain_graph is there for a second one): half of the backward's time
    # is the least a single pass gives back if the losses share most of the graph.
    least = share / 2.0
    if wait_bound(least) < WORTHWHILE_GAIN:
        return None
    upper = sampled_upper(share, r.samples)
    g = next((v for v in ctx.gpus if v.breakdown.total_s > 0), None)
    window = g.breakdown.total_s if g is not None else 0.0
    fn = r.fn.rsplit(".", 1)[-1]
    evidence = [f"main thread in the backward in {pct(share)} of its samples, every one of them called from "
                f"{r.site} in `{fn}`: `{r.code}`",
                "retain_graph keeps the graph for another backward through it"]
    if r.nested:
        evidence.append(f"the call sits in a loop (from line {r.loop}) inside the training loop (from line "
                        f"{r.step_loop}): the same graph is backwarded once per turn of it, each pass through the "
                        "layers the losses share")
    else:
        evidence.append("the call is in the training loop itself: whether a second backward goes through the same "
                        "layers is not seen")
    return Hit(
        evidence=tuple(evidence),
        action=(f"backward once, on the sum: at {r.site}, instead of one .backward(retain_graph=...) per loss, "
                "`sum(w * l for w, l in zip(weights, losses)).backward()` (the gradients are the same: they add "
                "up in .grad either way); only where each loss's gradient must be kept apart (PCGrad, GradNorm) "
                "take torch.autograd.grad of each loss w.r.t. the shared features, not the whole model"),
        expected_gain=(f"about {times(wait_bound(least))} with two losses (half of the backward's {pct(share)} of "
                       f"the step), more with more: with k losses (k - 1)/k of the shared layers' backward goes"),
        # The bound the text states: two losses, the share at its upper confidence limit.
        gain_bound=wait_bound(upper.upper / 2.0),
        cost_s=least * window,
        confidence=confidence(0.9 if r.nested else 0.5, r.samples),
        gpu_index=g.index if g is not None else None,
        severity=Severity.WARNING if r.nested else Severity.INFO,
        title=(f"The backward runs once per loss at {r.site} (retain_graph): the shared layers' backward repeats"
               if r.nested else f"A backward keeps its graph at {r.site} (retain_graph): a second pass is weighed"),
    )
