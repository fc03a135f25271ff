"""Checkpoints: saves on the training thread that stall the GPU."""

from __future__ import annotations

from ...analysis import CPU_DEVICE, Bucket
from ...analysis import periodicity
from ...model import Category, Severity
from ..context import AnalysisContext
from .base import (
    MIN_MAIN_SAMPLES, Hit, bounded, loop_wait, loop_wait_upper, confidence, device_name, gain,
    gpu_index, idle_line, labels_line, pct, secs, significant, uses, worst,
)
from .threshold import JUDGEMENT, Threshold

# Checkpoint stalls are periodic and short, so the bar is lower than other causes' (base's
# MIN_COST_FRACTION): a few % of the time (one save of ~1 s every 30 s) is already a clear, cheap
# win to reclaim; 0.3 s is a save long enough to show in one or two stack samples at the
# sampler's 5 Hz. Judgement. The checkpoint-stall workload lost 43 % of the window, saves up to
# 3.5 s (bench/results/advisor_bench.json).
CHECKPOINT_MIN_FRACTION = Threshold(
    0.03, "share", JUDGEMENT,
    "Saves are periodic and short: a few % of the time (one ~1 s save every 30 s) is already a clear, cheap win.",
    "bench/results/advisor_bench.json")
CHECKPOINT_MIN_S = Threshold(
    0.3, "s", JUDGEMENT, "A save long enough to show in one or two stack samples at the sampler's 5 Hz.")
SAVE_GAP_S = Threshold(
    1.0, "s", JUDGEMENT, "A save's edge with no sample beside it (the window's start) reaches out by the usual "
    "spacing between samples, at most this (five samples at 5 Hz).")


@uses(CHECKPOINT_MIN_FRACTION, CHECKPOINT_MIN_S, SAVE_GAP_S, MIN_MAIN_SAMPLES)
def check_checkpoint_stall(ctx: AnalysisContext) -> Hit | None:
    found = worst(ctx, lambda g: g.breakdown.get(Bucket.CHECKPOINT))
    if found is None or not significant(found[0], found[1], CHECKPOINT_MIN_FRACTION, CHECKPOINT_MIN_S):
        return None
    g, cost = found
    frac = loop_wait(ctx, cost / g.breakdown.total_s, Category.CHECKPOINT_IO)
    upper = loop_wait_upper(ctx, cost / g.breakdown.total_s, Category.CHECKPOINT_IO)  # the stated bound's only
    saves, running = _saves(ctx, Category.CHECKPOINT_IO)
    if not saves and not (running and _running_save_moves(ctx)):
        # No save seen to end, and the one under way shows no progress (one stack, no bytes): a
        # call that has not returned is no evidence of saves that stall the loop; frozen there, it
        # is a hang, the stuck verdict's to call.
        return None
    ev = [idle_line(g, [Bucket.CHECKPOINT])]
    if saves:
        low, high = max(saves, key=lambda r: r[1])
        ev.append(f"{len(saves)} save{'s' if len(saves) != 1 else ''} seen, the longest {low:.1f}-{high:.1f} s "
                  "(from its first to last sample, and between the samples around it)"
                  + ("; one more has not ended yet" if running else ""))
    else:
        ev.append("a save under way for the whole window, moving (its stack changes, or the job writes)")
    every = periodicity([iv for iv in g.idle if iv.duration >= CHECKPOINT_MIN_S])
    if every is not None and g.index != CPU_DEVICE:
        ev.append(f"{g.name} goes idle in bursts about every {secs(every)}")
    line = labels_line(g, Bucket.CHECKPOINT)
    if line:
        ev.append(line)
    # One save seen and no recurring idle bursts: how often saves come is not known, so neither is
    # their share of the time (one 0.75 s save in a 3 s window read as "25 % of the time", and a
    # rank's one checkpoint barrier in a hang as a stall). Said as what it is until a second save
    # or the GPU's bursts show a period.
    if len(saves) + (1 if running else 0) < 2 and every is None:
        longest = max((h for _, h in saves), default=None)
        return Hit(
            evidence=tuple(ev),
            action=("if saves recur: save in the background (torch.distributed.checkpoint.async_save, or a CPU copy "
                    "saved in a thread), or save less often"),
            expected_gain=(f"not known until a second save shows how often they come: this one took {pct(frac)} of "
                           f"the {g.breakdown.total_s:.0f} s watched"),
            cost_s=cost,
            confidence=confidence(0.3, g.breakdown.idle_samples + 10),
            gpu_index=gpu_index(g),
            severity=Severity.INFO,
            title=(f"A checkpoint save stalled {device_name(g)}"
                   + (f" for up to {secs(longest)}" if longest else "") + "; how often is not known yet"),
        )
    return Hit(
        evidence=tuple(ev),
        action=(
            "save in the background: torch.distributed.checkpoint.async_save(state_dict, "
            "checkpoint_id=path) (torch >= 2.3), or copy the state to CPU "
            "({k: v.detach().cpu() for k, v in sd.items()}) and torch.save it in a thread; "
            "or save less often"
        ),
        expected_gain=gain(frac, upper=upper),
        gain_bound=bounded(frac, upper=upper),
        cost_s=cost,
        confidence=confidence(g.breakdown.idle_sample_share(Bucket.CHECKPOINT) or frac * 5, g.breakdown.idle_samples + 10),
        gpu_index=gpu_index(g),
        title=f"Checkpoint saves stall {device_name(g)} {pct(frac)} of the time",
    )


def _running_save_moves(ctx: AnalysisContext) -> bool:
    """Whether the save under way at the newest sample progresses: its samples show more than one
    stack (a frozen call shows one), or the job's own processes move bytes through read/write."""
    xs = ctx.main_stacks
    run = []
    for s in reversed(xs):
        if s.category is not Category.CHECKPOINT_IO:
            break
        run.append(s)
    if len({tuple((f.filename, f.line, f.name) for f in s.frames) for s in run}) > 1:
        return True
    return ctx.stuck is not None and ctx.stuck.io_moves


def _saves(ctx: AnalysisContext, cat: Category, edge: float = SAVE_GAP_S) -> tuple[list[tuple[float, float]], bool]:
    """(each run of main-thread samples in ``cat`` (a save) that ended, as (at least, at most)
    seconds long; whether one is still running at the newest sample). A run is one call for as long
    as no sample shows the main thread elsewhere, however far apart its samples are: a gap in
    sampling (a loaded host gives ~1 stack/s, a pause gives none) is no sign that the save ended,
    and splitting there would count one call that never returns as many saves. A run's length is
    from its first sample to its last, and from the sample before it to the sample after it (a
    save caught by one sample is not 0 s long: it lasted up to the spacing around it, which is also
    the time the breakdown gives it); its start with no sample before it (the window's start)
    reaches out by the usual spacing, at most ``edge``."""
    xs = ctx.main_stacks
    steps = sorted(b.ts - a.ts for a, b in zip(xs, xs[1:]) if b.ts > a.ts)
    spacing = min(edge, steps[len(steps) // 2]) if steps else 0.0
    runs: list[list[int]] = []
    for i, s in enumerate(xs):
        if s.category is not cat:
            continue
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    running = bool(runs) and runs[-1][1] == len(xs) - 1
    out = []
    for i, j in (runs[:-1] if running else runs):
        first, last = xs[i].ts, xs[j].ts
        before = xs[i - 1].ts if i > 0 else first - spacing
        out.append((last - first, xs[j + 1].ts - before))
    return out, running
