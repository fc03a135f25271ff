"""Gradients all-reduced by hand, one tensor at a time (advisor.rules.distributed)."""

from gputop.advisor.context import AnalysisContext
from gputop.advisor.rules.distributed import check_manual_gradient_sync
from gputop.analysis.ranks import rank_views
from gputop.model import Category, Frame, StackSample

T0 = 1_700_000_000.0
PROJ = "/home/user/project/train.py"
C10D = Frame("all_reduce", "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 3068)
DDP = Frame("DistributedDataParallel.forward", "/usr/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", 1699)


def _main(pid, i, frames, cat):
    return StackSample(ts=T0 + i / 5, pid=pid, thread_id=pid, thread_name="MainThread", frames=frames, active=True,
                       is_main=True, category=cat, os_thread_id=pid)


def _stacks(share: float, caller: str = "average_gradients", wrapped: bool = False, n: int = 60):
    step = (Frame("train_step", PROJ, 30), *((DDP,) if wrapped else ()), Frame("main", PROJ, 90))
    out = []
    for pid in (10, 11):
        for i in range(n):
            if i % n < round(share * n):
                # A loop over the parameters: the caller's line moves between the call and the division.
                frames = (C10D, Frame(caller, PROJ, 603 + i % 3), Frame("train_step", PROJ, 40), Frame("main", PROJ, 90))
                out.append(_main(pid, i, frames, Category.COLLECTIVE))
            else:
                out.append(_main(pid, i, step, Category.BACKWARD))
    return out


def _check(stacks):
    views = rank_views({10: 0, 11: 1}, stacks, T0)
    return check_manual_gradient_sync(AnalysisContext(now=T0 + 12, t0=T0, t1=T0 + 12, gpus=(), ranks=views))


def test_per_tensor_all_reduce_by_hand_is_named_with_ddp_as_the_change():
    hit = _check(_stacks(0.18))
    assert hit is not None and "`average_gradients`" in hit.title
    assert "DistributedDataParallel" in hit.action and "average_gradients" in hit.action
    assert "rank 1 (pid 11): all_reduce 18 %" in " ".join(hit.evidence)


def test_ddp_a_small_share_or_a_metric_from_elsewhere_is_not_it():
    assert _check(_stacks(0.18, wrapped=True)) is None  # DDP's own all-reduce
    assert _check(_stacks(0.05)) is None  # a loss averaged once a step: nothing to give back
    one = [s for s in _stacks(0.18) if s.pid == 10] + [s for s in _stacks(0.18, caller="log_metrics") if s.pid == 11]
    assert _check(one) is None  # each rank reduces something else


def test_ddps_backward_wait_is_ddp_though_its_forward_frame_was_not_sampled():
    """A healthy 2-rank gloo DDP job with a tiny model: its forward (under DDP's frame) was sampled
    once in 40, so early windows held no DDP frame, and its reducer's all-reduce wait in backward
    (read as a collective, `all_reduce`, called from the loop's line) was told "gradients
    all-reduced by hand". A collective wait inside autograd's engine is DDP's own."""
    engine = (Frame("_engine_run_backward", "/usr/lib/python3.11/site-packages/torch/autograd/graph.py", 829),
              Frame("backward", "/usr/lib/python3.11/site-packages/torch/autograd/__init__.py", 347),
              Frame("run_job", PROJ, 107))
    out = []
    for pid in (10, 11):
        for i in range(60):
            if i % 5 < 2:
                out.append(_main(pid, i, engine, Category.COLLECTIVE))
            else:
                out.append(_main(pid, i, (Frame("step", "/usr/lib/python3.11/site-packages/torch/optim/sgd.py", 80),
                                          Frame("run_job", PROJ, 108)), Category.OPTIMIZER))
    views = rank_views({10: 0, 11: 1}, out, T0)
    assert all(v.wrapper == "DDP" for v in views)
    assert _check(out) is None


def _looped(per_tensor: str | None, n: int = 60, share: float = 0.18):
    """Frames with their loops read (Frame.loop): the training loop at line 85 of `main`; the
    all-reduce from `average_gradients`' own loop over the parameters (line 602; "helper", its
    division between the calls sampled too), from a loop over them inline in the training loop
    ("inline", line 91), or from the training loop itself, once a step (None)."""
    out = []
    for pid in (10, 11):
        for i in range(n):
            if i % n < round(share * n):
                if per_tensor == "helper":
                    frames = (C10D, Frame("average_gradients", PROJ, 603, loop=602), Frame("main", PROJ, 92, loop=85))
                elif per_tensor == "inline":
                    frames = (C10D, Frame("main", PROJ, 92, loop=91))
                else:
                    frames = (C10D, Frame("main", PROJ, 92, loop=85))
                out.append(_main(pid, i, frames, Category.COLLECTIVE))
            elif per_tensor == "helper" and i % 7 == 0:
                frames = (Frame("average_gradients", PROJ, 604, loop=602), Frame("main", PROJ, 92, loop=85))
                out.append(_main(pid, i, frames, Category.OTHER))
            else:
                step = (Frame("train_step", PROJ, 30), Frame("main", PROJ, 90, loop=85))
                out.append(_main(pid, i, step, Category.BACKWARD))
    return out


def test_one_all_reduce_a_step_from_the_training_loop_is_not_a_per_tensor_sync():
    """A healthy 2-rank gloo job reducing one tensor a step from its loop, on a loaded machine, sat
    in all_reduce 17 % of its samples (the ranks' jitter) and was told to wrap its model in DDP."""
    views = rank_views({10: 0, 11: 1}, _looped(None), T0)
    assert all(v.collective_once_per_step is True for v in views)
    assert _check(_looped(None)) is None
    for kind, caller in (("helper", "average_gradients"), ("inline", "main")):
        views = rank_views({10: 0, 11: 1}, _looped(kind), T0)
        assert all(v.collective_once_per_step is False for v in views), kind
        hit = _check(_looped(kind))
        assert hit is not None and f"`{caller}`" in hit.title, kind
    # Loops not read (no source): as before, the share and the caller decide.
    assert all(v.collective_once_per_step is None for v in rank_views({10: 0, 11: 1}, _stacks(0.18), T0))
