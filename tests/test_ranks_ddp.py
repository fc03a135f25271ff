"""DDP ranks on the CPU, from real captures (tests/fixtures/stacks/fw-ddp-*.json) laid out as
synthetic 2-rank jobs: DDP's gradient all-reduce runs inside ``loss.backward()`` (autograd's
engine, C++), so a rank waiting for it shows backward, off the CPU, and no torch.distributed
frame. As a rank of a multi-rank job on the CPU that is a collective wait: for the straggler
rule, the ranks view, the stuck verdict's rank naming and the advisor's stuck finding alike. One
process's backward stays backward; a rank on a GPU keeps it too (autograd's device threads run
its backward while its main thread waits off the CPU)."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from gputop.advisor.context import build_context
from gputop.advisor.rules import RULES_BY_ID
from gputop.analysis.classify import classify, is_library, rank_category, rank_samples
from gputop.analysis.hang import COLLECTIVE, collective_fn
from gputop.analysis.ranks import as_ranks, cpu_ranks, group_shares, ranks_message
from gputop.analysis.window import job_view
from gputop.analysis.watch import StuckWatch
from gputop.analysis.window import stuck_verdict
from gputop.model import Category, Event, Frame, GpuInfo, GpuProcess, ProcSample, StackSample, SystemInfo
from gputop.sources.stacks import StackParser
from gputop.store import Store

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "stacks")
T0 = 1_700_000_000.0
R0, R1 = 201, 202
C = Category


def capture(name: str) -> StackSample:
    """The main thread of a fixture, parsed and classified as the sampler does."""
    with open(os.path.join(HERE, name + ".json")) as f:
        doc = json.load(f)
    lines = doc["source_lines"]
    parser = StackParser(lambda fn, ln: lines.get(f"{fn}:{ln}"), classify, is_library)
    return next(s for s in parser.samples(doc["dump"], 1.0) if s.is_main)


ALLREDUCE_WAIT = capture("fw-ddp-allreduce-wait")  # backward, off the CPU
BUFFER_BCAST = capture("fw-ddp-buffer-broadcast")  # DDP's forward prologue, off the CPU
LOADING = capture("fw-ddp-straggler")  # the straggler's slow __getitem__
COMPUTING = capture("backward")  # a backward that computes (on the CPU)
TRAIN = "/home/user/project/train.py"
SLEEPING = (Frame("never_arrives", TRAIN, 35, code="time.sleep(0.05)"), Frame("main", TRAIN, 59))


def at(s: StackSample, ts: float, pid: int, active: bool | None = None) -> StackSample:
    return replace(s, ts=ts, pid=pid, thread_id=pid, os_thread_id=pid, active=s.active if active is None else active)


def sleeping(ts: float, pid: int) -> StackSample:
    return StackSample(ts=ts, pid=pid, thread_id=pid, thread_name="MainThread", frames=SLEEPING, active=False,
                       is_main=True, category=C.IDLE, os_thread_id=pid)


def job(seconds: float, rank0, rank1, on_gpu: bool = False, ranks: bool = True, envs=None) -> Store:
    """A 2-rank job sampled at 5 Hz per rank: ``rank0``/``rank1`` give each rank's main-thread
    sample at a time; its processes idle to psutil (what a wait looks like); ``on_gpu``: NVML lists
    each rank on its own GPU."""
    store = Store()
    store.add([SystemInfo(ts=T0, gpu_count=2 if on_gpu else 0, cpu_count=8)])
    if on_gpu:
        store.add([GpuInfo(ts=T0, index=i, name="Test GPU") for i in range(2)])
    if ranks:
        store.add([Event(T0 - 1, "ranks", ranks_message({R0: 0, R1: 1}, 200))])
    for i in range(int(seconds * 5) + 1):
        ts = T0 + i / 5
        batch: list[object] = [rank0(ts, R0), rank1(ts, R1)]
        if i % 5 == 0:
            for r, p in enumerate((R0, R1)):
                env = tuple(sorted((envs or {}).get(r, {}).items()))
                batch.append(ProcSample(ts=ts, pid=p, ppid=200, name="python", cpu_percent=0.0, status="sleeping",
                                        role="target" if p == R0 else "gpu", env=env))
                if on_gpu:
                    batch.append(GpuProcess(ts=ts, gpu_index=r, pid=p))
        store.add(batch)
    return store


def waits(ts, pid):
    return at(ALLREDUCE_WAIT, ts, pid)


def loads(ts, pid):
    return at(LOADING, ts, pid, active=True)


def straggling_job(**kw) -> Store:
    # Rank 0 waits in the gradient all-reduce 4 samples in 5 and computes its backward in the
    # fifth; rank 1 builds its batch in Python the whole time.
    return job(40.0, lambda ts, p: at(COMPUTING, ts, p) if round((ts - T0) * 5) % 5 == 0 else waits(ts, p),
               loads, **kw)


# --------------------------------------------------------------------------- one sample


def test_a_cpu_rank_off_the_cpu_in_backward_waits_in_the_gradient_all_reduce():
    assert ALLREDUCE_WAIT.category is C.BACKWARD and not ALLREDUCE_WAIT.active
    judged = rank_samples([ALLREDUCE_WAIT], {ALLREDUCE_WAIT.pid})[0]
    assert judged.category is C.COLLECTIVE
    assert collective_fn(judged) == "all_reduce"
    # One process (not a rank): its backward stays backward.
    assert rank_samples([ALLREDUCE_WAIT], set())[0].category is C.BACKWARD
    assert collective_fn(ALLREDUCE_WAIT) is None


def test_a_rank_that_computes_its_backward_or_waits_elsewhere_keeps_its_category():
    assert COMPUTING.category is C.BACKWARD and COMPUTING.active
    assert rank_category(COMPUTING.frames, True, C.BACKWARD) is C.BACKWARD
    # Off the CPU, but in its own code (a user's Function.backward reading a file): not the engine's wait.
    own = (Frame("MyFn.backward", TRAIN, 12, code="data = f.read()"),) + ALLREDUCE_WAIT.frames
    assert rank_category(own, False, C.BACKWARD) is C.BACKWARD
    assert rank_category(LOADING.frames, False, LOADING.category) is C.DATA_FETCH


def test_ddp_forward_prologue_off_the_cpu_is_a_broadcast_wait():
    assert BUFFER_BCAST.category is C.COLLECTIVE and collective_fn(BUFFER_BCAST) == "broadcast"
    # DDP's forward calling into C (the reducer, a coalesced broadcast): forward by its frames.
    prologue = BUFFER_BCAST.frames[4:]
    assert prologue[0].name == "DistributedDataParallel._pre_forward"
    assert classify(prologue, False) is C.FORWARD
    assert rank_category(prologue, False, C.FORWARD) is C.COLLECTIVE
    assert rank_category(prologue, True, C.FORWARD) is C.FORWARD


def test_ranks_on_gpus_keep_their_backward():
    pid_rank = {R0: 0, R1: 1}
    gpus = [GpuProcess(ts=T0, gpu_index=0, pid=R0)]
    assert cpu_ranks(pid_rank, gpus, gpus=True) == {R1}
    assert cpu_ranks(pid_rank, (), gpus=True) == frozenset()  # NVML lists no process: cannot tell
    assert cpu_ranks(pid_rank, (), gpus=False) == {R0, R1}
    s = at(ALLREDUCE_WAIT, T0, R0)
    assert as_ranks([s], pid_rank, gpus, gpus=True)[0].category is C.BACKWARD
    assert as_ranks([at(ALLREDUCE_WAIT, T0, R1)], pid_rank, gpus, gpus=True)[0].category is C.COLLECTIVE


# --------------------------------------------------------------------------- the straggler


def test_the_straggler_is_named_when_the_others_wait_inside_backward():
    ctx = build_context(straggling_job(), target_pid=R0)
    r0, r1 = ctx.ranks
    assert r0.collective == pytest.approx(0.8, abs=0.05) and r0.collective_fn == "all_reduce"
    assert r1.collective == 0.0
    f = RULES_BY_ID["rank-straggler"].evaluate(ctx)
    assert f is not None, [v.shares for v in ctx.ranks]
    assert f.title.startswith("rank 1 is the straggler: the other ranks wait 8") and f.title.endswith("in all_reduce for it")
    assert "Straggler.__getitem__ (" in f.evidence[0]
    # The target rank's own time line says so too.
    assert ctx.main_shares()[C.COLLECTIVE] == pytest.approx(0.8, abs=0.05)
    # And it is a straggler, not a hang: rank 0's stack barely moves, rank 1 works.
    assert ctx.stuck is not None and not ctx.stuck.stuck


def test_the_ranks_view_shows_the_wait_as_communication():
    jv = job_view(straggling_job(), window_s=60.0)
    comm = {v.rank: dict(group_shares(v.shares))["comm"] for v in jv.ranks}
    assert comm[0] == pytest.approx(0.8, abs=0.05) and comm[1] == 0.0


def test_one_process_in_backward_is_busy_in_backward():
    ctx = build_context(straggling_job(ranks=False), target_pid=R0)
    assert ctx.ranks == ()
    assert ctx.main_shares().get(C.COLLECTIVE, 0.0) == 0.0 and ctx.main_shares()[C.BACKWARD] == 1.0


def test_ranks_on_gpus_are_not_judged_as_cpu_ranks():
    ctx = build_context(straggling_job(on_gpu=True), target_pid=R0)
    assert [v.collective for v in ctx.ranks] == [0.0, 0.0]
    assert RULES_BY_ID["rank-straggler"].evaluate(ctx) is None


def test_a_healthy_job_whose_ranks_wait_alike_has_no_straggler():
    # Both ranks compute their backward and wait in the all-reduce alike (every other sample).
    def rank(ts, p):
        return waits(ts, p) if round((ts - T0) * 5) % 2 else at(COMPUTING, ts, p)

    ctx = build_context(job(40.0, rank, rank), target_pid=R0)
    assert all(v.collective == pytest.approx(0.5, abs=0.05) for v in ctx.ranks)
    assert RULES_BY_ID["rank-straggler"].evaluate(ctx) is None


# --------------------------------------------------------------------------- the hang


def hung_job() -> Store:
    return job(40.0, waits, sleeping)


def test_the_rank_that_never_reaches_the_gradient_all_reduce_is_named():
    v = stuck_verdict(hung_job(), R0, threshold=30.0)
    d = v.diagnosis
    assert v.stuck and d is not None and d.kind == COLLECTIVE, v.reason
    assert d.summary.startswith(f"collective wait: rank 0 (pid {R0}) waits in all_reduce for rank 1 (pid {R1}), "
                                "which never arrives: it is at project/train.py:35 in never_arrives, sleeps"), d.summary
    msg = StuckWatch(hung_job(), R0, threshold=30.0).poll()[0].message
    assert f"rank 1 (pid {R1}), which never arrives" in msg, msg


def test_the_advisor_and_the_stuck_watch_reach_one_verdict():
    store = hung_job()
    ctx = build_context(store, target_pid=R0, stuck_after_s=30.0)
    watch = stuck_verdict(store, R0, threshold=30.0)
    assert ctx.stuck is not None and ctx.stuck.stuck
    assert ctx.stuck.diagnosis.summary == watch.diagnosis.summary
    f = RULES_BY_ID["stuck"].evaluate(ctx)
    assert f is not None and f"rank 1 (pid {R1})" in f.title, f.title
    # The straggler job is not stuck for either.
    straggling = straggling_job()
    v = stuck_verdict(straggling, R0, threshold=30.0)
    assert not build_context(straggling, target_pid=R0, stuck_after_s=30.0).stuck.stuck and not v.stuck


# --------------------------------------------------------------------------- each rank's own environment


def test_the_nccl_env_rule_reads_each_ranks_own_environment():
    envs = {0: {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
            1: {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "NCCL_P2P_DISABLE": "1"}}
    ctx = build_context(straggling_job(envs=envs), target_pid=R0)
    assert dict(ctx.ranks[1].env).get("NCCL_P2P_DISABLE") == "1"
    f = RULES_BY_ID["nccl-env"].evaluate(ctx)
    assert f is not None and "NCCL_P2P_DISABLE=1" in f.title
    assert any(e.startswith("NCCL_P2P_DISABLE=1 on rank 1") for e in f.evidence), f.evidence
