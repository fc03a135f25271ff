"""Which GPUs an attached job is judged on: its own, and none when it demonstrably holds none
(another user's GPUs are not its to explain; a new user saw a CPU-only loop called launch-bound
on GPUs it never touched)."""

from __future__ import annotations

from gputop.advisor.context import build_context, holds_no_gpu
from gputop.analysis.breakdown import CPU_DEVICE
from gputop.model import Category, GpuProcess, GpuSample, ProcSample, StackSample

from synth import T0, TARGET, Job, periodic, stack

OTHER = 9999  # another user's training job, on the GPU


def _ctx(job: Job, other_ppid: int | None = 1, visible: bool = True):
    st = job.store()
    for sec in range(1, int(job.seconds) + 1):
        ts = T0 + sec
        # A poll's process list comes with its samples (the store keeps the latest poll's).
        batch: list[object] = [GpuSample(ts=ts, index=0, util_gpu=50.0),
                               GpuProcess(ts=ts, gpu_index=0, pid=OTHER, used_memory=1 << 30)]
        if visible:
            batch.append(ProcSample(ts=ts, pid=OTHER, ppid=other_ppid, name="python", role="gpu"))
        st.add(batch)
    return build_context(st, window_s=60.0)


def _job() -> Job:
    # A CPU-bound loop (plain Python: "other") beside a GPU busy in bursts with someone else's work.
    return Job(util=periodic(2.0, 1.0), main=lambda t: Category.OTHER, target_on_gpu=False)


def test_a_job_holding_no_gpu_is_judged_on_its_own_time_line():
    ctx = _ctx(_job())
    assert [g.index for g in ctx.gpus] == [CPU_DEVICE]


def test_other_gpu_users_that_may_be_the_jobs_own_keep_the_gpus():
    # A child of the target (a launcher's rank) on the GPU: the job's GPUs.
    assert [g.index for g in _ctx(_job(), other_ppid=TARGET).gpus] == [0]
    # A GPU process this machine's /proc does not show (another PID namespace): cannot tell.
    assert [g.index for g in _ctx(_job(), visible=False).gpus] == [0]
    # The job itself on the GPU: its GPU, as before.
    assert [g.index for g in build_context(Job().store(), window_s=60.0).gpus] == [0]


def test_holds_no_gpu_needs_a_process_list_read_since_the_stacks_began():
    main = [stack(T0 + 5.0, Category.OTHER)]
    procs = {OTHER: [ProcSample(ts=T0 + 6.0, pid=OTHER, ppid=1)]}
    fresh = [GpuProcess(ts=T0 + 6.0, gpu_index=0, pid=OTHER)]
    stale = [GpuProcess(ts=T0 + 1.0, gpu_index=0, pid=OTHER)]
    assert holds_no_gpu(TARGET, {TARGET}, {}, fresh, procs, main)
    assert not holds_no_gpu(TARGET, {TARGET}, {}, stale, procs, main)
    assert not holds_no_gpu(TARGET, {TARGET}, {OTHER: 1}, fresh, procs, main)  # one of its ranks
    assert not holds_no_gpu(TARGET, {TARGET, OTHER}, {}, fresh, procs, main)  # one of its workers
    assert not holds_no_gpu(None, set(), {}, fresh, procs, main)  # nothing attached
    assert not holds_no_gpu(TARGET, {TARGET}, {}, [], procs, main)  # no list: cannot tell
    assert not holds_no_gpu(TARGET, {TARGET}, {}, fresh, procs, [])  # no stacks yet
    assert isinstance(main[0], StackSample)


def test_the_cpu_time_line_spans_samples_a_second_apart():
    """After the attach burst stacks come ~1/s: the CPU device's time line covers them all, not
    only the spacings under NVML's 1 s gap."""
    from gputop.analysis.breakdown import stack_slices

    main = [stack(T0 + 0.2 * k, Category.FORWARD) for k in range(10)]  # the burst, 2 s
    main += [stack(T0 + 2.0 + 1.05 * k, Category.DATA_WAIT) for k in range(1, 20)]  # ~1/s for 20 s
    covered = sum(s.end - s.start for s in stack_slices(main, T0, main[-1].ts))
    assert covered > 0.95 * (main[-1].ts - main[0].ts), covered
    # A sampler that stalled for longer than a few seconds is a gap, not a measurement.
    stalled = main[:10] + [stack(T0 + 12.0, Category.FORWARD)]
    covered = sum(s.end - s.start for s in stack_slices(stalled, T0, T0 + 12.0))
    assert covered < 3.0, covered
