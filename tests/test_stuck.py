"""Stuck-job verdicts from plain samples (the live deadlock test is in test_stacks_live.py)."""

import json
import os

from gputop.analysis.stuck import gpu_state, judge, stuck_verdict, target_gpu_busy
from gputop.model import Category, Frame, GpuProcess, GpuSample, ProcSample, StackSample, UtilPoint
from gputop.sources.stacks import StackParser
from gputop.store import Store

PID = 4242
T0 = 1_700_000_000.0
PROJ = "/home/user/project/train.py"
LOCK = (Frame("train_step", PROJ, 42, code="with lock_b:"), Frame("main", PROJ, 90))
MOVING = [(Frame("train_step", PROJ, 30 + i % 3), Frame("main", PROJ, 90)) for i in range(3)]


def main_sample(ts, frames=LOCK, cat=Category.IDLE, pid=PID):
    return StackSample(ts=ts, pid=pid, thread_id=1, thread_name="MainThread", frames=frames,
                       active=False, is_main=True, category=cat, os_thread_id=pid)


def other(ts, name="metrics-writer", pid=PID, main=False):
    return StackSample(ts=ts, pid=pid, thread_id=2, thread_name=name, frames=(Frame("helper", PROJ, 12),),
                       active=False, is_main=main, category=Category.IDLE)


def fill(store, seconds, rate=5.0, frames=LOCK, cat=Category.IDLE, start=T0):
    n = int(seconds * rate) + 1
    for i in range(n):
        ts = start + i / rate
        fr = frames[i % len(frames)] if isinstance(frames, list) else frames
        store.add([main_sample(ts, fr, cat), other(ts)])
    return start + (n - 1) / rate


def gpu(store, ts, util, sm_util=None, pid=PID):
    store.add([GpuSample(ts=ts, index=0, util_gpu=util), GpuProcess(ts=ts, gpu_index=0, pid=pid, sm_util=sm_util)])


def test_unchanged_stack_without_gpu_info_is_stuck_after_threshold():
    store = Store()
    end = fill(store, 12.0)
    v = stuck_verdict(store, PID, threshold=10.0)
    assert v.stuck
    assert v.where == "project/train.py:42 in train_step"
    assert v.since == T0 and abs(v.held_s - 12.0) < 1e-6
    assert v.gpu == "unknown" and "GPU activity unknown" in v.reason
    assert [s.thread_name for s in v.others] == ["metrics-writer"]
    # Just under the threshold: not yet.
    assert not stuck_verdict(store, PID, threshold=10.0, now=T0 + 9.0).stuck
    assert end == store.now


def test_moving_stack_is_not_stuck():
    store = Store()
    fill(store, 20.0, frames=MOVING, cat=Category.FORWARD)
    v = stuck_verdict(store, PID, threshold=5.0)
    assert not v.stuck and "moved" in v.reason


def test_run_starts_at_the_last_change():
    store = Store()
    t = fill(store, 10.0, frames=MOVING, cat=Category.FORWARD)
    fill(store, 8.0, start=t + 0.2)
    v = stuck_verdict(store, PID, threshold=5.0)
    assert v.stuck and v.since == t + 0.2 and v.held_exact


def test_busy_gpu_is_not_stuck_unless_in_a_collective():
    store = Store()
    fill(store, 40.0)
    gpu(store, store.now, util=97.0)
    v = stuck_verdict(store, PID, threshold=30.0)
    assert not v.stuck and v.gpu == "busy" and "GPU is busy" in v.reason

    # A hung NCCL collective spins on the GPU: NVML says busy, the job is stuck all the same.
    coll = (Frame("all_reduce", "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2500),) + LOCK
    store2 = Store()
    fill(store2, 40.0, frames=coll, cat=Category.COLLECTIVE)
    gpu(store2, store2.now, util=100.0)
    v2 = stuck_verdict(store2, PID, threshold=30.0)
    assert v2.stuck and "collective" in v2.reason


def test_idle_gpu_from_util_buffer_and_per_process_util():
    store = Store()
    fill(store, 40.0)
    now = store.now
    gpu(store, now, util=None)
    store.add([UtilPoint(ts=now - 0.2 * k, index=0, util=0.0) for k in range(20, 0, -1)])
    assert gpu_state(store, PID, now) == "idle"
    assert target_gpu_busy(store, PID) is False
    v = stuck_verdict(store, PID, threshold=30.0)
    assert v.stuck and v.gpu == "idle" and "GPU idle" in v.reason
    # Per-process SM utilisation wins over the device's (another job may share the GPU).
    gpu(store, now + 0.1, util=90.0, sm_util=0.0)
    assert gpu_state(store, PID, now + 0.1) == "idle"
    gpu(store, now + 0.2, util=0.0, sm_util=40.0)
    assert gpu_state(store, PID, now + 0.2) == "busy"
    # The target on no GPU we can see: unknown, the stack decides.
    assert gpu_state(store, PID + 1, now) == "unknown"


def test_stale_samples_and_exited_target_give_no_verdict():
    store = Store()
    fill(store, 40.0)
    v = stuck_verdict(store, PID, threshold=30.0, now=store.now + 30.0)
    assert not v.stuck and "no stack sample" in v.reason
    store.add([ProcSample(ts=store.now + 1, pid=PID, status="exited", role="target")])
    v = stuck_verdict(store, PID, threshold=30.0)
    assert not v.stuck and "exited" in v.reason
    assert not judge([], T0, 30.0).stuck


def test_history_shorter_than_the_run_says_at_least():
    main = [main_sample(T0 + i) for i in range(100)]
    v = judge(main, T0 + 99, 30.0, history_start=T0 - 0.5)
    assert v.stuck and not v.held_exact and "≥" in v.reason


def test_real_deadlock_capture_is_judged_stuck_at_the_lock_line():
    path = os.path.join(os.path.dirname(__file__), "fixtures", "stacks", "deadlock.json")
    with open(path) as f:
        doc = json.load(f)
    parser = StackParser(lambda fn, ln: doc["source_lines"].get(f"{fn}:{ln}"))
    store = Store()
    for i in range(20):  # the same real dump, repeated as a hung process gives it
        store.add(parser.samples(doc["dump"], T0 + i * 0.2))
    pid = doc["dump"][0]["pid"]
    v = stuck_verdict(store, pid, threshold=3.0)
    assert v.stuck
    assert v.where.startswith("project/stack_targets.py:") and v.where.endswith("in mode_deadlock")
    assert "# DEADLOCK" in (v.frame.code or "")
    assert [s.thread_name for s in v.others] == ["metrics-writer"]
