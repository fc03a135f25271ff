"""Sessions recorded on two H100s with NCCL (``gputop record`` on the launcher of
bench/multi_rank.py's jobs, torch 2.11, NCCL 2.28) drive the advisor on CPU.

NCCL waits on the GPU, not the host: a rank whose peer is late launches its next step's kernels
until the launch queue is full and its GPU reads 100 % busy with 18 % of its SMs active (the
collective's kernel spinning). These are the data the rules for that case were written from.
"""

from pathlib import Path

import pytest

from gputop.advisor.context import build_context
from gputop.advisor.engine import Advisor
from gputop.session import open_replay

HERE = Path(__file__).parent / "fixtures" / "nccl"
BUSY_GPU_FINDINGS = {"launch-bound", "no-tensor-cores", "mixed-precision", "memory-headroom"}


def replay_findings(name: str, every_s: float = 2.0):
    """[(seconds since the first sample, context, findings shown)] through the file, one advisor
    evaluating every ``every_s`` as ``advise`` does."""
    session = open_replay(HERE / name, speed=1000.0, advisor=False)
    replay = session.replay
    adv = Advisor(target_pid=session.target_pid)
    out = []
    try:
        t = replay.start_ts + every_s
        while t <= replay.end_ts:
            replay.seek(t)
            session.pipeline.poll_once()
            shown = adv.evaluate(session.store, now=t)
            out.append((t - replay.start_ts, adv.last_context, shown))
            t += every_s
    finally:
        session.pipeline.stop()
    return out


@pytest.fixture(scope="module")
def straggler():
    return replay_findings("straggler-h100x2.gputop")


@pytest.fixture(scope="module")
def hang():
    return replay_findings("hang-h100x2.gputop")


def test_the_nccl_straggler_is_named_from_the_gpus(straggler):
    # The waiting rank's stacks show no collective at all: its host runs ahead into the next step.
    # Until the waiting rank moves again (6 s), rank 1 has shown no sign of arriving (none of its
    # samples in the model, its GPU idle): slow or never arriving is weighed, not warned about.
    early = [(t, shown) for t, _, shown in straggler if t < 6]
    assert not any(f.severity.value != "info" for _, shown in early for f in shown[:1]), early
    weighed = [shown[0] for _, shown in early if shown and shown[0].id == "weighing-hang"]
    assert weighed and any("rank 1" in e for e in weighed[-1].evidence)
    late = [(t, ctx, shown) for t, ctx, shown in straggler if t >= 7]
    assert all(max(v.collective for v in ctx.ranks) == 0.0 for _, ctx, _ in late)
    for t, ctx, shown in late:
        assert shown and shown[0].id == "rank-straggler", (t, [f.id for f in shown])
        f = shown[0]
        assert f.title.startswith("rank 1 is the straggler: the other ranks wait")
        assert "NCCL" in f.title
        assert "load_batch" in " ".join(f.evidence)
        rank0 = next(v for v in ctx.ranks if v.rank == 0)
        assert rank0.gpu_wait is not None and rank0.gpu_wait > 0.9


def test_a_rank_spinning_in_nccl_gets_no_busy_gpu_finding(straggler, hang):
    for t, ctx, shown in straggler + hang:
        assert not BUSY_GPU_FINDINGS & {f.id for f in shown}, (t, [f.id for f in shown])


def test_the_nccl_hang_is_stuck_and_names_the_rank_that_never_arrives(hang):
    stuck_at = [t for t, _, shown in hang if shown and shown[0].id == "stuck"]
    assert stuck_at and stuck_at[0] <= 8.0
    # Once called, it stays called, and nothing else is shown as its cause before or after.
    first = stuck_at[0]
    assert all(shown and shown[0].id == "stuck" for t, _, shown in hang if t >= first)
    assert all(not shown for t, _, shown in hang if t < first)
    f = next(shown[0] for t, _, shown in hang if t == first)
    assert "rank 1 (pid 1234)" in f.title and "never arrives" in f.title
    assert "never_arrives" in f.title or "never_arrives" in " ".join(f.evidence)
    assert any("spins" in e for e in f.evidence)


def test_the_healthy_nccl_job_gets_no_warning():
    for t, _, shown in replay_findings("healthy-h100x2.gputop"):
        assert not [f for f in shown if f.severity.value in ("warning", "critical")], (t, [f.id for f in shown])


def test_the_ranks_view_shows_each_ranks_gpu_wait():
    session = open_replay(HERE / "straggler-h100x2.gputop", speed=1000.0, advisor=False)
    try:
        session.replay.seek(session.replay.start_ts + 12)
        session.pipeline.poll_once()
        ctx = build_context(session.store, target_pid=session.target_pid)
        by = {v.rank: v for v in ctx.ranks}
        assert by[0].gpu_util is not None and by[0].gpu_util > 95 and by[0].gpu_sm < 25
        assert by[1].gpu_wait == 0.0 and by[1].gpu_util < 10
        assert by[0].wait > 0.9 and by[1].wait < 0.1
    finally:
        session.pipeline.stop()


def test_nccl_ras_counts_name_the_rank_in_the_stuck_evidence():
    from gputop.model import Event

    session = open_replay(HERE / "hang-h100x2.gputop", speed=1000.0, advisor=False)
    replay = session.replay
    try:
        t = replay.start_ts + 10
        replay.seek(t)
        session.pipeline.poll_once()
        # The report as NCCL's RAS service gave it during this hang, standing unchanged for 13 s:
        # read again unchanged for 8 s at least (the last poll may be 5 s back).
        session.store.add([Event(t - 13, "nccl-ras", (HERE / "ras-hang.txt").read_text(), "debug")])
        ctx = build_context(session.store, target_pid=session.target_pid, now=t)
        assert [v.verdict for v in ctx.nccl] == ["hang"]
        from gputop.advisor.rules import RULES_BY_ID

        f = RULES_BY_ID["stuck"].evaluate(ctx)
        assert f is not None
        line = next(e for e in f.evidence if e.startswith("NCCL's RAS service"))
        assert "rank 1 (pid 1234, GPU 1" in line and "77" in line and "not moved in 8 s" in line
    finally:
        session.pipeline.stop()


def test_the_compute_straggler_is_named_as_computing_on_its_gpu():
    # bench/multi_rank.py's compute mode: rank 1 runs two more forwards a step, its host never
    # waits; rank 0's GPU computes ~60 % of the time and spins the rest (SM 56 % against 73 %).
    runs = replay_findings("compute-h100x2.gputop")
    for t, ctx, shown in runs[2:]:
        assert shown and shown[0].id == "rank-straggler", (t, [f.id for f in shown])
        f = shown[0]
        assert f.title.startswith("rank 1 is the straggler")
        assert "computes on GPU 1" in " ".join(f.evidence)
        assert "same work per step" in f.action
        assert not BUSY_GPU_FINDINGS - {"memory-headroom"} & {x.id for x in shown}


def test_a_desync_on_nccl_is_stuck_and_named_from_nccls_counts():
    # Rank 0 in all_reduce (report_metrics), rank 1 in broadcast (receive_lr_schedule): both GPUs
    # spin, both hosts stand still after the call; the hang starts while watched, so it is the
    # spin that calls it within seconds, and NCCL's RAS counts (crossed) that name the desync.
    runs = replay_findings("order_mismatch-h100x2.gputop")
    stuck = [(t, shown[0]) for t, _, shown in runs if shown and shown[0].id == "stuck"]
    assert stuck and stuck[0][0] <= 12.0
    assert all(not shown or shown[0].id == "stuck" for _, _, shown in runs)  # nothing else shown first
    last = stuck[-1][1]
    assert "collective desync" in last.title and "Broadcast" in last.title and "AllReduce" in last.title
    assert "same collectives in the same order" in last.action


def test_a_queue_hang_on_nccl_names_the_rank_that_never_arrives():
    runs = replay_findings("queue_hang-h100x2.gputop")
    first = next(t for t, _, shown in runs if shown and shown[0].id == "stuck")
    assert first <= 6.0
    f = next(shown[0] for t, _, shown in runs if t == first)
    assert "rank 1 (pid 1071)" in f.title and "never arrives" in f.title
    assert all(not shown for t, _, shown in runs if t < first)


def test_an_fsdp_straggler_whose_peer_mixes_compute_and_spin_is_named():
    # Rank 1 tokenizes in Python (its GPU 8-22 % busy); rank 0's GPU mixes compute with NCCL's
    # spin within each poll (SM 29 % at 98 % busy, tensor 4 %): no poll is a pure spin, so the
    # wait is read against how full rank 1's kernels keep its SMs while they run.
    runs = replay_findings("fsdp_slow-h100x2.gputop")
    named = [f for _, _, shown in runs for f in shown[:1] if f.id == "rank-straggler"]
    assert len(named) >= len(runs) - 2
    assert all("tokenize_slowly" in " ".join(f.evidence) for f in named)


def test_the_target_blocked_in_its_own_code_while_its_peer_spins_is_the_rank_that_never_arrives():
    # A held-out job (2 x H200): rank 0 (the target) blocks on a dead writer thread's queue; rank 1's
    # GPU spins in the all-reduce and its host thread runs on, which read as "rank 1 moves: a
    # straggler" and left the job "weighing" for 20 s. Stuck once the target stood still 5 s.
    runs = replay_findings("demand_forecast-h200x2.gputop", every_s=1.0)
    first = next(t for t, _, shown in runs if shown and shown[0].id == "stuck")
    assert first <= 11.0
    f = next(shown[0] for t, _, shown in runs if t == first)
    assert "rank 0 (pid 2369), which never arrives" in f.title and "record_metrics" in f.title
    assert any("every other rank's GPU spins in a collective" in e for e in f.evidence)
    assert all(shown[0].id == "stuck" for t, _, shown in runs if t >= first)


def test_a_rank_whose_gpu_waits_for_its_peer_is_not_called_launch_bound():
    # A held-out DDP job (2 x H200) accumulating 8 micro-batches without no_sync(): rank 0's GPU
    # 'busy' 100 % with SMs 26 %, waiting 73 % beside its peer in the per-micro-batch all-reduce,
    # read as "kernels too small" and was told launch-bound for a second before the accumulation
    # was named. A GPU waiting for its peers has few SMs busy because a kernel waits.
    runs = replay_findings("ticket_router-h200x2.gputop", every_s=1.0)
    warned = [(t, shown[0].id) for t, _, shown in runs if shown and shown[0].severity.value == "warning"]
    assert warned and all(fid == "accumulation-sync" for _, fid in warned), warned
    assert warned[0][0] <= 5.0


def test_a_hang_weighed_names_only_the_ranks_still_moving_in_their_own_code():
    # A held-out DDP job (2 x H200, eighth set): rank 1 busy-looped in `except Exception: continue`,
    # never reaching the all-reduce rank 0 stood in; never-arrives wants that rank standing still.
    # While a hang is weighed, a rank still moving outside the model and any collective is named.
    from types import SimpleNamespace

    from gputop.advisor.engine import _ranks_elsewhere
    from gputop.model import Category, Frame, StackSample

    def view(rank, pid, cat, works=True):
        s = StackSample(ts=0.0, pid=pid, thread_id=1, thread_name="MainThread", is_main=True, active=True,
                        category=cat, frames=(Frame("loop", "/home/u/train.py", 40),))
        return SimpleNamespace(rank=rank, pid=pid, latest=s, works=works)

    assert _ranks_elsewhere([view(1, 11, Category.BACKWARD), view(2, 12, Category.COLLECTIVE)], 10) == []
    assert _ranks_elsewhere([view(1, 11, Category.OTHER, works=False)], 10) == []  # standing still: never-arrives'
    assert len(_ranks_elsewhere([view(0, 10, Category.OTHER), view(1, 11, Category.OTHER)], 10)) == 1


def test_a_rank_that_never_arrives_is_weighed_not_called_the_straggler():
    # A held-out DDP job (2 x H200, ninth set): rank 1 spins for ever in an unbounded rejection
    # sampler in its Dataset (run in the main process) while rank 0 waits in NCCL. Rank 0 stood
    # still from the attach on and rank 1 was never seen taking part in a step again (no sample in
    # the model or a collective, its GPU idle): "slow" and "never arrives" are weighed, then stuck.
    # It was "rank 1 is the straggler", a warning, from 9 s to 15 s.
    runs = replay_findings("roof_segmentation-h200x2.gputop", every_s=1.0)
    tops = [(t, shown[0].id) for t, _, shown in runs if shown]
    assert "rank-straggler" not in {fid for _, fid in tops}, tops
    weighed = [(t, shown[0]) for t, _, shown in runs if shown and shown[0].id == "weighing-hang"]
    assert weighed and weighed[0][0] <= 7.0
    assert any("rank 1" in e and "positive_crop" in e for e in weighed[-1][1].evidence), weighed[-1][1].evidence
    stuck = [t for t, fid in tops if fid == "stuck"]
    assert stuck and all(fid == "stuck" for t, fid in tops if t >= stuck[0])


def test_per_step_metrics_through_all_gather_object_are_a_host_sync_on_nccl():
    # A held-out DDP job (2 x H200, ninth set) averaged its metrics every step through
    # `.item()` and dist.all_gather_object (1.25x once gathered every N steps in one tensor). On
    # NCCL an object collective copies through the GPU and reads back: a sync. Each kind alone
    # was under the steady bar (7 % of the samples each); together they are the step's syncs.
    runs = replay_findings("ad_ctr-h200x2.gputop", every_s=1.0)
    _, _, shown = runs[-1]
    f = next((f for f in shown if f.id == "host-sync"), None)
    assert f is not None, [x.id for x in shown]
    assert f.title.startswith("all_gather_object every step syncs the host")
    assert "all_gather_object" in f.evidence[1] and "dist.all_reduce" in f.action


def test_object_collectives_are_syncs_only_on_a_job_with_gpus():
    from types import SimpleNamespace

    from gputop.advisor.rules.host import object_collective, syncs_host
    from gputop.model import Category, Frame, StackSample

    c10d = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"
    s = StackSample(ts=0.0, pid=1, thread_id=1, thread_name="MainThread", is_main=True, active=True,
                    category=Category.COLLECTIVE,
                    frames=(Frame("_tensor_to_object", c10d, 3232), Frame("all_gather_object", c10d, 3329),
                            Frame("log_metrics", "/home/u/train.py", 50)))
    plain = StackSample(ts=0.0, pid=1, thread_id=1, thread_name="MainThread", is_main=True, active=True,
                        category=Category.COLLECTIVE, frames=(Frame("all_reduce", c10d, 2800),))
    assert object_collective(s) and not object_collective(plain)
    gpu, cpu = SimpleNamespace(index=0), SimpleNamespace(index=-1)  # a GPU; the CPU as a job's device
    assert syncs_host(SimpleNamespace(gpus=(gpu,)), s)
    assert not syncs_host(SimpleNamespace(gpus=()), s)  # gloo on CPUs: a collective, no GPU to wait for
    assert not syncs_host(SimpleNamespace(gpus=(cpu,)), s)
    assert not syncs_host(SimpleNamespace(gpus=(gpu,)), plain)


def test_a_gap_nothing_explains_on_a_balanced_job_is_not_a_straggler():
    # A held-out healthy DDP ResNet (2 x H200, tenth set): in its first four polls after the attach
    # rank 0's GPU waited 16-24 % and rank 1's none, then the other way round. Rank 1's GPU computed
    # no longer than rank 0's (76 % busy against 98 % less its 22 % spin), shared no GPU, was not
    # throttled and ran nothing rank 0 did not: "rank 1 is the straggler ... computes for longer",
    # a warning for 10 s, had no cause behind it.
    runs = replay_findings("land_cover-h200x2.gputop", every_s=1.0)
    warned = [(t, shown[0].id) for t, _, shown in runs if shown and shown[0].severity.value != "info"]
    assert not warned, warned


def test_a_rank_computing_longer_is_still_the_compute_straggler():
    runs = replay_findings("compute-h100x2.gputop", every_s=1.0)
    _, _, shown = runs[-1]
    assert shown and shown[0].id == "rank-straggler" and "computes on GPU" in shown[0].evidence[0]
