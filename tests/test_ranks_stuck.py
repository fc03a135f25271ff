"""The stuck watch across ranks, from synthetic stacks: a stuck event names the rank; a rank that
never arrives is named with what it does instead; a rank in another collective is a desync; a
rank waiting while another works is a straggler, not a hang."""

from __future__ import annotations

from gputop.analysis.hang import COLLECTIVE, collective_fn, diagnose
from gputop.analysis.ranks import ranks_message
from gputop.analysis.watch import StuckWatch
from gputop.analysis.window import stuck_verdict
from gputop.model import Category, Event, Frame, ProcSample, StackSample, TaskSample, ThreadState
from gputop.store import Store

T0 = 1_700_000_000.0
R0, R1, R2 = 101, 102, 103
DIST = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/usr/lib/python3/site-packages/torch/distributed/c10d_logger.py"
TRAIN = "/home/u/job/train.py"
ALL_REDUCE = (Frame("all_reduce", DIST, 2500), Frame("wrapper", LOGGER, 80), Frame("main", TRAIN, 60))
BROADCAST = (Frame("broadcast", DIST, 2400), Frame("wrapper", LOGGER, 80), Frame("sync_params", TRAIN, 30),
             Frame("main", TRAIN, 58))
SLEEPING = (Frame("never_arrives", TRAIN, 35, code="time.sleep(0.05)"), Frame("main", TRAIN, 59))
LOADING = [(Frame("load_batch", TRAIN, 20 + i % 3), Frame("main", TRAIN, 55)) for i in range(3)]


def s(ts, pid, frames, cat, active=False):
    return StackSample(ts=ts, pid=pid, thread_id=pid, thread_name="MainThread", frames=frames, active=active,
                       is_main=True, category=cat, os_thread_id=pid)


def job_store(seconds: float, rank1, rank1_cat, rank1_active=False, ranks=(R0, R1),
              env: dict[int, dict[str, str]] | None = None) -> Store:
    """Rank 0 waits in all_reduce the whole time; rank 1 does ``rank1`` (frames, or a list that
    cycles); the processes use no CPU (what a hang looks like to psutil). ``env``: pid -> the
    environment its process samples carry."""
    store = Store()
    store.add([Event(T0 - 1, "ranks", ranks_message({p: i for i, p in enumerate(ranks)}, 100))])
    for i in range(int(seconds * 5) + 1):
        ts = T0 + i / 5
        fr = rank1[i % len(rank1)] if isinstance(rank1, list) else rank1
        batch = [s(ts, R0, ALL_REDUCE, Category.COLLECTIVE), s(ts, R1, fr, rank1_cat, rank1_active)]
        batch += [s(ts, p, ALL_REDUCE, Category.COLLECTIVE) for p in ranks[2:]]
        if i % 5 == 0:
            batch += [ProcSample(ts=ts, pid=p, cpu_percent=0.0, role="target" if p == R0 else "gpu",
                                 env=tuple(sorted((env or {}).get(p, {}).items()))) for p in ranks]
        store.add(batch)
    return store


def test_the_rank_that_never_arrives_is_named_with_what_it_does_instead():
    v = stuck_verdict(job_store(40.0, SLEEPING, Category.IDLE), R0, threshold=30.0)
    assert v.stuck and v.diagnosis is not None and v.diagnosis.kind == COLLECTIVE
    summary = v.diagnosis.summary
    assert summary.startswith("collective wait: rank 0 (pid 101) waits in all_reduce for rank 1 (pid 102)"), summary
    assert "never arrives: it is at job/train.py:35 in never_arrives, sleeps instead" in summary, summary
    assert f"gputop stacks --pid {R1}" in v.diagnosis.action


def test_a_rank_in_another_collective_is_a_desync():
    store = job_store(40.0, BROADCAST, Category.COLLECTIVE, ranks=(R0, R1, R2))
    v = stuck_verdict(store, R0, threshold=30.0)
    d = v.diagnosis
    assert v.stuck and d is not None and d.kind == COLLECTIVE
    assert d.summary.startswith("collective desync: rank 0 (pid 101), rank 2 (pid 103) wait in all_reduce while "
                                "rank 1 (pid 102) waits in broadcast"), d.summary
    assert any("waits in broadcast instead of all_reduce: a desync" in e for e in d.evidence), d.evidence
    assert "same collectives in the same order" in d.action


def test_the_stuck_watch_event_names_the_rank_and_the_one_that_never_arrives():
    store = job_store(40.0, SLEEPING, Category.IDLE)
    events = StuckWatch(store, R0, threshold=30.0).poll()
    assert len(events) == 1, events
    msg = events[0].message
    assert msg.startswith("rank 0 (PID 101) looks stuck: no progress for"), msg
    assert "rank 1 (pid 102), which never arrives" in msg, msg


def test_a_rank_waiting_while_another_works_is_a_straggler_not_a_hang():
    store = job_store(40.0, LOADING, Category.DATA_FETCH, rank1_active=True)
    v = stuck_verdict(store, R0, threshold=30.0)
    assert not v.stuck and "a straggler, not a hang" in v.reason, v.reason
    assert StuckWatch(store, R0, threshold=30.0).poll() == []


def test_without_ranks_the_parties_keep_their_old_names():
    main = s(T0, R0, ALL_REDUCE, Category.COLLECTIVE)
    d = diagnose(main, (s(T0, R1, SLEEPING, Category.IDLE),), R0)
    assert d.summary == "collective wait: main thread at job/train.py:60 in main waits for a rank that never arrives"


def test_the_target_rank_itself_can_be_the_one_that_never_arrives():
    # Attached to rank 0, which sleeps outside the collective rank 1 waits in.
    ranks = {R0: 0, R1: 1}
    d = diagnose(s(T0, R0, SLEEPING, Category.IDLE), (s(T0, R1, ALL_REDUCE, Category.COLLECTIVE),), R0, ranks=ranks)
    assert d.kind == COLLECTIVE
    assert "rank 1 (pid 102) waits in all_reduce for rank 0 (pid 101), which never arrives" in d.summary, d.summary


def test_collective_function_is_the_newest_torch_distributed_frame():
    assert collective_fn(s(T0, R0, ALL_REDUCE, Category.COLLECTIVE)) == "all_reduce"
    assert collective_fn(s(T0, R0, SLEEPING, Category.IDLE)) is None


def straggler_store(seconds: float, main_state_at_end: str) -> Store:
    """The 2-rank gloo straggler as gputop sees it attached to rank 0 on a loaded host (seen in a
    real advise run): rank 0's main thread in all_reduce in every sample since attaching, its
    process at a few % of a core; rank 1 builds its batch in load_batch, on CPU; /proc reads rank
    0's main thread asleep (S), except at the newest reading, where it happens to be runnable (R:
    gloo waking up for a chunk of the reduction, or the scheduler not having run it yet)."""
    store = Store()
    store.add([Event(T0 - 1, "ranks", ranks_message({R0: 0, R1: 1}, 100))])
    n = int(seconds * 5)
    for i in range(n + 1):
        ts = T0 + i / 5
        batch = [s(ts, R0, ALL_REDUCE, Category.COLLECTIVE), s(ts, R1, LOADING[i % 3], Category.DATA_FETCH, True)]
        if i % 5 == 0:
            batch += [ProcSample(ts=ts, pid=R0, cpu_percent=4.0, role="target"),
                      ProcSample(ts=ts, pid=R1, cpu_percent=60.0, role="gpu")]
            state = main_state_at_end if i == n else "S"
            batch += [TaskSample(ts=ts, pid=R0, ppid=100, threads=(
                ThreadState(R0, state=state, cpu_ns=int(ts - T0) * 40_000_000,
                            syscall=None if state == "R" else "recvfrom",
                            fd_path=None if state == "R" else "socket:[77]"),
                ThreadState(R0 + 1000, name="python", state="S", cpu_ns=0, syscall="clock_nanosleep")),
                rchar=int(ts - T0) * 1000, wchar=int(ts - T0) * 1000)]
        store.add(batch)
    return store


def test_a_waiting_rank_read_runnable_by_proc_still_waits_in_its_collective():
    # The main thread's stack is in all_reduce: that is its wait, whatever state /proc caught it in.
    # Read as "running on a CPU", the diagnosis lost the collective (kind unknown) and with it the
    # look across ranks that tells a straggler from a hang.
    main = s(T0, R0, ALL_REDUCE, Category.COLLECTIVE)
    tasks = {R0: TaskSample(T0, R0, 100, (ThreadState(R0, state="R"),))}
    d = diagnose(main, (s(T0, R1, SLEEPING, Category.IDLE),), R0, tasks=tasks, ranks={R0: 0, R1: 1})
    assert d.kind == COLLECTIVE, d
    assert "waits in all_reduce for rank 1 (pid 102), which never arrives" in d.summary, d.summary
    assert "waits in a collective (all_reduce) (state R" in d.parties[0].what, d.parties[0].what


def test_a_straggler_is_not_stuck_when_proc_catches_the_waiting_rank_runnable():
    for state in ("R", "S"):
        store = straggler_store(9.0, state)
        v = stuck_verdict(store, R0, threshold=30.0)
        # Not stuck: across the ranks (rank 1 moves), or already by its own readings (gloo, no GPU:
        # a wait that wakes to work at a few % of a core is steps going by).
        assert not v.stuck and ("a straggler, not a hang" in v.reason or "work between the samples" in v.reason), (
            state, v.reason, v.evidence)
        assert StuckWatch(store, R0, threshold=30.0).poll() == []


RECORDER = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr_"}


def _stuck_action(env: dict[int, dict[str, str]] | None) -> str:
    from gputop.advisor.context import context_of
    from gputop.advisor.rules.stuck import check_stuck
    from gputop.analysis.window import read_window

    hit = check_stuck(context_of(read_window(job_store(40.0, SLEEPING, Category.IDLE, env=env), R0, 30.0)))
    assert hit is not None and "never arrives" in hit.title, hit
    return hit.action


def test_a_collective_hang_in_a_job_with_the_flight_recorder_on_points_to_gputop_autopsy():
    action = _stuck_action({R0: RECORDER, R1: RECORDER})
    assert action.endswith("`gputop autopsy /scratch/fr_` names the rank that did not join"), action
    assert "TORCH_FR_BUFFER_SIZE=2000" in action
    # Read from another rank's environment when the target's has none.
    assert "`gputop autopsy /scratch/fr_`" in _stuck_action({R1: RECORDER})
    # Off: the action is as it was.
    assert "gputop autopsy" not in _stuck_action(None)
    assert "gputop autopsy" not in _stuck_action({R0: {"TORCH_FR_BUFFER_SIZE": "0"}})
