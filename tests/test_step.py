"""The training step from the main thread's samples (analysis.step)."""

from gputop.analysis.step import (
    COMPILE,
    FORWARD,
    IMPORT,
    OUTSIDE,
    SYNC,
    phase_of,
    step_dict,
    step_line,
    step_model,
    training_loop,
)
from gputop.model import Category as C
from gputop.model import Frame, StackSample

SITE = "/usr/lib/python3.11/site-packages"
TRAIN = "/home/u/train.py"


def sample(frames, cat, active=True, ts=0.0):
    return StackSample(ts=ts, pid=1, thread_id=1, thread_name="MainThread", frames=tuple(frames), active=active,
                       is_main=True, category=cat)


LOOP = Frame("train", TRAIN, 40)
MAIN = Frame("<module>", TRAIN, 99)
FWD = [Frame("Linear.forward", f"{SITE}/torch/nn/modules/linear.py", 116), Frame("step", TRAIN, 55), LOOP, MAIN]
AUG = [Frame("augment", TRAIN, 22, code="x = F.interpolate(x, size=(224, 224))"), LOOP, MAIN]
SYNCED = [Frame("step", TRAIN, 70, code="losses.append(loss.item())"), LOOP, MAIN]


def test_each_sample_is_placed_in_a_phase_of_the_step():
    assert phase_of(sample(FWD, C.FORWARD)) == FORWARD
    assert phase_of(sample(SYNCED, C.HOST_SYNC, active=False)) == SYNC
    assert phase_of(sample(AUG, C.OTHER)) == OUTSIDE  # the user's own code, on a CPU
    compile_ = [Frame("_compile", f"{SITE}/torch/_dynamo/convert_frame.py", 700)] + FWD
    assert phase_of(sample(compile_, C.FORWARD)) == COMPILE
    lazy = [Frame("<module>", f"{SITE}/torch/_dynamo/eval_frame.py", 1),
            Frame("_load_unlocked", "<frozen importlib._bootstrap>", 690)] + FWD
    assert phase_of(sample(lazy, C.FORWARD)) == IMPORT


def test_the_loop_is_the_users_frame_under_nearly_every_sample():
    main = [sample(FWD, C.FORWARD)] * 6 + [sample(AUG, C.OTHER)] * 3 + [sample(SYNCED, C.HOST_SYNC, False)]
    assert training_loop(main) == "train (u/train.py:40)"
    assert training_loop([sample(AUG, C.OTHER), sample([Frame("log", "/home/u/log.py", 3)], C.OTHER)]) is None


def test_the_step_names_the_users_code_outside_the_model():
    main = [sample(FWD, C.FORWARD)] * 2 + [sample(AUG, C.OTHER)] * 7 + [sample(SYNCED, C.HOST_SYNC, False)]
    m = step_model(main)
    assert m.samples == 10 and m.loop == "train (u/train.py:40)"
    assert m.phases[0] == (OUTSIDE, 0.7) and m.share(FORWARD) == 0.2 and m.share(SYNC) == 0.1
    assert m.outside == (("augment (u/train.py:22)", 0.7),)
    d = step_dict(m)
    assert d["phases"][OUTSIDE] == 0.7 and d["outside_model"][0]["where"] == "augment (u/train.py:22)"
    line = step_line(m)
    assert line.startswith("step of train (u/train.py:40): user code outside the model 70 %")
    assert "outside the model: augment (u/train.py:22) 70 %" in line and line.endswith("(of 10 main-thread samples)")
    assert step_model([]).samples == 0 and "no stacks" in step_line(step_model([]))


def test_the_step_of_a_real_nccl_rank():
    from pathlib import Path

    from gputop.advisor.context import build_context
    from gputop.session import open_replay

    session = open_replay(Path(__file__).parent / "fixtures" / "nccl" / "straggler-h100x2.gputop", speed=1000.0,
                          advisor=False)
    try:
        session.replay.seek(session.replay.start_ts + 15)
        session.pipeline.poll_once()
        ctx = build_context(session.store, target_pid=session.target_pid)
        m = ctx.step
        assert m.samples > 20 and m.loop is not None and m.loop.startswith("run_job (")
        assert abs(sum(sh for _, sh in m.phases) - 1.0) < 1e-9
    finally:
        session.pipeline.stop()


def test_a_slow_helper_under_most_samples_is_the_work_not_the_loop():
    """A loop at module level spends 80 % in log_metrics(), a pure-Python helper: the loop is
    <module>, whose callees vary (the model, the helper), not the helper running its own lines."""
    top = Frame("<module>", TRAIN, 15)
    helper = [Frame("log_metrics", TRAIN, 12), top]
    model = [Frame("Linear.forward", f"{SITE}/torch/nn/modules/linear.py", 116), Frame("<module>", TRAIN, 13)]
    main = [sample(helper, C.OTHER)] * 8 + [sample(model, C.FORWARD)] * 2
    assert training_loop(main) == "<module> (u/train.py:15)"
    # Augmenting each batch in one function of the loop: that function calls torch ops (library,
    # one callee class); the loop is the function that calls it and the model.
    loop = Frame("main", TRAIN, 94)
    aug = [Frame("interpolate", f"{SITE}/torch/nn/functional.py", 4860), Frame("augment", TRAIN, 48), loop]
    fwd = [Frame("Module._call_impl", f"{SITE}/torch/nn/modules/module.py", 1790), loop]
    assert training_loop([sample(aug, C.OTHER)] * 9 + [sample(fwd, C.FORWARD)] * 2) == "main (u/train.py:94)"


def test_the_start_up_is_not_the_step():
    """Attached half a second after launch, the loop was named "<module> (healthy.py:1)": the
    import line is under every sample while modules load. Importing and compiling are left out
    when the loop is looked for; a window of start-up alone has no loop yet."""
    lib = "/usr/lib/python3.11/site-packages"
    importing = [Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176),
                 Frame("<module>", f"{lib}/torch/__init__.py", 10), Frame("<module>", TRAIN, 1)]
    start = [sample(importing, C.OTHER)] * 8
    steps = [sample(FWD, C.FORWARD), sample(AUG, C.OTHER)] * 3
    assert all(phase_of(s) == IMPORT for s in start)
    assert training_loop(start + steps) == "train (u/train.py:40)"
    assert training_loop(start) is None


def test_a_metric_forward_after_the_update_is_evaluation_despite_a_stray_line_stamp():
    """A new user's loop: `opt.zero_grad(); loss.backward(); opt.step()` on line 11, then
    `print(... (model(x).argmax(1) == y).float().mean().item())` on line 13 every step. py-spy
    stamped 2 of 82 optimizer samples with the caller's next line (13), which put the step's end
    after the metric's forward: no evaluation was seen, and printing every 100 steps measured
    1.5-1.9x. A line's role is what it mostly runs."""
    lin = Frame("Linear.forward", f"{SITE}/torch/nn/modules/linear.py", 116)
    bwd = Frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 829)
    sgd = Frame("_single_tensor_sgd", f"{SITE}/torch/optim/sgd.py", 379)

    def at(line, leaf, cat, ts):
        return sample([leaf, Frame("<module>", TRAIN, line)], cat, ts=ts)

    main, t = [], 0.0
    for step in range(12):
        for line, leaf, cat in ((10, lin, C.FORWARD), (11, bwd, C.BACKWARD), (11, bwd, C.BACKWARD),
                                (11, sgd, C.OPTIMIZER), (13, lin, C.FORWARD)):
            main.append(at(line, leaf, cat, t))
            t += 0.2
    main.append(at(13, sgd, C.OPTIMIZER, t))  # the stray stamps
    main.append(at(13, sgd, C.OPTIMIZER, t + 0.2))
    m = step_model(main)
    assert m.evaluation is not None and m.evaluation.how == "inline", m.phases
    assert dict(m.phases)["eval"] > 0.15
