"""Evaluation inside the training loop: a validation pass run between training steps, after every
step or nearly, whose time the job's training loses.

The step model (analysis.step) places each main-thread sample in evaluation work from the stack:
a frame of evaluation code (``validate``, ``evaluate``, ``val_step``, transformers'
``Trainer.evaluate``, Lightning's evaluation loop), or a forward at a line of the loop after the
training step's backward and optimizer, with the ``.item()`` reads that follow it. Its samples
look like training's otherwise (a forward, syncs), so this finding, not host-sync or
launch-bound, owns them: those rules leave the evaluation's samples out (base.in_evaluation).

One long evaluation every few thousand steps is a choice the window cannot weigh (it sees one or
two); what is named is evaluation that recurs with the steps: many separate evaluations, each
after training, costing at least the advisor's bar of the time. "Every step" is said only where
the training runs between evaluations show one step each.
"""

from __future__ import annotations

import math

from ...analysis import CPU_DEVICE, HF_TRAINER, LIGHTNING, Evaluation
from ..context import AnalysisContext
from .base import (
    MIN_COST_FRACTION,
    MIN_COST_S,
    MIN_MAIN_SAMPLES,
    Hit,
    Withdraw,
    bounded,
    confidence,
    enough_stacks,
    gain,
    gpu_index,
    pct,
    sampled_upper,
    secs,
    significant,
    uses,
    worst,
)
from .threshold import JUDGEMENT, IntThreshold, Threshold

# Evaluation that started this many separate times after training in the window recurs with the
# steps. Judgement: one or two are a periodic evaluation (every few hundred or thousand steps,
# for seconds or minutes), whose cadence a 60 s window cannot tell, nor whether it is worth its
# time; four in the window is a loop that evaluates as it trains. The real job that validated
# after every step (bench/jobs/fresh_eval_every_step.py, a ViT-B/16 on an H200) showed 13 in
# its first 12 s.
EVAL_MIN_EVALUATIONS = IntThreshold(
    4, "evaluations", JUDGEMENT,
    "Evaluation started this many separate times after training in the window recurs with the steps: one or two "
    "are a periodic evaluation, whose cadence the window cannot tell.")
# "Every step" is said only where the training runs between two evaluations show one step each:
# at most this share of them holds a forward after a backward or optimizer sample (a second
# step). Judgement: a per-step evaluation sampled slower than the steps shows a few such runs by
# chance (two samples of training straddling a skipped evaluation); evaluation every N steps
# shows a second step in nearly every run it samples twice.
EVAL_SECOND_STEP_MAX = Threshold(
    0.25, "share", JUDGEMENT,
    "'Every step' is said where at most this share of the training runs between two evaluations show a second "
    "step: sampling across a skipped evaluation shows a few, evaluation every N steps nearly all.")
# The interval the action proposes is sized so evaluation costs about this share of the time
# afterwards. Judgement: well inside the ±5 % a job's step rate varies by itself, so what is
# left is not worth weighing; a user who needs more frequent validation chooses a smaller N.
EVAL_TARGET_SHARE = Threshold(
    0.02, "share", JUDGEMENT,
    "The proposed evaluation interval leaves evaluation about this share of the time: well inside the ±5 % a "
    "job's step rate varies by itself.")


def every_step(e: Evaluation) -> bool:
    """Positive evidence that the evaluation follows every training step: the training runs
    between evaluations, counted, show one step each."""
    return e.between > 0 and e.multi_step <= EVAL_SECOND_STEP_MAX * e.between


def _round_up(x: float) -> int:
    """The smallest of 2, 5, 10, 20, 50, 100, ... at or above ``x``: an interval a user writes."""
    scale = 10 ** max(0, math.floor(math.log10(max(x, 1.0))))
    for m in (1, 2, 5, 10):
        if m * scale >= x and m * scale >= 2:
            return m * scale
    return 10 * scale


def less_often(share: float) -> int:
    """How many times less often the evaluation should run to cost about EVAL_TARGET_SHARE of
    the time: it costs ``share / (1 - share)`` of the training's time now, and 1/N of that when
    run once in N."""
    now = share / max(1e-9, 1.0 - share)
    return _round_up(now * (1.0 - EVAL_TARGET_SHARE) / EVAL_TARGET_SHARE)


def _where(e: Evaluation) -> str:
    """The evaluation as a title names it: the framework's evaluation, its function, or the
    loop's lines it runs at."""
    if e.framework == HF_TRAINER:
        return "the Trainer's evaluation (Trainer.evaluate)"
    if e.framework == LIGHTNING:
        return "Lightning's validation loop"
    if e.named and e.where:
        return f"`{e.where[0].split(' (')[0]}`" + (f" (called at {e.at})" if e.at else "")
    return e.at or (e.where[0] if e.where else "the loop")


def _action(e: Evaluation, per_step: bool, n: int, share_after: str, framework: str | None) -> str:
    fw = e.framework or framework
    if fw == HF_TRAINER:
        return (f'evaluate every {n} steps{"" if per_step else " (or less often)"}: TrainingArguments('
                f'eval_strategy="steps", eval_steps={n}) (evaluation then ~{share_after} of the time; '
                'evaluation_strategy before transformers 4.41), or eval_strategy="epoch"; eval_steps=1 runs the '
                "whole evaluation set after every step; a smaller eval_dataset (eval_dataset.select(range(N))) "
                "bounds each evaluation")
    if fw == LIGHTNING:
        return (f"validate every {n} training batches{'' if per_step else ' (or less often)'}: Trainer("
                f"val_check_interval={n}) (validation then ~{share_after} of the time), or once per epoch "
                "(val_check_interval=1.0, check_val_every_n_epoch=1); limit_val_batches bounds each validation")
    first = e.lines[0] if e.lines else (e.where[0] if e.where else "the evaluation")
    if per_step:
        return (f"evaluate every {n} steps, not after every step: put the evaluation that starts at {first} under "
                f"`if step % eval_every == 0:` with eval_every = {n} (evaluation then ~{share_after} of the time), "
                "or run it once per epoch; model.eval(), torch.no_grad() and model.train() go inside that branch, "
                "and a fixed number of validation batches bounds each evaluation")
    return (f"evaluate {n}x less often: the evaluation that starts at {first} under `if step % eval_every == 0:` "
            f"with an eval_every {n} times its current one (evaluation then ~{share_after} of the time), or once "
            "per epoch; fewer validation batches per evaluation also shortens each one. The trade: validation "
            "metrics seen less often, for training time")


EVAL_RESOLVED_SAMPLES = Threshold(
    3.0, "samples", JUDGEMENT,
    "Fewer stack samples than this in one evaluation (its length from its share) leave its cadence unresolved: "
    "a few ms every step and seconds every few seconds read alike.")


def _one_rank_evaluates(ctx: AnalysisContext, e: Evaluation) -> int | None:
    """The rank that alone runs the evaluation (its function is that rank's own, which the other
    ranks do not run: ``RankView.only_here``) in a multi-rank job; None otherwise."""
    if len(ctx.ranks) < 2 or not e.where:
        return None
    fn = e.where[0].split(" (", 1)[0]
    own = [v for v in ctx.ranks if v.only_here and v.only_here.split(" (", 1)[0] == fn]
    return own[0].rank if len(own) == 1 else None


@uses(EVAL_MIN_EVALUATIONS, EVAL_SECOND_STEP_MAX, EVAL_TARGET_SHARE, MIN_MAIN_SAMPLES, MIN_COST_FRACTION, MIN_COST_S,
      EVAL_RESOLVED_SAMPLES)
def check_eval_every_step(ctx: AnalysisContext) -> Hit | Withdraw | None:
    """Evaluation recurring between the training steps (a validation forward and its `.item()`
    reads after every step, a Trainer evaluating every few steps): its share of the main thread's
    time is what training loses to it. The fix is to evaluate every N steps; nothing about the
    GPU, the loader or the syncs would give it back."""
    if not enough_stacks(ctx):
        return None
    e = ctx.step.evaluation
    n = ctx.step.samples
    if e is None or not n or e.bursts < EVAL_MIN_EVALUATIONS:
        return None
    alone = _one_rank_evaluates(ctx, e)
    if alone is not None:
        # The others wait for it in their collectives: the straggler finding names this function
        # with both fixes (share it across the ranks, or run it less often); two warnings for one
        # cause would be one too many (a held-out job's rank-0-only validation showed both).
        return Withdraw(f"rank {alone} alone evaluates while the other ranks wait: the straggler finding names it")
    share = e.samples / n
    found = worst(ctx, lambda g: share * g.breakdown.total_s)
    if found is None or not significant(found[0], found[1]):
        return None
    g, cost = found
    # "Every step" rests on the training runs between evaluations showing one step each, which
    # says something only where a run holds samples enough to show a second step: a Trainer
    # evaluating every 2 steps, sampled 1.5 times a run, was said to evaluate after every step.
    runs_resolved = e.between > 0 and (n - e.samples) / e.between >= EVAL_RESOLVED_SAMPLES
    per_step = every_step(e) and runs_resolved
    times_less = less_often(share)
    after = share / times_less / (1.0 - share + share / times_less)
    span = f"the last {secs(g.breakdown.total_s)}"
    # Sampled stacks see an evaluation only where a sample falls in it: the count is a floor and
    # the period a ceiling (a job evaluating about once a second was said to every ~3.1 s at 2
    # stacks a second), so both are stated as such, with the rate they were read at.
    rate = n / g.breakdown.total_s if g.breakdown.total_s > 0 else 0.0
    cadence = ((f"one every ~{secs(e.period_s)} or more often" if e.period_s is not None else "")
               + f" for ~{secs(e.burst_s)} each (read from {rate:.1f} stacks a second: shorter or more frequent "
               "evaluations fall between samples)")
    # Fewer samples than this in an evaluation of the length its share gives: its cadence is not
    # resolved. A few ms every step and ~1.7 s every ~9.5 s read alike at 0.9 stacks a second (a
    # new user's validation forward after every step was said to be "every ~9.5 s ... not every
    # step"); the share, and so the cost and the fix, hold either way.
    # (No training run between evaluations showing a second step is evidence of every step at any
    # rate; a second step seen is evidence of "every few" only where the samples resolve one.)
    runs_short = every_step(e) and not runs_resolved
    unresolved = not per_step and (rate * e.burst_s < EVAL_RESOLVED_SAMPLES or runs_short)
    ev = [f"main thread in evaluation in {pct(share)} of its samples ({e.samples} of {n}): "
          + (f"in `{e.where[0]}`" + (f", run from the loop at {', '.join(e.lines[:2])}" if e.lines else "")
             if e.named else
             "a forward at a line after the training step's backward and optimizer, then what reads its results: "
             + ", ".join(e.lines))]
    if runs_short:
        ev.append(f"at least {e.bursts} separate evaluations in {span}, {cadence}; "
                  f"{(n - e.samples) / e.between:.1f} training samples between two of them: whether each follows one "
                  "step or a few is not resolved")
    elif unresolved:
        ev.append(f"at least {e.bursts} separate stretches of it in {span}; at {rate:.1f} stacks a second its "
                  f"cadence is not resolved: ~{secs(e.burst_s)} every ~{secs(e.period_s or e.burst_s)} and a few ms "
                  "after every step read alike")
    elif per_step:
        ev.append(f"at least {e.bursts} separate evaluations in {span}, {cadence}; "
                  + ("none" if not e.multi_step else f"{e.multi_step}")
                  + f" of the {e.between} training runs between them shows a second step: an evaluation after "
                  "every training step")
    else:
        ev.append(f"at least {e.bursts} separate evaluations in {span}, {cadence}; {e.multi_step} of the {e.between} "
                  "training runs between them show more than one step: every few steps, not every step")
    if g.index != CPU_DEVICE and g.breakdown.total_s > 0:
        ev.append(f"{g.name} busy {pct(g.breakdown.busy_s / g.breakdown.total_s)}: the evaluation's kernels run on "
                  "it in the time training steps would; its `.item()` reads also wait for the training step's "
                  "queued kernels, so the bound below is loose")
    upper = sampled_upper(share, n)
    where = _where(e)
    title = (f"Evaluation between the training steps takes {pct(share)} of the loop's time, {where}" if unresolved
             else f"Evaluation after every training step: {pct(share)} of the loop's time, {where}" if per_step else
             f"Evaluation every ~{secs(e.period_s or e.burst_s)} or more often takes {pct(share)} of the loop's time, "
             f"{where}")
    return Hit(
        evidence=tuple(ev),
        action=_action(e, per_step, times_less, pct(after), ctx.framework.name),
        expected_gain=gain(share, upper=upper) + ": the training steps no longer wait for the evaluation",
        gain_bound=bounded(share, upper=upper),
        cost_s=cost,
        confidence=confidence(min(1.0, share * 2) if per_step else share, n),
        gpu_index=gpu_index(g),
        title=title,
    )
