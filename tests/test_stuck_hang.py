"""The verdict at attach and the kind of hang, from plain samples; the procfs source on threads
of this very process (blocked on a lock, a pipe, a socket)."""

from __future__ import annotations

import os
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from gputop.advisor.rules.data import _worker_read_blocked_share
from gputop.analysis.hang import DEADLOCK, SOCKET, WORKER, diagnose, progress
from gputop.analysis.stuck import EARLY_MIN_S, idle_reach, judge
from gputop.model import Category, Frame, StackSample, TaskSample, ThreadState

PID = 4242
T0 = 1_700_000_000.0
PROJ = "/home/user/project/train.py"
LOCK_MAIN = (Frame("Callbacks.on_step_end", PROJ, 42, code="with self.log_lock:"), Frame("main", PROJ, 90))
LOCK_HELPER = (Frame("Callbacks.flush", PROJ, 50, code="with self.state_lock:"),
               Frame("Thread.run", "/usr/lib/python3.11/threading.py", 975))
LOADER = "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py"
WAIT_DATA = (Frame("_MultiProcessingDataLoaderIter._get_data", LOADER, 1300),
             Frame("main", PROJ, 80, code="for x, y in loader:"))
RECV = (Frame("Net.__getitem__", PROJ, 20, code="data = conn.recv(65536)"),
        Frame("_worker_loop", "/usr/lib/python3/site-packages/torch/utils/data/_utils/worker.py", 300))


def stack(ts, frames, pid=PID, tid=None, main=True, cat=Category.IDLE, name="MainThread"):
    return StackSample(ts=ts, pid=pid, thread_id=tid or pid, thread_name=name, frames=frames, active=False,
                       is_main=main, category=cat, os_thread_id=tid or pid)


def task(ts, cpu_ns=(1_000_000, 2_000_000), runs=(10, 20), rchar=1000, wchar=10, pid=PID, ppid=1, syscall="futex"):
    threads = tuple(ThreadState(tid=pid + i, state="S", cpu_ns=c, runs=r, wchan="futex_do_wait", syscall=syscall)
                    for i, (c, r) in enumerate(zip(cpu_ns, runs)))
    return TaskSample(ts=ts, pid=pid, ppid=ppid, threads=threads, rchar=rchar, wchar=wchar)


def hung(seconds, rate=5.0, start=T0):
    main = [stack(start + i / rate, LOCK_MAIN) for i in range(int(seconds * rate) + 1)]
    others = (stack(main[-1].ts, LOCK_HELPER, tid=PID + 1, main=False, name="metrics-flusher"),)
    tasks = {PID: [task(start + i) for i in range(int(seconds) + 1)]}
    return main, others, tasks


# --------------------------------------------------------------------------- at attach


def test_hung_before_attach_is_stuck_within_seconds_with_the_default_threshold():
    main, others, tasks = hung(EARLY_MIN_S + 0.4)
    v = judge(main, main[-1].ts, 30.0, others=others, tasks=tasks, history_start=T0 - 90)
    assert v.stuck and v.early and not v.held_exact, v.reason
    assert v.held_s >= EARLY_MIN_S and "≥" in v.reason
    assert v.diagnosis is not None and v.diagnosis.kind == DEADLOCK
    assert [p.label for p in v.diagnosis.parties] == ["main thread", "thread metrics-flusher"]
    assert "train.py:50 in Callbacks.flush" in v.diagnosis.summary
    # Too early: not yet.
    main2, others2, tasks2 = hung(EARLY_MIN_S - 1.0)
    assert not judge(main2, main2[-1].ts, 30.0, others=others2, tasks=tasks2).stuck


def test_confidence_grows_and_the_gpu_buffer_extends_the_reach():
    main, others, tasks = hung(4.0)
    short = judge(main, main[-1].ts, 30.0, others=others, tasks=tasks)
    main, others, tasks = hung(12.0)
    longer = judge(main, main[-1].ts, 30.0, others=others, tasks=tasks)
    assert short.stuck and longer.stuck and longer.confidence > short.confidence
    reach = idle_reach([(main[-1].ts - 14.0 + 0.2 * i, 0.0) for i in range(71)], main[-1].ts)
    v = judge(main, main[-1].ts, 30.0, gpu="idle", others=others, tasks=tasks, gpu_idle_s=reach)
    assert v.stuck and round(v.held_s) == 14 and "≥ 14 s" in v.reason
    assert any("GPU idle for 14 s" in e for e in v.evidence)
    assert idle_reach([(1.0, 50.0), (2.0, 0.0), (3.0, 0.0)], 3.0) == 1.0
    assert idle_reach([(1.0, 0.0), (2.0, 50.0)], 2.0) == 0.0


def test_cpu_or_io_moving_is_not_stuck_at_attach():
    main, others, _ = hung(8.0)
    busy = {PID: [task(T0 + i, cpu_ns=(i * 900_000_000, 0), runs=(i, 0)) for i in range(9)]}
    v = judge(main, main[-1].ts, 30.0, others=others, tasks=busy)
    assert not v.stuck and "% CPU" in v.reason
    writing = {PID: [task(T0 + i, wchar=i * 50_000_000) for i in range(9)]}
    v = judge(main, main[-1].ts, 30.0, others=others, tasks=writing)
    assert not v.stuck and "MB/s" in v.reason
    p = progress(writing, T0, T0 + 8)
    assert p is not None and p.io_bps == pytest.approx(50e6, rel=0.01)


def test_a_job_that_moved_while_watched_waits_for_the_threshold():
    moving = [stack(T0 + i / 5, (Frame("step", PROJ, 30 + i % 3), Frame("main", PROJ, 90))) for i in range(10)]
    main, others, tasks = hung(6.0, start=T0 + 2.0)
    v = judge(moving + main, main[-1].ts, 30.0, others=others, tasks=tasks)
    assert not v.stuck and "moved" in v.reason


def test_a_rank_standing_still_while_every_peer_spins_in_a_collective_is_the_one_that_never_arrives():
    # NCCL: the peers' GPUs spin in the all-reduce (spin_pids); the target stopped while watched in
    # its own code and nothing says it works: stuck after SPIN_STUCK_S, not the 30 s threshold.
    from gputop.analysis.stuck import SPIN_STUCK_S

    peer = PID + 50
    moving = [stack(T0 + i / 5, (Frame("step", PROJ, 30 + i % 3), Frame("main", PROJ, 90))) for i in range(10)]
    main, others, tasks = hung(SPIN_STUCK_S + 1.0, start=T0 + 2.0)
    ranks = {PID: 0, peer: 1}
    v = judge(moving + main, main[-1].ts, 30.0, others=others, tasks=tasks, ranks=ranks,
              spin_pids=frozenset({peer}))
    assert v.stuck and not v.early and "while the other ranks wait for it in a collective" in v.reason, v.reason
    # not while a peer's GPU works (a straggler's case), nor before SPIN_STUCK_S, nor when it works
    assert not judge(moving + main, main[-1].ts, 30.0, others=others, tasks=tasks, ranks=ranks).stuck
    short = [s for s in main if s.ts <= main[0].ts + SPIN_STUCK_S - 1.0]
    assert not judge(moving + short, short[-1].ts, 30.0, others=others, tasks=tasks, ranks=ranks,
                     spin_pids=frozenset({peer})).stuck
    busy = {PID: [task(T0 + 2.0 + i, cpu_ns=(1_000_000 + i * 900_000_000, 2_000_000)) for i in range(8)]}
    assert not judge(moving + main, main[-1].ts, 30.0, others=others, tasks=busy, ranks=ranks,
                     spin_pids=frozenset({peer})).stuck


def test_a_main_thread_that_sleeps_on_purpose_is_not_stuck_at_attach():
    for code in ("time.sleep(5)", "time.sleep(interval)", "time.sleep(30)", "time.sleep(1e1)"):
        main = [stack(T0 + i / 5, (Frame("main", PROJ, 9, code=code),)) for i in range(40)]
        v = judge(main, main[-1].ts, 30.0, tasks={PID: [task(T0 + i) for i in range(9)]})
        assert not v.stuck and "sleeps" in v.reason, code


def test_a_sleep_longer_than_the_threshold_since_before_the_attach_is_stuck_at_once():
    # A new user's job asleep in `time.sleep(100000)` (its "hang") since before the attach was
    # called stuck only at the 30 s threshold, where /proc's flat counters said so at 4 s.
    for code in ("time.sleep(100000)", "time.sleep(60)", "time.sleep(1_000.5)"):
        main = [stack(T0 + i / 5, (Frame("wait_for_shard", PROJ, 9, code=code),)) for i in range(40)]
        v = judge(main, main[-1].ts, 30.0, tasks={PID: [task(T0 + i) for i in range(9)]})
        assert v.stuck and v.early, code
        assert any(f"`{code}`, longer than the stuck threshold (30 s)" in e for e in v.evidence)


def test_a_sleep_whose_source_cannot_be_read_waits_for_the_threshold_when_the_kernel_says_sleep():
    # A new user's `python -c "import time; time.sleep(60)"` (no file to read the line from) was
    # called stuck 4 s after the attach; /proc said the thread sleeps in clock_nanosleep.
    from dataclasses import replace

    main = [stack(T0 + i / 5, (Frame("<module>", "<string>", 1),)) for i in range(40)]
    asleep = [replace(task(T0 + i), threads=(ThreadState(PID, state="S", syscall="clock_nanosleep"),))
              for i in range(9)]
    v = judge(main, main[-1].ts, 30.0, tasks={PID: asleep})
    assert not v.stuck and "nanosleep" in v.reason, v.reason
    # The same unreadable line blocked elsewhere (a futex: a lock, a queue) is still a hang at once.
    locked = [replace(task(T0 + i), threads=(ThreadState(PID, state="S", syscall="futex"),)) for i in range(9)]
    assert judge(main, main[-1].ts, 30.0, tasks={PID: locked}).stuck


def test_without_proc_readings_psutil_and_pyspy_decide_as_in_a_replay():
    from gputop.model import ProcSample

    main, others, _ = hung(6.0)
    procs = {PID: [ProcSample(ts=T0 + i, pid=PID, role="target", cpu_percent=0.0) for i in range(1, 7)]}
    v = judge(main, main[-1].ts, 30.0, others=others, procs=procs)
    assert v.stuck and v.early and v.proc is None
    assert not judge(main, main[-1].ts, 30.0, others=others).stuck  # no CPU reading at all: wait


# --------------------------------------------------------------------------- the kind


def test_workers_hung_on_a_socket_are_a_hung_worker_with_each_line():
    main = stack(T0, WAIT_DATA, cat=Category.DATA_WAIT)
    workers = [stack(T0, RECV, pid=PID + k, cat=Category.DATA_FETCH) for k in (1, 2)]
    tasks = {PID + k: TaskSample(T0, PID + k, PID, (ThreadState(PID + k, state="S", syscall="recvfrom",
                                                                fd_path="socket:[77]"),)) for k in (1, 2)}
    d = diagnose(main, workers, PID, tasks=tasks)
    assert d.kind == WORKER and "socket" in d.summary and "train.py:20 in Net.__getitem__" in d.summary
    lines = [p.line() for p in d.parties]
    assert sum("train.py:20 in Net.__getitem__" in ln and "socket:[77]" in ln for ln in lines) == 2
    assert "DataLoader(..., timeout=" in d.action and "settimeout" in d.action
    # A socket wait outside any DataLoader is its own kind.
    d = diagnose(stack(T0, RECV[:1]), [], PID)
    assert d.kind == SOCKET


def test_socket_waits_in_workers_are_not_reads_from_storage():
    workers = [SimpleNamespace(category=Category.DATA_FETCH, active=False, frames=RECV) for _ in range(6)]
    share, n = _worker_read_blocked_share(SimpleNamespace(worker_stacks=workers))
    assert n == 6 and share == 0.0


# --------------------------------------------------------------------------- the procfs source


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_procfs_source_sees_threads_blocked_on_a_lock_a_pipe_and_a_socket():
    from gputop.sources.procfs import ProcfsSource

    lock = threading.Lock()
    lock.acquire()
    r, w = os.pipe()
    a, b = socket.socketpair()
    tids: dict[str, int] = {}

    def on(name, fn):
        def run():
            tids[name] = threading.get_native_id()
            fn()
        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        return t

    threads = [on("lock", lock.acquire), on("pipe", lambda: os.read(r, 1)), on("sock", lambda: a.recv(1))]
    try:
        time.sleep(0.3)
        src = ProcfsSource(os.getpid())
        (mine,) = [s for s in src.poll() if s.pid == os.getpid()]
        by = {t.tid: t for t in mine.threads}
        assert mine.threads[0].tid == os.getpid() and mine.rchar is not None
        assert {by[tids[n]].state for n in tids} == {"S"}
        if by[tids["pipe"]].syscall is not None:  # syscall is readable (same user or root)
            assert by[tids["lock"]].syscall == "futex"
            assert by[tids["pipe"]].fd_path.startswith("pipe:[")
            assert by[tids["sock"]].fd_path.startswith("socket:[")
        assert by[tids["lock"]].cpu_ns is not None
    finally:
        lock.release()
        os.write(w, b"x")
        b.send(b"x")
        for t in threads:
            t.join(2)
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


@pytest.mark.parametrize("sampled, running, line", [
    (1, 2, "1 of 2 DataLoader workers sampled: blocked inside the dataset (socket)"),
    (2, 3, "2 of 3 DataLoader workers sampled: all blocked inside the dataset (socket)"),
    (2, 2, "2 of 2 DataLoader workers blocked inside the dataset (socket)"),
    (2, None, "2 of 2 DataLoader workers blocked inside the dataset (socket)"),  # no /proc readings
])
def test_hung_workers_are_counted_against_those_the_os_shows(sampled, running, line):
    main = stack(T0, WAIT_DATA, cat=Category.DATA_WAIT)
    workers = [stack(T0, RECV, pid=PID + k, cat=Category.DATA_FETCH) for k in range(1, sampled + 1)]
    d = diagnose(main, workers, PID, workers_running=running)
    assert d.kind == WORKER and d.evidence[0].startswith(line)


def test_the_stuck_finding_counts_the_workers_once():
    """Two workers, one of them sampled so far (a worker's stacks come every few seconds): the
    hang's line and the workers' CPU line say the same number of workers."""
    from gputop.advisor.context import context_from_samples
    from gputop.advisor.rules.stuck import check_stuck
    from gputop.model import ProcSample

    now = T0 + 12.0
    main = [stack(T0 + i / 5, WAIT_DATA, cat=Category.DATA_WAIT) for i in range(61)]
    worker = stack(now - 1.0, RECV, pid=PID + 1, cat=Category.DATA_FETCH)
    procs = {PID: [ProcSample(ts=T0 + i, pid=PID, ppid=1, name="python", role="target", cpu_percent=0.0)
                   for i in range(13)]}
    for k in (1, 2):
        procs[PID + k] = [ProcSample(ts=T0 + i, pid=PID + k, ppid=PID, name="pt_data_worker", role="worker",
                                     cpu_percent=0.0) for i in range(13)]
    ctx = context_from_samples(now=now, window_s=60.0, procs=procs, stacks=main + [worker], target_pid=PID,
                               stuck_after_s=30.0)
    hit = check_stuck(ctx)
    assert hit is not None, ctx.stuck
    ev = " | ".join(hit.evidence)
    assert "1 of 2 DataLoader workers sampled: blocked inside the dataset" in ev, ev
    assert "2 loader workers at 0 % CPU each" in ev, ev
    assert "1 of 1 DataLoader workers" not in ev


# --------------------------------------------------------------------------- a lock wait, whatever the lock is called


def _blocked(frames, tid, name="MainThread", main=True, cat=Category.IDLE):
    return stack(T0, frames, tid=tid, main=main, cat=cat, name=name)


def _kernel(*tids, syscall="futex", wchan="futex_do_wait", pid=PID):
    return {pid: TaskSample(T0, pid, 1, tuple(ThreadState(t, state="S", syscall=syscall, wchan=wchan) for t in tids))}


AB_MAIN = (Frame("<module>", PROJ, 13, code="with b:"),)
AB_HELPER = (Frame("helper", PROJ, 7, code="with a:"), Frame("Thread.run", "/usr/lib/python3.11/threading.py", 975))


@pytest.mark.parametrize("main_code, helper_code", [
    ("with b:", "with a:"),
    ("with lock_b:", "with lock_a:"),
    ("with self.b, self.c:", "a.acquire()"),
    ("with locks[1] as held:  # the second", "ok = x.acquire(timeout=-1)"),
])
def test_two_threads_blocked_taking_locks_are_a_deadlock_whatever_the_locks_are_called(main_code, helper_code):
    main = _blocked((Frame("<module>", PROJ, 13, code=main_code),), PID)
    helper = _blocked((Frame("helper", PROJ, 7, code=helper_code),) + AB_HELPER[1:], PID + 1, "writer", main=False)
    d = diagnose(main, [helper], PID, tasks=_kernel(PID, PID + 1))
    assert d.kind == DEADLOCK, d
    assert "take the locks in one order" in d.action
    assert all(p.waits == "lock" for p in d.parties)
    # No /proc readings (a replay, another platform): the line's shape is enough.
    assert diagnose(main, [helper], PID).kind == DEADLOCK


def test_a_lock_wait_is_told_by_native_frames_and_threading_acquire_frames_without_source():
    native = (Frame("__lll_lock_wait", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
              Frame("PyThread_acquire_lock_timed", "/usr/lib/libpython3.11.so.1.0"),
              Frame("<module>", PROJ, 13))  # no source line
    rlock = (Frame("_RLock.acquire", "/usr/lib/python3.11/threading.py", 140, code="rc = self._block.acquire(blocking, timeout)"),
             Frame("helper", PROJ, 7))
    d = diagnose(_blocked(native, PID), [_blocked(rlock, PID + 1, "writer", main=False)], PID,
                 tasks=_kernel(PID, PID + 1))
    assert d.kind == DEADLOCK, d


def test_waits_that_are_not_lock_acquires_are_not_a_deadlock():
    helper = _blocked(AB_HELPER, PID + 1, "writer", main=False)
    # The kernel has the main thread in a read, not a futex: a `with` line is not a lock wait.
    main = _blocked(AB_MAIN, PID)
    tasks = {PID: TaskSample(T0, PID, 1, (ThreadState(PID, state="S", syscall="read", wchan="pipe_read"),
                                          ThreadState(PID + 1, state="S", syscall="futex", wchan="futex_do_wait")))}
    assert diagnose(main, [helper], PID, tasks=tasks).kind != DEADLOCK
    # A `with` that calls is a context manager, not a lock.
    ctx = _blocked((Frame("<module>", PROJ, 13, code="with torch.no_grad():"),), PID)
    assert diagnose(ctx, [helper], PID, tasks=_kernel(PID, PID + 1)).kind != DEADLOCK
    # A thread waiting on a queue (queue.get -> Condition.wait, its waiter lock in native frames too).
    qwait = (Frame("PyThread_acquire_lock_timed", "/usr/lib/libpython3.11.so.1.0"),
             Frame("Condition.wait", "/usr/lib/python3.11/threading.py", 320, code="waiter.acquire()"),
             Frame("Queue.get", "/usr/lib/python3.11/queue.py", 171, code="self.not_empty.wait()"),
             Frame("consume", PROJ, 30, code="item = q.get()"))
    q = _blocked(qwait, PID)
    assert diagnose(q, [helper], PID, tasks=_kernel(PID, PID + 1)).kind != DEADLOCK
    assert diagnose(q, [], PID, tasks=_kernel(PID)).kind not in (DEADLOCK, "lock")
    # A DataLoader's main thread waiting for its workers, a pin-memory thread on its queue.
    loader = _blocked(WAIT_DATA, PID, cat=Category.DATA_WAIT)
    mpq = (Frame("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py", 103, code="with self._rlock:"),
           Frame("_pin_memory_loop", "/usr/lib/python3/site-packages/torch/utils/data/_utils/pin_memory.py", 50))
    pin = _blocked(mpq, PID + 1, "pin_memory", main=False)
    assert diagnose(loader, [pin], PID, tasks=_kernel(PID, PID + 1)).kind == WORKER


AB_JOB = """
import threading
a, b = threading.Lock(), threading.Lock()
both = threading.Barrier(2)
def helper():
    with b:
        both.wait()
        with a:
            pass
threading.Thread(target=helper, name="writer", daemon=True).start()
both_ready = threading.Timer(0.3, lambda: print("ready", flush=True))
both_ready.start()
with a:
    both.wait()
    with b:
        pass
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_a_real_job_deadlocked_on_locks_named_a_and_b_is_a_deadlock(tmp_path):
    import subprocess
    import sys

    from gputop.analysis.classify import classify, is_library
    from gputop.sources.procfs import ProcfsSource
    from gputop.sources.stacks import AttachError, SourceLines, StackParser, dump_json, find_pyspy

    if find_pyspy() is None:
        pytest.skip("py-spy not installed")
    script = tmp_path / "ab.py"
    script.write_text(AB_JOB)
    job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "ready"
        # On a loaded machine a thread may still be on its way into the lock when the first
        # reading comes: look again, as the advisor does over its seconds of evidence.
        deadline = time.monotonic() + 10
        while True:
            try:
                data = dump_json(job.pid)
            except AttachError as exc:
                pytest.skip(f"py-spy cannot attach here: {exc}")
            samples = StackParser(SourceLines(job.pid).line, classify, is_library).samples(data, time.time())
            (task_sample,) = [s for s in ProcfsSource(job.pid).poll() if s.pid == job.pid]
            main = next(s for s in samples if s.is_main)
            d = diagnose(main, [s for s in samples if not s.is_main], job.pid, tasks={job.pid: task_sample})
            if d.kind == DEADLOCK or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        job.kill()
        job.wait(10)
    assert d.kind == DEADLOCK, [p.line() for p in d.parties]
    assert {p.code for p in d.parties} == {"with a:", "with b:"}
    assert "take the locks in one order" in d.action


def test_the_kinds_of_hang_are_a_table_tried_in_order():
    """Each kind is a row: a test of the hang's parties and the diagnosis it makes; the first that
    holds names the hang, and a scene no row claims is 'unknown'."""
    from gputop.analysis import hang

    kinds = [k for k, _ in hang.KINDS]
    assert kinds[0] == hang.GPU_KERNEL and kinds.index(hang.COLLECTIVE) < kinds.index(hang.DEADLOCK)
    assert kinds.index(hang.DEADLOCK) < kinds.index(hang.LOCK)  # two locks are a deadlock before one a lock
    assert {hang.GPU_KERNEL, hang.COLLECTIVE, hang.IO, hang.WORKER, hang.DEADLOCK, hang.SOCKET, hang.CHILD,
            hang.LOCK} == set(kinds)
    sc = hang.Scene((hang.Party(1, 1, "main thread", "train.py:3 in main", None, "sleep", "sleeps"),), 1,
                    "idle", {}, None)
    assert all(test(sc) is None for _, test in hang.KINDS)
    assert hang.diagnose.__doc__ and "KINDS" in hang.diagnose.__doc__


def test_a_collective_hang_on_gloo_is_not_told_the_nccl_settings():
    # A new user's gloo job (no GPU) was told TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and
    # TORCH_NCCL_DUMP_ON_TIMEOUT=1, which do nothing under gloo.
    from gputop.analysis.hang import diagnose as _diagnose
    from gputop.model import Frame, StackSample

    coll = (Frame("all_reduce", "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", 2500),
            Frame("main", "/home/u/ddp.py", 30, code="dist.all_reduce(t)"))
    main = StackSample(ts=T0, pid=PID, thread_id=PID, frames=coll, is_main=True, category=Category.COLLECTIVE,
                       active=False)
    gloo = _diagnose(main, [], PID, gpu="unknown")
    assert "TORCH_NCCL" not in gloo.action.replace("the TORCH_NCCL_* settings do nothing", "")
    assert "timeout=datetime.timedelta(minutes=10)" in gloo.action
    nccl = _diagnose(main, [], PID, gpu="idle")
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in nccl.action
