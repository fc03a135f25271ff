"""Where in the step the user's work runs (analysis.step_order), and the straggler's change that
follows from it: a rank slow in work of its own after the backward (a CPU-side EMA of the weights,
2 x H200) was told to move "the slow input work into DataLoader workers", which would not touch it;
keeping the EMA on the GPU measured 6.73x."""

from __future__ import annotations

from pathlib import Path

from gputop.analysis.step_order import AFTER_UPDATE, BEFORE_FORWARD, when_in_step
from gputop.model import Category as C
from gputop.model import Frame, StackSample

SITE = "/usr/lib/python3.12/site-packages"
TRAIN = "/home/u/train.py"
MAIN = Frame("<module>", TRAIN, 99)
NCCL = Path(__file__).parent / "fixtures" / "nccl"


def sample(frames, cat):
    return StackSample(ts=0.0, pid=1, thread_id=1, thread_name="MainThread", frames=tuple(frames), is_main=True,
                       category=cat)


def at(line):
    return Frame("train", TRAIN, line)


def fwd(line):
    return sample([Frame("Linear.forward", f"{SITE}/torch/nn/modules/linear.py", 116), at(line), MAIN], C.FORWARD)


def bwd(line):
    return sample([Frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 869), at(line), MAIN], C.BACKWARD)


def work(name, line):
    return sample([Frame(name, TRAIN, 10), at(line), MAIN], C.OTHER)


def test_work_called_before_the_forward_prepares_the_batch():
    main = [work("load_batch", 40)] * 6 + [fwd(42)] * 2 + [bwd(43)] * 2
    assert when_in_step(main, "load_batch (u/train.py:10)") == BEFORE_FORWARD


def test_work_called_after_the_backward_is_the_steps_own():
    main = [fwd(42)] * 2 + [bwd(43)] * 2 + [work("update_ema", 46)] * 6
    assert when_in_step(main, "update_ema") == AFTER_UPDATE


def test_work_between_the_forward_and_the_backward_or_without_model_work_is_not_placed():
    assert when_in_step([fwd(42)] * 2 + [work("clip", 43)] * 6 + [bwd(44)] * 2, "clip") is None
    assert when_in_step([work("load_batch", 40)] * 6, "load_batch") is None  # no model work seen
    assert when_in_step([fwd(42)] * 4, "load_batch") is None  # the work not seen


def test_a_torn_sample_on_the_works_line_does_not_move_the_work():
    # A torn non-blocking dump stamped the optimizer on the line that calls the work (a new user's
    # job, fetch() on lines 9-13, its step on line 14): the place flipped to unknown and the
    # finding came and went between watches of the same steady job.
    stray = sample([Frame("push_user_annotation", f"{SITE}/torch/autograd/profiler.py", 800), at(40), MAIN], C.OPTIMIZER)
    main = [work("load_batch", 40)] * 6 + [stray] + [fwd(42)] * 2 + [bwd(42)] * 3
    assert when_in_step(main, "load_batch") == BEFORE_FORWARD
    # a line the model's work holds mostly stays the model's
    main = [work("load_batch", 40)] * 6 + [fwd(42)] * 2 + [work("load_batch", 42)] + [bwd(42)] * 3
    assert when_in_step(main, "load_batch") == BEFORE_FORWARD


def _straggler_on(recording: str):
    from gputop.advisor.context import build_context
    from gputop.advisor.rules import RULES_BY_ID
    from gputop.record import Reader
    from gputop.store import Store

    reader = Reader(NCCL / recording)
    try:
        store = Store()
        store.add(reader.samples(reader.start_ts - 3600, reader.end_ts + 1))
        sess = reader.sessions[-1]
        ctx = build_context(store, target_pid=sess.get("target_pid"), now=reader.end_ts)
        return RULES_BY_ID["rank-straggler"].check(ctx)
    finally:
        reader.close()


def test_a_real_straggler_slow_in_an_ema_after_the_backward_is_told_to_keep_it_on_the_gpu():
    hit = _straggler_on("convnext_ema-h200x2.gputop")
    assert hit is not None and "rank 0 is the straggler" in hit.title
    assert "update_ema" in hit.action and "on the GPU" in hit.action
    assert "DataLoader" not in hit.action


def test_a_real_straggler_building_its_batches_is_still_told_to_use_dataloader_workers():
    hit = _straggler_on("straggler-h100x2.gputop")
    assert hit is not None and "rank 1 is the straggler" in hit.title
    assert "load_batch" in hit.action and "DataLoader workers" in hit.action
