"""Evaluation inside the training loop (eval-every-step): the step model's evaluation phase, told
from training by the stack, and the rule that names evaluation recurring between the steps.

A real job measured the miss: a ViT-B/16 validating after every step (bench/jobs/
fresh_eval_every_step.py) ran 1.65x faster on an H200 validating every 200 steps, and gputop said
nothing. Its recording is tests/fixtures/recordings/h200-vit-validate-every-step.gputop.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gputop.advisor.context import build_context
from gputop.advisor.engine import Advisor
from gputop.advisor.rules import RULES_BY_ID
from gputop.advisor.rules.evaluation import EVAL_MIN_EVALUATIONS, less_often
from gputop.analysis.step import EVAL, FORWARD, SYNC, step_dict, step_line, step_model
from gputop.model import Category as C
from gputop.model import Frame, StackSample

from synth import Job

SITE = "/usr/lib/python3.11/site-packages"
TORCH = f"{SITE}/torch"
TRAIN = "/home/u/train.py"
MAIN = Frame("<module>", TRAIN, 99, code="train()")
LINEAR = Frame("Linear.forward", f"{TORCH}/nn/modules/linear.py", 116)
CALL = Frame("Module._call_impl", f"{TORCH}/nn/modules/module.py", 1790)
ENGINE = Frame("_engine_run_backward", f"{TORCH}/autograd/graph.py", 768)
ADAMW = Frame("AdamW.step", f"{TORCH}/optim/adamw.py", 200)
HEALTHY_GPM = {"sm_active": 85.0, "sm_occupancy": 40.0, "tensor_active": 45.0, "fp32_active": 5.0, "fp16_active": 30.0}


def at(line: int, code: str | None = None, name: str = "train") -> Frame:
    return Frame(name, TRAIN, line, code=code)


# The training step: forward at 40, backward at 41, the optimizer at 42.
TRAIN_FWD = ((LINEAR, CALL, at(40, "loss = model(x, y).loss"), MAIN), C.FORWARD)
BWD = ((ENGINE, at(41, "loss.backward()"), MAIN), C.BACKWARD)
OPT = ((ADAMW, at(42, "opt.step()"), MAIN), C.OPTIMIZER)
# Inline validation after the optimizer: a forward at 47, its results read with .item() at 48.
EVAL_FWD = ((LINEAR, CALL, at(47, "out = model(val_x, val_y)"), MAIN), C.FORWARD)
EVAL_SYNC = ((at(48, "acc = (out.logits.argmax(-1) == val_y).float().mean().item()"), MAIN), C.HOST_SYNC)
# The same in a function of the user's named as evaluation code, called from the loop at 50.
VAL_CALL = at(50, "metrics = validate(model, val_batch)")
NAMED_FWD = ((LINEAR, CALL, Frame("validate", TRAIN, 81, code="out = model(vx, vy)"), VAL_CALL, MAIN), C.FORWARD)
NAMED_SYNC = ((Frame("validate", TRAIN, 82, code="return out.loss.item()"), VAL_CALL, MAIN), C.HOST_SYNC)


def cycle(*steps, gpu_idle_at=()):
    """A job whose main thread goes through ``steps`` (frames, category), one per 5 Hz sample,
    over and over; the GPU idle at the samples whose index in the cycle is in ``gpu_idle_at``."""
    def pick(t):
        return steps[round(t * 5) % len(steps)]

    return dict(main=lambda t: pick(t)[1], main_frames=lambda t: pick(t)[0],
                util=lambda t: 0.0 if round(t * 5) % len(steps) in gpu_idle_at else 100.0)


def run_rules(job: Job, window_s: float = 60.0):
    ctx = build_context(job.store(), window_s=window_s)
    adv = Advisor()
    found = {f.id: f for f in adv.run_rules(ctx)}
    assert adv.errors == {}
    return found, ctx


def sample(frames, cat, ts=0.0):
    return StackSample(ts=ts, pid=1, thread_id=1, thread_name="MainThread", frames=tuple(frames), active=True,
                       is_main=True, category=cat)


def timeline(*steps, repeat: int = 10):
    return [sample(f, c, ts=0.2 * i) for i, (f, c) in enumerate(list(steps) * repeat)]


# --------------------------------------------------------------------------- the step model


def test_a_forward_after_the_optimizer_and_its_item_reads_are_evaluation():
    m = step_model(timeline(TRAIN_FWD, BWD, OPT, EVAL_FWD, EVAL_SYNC, EVAL_SYNC))
    assert m.share(EVAL) == pytest.approx(0.5) and m.share(FORWARD) == pytest.approx(1 / 6)
    assert m.share(SYNC) == 0.0  # the .item() reads are the evaluation's
    e = m.evaluation
    assert e is not None and e.how == "inline" and not e.named
    assert e.at == "u/train.py:47-48"
    assert e.lines == ("`out = model(val_x, val_y)` (u/train.py:47)",
                       "`acc = (out.logits.argmax(-1) == val_y).float().mean().item()` (u/train.py:48)")
    assert e.bursts == 10 and e.between == 9 and e.multi_step == 0
    assert e.period_s == pytest.approx(1.2) and e.burst_s == pytest.approx(0.6, abs=0.05)
    assert [p for p in m.placed[:6]] == [FORWARD, "backward", "optimizer", EVAL, EVAL, EVAL]
    assert step_dict(m)["evaluation"]["evaluations"] == 10
    assert "eval 50 %" in step_line(m)


def test_a_function_named_as_evaluation_code_is_evaluation():
    m = step_model(timeline(TRAIN_FWD, BWD, OPT, NAMED_FWD, NAMED_SYNC, NAMED_SYNC))
    e = m.evaluation
    assert e is not None and e.named and e.where[0].startswith("validate (u/train.py:")
    assert e.lines == ("`metrics = validate(model, val_batch)` (u/train.py:50)",) and e.at == "u/train.py:50"
    assert m.share(EVAL) == pytest.approx(0.5) and e.bursts == 10


def test_the_frameworks_own_evaluation_loops_are_evaluation():
    tr = f"{SITE}/transformers/trainer.py"
    loop = (Frame("Trainer._inner_training_loop", tr, 2400), Frame("Trainer.train", tr, 2200),
            at(30, "trainer.train()", name="main"), MAIN)
    step = Frame("Trainer.training_step", tr, 3700)
    fwd = ((LINEAR, CALL, Frame("Trainer.compute_loss", tr, 3800), step) + loop, C.FORWARD)
    bwd = ((ENGINE, step) + loop, C.BACKWARD)
    opt = ((ADAMW,) + loop, C.OPTIMIZER)
    evaluating = (Frame("Trainer.prediction_step", tr, 3193), Frame("Trainer.evaluation_loop", tr, 2996),
                  Frame("Trainer.evaluate", tr, 2871), Frame("Trainer._evaluate", tr, 3310),
                  Frame("Trainer._maybe_log_save_evaluate", tr, 2278)) + loop
    m = step_model(timeline(fwd, bwd, opt, ((LINEAR, CALL) + evaluating, C.FORWARD), (evaluating, C.HOST_SYNC)))
    e = m.evaluation
    assert e is not None and e.framework == "transformers" and m.share(EVAL) == pytest.approx(0.4)
    assert m.loop == "main (u/train.py:30)"
    # Lightning: any function of its evaluation loop's file.
    lit = (Frame("_EvaluationLoop._evaluation_step", f"{SITE}/lightning/pytorch/loops/evaluation_loop.py", 420),
           Frame("_EvaluationLoop.run", f"{SITE}/lightning/pytorch/loops/evaluation_loop.py", 143)) + loop
    m = step_model(timeline(fwd, bwd, opt, ((LINEAR, CALL) + lit, C.FORWARD)))
    assert m.evaluation is not None and m.evaluation.framework == "lightning" and m.share(EVAL) == pytest.approx(0.25)


def test_training_that_looks_like_evaluation_is_not():
    # A GAN: the generator's forward after the discriminator's optimizer step is followed by its
    # own backward and optimizer: the training step's, not an evaluation.
    g_fwd = ((LINEAR, CALL, at(44, "fake = G(z); g_loss = crit(D(fake), real)"), MAIN), C.FORWARD)
    g_bwd = ((ENGINE, at(45, "g_loss.backward()"), MAIN), C.BACKWARD)
    g_opt = ((ADAMW, at(46, "opt_g.step()"), MAIN), C.OPTIMIZER)
    assert step_model(timeline(TRAIN_FWD, BWD, OPT, g_fwd, g_bwd, g_opt)).evaluation is None
    # A function named `predict` whose output the next line backpropagates: the training forward.
    pred = ((LINEAR, CALL, Frame("predict", TRAIN, 12), at(40, "loss = predict(model, x)"), MAIN), C.FORWARD)
    m = step_model(timeline(pred, BWD, OPT))
    assert m.evaluation is None and m.share(FORWARD) == pytest.approx(1 / 3)
    # A .item() logging read after the optimizer, every step, with no forward after it.
    log = ((at(43, "print(loss.item())"), MAIN), C.HOST_SYNC)
    m = step_model(timeline(TRAIN_FWD, BWD, OPT, log))
    assert m.evaluation is None and m.share(SYNC) == pytest.approx(0.25)
    # Gradient accumulation: forward and backward repeated before one optimizer step.
    assert step_model(timeline(TRAIN_FWD, BWD, TRAIN_FWD, BWD, TRAIN_FWD, BWD, OPT)).evaluation is None


# --------------------------------------------------------------------------- the rule


def per_step_job(gpu_idle_at=()):
    return Job(seconds=20, gpu=HEALTHY_GPM,
               **cycle(TRAIN_FWD, BWD, OPT, EVAL_FWD, EVAL_SYNC, EVAL_SYNC, gpu_idle_at=gpu_idle_at))


def test_evaluation_after_every_step_is_named_with_its_lines_and_the_fix():
    found, ctx = run_rules(per_step_job())
    f = found["eval-every-step"]
    assert f.title.startswith("Evaluation after every training step: 50 % of the loop's time, u/train.py:47-48")
    ev = " ".join(f.evidence)
    assert "`out = model(val_x, val_y)` (u/train.py:47)" in ev and ".item()` (u/train.py:48)" in ev
    assert "an evaluation after every training step" in ev
    n = less_often(0.5)
    assert n == 50  # evaluation costs as much as training now: 1/50 of it is ~2 %
    assert f"`if step % eval_every == 0:` with eval_every = {n}" in f.action
    assert "`out = model(val_x, val_y)` (u/train.py:47)" in f.action
    # The bound is 1 / (1 - f) at the share's upper confidence limit: at least 2x for half the time.
    assert f.gain_predicted is not None and f.gain_predicted >= 2.0
    assert f.expected_gain.startswith("at most ")
    assert set(found) == {"eval-every-step"}, sorted(found)


def test_a_named_evaluation_function_gets_the_same_finding():
    job = Job(seconds=20, gpu=HEALTHY_GPM, **cycle(TRAIN_FWD, BWD, OPT, NAMED_FWD, NAMED_SYNC, NAMED_SYNC))
    f = run_rules(job)[0]["eval-every-step"]
    assert "`validate` (called at u/train.py:50)" in f.title
    assert "`metrics = validate(model, val_batch)` (u/train.py:50)" in f.action


def test_the_evaluations_syncs_are_not_also_a_host_sync_finding():
    """The GPU idles while the evaluation's .item() reads wait: without the evaluation placed,
    host-sync would claim them as a per-step sync; they are the evaluation's."""
    found, ctx = run_rules(per_step_job(gpu_idle_at=(4, 5)))
    assert "eval-every-step" in found and "host-sync" not in found and "launch-bound" not in found, sorted(found)
    # The same samples with no evaluation placed (a context built by hand): host-sync's.
    bare = dataclasses.replace(ctx, step=dataclasses.replace(ctx.step, placed=(), evaluation=None))
    assert RULES_BY_ID["host-sync"].evaluate(bare) is not None
    assert RULES_BY_ID["eval-every-step"].evaluate(bare) is None


def test_an_evaluation_every_step_sampled_sparsely_is_not_given_a_cadence():
    """A new user's validation forward after every 20 ms step, sampled at 0.9 stacks a second, was
    said to run "every ~9.5 s ... for ~1.7 s each ... not every step": the samples land in a step's
    training or its evaluation at random, so runs of training samples span many steps. Its share and
    its fix hold; its cadence is not resolved and is not stated."""
    import random

    def pick(t):  # 20 ms steps, 17 % of each evaluating: a sample lands in either at random
        r = random.Random(round(t * 1000))
        if r.random() < 0.17:
            return (EVAL_FWD, EVAL_SYNC)[r.randrange(2)]
        return (TRAIN_FWD, BWD, OPT)[r.randrange(3)]

    job = Job(seconds=60, gpu=HEALTHY_GPM, stack_rate=0.9, main=lambda t: pick(t)[1], main_frames=lambda t: pick(t)[0])
    found, ctx = run_rules(job)
    e = ctx.step.evaluation
    assert e is not None and e.multi_step > 0  # what the old reading took for "every few steps"
    f = found["eval-every-step"]
    assert f.title.startswith("Evaluation between the training steps takes "), f.title
    ev = " ".join(f.evidence)
    assert "its cadence is not resolved" in ev and "not every step" not in ev and "or more often" not in f.title
    assert "eval_every" in f.action


def test_a_long_evaluation_every_few_thousand_steps_is_not_every_step():
    """Validation every N steps that lasts 30 s: the window sees one, and says nothing of it."""
    def pick(t):
        if 20 <= t < 50:
            return (EVAL_FWD, EVAL_SYNC)[round(t * 5) % 2]
        return (TRAIN_FWD, BWD, OPT)[round(t * 5) % 3]

    job = Job(seconds=60, gpu=HEALTHY_GPM, main=lambda t: pick(t)[1], main_frames=lambda t: pick(t)[0])
    found, ctx = run_rules(job)
    assert ctx.step.evaluation is not None and ctx.step.evaluation.bursts == 1
    assert ctx.step.evaluation.bursts < EVAL_MIN_EVALUATIONS
    assert "eval-every-step" not in found, found.get("eval-every-step")


def test_evaluation_every_few_seconds_is_weighed_not_called_every_step():
    """Every 10 s: 6 s of training (several steps), then 4 s of evaluation. It costs 40 % and
    recurs, but the training runs between show many steps: said with its cadence."""
    def pick(t):
        if t % 10 >= 6 - 1e-9:
            return (EVAL_FWD, EVAL_SYNC)[round(t * 5) % 2]
        return (TRAIN_FWD, BWD, OPT)[round(t * 5) % 3]

    job = Job(seconds=60, gpu=HEALTHY_GPM, main=lambda t: pick(t)[1], main_frames=lambda t: pick(t)[0])
    found, ctx = run_rules(job)
    e = ctx.step.evaluation
    assert e is not None and e.bursts >= EVAL_MIN_EVALUATIONS and e.multi_step == e.between
    f = found["eval-every-step"]
    assert "every training step" not in f.title and f.title.startswith("Evaluation every ~10 s or more often takes 40 %")
    assert "every few steps, not every step" in " ".join(f.evidence)
    assert "less often" in f.action and "The trade" in f.action


def test_a_healthy_loop_raises_nothing():
    found, ctx = run_rules(Job(seconds=20, gpu=HEALTHY_GPM, **cycle(TRAIN_FWD, BWD, BWD, OPT)))
    assert found == {} and ctx.step.evaluation is None
    # A small evaluation every step, under the advisor's 10 % bar: not worth naming.
    steps = [TRAIN_FWD, BWD, BWD, OPT] * 3 + [EVAL_FWD]
    found, ctx = run_rules(Job(seconds=20, gpu=HEALTHY_GPM, **cycle(*steps)))
    assert ctx.step.evaluation is not None and ctx.step.evaluation.bursts >= EVAL_MIN_EVALUATIONS
    assert "eval-every-step" not in found


# --------------------------------------------------------------------------- real recordings

RECORDINGS = Path(__file__).parent / "fixtures" / "recordings"
VIT = RECORDINGS / "h200-vit-validate-every-step.gputop"
# Every other job the single-GPU benches recorded, where present (not part of the repository).


def replay(path: Path, step_s: float = 1.0):
    """The advisor over a recording as `advise` would run it, one evaluation per second fed what
    was recorded up to then (bench/replay_advise.py): (findings shown at the end, {id: first
    shown at, seconds from the start}, the last context)."""
    from gputop.record import Reader
    from gputop.report.rejudge import judged

    with Reader(path) as reader:
        t0 = reader.start_ts
        seen: dict[str, float] = {}
        shown, adv = [], None
        for t, shown, adv in judged(reader, step_s):
            for f in shown:
                seen.setdefault(f.id, round(t - t0, 1))
    return {f.id: f for f in shown}, seen, adv.last_context if adv is not None else None


def test_the_real_vit_validating_every_step_is_told_to_validate_every_n_steps():
    shown, seen, ctx = replay(VIT)
    assert seen.get("eval-every-step") is not None and seen["eval-every-step"] <= 5.0, seen
    f = shown["eval-every-step"]
    # 1.2 training samples between two evaluations cannot show whether a run holds one step or
    # two: "after every step" is not claimed (a Trainer evaluating every 2 steps, sampled alike,
    # was told "after every step"); the change and its bound are the same either way.
    assert f.title.startswith("Evaluation between the training steps takes 63 %"), f.title
    assert "jobs/fresh_eval_every_step.py:55-56" in f.title
    assert "`out = model(pixel_values=val_x, labels=val_y)` (jobs/fresh_eval_every_step.py:55)" in f.action
    assert "`if step % eval_every == 0:`" in f.action
    # Validating every 200 steps measured 1.65x on the H200: the stated bound holds it.
    assert f.gain_predicted is not None and f.gain_predicted >= 1.65
    assert set(shown) == {"eval-every-step"}, sorted(shown)
    assert ctx.step.evaluation is not None and ctx.step.evaluation.how == "inline"


def _others() -> list[Path]:
    # The new user's CPU job validates after every step too: it is the replay-speed test's (it gets
    # the finding there), not one of the others.
    mine = [p for p in sorted(RECORDINGS.glob("*.gputop")) if p != VIT and p.name != "cpu-evalstep.gputop"]
    nccl = sorted((Path(__file__).parent / "fixtures" / "nccl").glob("*.gputop"))
    return mine + nccl


@pytest.mark.parametrize("path", _others(), ids=lambda p: p.name)
def test_no_other_real_recording_is_told_it_evaluates_every_step(path):
    _, seen, _ = replay(path)
    assert "eval-every-step" not in seen, seen


def test_the_evaluations_counted_from_samples_are_a_floor_and_their_period_a_ceiling():
    """A job evaluating about once a second was said to evaluate "one every ~3.1 s" at 2 stacks a
    second (new user, CPU): sampled stacks miss the evaluations between samples, so the count is
    stated as "at least", the period as "or more often", with the rate they were read at."""
    shown, _, _ = replay(RECORDINGS / "h200-vit-validate-every-step.gputop")
    f = shown["eval-every-step"]
    line = next(e for e in f.evidence if "separate evaluations" in e)
    assert line.startswith("at least ") and "or more often" in line and "stacks a second" in line
