"""The stuck verdict under sparse sampling (~1 stack/s, as on a loaded host): a main thread that
every sample shows waiting at one line is not proven stuck while the kernel's count of its CPU
time and wakes shows it working between the samples; real hangs (a lock never released, a poll
loop waiting forever, a wait in a collective) stay stuck. A hang inside a function named like a
checkpoint save is a hang: stuck wins, without flicker, and no saves are invented from sampling
gaps. Plain samples in, as the sources would give them."""

from __future__ import annotations

from dataclasses import replace

from gputop.advisor.engine import Advisor
from gputop.analysis.hang import WORKER
from gputop.analysis.stuck import judge
from gputop.model import (
    Category, Frame, HostSample, ProcSample, StackSample, SystemInfo, TaskSample, ThreadState,
)
from gputop.store import Store

PID = 4242
T0 = 1_700_000_000.0
PROJ = "/home/user/project/train.py"
LOADER = "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py"
SLEEP = (Frame("log_metrics", PROJ, 7, code="time.sleep(0.05)"), Frame("<module>", PROJ, 11, code="log_metrics(); r.tick()"))
POLL = (Frame("wait_ready", PROJ, 30, code="time.sleep(1)"), Frame("<module>", PROJ, 40, code="wait_ready()"))
LOCK_SAVE = (Frame("save_checkpoint", PROJ, 15, code="with lock:"), Frame("<module>", PROJ, 17, code="save_checkpoint()"))
WAIT_DATA = (Frame("_MultiProcessingDataLoaderIter._get_data", LOADER, 1300),
             Frame("main", PROJ, 14, code="for x, y in dl:"))
GETITEM_SLEEP = (Frame("DS.__getitem__", PROJ, 8, code="time.sleep(0.004)"),
                 Frame("_worker_loop", "/usr/lib/python3/site-packages/torch/utils/data/_utils/worker.py", 300))
GETITEM_LOCK = (Frame("DS.__getitem__", PROJ, 8, code="with self.lock:"),
                Frame("_worker_loop", "/usr/lib/python3/site-packages/torch/utils/data/_utils/worker.py", 300))
COLL = (Frame("all_reduce", "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", 2000),
        Frame("main", PROJ, 60))


def sparse_times(seconds: float, start: float = T0) -> list[float]:
    """Stack times ~1/s, unevenly spaced (0.7-1.5 s apart), as a host that holds py-spy back gives."""
    gaps = (0.9, 1.3, 0.7, 1.5, 1.1, 0.8, 1.2)
    out, t, i = [], start, 0
    while t <= start + seconds:
        out.append(t)
        t += gaps[i % len(gaps)]
        i += 1
    return out


def stack(ts, frames, cat, pid=PID, main=True, active=False) -> StackSample:
    return StackSample(ts=ts, pid=pid, thread_id=pid, thread_name="MainThread", frames=frames, active=active,
                       is_main=main, category=cat, os_thread_id=pid)


def task(ts, main_ms_per_s: float, main_runs_per_s: float, pid=PID, ppid=1, start=T0, syscall="clock_nanosleep"):
    """A /proc reading of one process at ``ts``: its main thread's CPU time and wakes grow at the
    given rates since ``start``."""
    dt = ts - start
    main = ThreadState(tid=pid, state="S", cpu_ns=int(main_ms_per_s * 1e6 * dt), runs=int(main_runs_per_s * dt),
                       wchan="hrtimer_nanosleep", syscall=syscall)
    idle = ThreadState(tid=pid + 1, state="S", cpu_ns=1_000_000, runs=10, wchan="futex_do_wait", syscall="futex")
    return TaskSample(ts=ts, pid=pid, ppid=ppid, threads=(main, idle), rchar=1000, wchar=10)


def verdict(frames, cat, seconds, main_ms_per_s, runs_per_s, threshold=30.0):
    main = [stack(t, frames, cat) for t in sparse_times(seconds)]
    tasks = {PID: [task(T0 + i, main_ms_per_s, runs_per_s) for i in range(int(seconds) + 1)]}
    return judge(main, main[-1].ts, threshold, tasks=tasks)


# --------------------------------------------------------------------------- item: a sleep in the loop


def test_a_loop_that_sleeps_at_one_line_but_runs_ms_per_wake_is_not_stuck():
    # The measured sleeper: 18.6 steps/s, 1.7 ms of CPU per wake, asleep at one line in every one of
    # ~45 sparse samples. Past the threshold and at attach alike.
    v = verdict(SLEEP, Category.IDLE, 45.0, main_ms_per_s=34.0, runs_per_s=20.0)
    assert not v.stuck and "1.7 ms each time" in v.reason and "unseen" in v.reason, v.reason
    v = verdict(SLEEP, Category.IDLE, 8.0, main_ms_per_s=34.0, runs_per_s=20.0)
    assert not v.stuck, v.reason


def test_a_poll_loop_waiting_forever_is_stuck_whatever_its_interval():
    # `while not ready: sleep(d)`: it wakes, but each wake runs 30-70 us (measured, d from 1 ms to
    # 1 s); at 1 ms it burns more CPU per second (2.7 %) than the sleeper's loop does not count.
    for ms_per_s, runs_per_s in ((0.066, 1.0), (0.66, 98.0), (26.5, 898.0)):
        v = verdict(POLL, Category.IDLE, 45.0, main_ms_per_s=ms_per_s, runs_per_s=runs_per_s)
        assert v.stuck, (ms_per_s, v.reason)


def test_a_lock_never_released_is_stuck_and_a_collective_is_not_excused_by_cpu():
    v = verdict(LOCK_SAVE, Category.CHECKPOINT_IO, 45.0, main_ms_per_s=0.0, runs_per_s=0.0)
    assert v.stuck
    # A rank in a collective may spin in the driver: long runs of CPU prove nothing there.
    v = verdict(COLL, Category.COLLECTIVE, 45.0, main_ms_per_s=900.0, runs_per_s=50.0)
    assert v.stuck, v.reason


def test_a_loop_that_worked_at_the_line_then_hung_there_is_stuck_soon_after():
    # Ran like the sleeper for 30 s, then its wakes stopped (the loop now blocks at the same line):
    # the recent part of the run decides, not its past.
    main = [stack(t, SLEEP, Category.IDLE) for t in sparse_times(75.0)]
    tasks = {PID: [TaskSample(ts=T0 + i, pid=PID, ppid=1, threads=(
        ThreadState(tid=PID, state="S", cpu_ns=int(34e6 * min(i, 30)), runs=20 * min(i, 30)),), rchar=0, wchar=0)
        for i in range(76)]}
    assert not judge(main, T0 + 30.0, 30.0, tasks=tasks).stuck
    v = judge(main, main[-1].ts, 30.0, tasks=tasks)
    assert v.stuck, v.reason


def test_without_per_thread_readings_the_targets_cpu_tells_a_working_loop_from_a_hang():
    # A replay: psutil's per-process CPU only. The sleeper's 3 % is work between the samples; a
    # lock's 0 % and a 10 ms poll's 0.6 % are not.
    main = [stack(t, SLEEP, Category.IDLE) for t in sparse_times(45.0)]

    def procs(cpu):
        return {PID: [ProcSample(ts=T0 + i, pid=PID, ppid=1, cpu_percent=cpu, role="target") for i in range(46)]}

    v = judge(main, main[-1].ts, 30.0, procs=procs(3.0))
    assert not v.stuck and "3.0 % of a core" in v.reason, v.reason
    for cpu in (0.0, 0.6):
        assert judge(main, main[-1].ts, 30.0, procs=procs(cpu)).stuck, cpu


# --------------------------------------------------------------------------- item: workers asleep in their code


def loader(seconds, main_runs_per_s, main_ms_per_s, worker_frames):
    main = [stack(t, WAIT_DATA, Category.DATA_WAIT) for t in sparse_times(seconds)]
    workers = tuple(stack(main[-1].ts, worker_frames, Category.DATA_FETCH, pid=PID + 10 + w) for w in range(2))
    tasks = {PID: [task(T0 + i, main_ms_per_s, main_runs_per_s, syscall="poll") for i in range(int(seconds) + 1)]}
    for w in range(2):
        tasks[PID + 10 + w] = [task(T0 + i, 2.5, 250.0, pid=PID + 10 + w, ppid=PID) for i in range(int(seconds) + 1)]
    procs = {p: [ProcSample(ts=T0 + i, pid=p, ppid=1 if p == PID else PID, cpu_percent=3.0,
                            role="target" if p == PID else "worker") for i in range(int(seconds) + 1)]
             for p in tasks}
    return judge(main, main[-1].ts, 30.0, others=workers, tasks=tasks, procs=procs)


def test_a_main_thread_whose_data_wait_keeps_ending_is_not_stuck_while_its_workers_sleep():
    # The measured job: two workers asleep 4 ms per sample in __getitem__, 29 batches/s; the main
    # thread woke 512 times/s at ~100 us each (no longer per wake than a poll), 5 % of a core on
    # an idle host, less on a loaded one (here 3 %, under the 5 % that says "it runs"), in the
    # DataLoader's wait in all 20 sparse samples. That wait wakes by itself only every 5 s.
    v = loader(20.0, main_runs_per_s=512.0, main_ms_per_s=30.0, worker_frames=GETITEM_SLEEP)
    assert not v.stuck and "batches arrive" in v.reason, v.reason


def test_a_worker_hung_in_getitem_is_still_a_hung_worker():
    # The DataLoader's own 5 s status check is all that wakes the main thread.
    v = loader(20.0, main_runs_per_s=0.2, main_ms_per_s=0.02, worker_frames=GETITEM_LOCK)
    assert v.stuck and v.diagnosis is not None and v.diagnosis.kind == WORKER, v.reason


# --------------------------------------------------------------------------- item: a hang inside a save


def save_hang_store_feed(seconds: float):
    """What the sources give, second by second, for a job blocked forever on a lock inside
    save_checkpoint(): one call that never returns, sampled ~1/s, no CPU, no bytes of its own,
    while the host's disk is busy with someone else's writes (gputop's own recording)."""
    times = sparse_times(seconds)
    for sec in range(int(seconds) + 1):
        ts = T0 + sec
        batch: list[object] = [
            HostSample(ts=ts, cpu_percent=90.0, disk_write_bps=2e6),
            ProcSample(ts=ts, pid=PID, ppid=1, name="python", cpu_percent=0.0, num_threads=2, status="sleeping",
                       role="target"),
            TaskSample(ts=ts, pid=PID, ppid=1, threads=(
                ThreadState(tid=PID, state="S", cpu_ns=5_000_000, runs=40, wchan="futex_do_wait", syscall="futex"),
                ThreadState(tid=PID + 1, state="S", cpu_ns=1_000_000, runs=5, wchan="hrtimer_nanosleep",
                            syscall="clock_nanosleep")), rchar=1000, wchar=10),
        ]
        if sec == 0:
            batch.insert(0, SystemInfo(ts=ts, gpu_count=0, cpu_count=2))
        batch += [stack(t, LOCK_SAVE, Category.CHECKPOINT_IO) for t in times if ts - 1 < t <= ts]
        yield ts, sorted(batch, key=lambda s: s.ts)


def test_a_hang_inside_a_save_is_stuck_within_seconds_never_flickers_and_invents_no_saves():
    store, advisor = Store(), Advisor(target_pid=PID)
    first_stuck = None
    for ts, batch in save_hang_store_feed(40.0):
        store.add(batch)
        shown = {f.id: f for f in advisor.evaluate(store, now=ts)}
        assert "checkpoint-stall" not in shown, (ts - T0, shown["checkpoint-stall"].evidence)
        if "stuck" in shown and first_stuck is None:
            first_stuck = ts - T0
        if first_stuck is not None:
            assert "stuck" in shown, f"stuck dropped at {ts - T0:.0f} s"
    assert first_stuck is not None and first_stuck <= 6.0, first_stuck


def test_one_save_that_never_ends_is_not_split_by_sampling_gaps():
    # The checkpoint rule on its own, past the stuck verdict: saves seen to end are counted, one
    # per call, however far apart the samples inside it are.
    from gputop.advisor.context import build_context
    from gputop.advisor.rules.checkpoint import _saves, check_checkpoint_stall

    store = Store()
    for _, batch in save_hang_store_feed(30.0):
        store.add(batch)
    ctx = build_context(store, target_pid=PID, now=T0 + 30.0)
    saves, running = _saves(ctx, Category.CHECKPOINT_IO)
    assert saves == [] and running
    assert check_checkpoint_stall(ctx) is None
    # Two real saves, ~6 s each, sampled ~1/s with a step between them: two saves, both ended.
    store = Store()
    store.add([SystemInfo(ts=T0, gpu_count=0, cpu_count=2)])
    step = (Frame("train_step", PROJ, 50, code="loss.backward()"), Frame("<module>", PROJ, 60))
    for t in sparse_times(30.0):
        k = int(t - T0)
        in_save = 5 <= k < 11 or 18 <= k < 24
        store.add([stack(t, LOCK_SAVE if in_save else step, Category.CHECKPOINT_IO if in_save else Category.BACKWARD,
                         active=not in_save)])
    ctx = build_context(store, target_pid=PID, now=T0 + 30.0)
    saves, running = _saves(ctx, Category.CHECKPOINT_IO)
    assert len(saves) == 2 and not running, saves
    assert all(4.0 <= low <= high <= 8.0 for low, high in saves), saves


def test_a_save_under_way_counts_while_its_stack_moves_and_not_while_frozen():
    from gputop.advisor.context import build_context
    from gputop.advisor.rules.checkpoint import check_checkpoint_stall

    def ctx_of(moving: bool):
        store = Store()
        store.add([SystemInfo(ts=T0, gpu_count=0, cpu_count=2)])
        for n, t in enumerate(sparse_times(30.0)):
            line = 880 + (n % 3 if moving else 0)  # torch.save's inner lines as it writes
            frames = (Frame("_save", "/usr/lib/python3/site-packages/torch/serialization.py", line),
                      Frame("save_checkpoint", PROJ, 15), Frame("<module>", PROJ, 17))
            store.add([stack(t, frames, Category.CHECKPOINT_IO)])
        return build_context(store, target_pid=PID, now=T0 + 30.0)

    f = check_checkpoint_stall(ctx_of(moving=True))
    assert f is not None and any("a save under way" in e for e in f.evidence), f
    assert check_checkpoint_stall(ctx_of(moving=False)) is None


def test_without_wake_counts_the_main_threads_own_cpu_decides():
    # /proc without schedstat: CPU time from stat ticks, no wake counts. The sleeper's 3.4 % of a
    # core is work; a lock's nothing is not.
    main = [stack(t, SLEEP, Category.IDLE) for t in sparse_times(45.0)]

    def tasks(ms_per_s):
        return {PID: [TaskSample(ts=T0 + i, pid=PID, ppid=1, threads=(
            ThreadState(tid=PID, state="S", cpu_ns=int(ms_per_s * 1e6 * i), runs=None),), rchar=0, wchar=0)
            for i in range(46)]}

    v = judge(main, main[-1].ts, 30.0, tasks=tasks(34.0))
    assert not v.stuck and "3.4 % of a core" in v.reason, v.reason
    assert judge(main, main[-1].ts, 30.0, tasks=tasks(0.0)).stuck


# ------------------------------------------------------------------- item: a dataset read per item

FETCH = Frame("_MapDatasetFetcher.fetch", "/usr/lib/python3/site-packages/torch/utils/data/_utils/fetch.py", 54)
ITER = (FETCH, Frame("_BaseDataLoaderIter.__next__", LOADER, 725), Frame("<module>", PROJ, 13, code="for x, y in dl:"))


def test_a_read_per_item_in_the_main_process_is_not_stuck_a_poll_in_it_is():
    # No workers: the fetcher calls __getitem__ for each item, which sleeps 2 ms (a remote read).
    # Every wake is a few microseconds of work, like a poll's; the read has no loop of its own, so
    # each wake ends it and the fetcher moves on (measured: 13.9 steps/s throughout).
    reads = (Frame("Remote.__getitem__", PROJ, 8, code="time.sleep(0.002)", loop=0),) + ITER
    v = verdict(reads, Category.DATA_FETCH, 45.0, main_ms_per_s=60.0, runs_per_s=480.0)
    assert not v.stuck and "each item's read returns" in v.reason, v.reason
    # The same line inside a `while not ready:` of its own: a poll, stuck.
    poll = (Frame("Remote.__getitem__", PROJ, 9, code="time.sleep(0.002)", loop=8),) + ITER
    assert verdict(poll, Category.DATA_FETCH, 45.0, main_ms_per_s=60.0, runs_per_s=480.0).stuck
    # A library between the read and the wait (an HTTP client's retry loop) is not read: no excuse.
    lib = (Frame("Session.send", "/usr/lib/python3/site-packages/requests/sessions.py", 700),
           Frame("Remote.__getitem__", PROJ, 8, code="requests.get(url)", loop=0)) + ITER
    assert verdict(lib, Category.DATA_FETCH, 45.0, main_ms_per_s=60.0, runs_per_s=480.0).stuck
    # A read that never wakes is a hang whatever its loops.
    assert verdict(reads, Category.DATA_FETCH, 45.0, main_ms_per_s=0.0, runs_per_s=0.0).stuck


def test_a_starved_loop_is_judged_by_its_wakes_not_its_preempted_runs():
    """A loop sleeping 50 ms a step on a host busier than its cores (measured: 72 ms of CPU a second,
    83 runs a second of which 81 preemptions, 2.4 voluntary wakes a second): per run 0.86 ms, and in
    a busier moment under the 0.5 ms a run that tells work from a poll; per wake 30 ms. Its wakes
    decide where they are read. A poll loop's wakes stay microseconds each, read either way."""
    def starved(ts, ms_per_s, runs_per_s, wakes_per_s):
        t = task(ts, ms_per_s, runs_per_s)
        main = replace(t.threads[0], wakes=int(wakes_per_s * (ts - T0)))
        return replace(t, threads=(main, *t.threads[1:]))

    main = [stack(t, SLEEP, Category.IDLE) for t in sparse_times(45.0)]
    # Preempted into 0.3 ms runs: by its runs alone, a poll (the stuck verdict a CI run made).
    runs_only = {PID: [task(T0 + i, 36.0, 120.0) for i in range(46)]}
    assert judge(main, main[-1].ts, 30.0, tasks=runs_only).stuck
    wakes = {PID: [starved(T0 + i, 36.0, 120.0, 2.4) for i in range(46)]}
    v = judge(main, main[-1].ts, 30.0, tasks=wakes)
    assert not v.stuck and "15.0 ms each time" in v.reason, v.reason
    # A poll that wakes 10 times a second for 50 us stays stuck with its wakes read.
    poll = {PID: [starved(T0 + i, 0.5, 10.0, 10.0) for i in range(46)]}
    assert judge([stack(t, POLL, Category.IDLE) for t in sparse_times(45.0)], main[-1].ts, 30.0, tasks=poll).stuck


def test_the_procfs_source_reads_the_main_threads_voluntary_switches():
    from gputop.sources.procfs import _voluntary_switches

    status = "Name:\tpython\nvoluntary_ctxt_switches:\t1234\nnonvoluntary_ctxt_switches:\t99\n"
    assert _voluntary_switches(status) == 1234
    assert _voluntary_switches("Name:\tpython\n") is None and _voluntary_switches(None) is None
