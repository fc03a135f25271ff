"""A job on no GPU (CPU training): no "host-device sync" in its breakdown, and no pin_memory=True
in its advice (pinning speeds only host-to-GPU copies). The new user's CPU jobs were shown both."""

from __future__ import annotations

from synth import Job, rule_findings

from gputop.analysis import CPU_DEVICE, Bucket
from gputop.model import Category as C


def _cpu_job(main) -> Job:
    return Job(seconds=20.0, util=None, main=main)


def test_a_read_of_a_loss_on_no_gpu_is_the_steps_own_work_not_a_sync():
    # Every fifth sample in loss.item() (classified a host sync): on no device it waits for nothing.
    found, ctx = rule_findings(_cpu_job(lambda t: C.HOST_SYNC if int(t * 5) % 5 == 0 else C.FORWARD))
    (cpu,) = [g for g in ctx.gpus if g.index == CPU_DEVICE]
    assert cpu.breakdown.get(Bucket.SYNC) == 0.0 and cpu.breakdown.get(Bucket.H2D) == 0.0
    assert cpu.breakdown.busy_s >= 0.99 * cpu.breakdown.total_s
    assert "host-sync" not in found


def test_a_cpu_job_waiting_for_data_is_not_told_to_pin_memory():
    found, _ = rule_findings(_cpu_job(lambda t: C.DATA_FETCH if int(t * 5) % 5 else C.FORWARD))
    f = found["data-starved"]
    assert "num_workers=" in f.action and "pin_memory" not in f.action
