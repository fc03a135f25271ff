"""A straggler asleep in its own code, seen at ~1 stack/s, is still the rank the others wait for:
its last few samples can all land in its sleep, and only the OS shows it working between them
(the new user's gloo job: rank 1 sleeps 0.1 s in load_batch each step, rank 0 waits in all_reduce;
the exporter called rank 0 stuck). A rank hung in its own code stays a hang."""

from __future__ import annotations

from test_stuck_sparse import COLL, PID, PROJ, T0, sparse_times, stack, task

from gputop.analysis.stuck import across_ranks, judge
from gputop.model import Category, Frame, ProcSample

RANK1 = PID + 100
LOAD_SLEEP = (Frame("load_batch", PROJ, 9, code="time.sleep(0.1)"), Frame("main", PROJ, 14, code="x = load_batch()"))
LOCKED = (Frame("load_batch", PROJ, 9, code="with lock:"), Frame("main", PROJ, 14, code="x = load_batch()"))
RANKS = {PID: 0, RANK1: 1}
SECONDS = 45.0


def _rank0_waiting():
    main = [stack(t, COLL, Category.COLLECTIVE) for t in sparse_times(SECONDS)]
    v = judge(main, main[-1].ts, 30.0)
    assert v.stuck  # alone, rank 0's unchanged wait reads as a hang
    return main, v


def _rank1(frames, ms_per_s, runs_per_s):
    stacks = [stack(t, frames, Category.OTHER, pid=RANK1) for t in sparse_times(SECONDS, T0 + 0.4)]
    tasks = {RANK1: [task(T0 + i, ms_per_s, runs_per_s, pid=RANK1) for i in range(int(SECONDS) + 1)]}
    return stacks, tasks


def test_a_straggler_asleep_in_every_sample_but_working_between_them_vetoes_the_hang():
    main, v = _rank0_waiting()
    # 10 wakes/s running ~4 ms each (its step's own work around the sleep): 4 % of a core.
    stacks, tasks = _rank1(LOAD_SLEEP, ms_per_s=40.0, runs_per_s=10.0)
    out = across_ranks(v, RANKS, main + stacks, PID, tasks=tasks, now=main[-1].ts)
    assert not out.stuck and "rank 1 moves" in out.reason
    # Without the OS's view its samples alone cannot tell: the verdict is the stacks' (stuck).
    assert across_ranks(v, RANKS, main + stacks, PID).stuck


def test_a_rank_hung_on_a_lock_in_its_own_code_does_not_veto():
    main, v = _rank0_waiting()
    stacks, tasks = _rank1(LOCKED, ms_per_s=0.0, runs_per_s=0.0)
    assert across_ranks(v, RANKS, main + stacks, PID, tasks=tasks, now=main[-1].ts).stuck


def test_a_rank_polling_for_ever_does_not_veto():
    main, v = _rank0_waiting()
    # Wakes 10 times a second for 50 us each: a poll, not work.
    stacks, tasks = _rank1(LOAD_SLEEP, ms_per_s=0.5, runs_per_s=10.0)
    assert across_ranks(v, RANKS, main + stacks, PID, tasks=tasks, now=main[-1].ts).stuck


def test_without_proc_the_rank_s_own_cpu_decides():
    main, v = _rank0_waiting()
    stacks, _ = _rank1(LOAD_SLEEP, 0.0, 0.0)
    now = main[-1].ts

    def procs(cpu):
        return {RANK1: [ProcSample(T0 + i, RANK1, ppid=1, name="python", cpu_percent=cpu, role="target")
                        for i in range(int(SECONDS) + 1)]}

    assert not across_ranks(v, RANKS, main + stacks, PID, procs=procs(4.0), now=now).stuck
    assert across_ranks(v, RANKS, main + stacks, PID, procs=procs(0.1), now=now).stuck


def test_at_attach_a_rank_outside_the_collective_not_read_yet_is_weighed_not_a_hang():
    """The exporter polls the OS every 5 s: in its first seconds rank 0's wait in all_reduce was
    called stuck (shown 6-20 s) before rank 1, asleep in its own code, had been read once."""
    main = [stack(t, COLL, Category.COLLECTIVE) for t in sparse_times(8.0)]
    now = main[-1].ts
    # Rank 0 read by the OS at next to nothing: alone, its wait reads as a hang at attach.
    own = {PID: [ProcSample(T0 + i, PID, ppid=1, name="python", cpu_percent=0.1, role="target") for i in range(9)]}
    v = judge(main, now, 30.0, procs=own)
    assert v.stuck and v.early
    # Before any reading of it, its wait on the CPU (gloo: no GPU seen) is not judged at attach.
    assert not judge(main, now, 30.0).stuck
    stacks, _ = _rank1(LOAD_SLEEP, 0.0, 0.0)
    stacks = [s for s in stacks if s.ts <= now]
    out = across_ranks(v, RANKS, main + stacks, PID, procs=own, now=now)
    assert not out.stuck and "rank 1 is outside it and not read by the OS yet" in out.reason
    # Once read, its own CPU decides: idle -> the hang stands.
    idle = {**own, RANK1: [ProcSample(T0 + i, RANK1, ppid=1, name="python", cpu_percent=0.1, role="target")
                           for i in range(9)]}
    assert across_ranks(v, RANKS, main + stacks, PID, procs=idle, now=now).stuck
    # A rank waiting in the collective too is known to stand: no weighing.
    coll = [stack(s.ts, COLL, Category.COLLECTIVE, pid=RANK1) for s in stacks]
    assert across_ranks(v, RANKS, main + coll, PID, procs=own, now=now).stuck


LOAD_BUSY = (Frame("load_batch", PROJ, 9, code="x = [i * i for i in range(n)]"),
             Frame("main", PROJ, 14, code="x = load_batch()"))


def _rank1_every(seconds_apart: float, frames_at):
    """Rank 1 seen once every ``seconds_apart`` (a starved host rotating py-spy over three
    processes): ``frames_at(i)`` -> (frames, category, active) of its i-th sample."""
    out, i, t = [], 0, T0 + 0.4
    while t <= T0 + SECONDS:
        frames, cat, active = frames_at(i)
        out.append(stack(t, frames, cat, pid=RANK1, active=active))
        i, t = i + 1, t + seconds_apart
    return out


def test_a_sparse_straggler_caught_in_its_brief_wait_still_moves():
    """CI on two busy cores: rank 1 builds each batch in Python and waits in the all-reduce only
    briefly, but seen once every ~4 s its newest sample landed in that wait. With no other sample
    of it within 3 s, it read as standing still beside rank 0 and the job was called stuck. It
    was working when last seen before, and nothing shows it in the collective for longer than a
    step's wait: it moves."""
    main, v = _rank0_waiting()
    n = len(_rank1_every(4.0, lambda i: (LOAD_BUSY, Category.OTHER, True)))
    stacks = _rank1_every(4.0, lambda i: (COLL, Category.COLLECTIVE, False) if i == n - 1
                          else (LOAD_BUSY, Category.OTHER, True))
    out = across_ranks(v, RANKS, main + stacks, PID)
    assert not out.stuck and "rank 1 moves" in out.reason, out.reason


def test_a_rank_seen_twice_in_the_collective_after_working_is_known_to_stand():
    """The same rank seen in the collective at its last two samples, 4 s apart, after working
    (a desync: it moved when the others stopped, then stood in a collective of its own): that
    stand is seen, and the hang stands."""
    main, v = _rank0_waiting()
    n = len(_rank1_every(4.0, lambda i: (LOAD_BUSY, Category.OTHER, True)))
    stacks = _rank1_every(4.0, lambda i: (COLL, Category.COLLECTIVE, False) if i >= n - 2
                          else (LOAD_BUSY, Category.OTHER, True))
    assert across_ranks(v, RANKS, main + stacks, PID).stuck
