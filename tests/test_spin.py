"""A GPU 'busy' doing nothing (analysis.spin), and what the stuck verdict and the straggler make of it."""

import pytest

from gputop.analysis.hang import COLLECTIVE, GPU_KERNEL, diagnose
from gputop.analysis.ranks import gpu_straggler, rank_views
from gputop.analysis.spin import (
    WaitPoll,
    is_spin,
    paired_gap,
    spin_share,
    spins_now,
    student_t,
    wait_series,
)
from gputop.analysis.stuck import judge, spinning_pids
from gputop.model import Category, Frame, GpuProcess, GpuSample, StackSample, UtilPoint

T0 = 1_700_000_000.0
PROJ = "/home/user/project/train.py"


def poll(ts, util, sm=None, tensor=None, power=None, index=0):
    return GpuSample(ts=ts, index=index, util_gpu=util, sm_active=sm, tensor_active=tensor, power_w=power,
                     power_limit_w=700.0 if power is not None else None)


def test_a_spin_is_busy_with_few_sms_and_no_tensor_work():
    assert is_spin(poll(T0, 100, sm=18.5, tensor=0.0)) is True  # NCCL all_reduce waiting (H100)
    assert is_spin(poll(T0, 100, sm=68.0, tensor=0.0)) is False  # fp32 compute
    assert is_spin(poll(T0, 100, sm=20.0, tensor=30.0)) is False  # small bf16 kernels
    small_fp32 = GpuSample(ts=T0, index=0, util_gpu=100, sm_active=20.0, tensor_active=0.0, fp32_active=12.0,
                           dram_active=9.0)
    assert is_spin(small_fp32) is False  # small fp32 kernels: math and memory traffic, no wait
    assert is_spin(poll(T0, 40, sm=5.0)) is False  # idle half the time: not a spin
    assert is_spin(poll(T0, 100, power=140.0)) is True  # no GPM: power near idle
    assert is_spin(poll(T0, 100, power=500.0)) is False
    assert is_spin(poll(T0, 100)) is None  # nothing to tell by
    assert is_spin(GpuSample(ts=T0, index=0)) is None


def test_spins_now_needs_every_poll_and_buffer_point_in_the_window():
    polls = [poll(T0 + i, 100, sm=18.0, tensor=0.0) for i in range(6)]
    assert spins_now(polls, [], T0 + 5, 5.0)
    assert not spins_now(polls[:1], [], T0 + 5, 5.0)  # one poll is not a spell
    gap = [UtilPoint(T0 + 3.2, 0, 0.0)]
    assert not spins_now(polls, gap, T0 + 5, 5.0)  # a 200 ms gap: kernels end and start, work
    mixed = polls[:3] + [poll(T0 + 4, 100, sm=70.0, tensor=0.0)] + polls[5:]
    assert not spins_now(mixed, [], T0 + 5, 5.0)


def test_spin_share_weighs_each_poll_by_its_span():
    polls = [poll(T0, 100, sm=18.0), poll(T0 + 1, 100, sm=18.0), poll(T0 + 4, 100, sm=70.0)]
    assert spin_share(polls, T0, T0 + 4) == pytest.approx(0.25)


def test_wait_series_reads_a_compute_straggler_from_the_peers_activity():
    # Rank 1's GPU computes all the time (SM 68 %); rank 0's does the same work in half the time
    # and spins the rest: its SM reads halfway between its spinning level (18 %) and 68 %.
    gpus = {0: [poll(T0 + i, 100, sm=18.0 if i == 1 else 43.0, tensor=0.0, index=0) for i in range(8)],
            1: [poll(T0 + i, 100, sm=68.0, tensor=0.0, index=1) for i in range(8)]}
    w = wait_series(gpus, T0, T0 + 8)
    assert w[1] and all(p.wait == 0.0 for p in w[1])
    assert [round(p.wait, 2) for p in w[0]][1:] == [0.5] * 6
    assert w[0][0].wait == 1.0  # the poll that spun waited all of it (the window's first poll is left out)
    # SM activity is the measure whatever the kernels' precision: one GPU's tensor work against the
    # other's fp32 work at the same SM activity is the same amount of work, no wait.
    mix = {0: [poll(T0 + i, 97, sm=90.0, tensor=40.0, index=0) for i in range(5)],
           1: [poll(T0 + i, 98, sm=91.0, tensor=0.0, index=1) for i in range(5)]}
    assert all(p.wait == 0.0 for ws in wait_series(mix, T0, T0 + 5).values() for p in ws)


def test_an_idle_gpu_waits_on_nothing():
    gpus = {0: [poll(T0 + i, 100, sm=18.0, index=0) for i in range(5)],
            1: [poll(T0 + i, 2, sm=0.5, index=1) for i in range(5)]}
    w = wait_series(gpus, T0, T0 + 5)
    assert all(p.wait == 1.0 for p in w[0]) and all(p.wait == 0.0 for p in w[1])


def test_paired_gap_is_a_lower_limit_that_grows_with_the_polls():
    a = [WaitPoll(T0 + i, 1.0, 0.5) for i in range(10)]
    b = [WaitPoll(T0 + i, 1.0, 0.0) for i in range(10)]
    mean, low, n = paired_gap(a, b, 1.96)
    assert n == 10 and mean == pytest.approx(0.5) and 0.4 < low < 0.5
    _, low3, _ = paired_gap(a[:3], b[:3], 1.96)
    assert low3 < low
    _, low1, n1 = paired_gap(a[:1], b[:1], 1.96)
    assert n1 == 1 and low1 < 0  # one poll decides nothing
    assert student_t(1.96, 3) == pytest.approx(3.18, abs=0.1) and student_t(1.96, 1000) == pytest.approx(1.96, abs=0.01)


def _main(pid, ts, frames, cat, active=True):
    return StackSample(ts=ts, pid=pid, thread_id=pid, thread_name="MainThread", frames=frames, active=active,
                       is_main=True, category=cat, os_thread_id=pid)


def test_a_compute_straggler_is_named_from_the_gpus_alone():
    step = (Frame("train_step", PROJ, 30), Frame("main", PROJ, 90))
    stacks = [_main(pid, T0 + i / 5, step, Category.FORWARD) for pid in (10, 11) for i in range(50)]
    procs = [GpuProcess(ts=T0, gpu_index=0, pid=10), GpuProcess(ts=T0, gpu_index=1, pid=11)]
    gpus = {0: [poll(T0 + i, 100, sm=43.0, tensor=0.0, index=0) for i in range(11)],
            1: [poll(T0 + i, 100, sm=68.0, tensor=0.0, index=1) for i in range(11)]}
    views = rank_views({10: 0, 11: 1}, stacks, T0, procs, gpu_samples=gpus, t1=T0 + 10)
    found = gpu_straggler(views, 0.30, 0.25)
    # No spin seen on GPU 0: NCCL's measured spinning level (18 % SM) stands in for its floor.
    assert found is not None and found.slow.rank == 1 and found.on_gpu and found.polls == 10
    assert found.waiting[0].gpu_wait == pytest.approx((68 - 43) / (68 - 18), abs=0.01)
    # Ranks doing the same work: nothing to name.
    even = {0: gpus[1], 1: [poll(T0 + i, 100, sm=67.0, tensor=0.0, index=1) for i in range(11)]}
    even = {0: [poll(s.ts, 100, sm=68.0, tensor=0.0, index=0) for s in gpus[0]], 1: even[1]}
    assert gpu_straggler(rank_views({10: 0, 11: 1}, stacks, T0, procs, gpu_samples=even, t1=T0 + 10), 0.30, 0.25) is None


def test_a_rank_asleep_with_its_gpu_idle_is_no_straggler_but_a_hang():
    spin = (Frame("train_step", PROJ, 30), Frame("main", PROJ, 90))
    sleep = (Frame("never_arrives", PROJ, 59, code="time.sleep(0.05)"), Frame("main", PROJ, 90))
    stacks = ([_main(10, T0 + i / 5, spin, Category.FORWARD) for i in range(50)]
              + [_main(11, T0 + i / 5, sleep, Category.IDLE, active=False) for i in range(50)])
    procs = [GpuProcess(ts=T0, gpu_index=0, pid=10), GpuProcess(ts=T0, gpu_index=1, pid=11)]
    gpus = {0: [poll(T0 + i, 100, sm=18.0, tensor=0.0, index=0) for i in range(11)],
            1: [poll(T0 + i, 0, sm=0.0, tensor=0.0, index=1) for i in range(11)]}
    views = rank_views({10: 0, 11: 1}, stacks, T0, procs, gpu_samples=gpus, t1=T0 + 10)
    assert gpu_straggler(views, 0.30, 0.25) is None
    # The stuck verdict at attach: rank 0 unchanged, its GPU spinning, its CPU busy in the driver.
    main = [s for s in stacks if s.pid == 10]
    pids = spinning_pids([10, 11], procs, gpus, {}, T0 + 10)
    assert pids == frozenset({10})
    v = judge(main, T0 + 10, 30.0, gpu="spin", others=(stacks[-1],), history_start=T0 - 60,
              ranks={10: 0, 11: 1}, spin_pids=pids)
    assert v.stuck and v.early and v.diagnosis is not None and v.diagnosis.kind == COLLECTIVE
    assert "rank 1 (pid 11)" in v.diagnosis.summary and "never arrives" in v.diagnosis.summary
    # The same stacks with the GPU computing: the job is working, not stuck.
    assert not judge(main, T0 + 10, 30.0, gpu="busy", others=(stacks[-1],), history_start=T0 - 60).stuck


def test_one_process_on_a_spinning_gpu_is_a_kernel_that_never_ends():
    item = (Frame("train", PROJ, 77, code="print(loss.item())"), Frame("main", PROJ, 90))
    main = [_main(10, T0 + i / 5, item, Category.HOST_SYNC, active=False) for i in range(30)]
    v = judge(main, T0 + 6, 30.0, gpu="spin", history_start=T0 - 60)
    assert v.stuck and v.early
    assert v.diagnosis.kind == GPU_KERNEL and "never finishes" in v.diagnosis.summary
    assert any("spins" in e for e in v.evidence)
    d = diagnose(main[-1], (), 10, gpu="spin")
    assert d.kind == GPU_KERNEL and "CUDA_LAUNCH_BLOCKING=1" in d.action


def test_a_straggler_waiting_for_its_dataloader_is_named_with_its_workers_work():
    from gputop.advisor.rules.distributed import straggler_phase
    from gputop.analysis.ranks import Straggler
    from gputop.model import ProcSample

    wait = (Frame("_MultiProcessingDataLoaderIter._next_data",
                  "/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1300),
            Frame("train", PROJ, 66))
    step = (Frame("train_step", PROJ, 30), Frame("main", PROJ, 90))
    decode = (Frame("decode_record", "/home/user/project/data.py", 88), Frame("__getitem__", "/home/user/project/data.py", 40))
    stacks = ([_main(10, T0 + i / 5, step, Category.FORWARD) for i in range(50)]
              + [_main(11, T0 + i / 5, wait, Category.DATA_WAIT, active=(i % 3 == 0)) for i in range(50)]
              + [_main(12, T0 + i / 2, decode, Category.DATA_FETCH) for i in range(20)])
    procs = {12: [ProcSample(ts=T0, pid=12, ppid=11, name="pt_data_worker", role="worker")]}
    views = rank_views({10: 0, 11: 1}, stacks, T0, (), procs)
    slow = next(v for v in views if v.rank == 1)
    assert slow.worker_hot == "decode_record (project/data.py:88)"

    class Ctx:
        gpus = ()
        gil_holders: dict = {}
        ranks = views

    doing, fix = straggler_phase(Ctx, Straggler(slow, (views[0],)))
    assert "waits for its DataLoader" in doing and "decode_record" in doing
    assert "num_workers" in fix and "decode_record" in fix


def test_a_straggler_on_a_shared_gpu_is_told_to_move_the_other_process():
    from gputop.advisor.rules.distributed import straggler_phase

    step = (Frame("train_step", PROJ, 30), Frame("main", PROJ, 90))
    stacks = [_main(pid, T0 + i / 5, step, Category.FORWARD) for pid in (10, 11) for i in range(50)]
    procs = [GpuProcess(ts=T0, gpu_index=0, pid=10), GpuProcess(ts=T0, gpu_index=1, pid=11),
             GpuProcess(ts=T0, gpu_index=1, pid=77)]  # an eval worker sharing rank 1's GPU
    gpus = {0: [poll(T0 + i, 100, sm=40.0, tensor=0.0, index=0) for i in range(11)],
            1: [poll(T0 + i, 100, sm=80.0, tensor=0.0, index=1) for i in range(11)]}
    views = rank_views({10: 0, 11: 1}, stacks, T0, procs, gpu_samples=gpus, t1=T0 + 10)
    found = gpu_straggler(views, 0.30, 0.25)
    assert found is not None and found.slow.rank == 1 and found.slow.gpu_guests == (77,)

    class Ctx:
        gpus = ()
        gil_holders: dict = {}
        ranks = views

    doing, fix = straggler_phase(Ctx, found)
    assert "shares with PID 77" in doing and "move PID 77 off GPU 1" in fix


def test_a_throttled_straggler_gpu_is_named_from_its_own_polls():
    from gputop.advisor.rules.distributed import straggler_phase

    step = (Frame("train_step", PROJ, 30), Frame("main", PROJ, 90))
    stacks = [_main(pid, T0 + i / 5, step, Category.FORWARD) for pid in (10, 11) for i in range(50)]
    procs = [GpuProcess(ts=T0, gpu_index=0, pid=10), GpuProcess(ts=T0, gpu_index=1, pid=11)]
    hot = 0x20  # NVML's software thermal slowdown
    gpus = {0: [poll(T0 + i, 100, sm=40.0, tensor=0.0, index=0) for i in range(11)],
            1: [GpuSample(ts=T0 + i, index=1, util_gpu=100, sm_active=80.0, tensor_active=0.0,
                          throttle_reasons=hot) for i in range(11)]}
    views = rank_views({10: 0, 11: 1}, stacks, T0, procs, gpu_samples=gpus, t1=T0 + 10)
    found = gpu_straggler(views, 0.30, 0.25)
    assert found is not None and found.slow.rank == 1 and found.slow.gpu_throttled

    class Ctx:
        gpus = ()  # not the target's GPU: no GpuView of it
        ranks = views
        gil_holders: dict = {}

    doing, fix = straggler_phase(Ctx, found)
    assert "throttled (" in doing and "nvidia-smi -q -d PERFORMANCE" in fix


def test_a_rank_writing_a_checkpoint_is_the_straggler_not_a_hang():
    """Rank 0 blocked in torch.save's write (one stack, off the CPU) while rank 1's GPU spins in
    NCCL: its process writes hundreds of MB/s, so it works; named with its save and the async fix."""
    from gputop.advisor.rules.distributed import straggler_phase
    from gputop.model import ProcSample

    save = (Frame("_write", "/usr/lib/python3.11/site-packages/torch/serialization.py", 900),
            Frame("save_checkpoint", PROJ, 120), Frame("main", PROJ, 90))
    step = (Frame("train_step", PROJ, 30), Frame("main", PROJ, 90))
    stacks = ([_main(10, T0 + i / 5, save, Category.CHECKPOINT_IO, active=False) for i in range(50)]
              + [_main(11, T0 + i / 5, step, Category.HOST_SYNC, active=False) for i in range(50)])
    procs = [GpuProcess(ts=T0, gpu_index=0, pid=10), GpuProcess(ts=T0, gpu_index=1, pid=11)]
    gpus = {0: [poll(T0 + i, 0, sm=0.0, tensor=0.0, index=0) for i in range(11)],
            1: [poll(T0 + i, 100, sm=18.0, tensor=0.0, index=1) for i in range(11)]}
    writing = {10: [ProcSample(ts=T0 + i, pid=10, io_write_bps=400e6, role="target") for i in range(11)]}
    views = rank_views({10: 0, 11: 1}, stacks, T0, procs, writing, gpu_samples=gpus, t1=T0 + 10)
    found = gpu_straggler(views, 0.30, 0.25)
    assert found is not None and found.slow.rank == 0 and found.slow.works

    class Ctx:
        gpus = ()
        gil_holders: dict = {}
        ranks = views

    doing, fix = straggler_phase(Ctx, found)
    assert "saves checkpoints" in doing and "save_checkpoint" in doing
    assert "async_save" in fix and "rank 0" in fix
    # The same stacks with no bytes moving: a rank blocked in one place with its GPU idle is a
    # hang, the stuck verdict's to name, not a straggler.
    still = {10: [ProcSample(ts=T0 + i, pid=10, io_write_bps=0.0, role="target") for i in range(11)]}
    assert gpu_straggler(rank_views({10: 0, 11: 1}, stacks, T0, procs, still, gpu_samples=gpus, t1=T0 + 10),
                         0.30, 0.25) is None


def test_the_straggler_finding_absorbs_the_checkpoint_and_collective_findings():
    from gputop.advisor.rules import RULES_BY_ID

    assert {"checkpoint-stall", "collective-wait"} <= set(RULES_BY_ID["rank-straggler"].supersedes)


def test_a_rank_looping_in_its_own_code_is_hung_when_nccl_counts_stand_still():
    """Rank 1 busy in a loop that never returns (its stacks move, on a CPU) while rank 0 waits in
    the collective: the moving rank vetoes the hang, unless NCCL's RAS counts say rank 1 has
    launched no collective for 10 s while rank 0 is ahead."""
    import os

    from gputop.analysis.nccl_ras import compare, parse
    from gputop.analysis.stuck import StuckVerdict, across_ranks

    with open(os.path.join(os.path.dirname(__file__), "fixtures", "nccl", "ras-hang.txt"), encoding="utf-8") as f:
        hung = parse(f.read())  # rank 1 (pid 1234) at AllReduce 77, rank 0 (pid 1233) at 161
    loop = [(Frame("pack_rows", PROJ, 418 + i % 3), Frame("batches", PROJ, 440), Frame("main", PROJ, 90))
            for i in range(3)]
    stacks = [_main(1234, T0 + i / 5, loop[i % 3], Category.OTHER) for i in range(50)]
    v = StuckVerdict(True, "main thread unchanged", since=T0, held_s=10.0, category=Category.COLLECTIVE)
    ranks = {1233: 0, 1234: 1}
    assert not across_ranks(v, ranks, stacks, 1233).stuck  # moving: a straggler, as far as stacks tell
    frozen = compare(hung, hung, 10.0)
    held = across_ranks(v, ranks, stacks, 1233, nccl=frozen)
    assert held.stuck and any("launches no collective" in e and "AllReduce up to 77" in e for e in held.evidence)
    # Counts that move (a slow rank, not a hung one) leave the veto standing.
    assert not across_ranks(v, ranks, stacks, 1233, nccl=compare(hung, hung, 2.0)).stuck


def test_a_spinning_gpu_says_nothing_of_its_kernels():
    """Polls of a kernel spinning in a collective are left out of what the GPU's work is said to
    be (SM activity, fill): a rank's first seconds of a hang are not 'kernels too small'."""
    from gputop.analysis.efficiency import gpu_efficiency

    work = [GpuSample(ts=T0 + i, index=0, util_gpu=95.0, sm_active=80.0, tensor_active=30.0, dram_active=40.0)
            for i in range(4)]
    spin = [poll(T0 + 4 + i, 100, sm=18.0, tensor=0.0) for i in range(6)]
    e = gpu_efficiency(0, work + spin)
    assert e.busy_polls == 10 and e.spin_polls == 6
    assert e.sm_active == pytest.approx(80.0) and e.tensor_active == pytest.approx(30.0)
    assert e.sm_fill == pytest.approx(80 / 95, abs=0.01)
    only = gpu_efficiency(0, spin)
    assert only.spin_polls == 6 and only.sm_active is None and only.sm_fill is None


def test_a_compute_straggler_is_named_by_what_only_it_runs():
    """Rank 0 alone evaluates (its GPU busy, power-capped) while rank 1's GPU spins in the next
    all-reduce: named with `evaluate`, the function no other rank runs, and the change that shares it."""
    from gputop.advisor.rules.distributed import straggler_phase

    step = (Frame("train_step", PROJ, 30), Frame("main", PROJ, 90))
    ev = (Frame("forward", "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125),
          Frame("evaluate", PROJ, 522), Frame("main", PROJ, 95))
    stacks = ([_main(10, T0 + i / 5, ev if i % 5 < 2 else step, Category.FORWARD) for i in range(50)]
              + [_main(11, T0 + i / 5, step, Category.BACKWARD) for i in range(50)])
    procs = [GpuProcess(ts=T0, gpu_index=0, pid=10), GpuProcess(ts=T0, gpu_index=1, pid=11)]
    gpus = {0: [GpuSample(ts=T0 + i, index=0, util_gpu=90.0, sm_active=75.0, tensor_active=20.0, throttle_reasons=4)
                for i in range(13)],
            1: [poll(T0 + i, 100, sm=18.0 if i % 2 else 70.0, tensor=0.0 if i % 2 else 20.0, index=1) for i in range(13)]}
    views = rank_views({10: 0, 11: 1}, stacks, T0, procs, gpu_samples=gpus, t1=T0 + 12)
    slow = next(v for v in views if v.rank == 0)
    assert slow.only_here == "evaluate (project/train.py:522)" and slow.only_here_share == pytest.approx(0.4)
    assert next(v for v in views if v.rank == 1).only_here is None  # train_step and main: every rank's
    found = gpu_straggler(views, 0.10, 0.10)
    assert found is not None and found.slow.rank == 0

    class Ctx:
        gpus = ()
        gil_holders: dict = {}
        ranks = views

    doing, fix = straggler_phase(Ctx, found)
    assert "computes on GPU 0" in doing and "`evaluate (project/train.py:522)`" in doing and "throttled" not in doing
    assert "share it" in fix and "dist.all_reduce" in fix


def test_a_straggler_the_others_wait_a_fifth_for_on_their_gpus_is_named():
    """NCCL: rank 1's GPU spins in the all-reduce in about 40 % of its polls, unevenly (a rank
    evaluating now and then); at the lower limit the gap is ~0.2: the health bar (a tenth), not the
    host samples' quarter, decides on the GPUs' paired polls."""
    from gputop.advisor.context import AnalysisContext
    from gputop.advisor.rules.distributed import check_rank_straggler

    step = (Frame("train_step", PROJ, 30), Frame("main", PROJ, 90))
    stacks = [_main(pid, T0 + i / 5, step, Category.FORWARD) for pid in (10, 11) for i in range(60)]
    procs = [GpuProcess(ts=T0, gpu_index=0, pid=10), GpuProcess(ts=T0, gpu_index=1, pid=11)]
    waits = [0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0]  # rank 1's GPU spinning whole polls, unevenly
    gpus = {0: [GpuSample(ts=T0 + i, index=0, util_gpu=90.0, sm_active=75.0, tensor_active=20.0) for i in range(14)],
            1: [poll(T0 + i, 100, sm=18.0 if w else 72.0, tensor=0.0 if w else 20.0, index=1) for i, w in enumerate(waits)]}
    views = rank_views({10: 0, 11: 1}, stacks, T0, procs, gpu_samples=gpus, t1=T0 + 13)
    assert gpu_straggler(views, 0.30, 0.25) is None  # the host's bars: not resolved
    hit = check_rank_straggler(AnalysisContext(now=T0 + 13, t0=T0, t1=T0 + 13, gpus=(), ranks=views))
    assert hit is not None and hit.title.startswith("rank 0 is the straggler")


def test_a_cpu_rank_slow_after_its_update_is_not_told_to_use_the_gpu():
    """A gloo CPU straggler summing in pure Python after its update was told to "keep its tensors on
    the GPU ... torch._foreach_*" (a new user's report): a rank with no GPU is told what it can do."""
    from dataclasses import replace

    from gputop.advisor.rules.distributed import straggler_phase
    from gputop.analysis import AFTER_UPDATE, Straggler

    step = (Frame("train_step", PROJ, 30), Frame("main", PROJ, 90))
    stacks = [_main(pid, T0 + i / 5, step, Category.FORWARD) for pid in (10, 11) for i in range(50)]
    views = rank_views({10: 0, 11: 1}, stacks, T0, (), {})
    slow = replace(next(v for v in views if v.rank == 1), hot="sum_stats (project/train.py:70)", hot_when=AFTER_UPDATE,
                   hot_share=0.6)

    class Ctx:
        gpus = ()
        gil_holders: dict = {}
        ranks = views

    found = Straggler(slow, (views[0],))
    assert slow.gpu is None
    _, fix = straggler_phase(Ctx, found)
    assert "GPU" not in fix and "_foreach_" not in fix and "every N steps" in fix
    _, with_gpu = straggler_phase(Ctx, Straggler(replace(slow, gpu=1), (views[0],)))
    assert "torch._foreach_*" in with_gpu
