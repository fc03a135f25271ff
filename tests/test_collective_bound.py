"""Communication-bound: every rank waits in collectives alike (advisor.rules.distributed)."""

from gputop.advisor.context import AnalysisContext
from gputop.advisor.rules.distributed import check_collective_bound
from gputop.analysis.ranks import rank_views
from gputop.model import Category, Frame, GpuProcess, GpuSample, StackSample

T0 = 1_700_000_000.0
PROJ = "/home/user/project/train.py"
DDP = Frame("DistributedDataParallel.forward", "/usr/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", 1600)
C10D = Frame("all_reduce", "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2500)


def _main(pid, i, frames, cat, active=True):
    return StackSample(ts=T0 + i / 5, pid=pid, thread_id=pid, thread_name="MainThread", frames=frames, active=active,
                       is_main=True, category=cat, os_thread_id=pid)


def _stacks(waits: dict[int, float], n: int = 60, wrapper=DDP):
    step = (Frame("train_step", PROJ, 30), wrapper, Frame("main", PROJ, 90))
    coll = (C10D, Frame("train_step", PROJ, 33), Frame("main", PROJ, 90))
    out = []
    for pid, w in waits.items():
        k = round(w * n)
        out += [_main(pid, i, coll if i % n < k else step, Category.COLLECTIVE if i % n < k else Category.FORWARD)
                for i in range(n)]
    return out


def _ctx(views):
    return AnalysisContext(now=T0 + 12, t0=T0, t1=T0 + 12, gpus=(), ranks=views)


def test_hosts_waiting_alike_in_gloo_collectives_are_not_enough():
    """A host blocked in all_reduce waits for its peers' compute and scheduling as much as for the
    bytes (a balanced gloo DDP job on two busy cores waits 42 %): without the GPUs' side, nothing."""
    views = rank_views({10: 0, 11: 1}, _stacks({10: 0.60, 11: 0.55}), T0)
    assert views[0].wrapper == "DDP" and views[0].collective > 0.5
    assert check_collective_bound(_ctx(views)) is None


def _gpu_views(sm0: float, sm1: float):
    step = (Frame("train_step", PROJ, 30), DDP, Frame("main", PROJ, 90))
    stacks = [_main(pid, i, step, Category.FORWARD) for pid in (10, 11) for i in range(60)]
    procs = [GpuProcess(ts=T0, gpu_index=0, pid=10), GpuProcess(ts=T0, gpu_index=1, pid=11)]
    gpus = {g: [GpuSample(ts=T0 + i, index=g, util_gpu=100.0, sm_active=sm, tensor_active=0.0 if sm < 30 else 30.0)
                for i in range(13)] for g, sm in ((0, sm0), (1, sm1))}
    return rank_views({10: 0, 11: 1}, stacks, T0, procs, gpu_samples=gpus, t1=T0 + 12)


def test_a_straggler_or_computing_gpus_are_not_communication_bound():
    both = _gpu_views(18.0, 18.0)
    assert check_collective_bound(_ctx(both)) is not None
    # GPU 0 spins while GPU 1 computes: one rank is waited for, the straggler rule's.
    assert check_collective_bound(_ctx(_gpu_views(18.0, 70.0))) is None
    # Both compute: the all-reduce overlaps backward, nothing to say.
    assert check_collective_bound(_ctx(_gpu_views(70.0, 68.0))) is None
    # One rank: nothing to compare.
    assert check_collective_bound(_ctx(both[:1])) is None


def test_nccl_ranks_waiting_on_their_gpus_are_communication_bound_and_fsdp_gets_its_knob():
    """NCCL: the hosts run on (their stacks in a sync), both GPUs sit in NCCL kernels (few SMs
    active, no tensor work) most of every poll."""
    fsdp = Frame("FullyShardedDataParallel.forward",
                 "/usr/lib/python3.11/site-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py", 850)
    step = (Frame("train_step", PROJ, 30), fsdp, Frame("main", PROJ, 90))
    sync = (Frame("train_step", PROJ, 40, code="loss.item()"), Frame("main", PROJ, 90))
    stacks = [_main(pid, i, sync if i % 3 else step, Category.HOST_SYNC if i % 3 else Category.FORWARD)
              for pid in (10, 11) for i in range(60)]
    procs = [GpuProcess(ts=T0, gpu_index=0, pid=10), GpuProcess(ts=T0, gpu_index=1, pid=11)]

    def spin(i, g):
        return GpuSample(ts=T0 + i, index=g, util_gpu=100.0, sm_active=18.0, tensor_active=0.0)

    gpus = {g: [spin(i, g) for i in range(13)] for g in (0, 1)}
    views = rank_views({10: 0, 11: 1}, stacks, T0, procs, gpu_samples=gpus, t1=T0 + 12)
    hit = check_collective_bound(_ctx(views))
    assert hit is not None and "NCCL kernels" in hit.evidence[0]
    assert "set_requires_gradient_sync(False)" in hit.action and "FSDP" in " ".join(hit.evidence)
    # The same hosts with the GPUs computing: nothing.
    busy = {g: [GpuSample(ts=T0 + i, index=g, util_gpu=100.0, sm_active=70.0, tensor_active=40.0) for i in range(13)]
            for g in (0, 1)}
    views = rank_views({10: 0, 11: 1}, stacks, T0, procs, gpu_samples=busy, t1=T0 + 12)
    assert check_collective_bound(_ctx(views)) is None


def test_ranks_of_a_job_spanning_nodes_waiting_alike_are_weighed_not_judged():
    """Two local ranks of a 16-rank job both in NCCL alike: a straggler on another node looks the
    same from here; the finding says what is weighed, as a note, and sends the user to all nodes."""
    from dataclasses import replace

    from gputop.model import Severity

    spans = (("WORLD_SIZE", "16"), ("LOCAL_WORLD_SIZE", "2"))
    views = tuple(replace(v, env=spans) for v in _gpu_views(18.0, 18.0))
    hit = check_collective_bound(_ctx(views))
    assert hit is not None and hit.severity is Severity.INFO
    assert "another node" in hit.title and "gputop job --prometheus" in hit.action
    assert check_collective_bound(_ctx(_gpu_views(18.0, 18.0))).severity is None  # one node: the rule's warning


def test_the_rank_straggler_is_judged_once_per_evaluation(monkeypatch):
    """Three rules read the rank straggler (the straggler rule names it; the communication-bound and
    by-hand-sync rules leave a job with one to it): one evaluation judges it once, shared."""
    import gputop.advisor.rules.distributed as distributed
    from gputop.advisor.engine import Advisor

    # Gradients all-reduced by hand on both ranks, both GPUs spinning in NCCL: each of the three
    # rules gets as far as asking whether one rank holds the others back.
    by_hand = (C10D, Frame("average_gradients", PROJ, 603), Frame("train_step", PROJ, 40), Frame("main", PROJ, 90))
    step = (Frame("train_step", PROJ, 30), Frame("main", PROJ, 90))
    stacks = [_main(pid, i, by_hand if i % 5 < 2 else step, Category.COLLECTIVE if i % 5 < 2 else Category.BACKWARD)
              for pid in (10, 11) for i in range(60)]
    procs = [GpuProcess(ts=T0, gpu_index=0, pid=10), GpuProcess(ts=T0, gpu_index=1, pid=11)]
    gpus = {g: [GpuSample(ts=T0 + i, index=g, util_gpu=100.0, sm_active=18.0, tensor_active=0.0) for i in range(13)]
            for g in (0, 1)}
    views = rank_views({10: 0, 11: 1}, stacks, T0, procs, gpu_samples=gpus, t1=T0 + 12)

    calls = []
    judge = distributed.straggler

    def counted(*args, **kwargs):
        calls.append(args[0])
        return judge(*args, **kwargs)

    monkeypatch.setattr(distributed, "straggler", counted)
    # Each of the three asks, on a context of its own.
    checks = (distributed.check_rank_straggler, distributed.check_collective_bound,
              distributed.check_manual_gradient_sync)
    assert distributed.check_collective_bound(_ctx(views)) is not None  # it got past its own bars
    assert distributed.check_manual_gradient_sync(_ctx(views)) is not None
    calls.clear()
    for check in checks:
        check(_ctx(views))
    assert len(calls) == 3
    # One evaluation of every rule: once.
    calls.clear()
    advisor = Advisor()
    advisor.run_rules(_ctx(views))
    assert len(calls) == 1 and calls[0] == views and not advisor.errors
    # The next evaluation judges its own window again.
    advisor.run_rules(_ctx(views))
    assert len(calls) == 2


def test_ranks_apart_in_ncclss_own_counts_are_not_communication_bound():
    """Both GPUs in NCCL alike, yet NCCL's RAS counts have rank 1 a straggler's gap behind (FSDP2,
    a rank looping in its own code 33 AllGathers behind while its hang formed, 2 x H200): one rank
    is waited for, not the wire."""
    from dataclasses import replace

    from gputop.analysis.nccl_ras import STRAGGLER_MIN_GAP_OPS, UNKNOWN, CommVerdict

    ctx = _ctx(_gpu_views(18.0, 18.0))
    apart = CommVerdict("033a", "#0-0", UNKNOWN, "AllGather", gap_ops=int(STRAGGLER_MIN_GAP_OPS) + 1)
    in_step = replace(apart, gap_ops=7)  # work in flight
    assert check_collective_bound(replace(ctx, nccl=(in_step,))) is not None
    assert check_collective_bound(replace(ctx, nccl=(apart,))) is None
