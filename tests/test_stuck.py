"""Stuck-job verdicts from plain samples (the live deadlock test is in test_stacks_live.py)."""

import json
import os
from dataclasses import replace

import pytest

from gputop.analysis.stuck import judge

from gputop.analysis.window import read_window, stuck_verdict
from gputop.model import Category, Frame, PaneViews, GpuProcess, GpuSample, ProcSample, StackSample, UtilPoint
from gputop.analysis.classify import classify, is_library
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


def gpu_state(store, pid, now):
    """The stuck verdict's reading of the target's GPUs, from the window it judges."""
    return read_window(store, pid, now=now).gpu_state


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
    v = stuck_verdict(store, PID, threshold=30.0)
    assert v.stuck and v.gpu == "idle" and "GPU idle" in v.reason
    # Per-process SM utilisation wins over a busy device's (another job may share the GPU)...
    gpu(store, now + 0.1, util=90.0, sm_util=0.0)
    store.add([UtilPoint(ts=now + 0.1, index=0, util=90.0)])
    assert gpu_state(store, PID, now + 0.1) == "idle"
    gpu(store, now + 0.2, util=90.0, sm_util=40.0)
    store.add([UtilPoint(ts=now + 0.2, index=0, util=90.0)])
    assert gpu_state(store, PID, now + 0.2) == "busy"
    # ...not over an idle one: a process's reading lags, and an idle GPU runs nothing of anyone's.
    gpu(store, now + 6.0, util=0.0, sm_util=40.0)
    store.add([UtilPoint(ts=now + 0.2 + 0.2 * k, index=0, util=0.0) for k in range(1, 30)])
    assert gpu_state(store, PID, now + 6.0) == "idle"
    # The target on no GPU we can see while another process is (another PID namespace): the job's
    # GPUs' time line, as the advisor has always read it; with no GPU at all, unknown.
    assert gpu_state(store, PID + 1, now) == "idle"
    nogpu = Store()
    fill(nogpu, 5.0)
    assert gpu_state(nogpu, PID, nogpu.now) == "unknown"


def test_a_lagging_per_process_reading_does_not_make_an_idle_gpu_busy():
    """NVML's per-process utilisation is read every few seconds and averages behind: a held-out
    NCCL rank blocked on a queue read 32 % there 4 s into its GPU's idleness (every device poll
    0 %), and the stuck verdict's "the GPU is busy" kept its hang from forming."""
    store = Store()
    fill(store, 12.0)
    now = store.now
    for k in range(4, -1, -1):
        gpu(store, now - 2.0 * k, util=0.0, sm_util=32.0)
    assert gpu_state(store, PID, now) == "idle"
    # The GPU busy now: the reading is believed.
    gpu(store, now + 1.0, util=60.0, sm_util=32.0)
    assert gpu_state(store, PID, now + 1.0) == "busy"


def test_the_gpus_work_before_the_thread_stopped_is_not_work_while_it_waits():
    """A rank blocked on a queue: its GPU ran its last kernels until the thread stopped, then
    idled. Over the usual 5 s look-back it reads busy for 5 s; over the stillness it is idle."""
    store = Store()
    step = fill(store, 6.0, frames=MOVING, cat=Category.FORWARD)
    still = fill(store, 3.0, start=step + 0.2)  # then still at one line for 3 s
    for k in range(int((still - T0) / 0.5) + 1):
        t = T0 + 0.5 * k
        store.add([GpuSample(ts=t, index=0, util_gpu=80.0 if t <= step + 0.2 else 0.0),
                   GpuProcess(ts=t, gpu_index=0, pid=PID)])
    w = read_window(store, PID, now=still)
    assert w.gpu_state == "busy"  # its kernels before the stop are in the 5 s look-back
    assert w.gpu_state_while_still == "idle"
    assert w.stuck is not None and w.stuck.works is None, w.stuck.reason


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
    parser = StackParser(lambda fn, ln: doc["source_lines"].get(f"{fn}:{ln}"), classify, is_library)
    store = Store()
    for i in range(20):  # the same real dump, repeated as a hung process gives it
        store.add(parser.samples(doc["dump"], T0 + i * 0.2))
    pid = doc["dump"][0]["pid"]
    v = stuck_verdict(store, pid, threshold=3.0)
    assert v.stuck
    assert v.where.startswith("project/stack_targets.py:") and v.where.endswith("in mode_deadlock")
    assert "# DEADLOCK" in (v.frame.code or "")
    assert [s.thread_name for s in v.others] == ["metrics-writer"]


# --------------------------------------------------------------------------- slow is not stuck
# The measured false alarms (bench/advisor_bench.py on an H100): slow jobs whose main stack looks
# the same sample after sample while the GPU idles, but whose processes burn CPU.

GETITEM = (Frame("SyntheticImages.__getitem__", "/home/user/project/data.py", 52, code="x = torch.tanh(x @ w)"),
           Frame("main", PROJ, 90))
QUEUE_WAIT = (Frame("wait", "/usr/lib/python3.11/threading.py", 331),
              Frame("_MultiProcessingDataLoaderIter._try_get_data",
                    "/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1133),
              Frame("main", PROJ, 90))
COLL = (Frame("all_reduce", "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2500),) + LOCK


def timeline(store, seconds, frames, cat, active, target_cpu, workers=(), gpu_util=0.0):
    """Main stacks at 5 Hz, the target's and each worker's CPU every second (as the host and
    stacks sources write them), an idle (or busy) GPU."""
    for i in range(int(seconds * 5) + 1):
        ts = T0 + i / 5
        batch = [StackSample(ts=ts, pid=PID, thread_id=1, thread_name="MainThread", frames=frames, active=active,
                             is_main=True, category=cat, os_thread_id=PID)]
        if i % 5 == 0 and i:
            batch.append(ProcSample(ts=ts, pid=PID, ppid=1, cpu_percent=target_cpu, role="target"))
            batch += [ProcSample(ts=ts, pid=PID + 1 + k, ppid=PID, cpu_percent=c, role="worker")
                      for k, c in enumerate(workers)]
        store.add(batch)
    gpu(store, store.now, util=gpu_util)


def test_busy_main_thread_with_an_unchanged_stack_is_not_stuck():
    # dataloader-starved: num_workers=0, the main thread computes in __getitem__ (~1600 % with
    # torch's intra-op threads); the GPU waits.
    store = Store()
    timeline(store, 40.0, GETITEM, Category.DATA_FETCH, active=True, target_cpu=1597.0)
    v = stuck_verdict(store, PID, threshold=5.0)
    assert not v.stuck
    assert v.held_s >= 39.0 and v.gpu == "idle"
    assert "1597 % CPU" in v.reason and v.tree_cores == pytest.approx(15.97)
    # The OS wins over py-spy's flag: the same stack at ~100 % CPU but read as blocked.
    store2 = Store()
    timeline(store2, 40.0, GETITEM, Category.DATA_FETCH, active=False, target_cpu=100.0)
    assert not stuck_verdict(store2, PID, threshold=5.0).stuck


def test_blocked_main_thread_with_busy_workers_is_not_stuck():
    # workers-saturated / oversubscribed: the main thread waits on the loader's queue (blocked,
    # ~0 %) while every worker runs flat out.
    store = Store()
    timeline(store, 40.0, QUEUE_WAIT, Category.DATA_WAIT, active=False, target_cpu=0.5, workers=(99.0, 100.0, 98.0))
    v = stuck_verdict(store, PID, threshold=5.0)
    assert not v.stuck and "are at 298 % CPU" in v.reason
    # Workers that are not the target's (another job's processes) do not count.
    store2 = Store()
    timeline(store2, 40.0, QUEUE_WAIT, Category.DATA_WAIT, active=False, target_cpu=0.5)
    store2.add([ProcSample(ts=store2.now, pid=999, ppid=1, cpu_percent=100.0, role="gpu")])
    assert stuck_verdict(store2, PID, threshold=5.0).stuck


def test_everything_blocked_at_no_cpu_is_stuck_at_the_lock_line():
    store = Store()
    timeline(store, 12.0, LOCK, Category.IDLE, active=False, target_cpu=0.3, workers=(0.0, 0.2))
    v = stuck_verdict(store, PID, threshold=10.0)
    assert v.stuck and v.where == "project/train.py:42 in train_step"
    assert v.frame.code == "with lock_b:"
    assert "GPU idle" in v.reason and "processes at 0 % CPU" in v.reason
    assert v.tree_cores == pytest.approx(0.005)


def test_a_job_that_worked_then_hung_is_stuck_soon_after():
    # The stack stopped moving at T0 + 20; the CPU readings before that do not count.
    store = Store()
    timeline(store, 20.0, MOVING[0], Category.FORWARD, active=True, target_cpu=100.0, workers=(100.0,))
    for i in range(1, 8 * 5 + 1):
        ts = T0 + 20 + i / 5
        batch = [main_sample(ts)]
        if i % 5 == 0:
            batch += [ProcSample(ts=ts, pid=PID, ppid=1, cpu_percent=0.0, role="target"),
                      ProcSample(ts=ts, pid=PID + 1, ppid=PID, cpu_percent=0.0, role="worker")]
        store.add(batch)
    v = stuck_verdict(store, PID, threshold=5.0)
    assert v.stuck and abs(v.held_s - 8.0) < 0.3 and v.tree_cores == 0.0


def test_a_hung_collective_is_stuck_even_while_gpu_and_cpu_spin():
    # NCCL's kernel spins (GPU 100 %), the main thread spin-waits and the proxy threads poll:
    # neither says the job progresses, only the stack does.
    store = Store()
    timeline(store, 40.0, COLL, Category.COLLECTIVE, active=True, target_cpu=200.0, gpu_util=100.0)
    v = stuck_verdict(store, PID, threshold=30.0)
    assert v.stuck and "collective" in v.reason and v.gpu == "busy"


def test_without_cpu_readings_the_main_threads_own_flag_decides():
    # Stacks only (no host source): a main thread on CPU in an unchanged stack is computing...
    main = [main_sample(T0 + i / 5, frames=GETITEM, cat=Category.DATA_FETCH) for i in range(100)]
    busy = [replace(s, active=True) for s in main]
    assert not judge(busy, T0 + 99 / 5, 10.0).stuck
    # ... and a blocked one with no other word on progress is stuck, as before.
    v = judge(main, T0 + 99 / 5, 10.0)
    assert v.stuck and v.tree_cores is None and "CPU" not in v.reason


# --------------------------------------------------------------------------- the stuck watch's Event


def test_stuck_watch_event_uses_the_same_decision():
    from gputop.analysis.watch import StuckWatch

    store = Store()
    watch = StuckWatch(store, PID, threshold=5.0)
    now = [T0]

    def feed(seconds, frames, cat, active, cpu):
        events = []
        for i in range(int(seconds * 5)):
            now[0] += 0.2
            batch = [StackSample(ts=now[0], pid=PID, thread_id=1, frames=frames, active=active, is_main=True,
                                 category=cat)]
            if round((now[0] - T0) * 5) % 5 == 0:
                batch.append(ProcSample(ts=now[0], pid=PID, cpu_percent=cpu, role="target"))
                gpu(store, now[0], util=0.0)  # the GPU the target holds is idle
            store.add(batch)
            events += [e for e in watch.poll() if getattr(e, "source", "") == "stuck"]
        return events

    # slow, not stuck: 20 s in one __getitem__ line at 100 % CPU, GPU idle
    assert feed(20.0, GETITEM, Category.DATA_FETCH, True, 100.0) == []
    # then the main thread blocks at ~0 % CPU: one event, at the lock line
    events = feed(8.0, LOCK, Category.IDLE, False, 0.0)
    assert len(events) == 1
    assert "looks stuck" in events[0].message and "project/train.py:42 in train_step" in events[0].message
    assert "GPU idle, processes at 0 % CPU" in events[0].message
    # and one when it moves again
    moved = feed(1.0, MOVING[0], Category.FORWARD, True, 100.0)
    assert len(moved) == 1 and "moving again" in moved[0].message


def test_one_stuck_verdict_a_tick_for_the_advisor_the_stuck_watch_and_the_panes(monkeypatch):
    """The job stage reads one evidence window a tick and the advisor, the stuck watch and the
    panes' views all read it: one judgement of one set of inputs, one rank map, one pass of the
    ranks over the stacks; the event, the finding and the Stacks tab say the same."""
    import gputop.analysis.window as window_mod
    from gputop.advisor.engine import AdvisorSource
    from gputop.advisor.stage import JobStage
    from gputop.analysis.views import ViewsStage
    from gputop.analysis.watch import StuckWatch

    store = Store()
    fill(store, 40.0)
    gpu(store, store.now, util=0.0)
    calls = {"judge": 0, "rank_map": 0, "as_ranks": 0}

    def counting(name):
        real = getattr(window_mod, name)

        def f(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        return f

    for name in calls:
        monkeypatch.setattr(window_mod, name, counting(name))
    stage = JobStage(store, PID, stuck_after_s=30.0,
                     advisor=AdvisorSource(store, target_pid=PID, stuck_after_s=30.0),
                     stuck_watch=StuckWatch(store, PID, threshold=30.0), views=ViewsStage(store, PID, 30.0))
    first = stage.poll()  # a fresh start also looks back once (the window as it stood a second ago)
    assert stage.windows_read == 2
    events = [x for x in first if getattr(x, "source", None) == "stuck"]
    assert len(events) == 1 and "looks stuck" in events[0].message
    ctx = stage.advisor.advisor.last_context
    (views,) = [x for x in first if isinstance(x, PaneViews)]
    assert ctx.stuck.stuck and ctx.stuck.where in events[0].message
    assert views.stacks.verdict is ctx.stuck  # the Stacks tab's verdict is the advisor's, the same object
    # The next tick: one window, one judgement, one rank map, one ranks pass; the watch, having
    # told, says nothing.
    gpu(store, store.now + 1.0, util=0.0)
    for name in calls:
        calls[name] = 0
    again = stage.poll()
    assert stage.windows_read == 3
    assert calls == {"judge": 1, "rank_map": 1, "as_ranks": 1}
    assert not [x for x in again if getattr(x, "source", None) == "stuck"]
    (views,) = [x for x in again if isinstance(x, PaneViews)]
    assert views.stacks.verdict is stage.advisor.advisor.last_context.stuck
