"""Gradient accumulation that all-reduces every micro-batch (no ``no_sync()``): read from the
loop's source (sources.loop_source), carried on the loop's frame and in a recording
(record.codec), and judged with the ranks' time in collectives (advisor.rules.distributed)."""

import json
import textwrap

from gputop.advisor.context import AnalysisContext
from gputop.advisor.rules.distributed import check_accumulation_sync
from gputop.analysis.ranks import rank_views
from gputop.model import Category, Frame, StackSample
from gputop.record import codec
from gputop.sources.loop_source import accum_at, loops_of
from gputop.sources.pyspy_parser import StackParser

ACCUM_LOOP = """\
import contextlib
import torch

GRAD_ACCUM = 8

def train(model, opt, loader):
    for step, (x, y) in enumerate(loader):
        with torch.autocast("cuda"):
            loss = model(x).sum() / GRAD_ACCUM
        loss.backward()
        if (step + 1) % GRAD_ACCUM == 0:
            opt.step()
            opt.zero_grad()
"""


def _accum(text: str, line: int):
    return accum_at(loops_of(textwrap.dedent(text)), line)


def test_the_gate_its_k_and_its_condition_are_read_from_the_loop():
    assert _accum(ACCUM_LOOP, 10) == (11, 8, "(step + 1) % GRAD_ACCUM == 0", (10,), ())
    # k written in the test itself, a scaler's step, a name bound more than once (k not read).
    assert _accum(ACCUM_LOOP.replace("% GRAD_ACCUM", "% 4"), 10)[1] == 4
    assert _accum(ACCUM_LOOP.replace("opt.step()", "scaler.step(opt)"), 10)[0] == 11
    assert _accum(ACCUM_LOOP + "\nGRAD_ACCUM = 16\n", 10)[1] == 0
    assert _accum(ACCUM_LOOP.replace("% GRAD_ACCUM", "% args.accum"), 10)[1:3] == (0, "(step + 1) % args.accum == 0")
    # The gate through a name the loop binds (`boundary = ...; if boundary:`).
    named = ACCUM_LOOP.replace("        loss.backward()\n", "        loss.backward()\n        last = (step + 1) % GRAD_ACCUM == 0\n")
    named = named.replace("if (step + 1) % GRAD_ACCUM == 0:", "if last:")
    assert _accum(named, 10)[:3] == (12, 8, "(step + 1) % GRAD_ACCUM == 0")


def test_a_loop_that_skips_the_sync_or_steps_every_turn_is_not_read_as_accumulating():
    skipped = ACCUM_LOOP.replace("        loss.backward()", "        with model.no_sync():\n            loss.backward()")
    assert _accum(skipped, 10) is None
    ctx = ACCUM_LOOP.replace("        loss.backward()", "        ctx = nullcontext() if (step + 1) % GRAD_ACCUM == 0 "
                             "else model.no_sync()\n        with ctx:\n            loss.backward()")
    assert _accum(ctx, 10) is None  # the skipping context bound to a name first
    assert _accum(ACCUM_LOOP.replace("opt.zero_grad()", "opt.zero_grad()\n    model.require_backward_grad_sync = True"),
                  10) is None  # a switch: where it takes effect cannot be read
    # A flag's two branches in one loop: both backwards kept, each with whether it syncs.
    both = ACCUM_LOOP.replace("        loss.backward()", "        if fixed:\n            with model.no_sync():\n"
                              "                loss.backward()\n        else:\n            loss.backward()")
    assert _accum(both, 10)[3:] == ((14,), (12,))
    fabric = ACCUM_LOOP.replace("        loss.backward()",
                                "        with fabric.no_backward_sync(model, enabled=(step + 1) % GRAD_ACCUM != 0):\n"
                                "            fabric.backward(loss)")
    assert _accum(fabric, 10) is None  # Lightning Fabric's own skip
    # A function of the user's own named like accelerate's method is not accelerate's.
    assert _accum(ACCUM_LOOP + "\ndef accumulate():\n    train(None, None, [])\n", 10) is not None
    every = ACCUM_LOOP.replace("        if (step + 1) % GRAD_ACCUM == 0:\n            opt.step()", "        opt.step()\n        if 1:")
    assert _accum(every, 10) is None  # steps every turn
    logging = ACCUM_LOOP.replace("opt.step()", "print(loss)")
    assert _accum(logging, 10) is None  # a modulo gate around logging, not around the step
    inside = ACCUM_LOOP.replace("        loss.backward()\n", "").replace("opt.step()", "loss.backward()\n            opt.step()")
    assert _accum(inside, 9) is None  # backward only when it steps: no accumulation


def test_the_loops_frame_carries_it_and_a_recording_keeps_it(tmp_path):
    src = tmp_path / "train.py"
    src.write_text(ACCUM_LOOP)
    from gputop.sources.pyspy_parser import SourceLines

    lines = SourceLines(pid=0)
    lines._read = lambda filename: ACCUM_LOOP.splitlines()  # the file as the target sees it
    parser = StackParser(lines.line, facts=lines.facts)
    f = parser.frame({"name": "train", "filename": str(src), "line": 10}, leaf=False)
    assert f.loop == 7 and f.accum == (11, 8, "(step + 1) % GRAD_ACCUM == 0", (10,), ())
    back = codec.loop_fields(codec.keeps_text(f))
    assert back["accum"] == f.accum and back["loop"] == 7
    # A foreign or damaged column reads as none.
    assert codec.loop_fields(json.dumps({"loop": 7, "keeps": [], "accum": [11, "8", "x", [10], []]}))["accum"] == ()
    assert codec.loop_fields(json.dumps({"loop": 7, "keeps": [], "accum": [-1, 8, "x", [10], []]}))["accum"] == ()
    assert codec.loop_fields(json.dumps({"loop": 7, "keeps": [], "accum": [11, 8, "x", [], []]}))["accum"] == ()
    assert codec.loop_fields(json.dumps({"loop": 7, "keeps": [], "accum": [11, 8, "x"]}))["accum"] == ()


T0 = 1_700_000_000.0
PROJ = "/home/user/project/train.py"
DDP = Frame("DistributedDataParallel.forward", "/usr/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", 1699)
BACKWARD = Frame("_engine_run_backward", "/usr/lib/python3.11/site-packages/torch/autograd/graph.py", 829)
C10D = Frame("all_reduce", "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 3068)


def _loop(k: int = 8, line: int = 10, quiet: tuple = ()) -> Frame:
    return Frame("train", PROJ, line, loop=7,
                 accum=(11, k, "(step + 1) % GRAD_ACCUM == 0", (10,), quiet) if k >= 0 else ())


def _stacks(wait: float, k: int = 8, wrapped: bool = True, n: int = 60, backward_at: int = 10, quiet: tuple = ()):
    out = []
    for pid in (10, 11):
        for i in range(n):
            if i < round(wait * n):  # DDP's reducer waiting for the all-reduce at backward's end
                # (without DDP, an all_reduce of the user's own: a wait in autograd's engine is DDP's)
                frames, cat = ((BACKWARD if wrapped else C10D), _loop(k, backward_at, quiet)), Category.COLLECTIVE
            else:
                frames, cat = ((Frame("forward", PROJ, 30), *((DDP,) if wrapped else ()), _loop(k, 9, quiet)),
                               Category.FORWARD)
            out.append(StackSample(ts=T0 + i / 5, pid=pid, thread_id=pid, thread_name="MainThread", frames=frames,
                                   active=cat is not Category.COLLECTIVE, is_main=True, category=cat, os_thread_id=pid))
    return out


def _check(stacks):
    views = rank_views({10: 0, 11: 1}, stacks, T0)
    main = tuple(s for s in stacks if s.pid == 10)
    return check_accumulation_sync(AnalysisContext(now=T0 + 12, t0=T0, t1=T0 + 12, gpus=(), ranks=views,
                                                   main_stacks=main))


def test_accumulation_under_ddp_is_named_with_no_sync_and_its_bound():
    hit = _check(_stacks(0.45))
    assert hit is not None and "`train`" in hit.title
    assert "no_sync()" in hit.action and "(step + 1) % GRAD_ACCUM == 0" in hit.action
    ev = " ".join(hit.evidence)
    assert "line 11: every 8 micro-batches" in ev and "(line 10), not under no_sync()" in ev
    assert "wrapped in DDP" in ev and "rank 1 (pid 11)" in ev
    assert "7 of 8 collectives go" in hit.expected_gain
    # 45 % waited, 7/8 of it goes: 1 / (1 - 0.39) = 1.6x, stated at the share's upper limit.
    assert 1.6 < hit.gain_bound < 2.6


def test_k_unread_bounds_with_all_but_one_and_small_waits_say_nothing():
    hit = _check(_stacks(0.45, k=0))
    assert hit is not None and "every few micro-batches" in " ".join(hit.evidence)
    assert "all but one collectives go" in hit.expected_gain
    assert _check(_stacks(0.02)) is None  # the all-reduces cost next to nothing: nothing worth changing
    assert _check(_stacks(0.45, wrapped=False)) is None  # no DDP or FSDP: backward syncs nothing
    assert _check(_stacks(0.45, k=-1)) is None  # no accumulating loop in the samples
    # The file also holds a backward under no_sync() (line 14, a flag's other branch): named only
    # when the samples show the syncing one running.
    assert _check(_stacks(0.45, quiet=(14,))) is not None
    assert _check(_stacks(0.45, quiet=(14,), backward_at=14)) is None
