"""The stuck finding of `x, y = batches.get()` after its producer thread ended said the same
sentence three times ("why (unknown): main thread … waits on a condition (threading.Condition.wait)
that nothing sets", again as a bare line, again as the main thread's line) and named the
threading call under the user's: a queue's get is said as such, once, and "unknown" is no reason.
The verdict itself is unchanged: the same samples are stuck as before."""

from __future__ import annotations

from gputop.advisor.context import build_context
from gputop.advisor.rules import RULES_BY_ID
from gputop.analysis.hang import diagnose, waits_on
from gputop.model import Category, Frame, StackSample, TaskSample, ThreadState
from gputop.store import Store

PID = 4242
T0 = 1_700_000_000.0
JOB = "/home/user/jobs/hang.py"
LIB = "/usr/lib/python3.11"
GET = (Frame("Condition.wait", f"{LIB}/threading.py", 355, code="waiter.acquire()"),
       Frame("Queue.get", f"{LIB}/queue.py", 171, code="self.not_empty.wait()"),
       Frame("<module>", JOB, 11, code="x, y = batches.get()          # blocks forever once the producer is done"))
PUT = (Frame("Condition.wait", f"{LIB}/threading.py", 355, code="waiter.acquire()"),
       Frame("Queue.put", f"{LIB}/queue.py", 140, code="self.not_full.wait()"),
       Frame("produce", JOB, 5, code="q.put(item)"))
EVENT = (Frame("Condition.wait", f"{LIB}/threading.py", 355, code="waiter.acquire()"),
         Frame("Event.wait", f"{LIB}/threading.py", 655, code="signaled = self._cond.wait(timeout)"),
         Frame("main", JOB, 20, code="ready.wait()"))


def sample(ts: float, frames=GET) -> StackSample:
    return StackSample(ts=ts, pid=PID, thread_id=PID, thread_name="MainThread", frames=frames, active=False,
                       is_main=True, category=Category.IDLE, os_thread_id=PID)


def kernel(ts: float) -> TaskSample:
    return TaskSample(ts=ts, pid=PID, ppid=1, threads=(
        ThreadState(tid=PID, state="S", cpu_ns=1_000_000, runs=10, wchan="futex_do_wait", syscall="futex"),))


def test_a_queue_get_is_said_as_the_users_call_not_threadings():
    waits, what = waits_on(sample(T0), kernel(T0).threads[0])
    assert waits == "event"  # the kind of wait (and so the kind of hang) is what it was
    assert what == "waits on a queue's get (queue.Queue.get) that nothing puts into"
    assert "Condition" not in what
    assert waits_on(sample(T0, PUT))[1] == "waits on a queue's put (queue.Queue.put) that nothing takes from"
    # Without a queue above it, threading's own call still names the wait.
    assert waits_on(sample(T0, EVENT))[1] == "waits on an event (threading.Event.wait) that nothing sets"


def test_the_unknown_kind_adds_no_line_that_repeats_the_parties():
    d = diagnose(sample(T0), [], PID, tasks={PID: kernel(T0)})
    assert d.kind == "unknown"
    assert d.evidence == ()  # the main thread's line (in the parties) says its wait, once


def _stuck_finding():
    store = Store()
    for i in range(12 * 5 + 1):
        ts = T0 + i / 5
        store.add([sample(ts)])
        if i % 5 == 0:
            store.add([kernel(ts)])
    ctx = build_context(store, target_pid=PID, stuck_after_s=10.0, now=T0 + 12.0)
    return RULES_BY_ID["stuck"].evaluate(ctx)


def test_the_stuck_finding_says_the_wait_once():
    f = _stuck_finding()
    assert f is not None and f.id == "stuck"
    assert "queue's get (queue.Queue.get)" in f.title and "Condition" not in f.title
    said = [e for e in f.evidence if "queue's get" in e]
    # The main thread's own line, with its code: the title has the diagnosis already.
    assert len(said) == 1, f.evidence
    assert said[0].startswith("main thread: jobs/hang.py:11 in <module>  `x, y = batches.get()")
    assert not any(e.startswith("why (unknown)") or "(unknown)" in e for e in f.evidence), f.evidence
