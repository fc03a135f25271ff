"""The step's loop is the frame that encloses the step (the function that calls forward, backward
and the optimizer), never a Dataset's __getitem__ or a logging helper beside the step."""

from __future__ import annotations

import json
import os
from dataclasses import replace

from gputop.analysis.step import step_line, step_model, training_loop
from gputop.model import Category as C
from gputop.model import Frame, StackSample

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "stacks")
SITE = "/usr/lib/python3.11/site-packages"


def main_frames(name: str) -> tuple[Frame, ...]:
    """The main thread's frames of a captured dump, newest first."""
    with open(os.path.join(FIX, f"{name}.json")) as f:
        doc = json.load(f)
    t = next(t for t in doc["dump"] if t["thread_name"] == "MainThread")
    return tuple(Frame(x["name"], x["filename"], x["line"]) for x in t["frames"])


def sample(frames, cat, ts=0.0):
    return StackSample(ts=ts, pid=1, thread_id=1, thread_name="MainThread", frames=tuple(frames), active=True,
                       is_main=True, category=cat)


def _rooted(frames, loop: Frame):
    """``frames`` with everything from its user loop down replaced by ``loop`` and what is under it."""
    k = next(i for i, f in enumerate(frames) if f.name.startswith("mode_"))
    return frames[:k] + loop


FETCH = main_frames("data-fetch")  # SlowDataset.__getitem__ <- DataLoader <- mode_fetch <- <module>
LOOP = FETCH[next(i for i, f in enumerate(FETCH) if f.name == "mode_fetch"):]


def test_a_starved_loop_is_not_named_after_its_datasets_getitem():
    fwd = _rooted(main_frames("forward"), (replace(LOOP[0], line=82),) + LOOP[1:])
    bwd = _rooted(main_frames("backward"), (replace(LOOP[0], line=83),) + LOOP[1:])
    main = [sample(FETCH, C.DATA_FETCH)] * 9 + [sample(fwd, C.FORWARD), sample(bwd, C.BACKWARD)]
    assert training_loop(main) == "mode_fetch (project/stack_targets.py:80)"
    assert step_line(step_model(main)).startswith("step of mode_fetch (")


def test_one_stack_each_names_its_loop_never_a_callback():
    for name, loop in (("data-fetch", "mode_fetch ("), ("forward", "mode_forward ("),
                       ("fw-ddp-straggler", "rank_main ("), ("fw-fsdp1-forward", "rank_main (")):
        got = training_loop([sample(main_frames(name), C.OTHER)] * 5)
        assert got is not None and got.startswith(loop), (name, got)
    # A DataLoader worker's main thread runs the dataset, not a training loop.
    assert training_loop([sample(main_frames("worker-fetch"), C.DATA_FETCH)] * 5) is None


def test_a_logging_helper_beside_the_step_is_not_the_loop():
    """The loop spends 85 % in log_metrics(), which calls the user's formatter and a library: its
    callees vary like a loop's. It is under none of the model's samples; the loop is under all."""
    loop = (Frame("train", "/home/u/train.py", 40), Frame("<module>", "/home/u/train.py", 99))
    log = Frame("log_metrics", "/home/u/train.py", 12)
    fmt = [Frame("format_row", "/home/u/train.py", 5), log, *loop]
    dump = [Frame("dumps", f"{SITE}/json/__init__.py", 231), log, *loop]
    fwd = _rooted(main_frames("forward"), (replace(loop[0], line=41),) + loop[1:])
    opt = _rooted(main_frames("optimizer"), (replace(loop[0], line=43),) + loop[1:])
    main = [sample(fmt, C.OTHER)] * 9 + [sample(dump, C.OTHER)] * 8 + [sample(fwd, C.FORWARD),
                                                                       sample(opt, C.OPTIMIZER)] * 2
    assert training_loop(main) == "train (u/train.py:40)"
