"""A thread of the training process holding the GIL while the training thread waits for it
(analysis.gil_holder): the GPU idles because the thread that launches its kernels cannot run. Larger
batches, graphs or more workers do not touch it; the spinning thread must block or sleep."""

from __future__ import annotations

from ..context import AnalysisContext
from .base import MIN_MAIN_SAMPLES, Hit, bounded, confidence, enough_stacks, gain, idle_unless_spinning, pct, \
    significant, uses, worst


@uses(MIN_MAIN_SAMPLES)
def check_gil_held(ctx: AnalysisContext) -> Hit | None:
    if not enough_stacks(ctx) or len(ctx.ranks) >= 2:
        return None  # several ranks: the straggler finding names the rank whose thread holds it
    h = ctx.gil_holders.get(ctx.target_pid) if ctx.target_pid is not None else None
    if h is None:
        return None
    found = worst(ctx, lambda g: min(h.main_waits * g.breakdown.total_s, idle_unless_spinning(g)), gpu_only=True)
    if found is None or not significant(found[0], found[1]):
        return None
    g, cost = found
    frac = cost / g.breakdown.total_s
    fn = h.where.split(" (")[0]
    return Hit(
        evidence=(f"the main thread not running in {pct(h.main_waits)} of its samples while its thread `{h.thread}` "
                  f"holds the GIL in {pct(h.held)} of {h.samples}, in `{h.where}`",
                  f"{g.name} idle {pct(g.breakdown.idle_s / g.breakdown.total_s)} of the window: the thread that "
                  "launches its kernels waits for the GIL (CPython hands it over every 5 ms)"),
        action=(f"stop `{fn}` spinning in Python: block instead (queue.Queue.get(timeout=...), "
                "threading.Event.wait(...)) or sleep between polls (time.sleep(0.01)); CPU-heavy work belongs in a "
                "process of its own (multiprocessing), not a thread beside the training loop"),
        expected_gain=gain(frac) + ": the training thread runs when it needs to",
        gain_bound=bounded(frac),
        cost_s=cost,
        confidence=confidence(min(h.held, h.main_waits), h.samples),
        gpu_index=g.index,
        title=f"Thread `{h.thread}` holds the GIL: the training thread waits, {g.name} idle {pct(frac)}",
    )
