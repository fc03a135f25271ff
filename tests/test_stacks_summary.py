"""Window summaries for the stacks pane: latest threads, category shares, hottest frames, workers."""

from gputop.analysis.stacks_summary import (
    category_shares,
    hottest,
    latest_fault,
    latest_threads,
    main_samples,
    worker_views,
)
from gputop.analysis.window import stacks_view
from gputop.model import Category, Event, Frame, ProcSample, StackSample
from gputop.store import Store

PID, W1, W2 = 100, 101, 102
T0 = 1_700_000_000.0
PROJ = "/home/user/project/train.py"
LIB = "/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py"

WAIT = (Frame("_try_get_data", LIB, 1291), Frame("train", PROJ, 12))
FWD = (Frame("Linear.forward", "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125), Frame("train", PROJ, 14))
ITEM = (Frame("train", PROJ, 16, code="loss.item()"),)


def s(ts, frames, cat, pid=PID, tid=1, main=True, name="MainThread"):
    return StackSample(ts=ts, pid=pid, thread_id=tid, thread_name=name, frames=frames, is_main=main, category=cat)


def window():
    out = []
    plan = [(WAIT, Category.DATA_WAIT)] * 6 + [(FWD, Category.FORWARD)] * 3 + [(ITEM, Category.HOST_SYNC)]
    for i, (fr, cat) in enumerate(plan):
        ts = T0 + i * 0.2
        out.append(s(ts, fr, cat))
        out.append(s(ts, (Frame("Condition.wait", "/usr/lib/python3.11/threading.py", 327),), Category.IDLE,
                     tid=2, main=False, name="QueueFeederThread"))
    return out


def test_shares_are_of_main_thread_samples_largest_first():
    main = main_samples(window(), PID)
    assert len(main) == 10
    assert category_shares(main) == ((Category.DATA_WAIT, 0.6), (Category.FORWARD, 0.3), (Category.HOST_SYNC, 0.1))
    assert category_shares([]) == ()


def test_hottest_frames_with_project_frame_under_library_code():
    hot = hottest(main_samples(window(), PID))
    assert [(h.frame.name, round(h.share, 2), h.category) for h in hot] == [
        ("_try_get_data", 0.6, Category.DATA_WAIT),
        ("Linear.forward", 0.3, Category.FORWARD),
        ("train", 0.1, Category.HOST_SYNC),
    ]
    assert hot[0].via.line == 12 and hot[1].via.line == 14
    assert hot[2].via is None  # the frame is itself project code
    assert sum(h.count for h in hot) == 10


def test_latest_threads_is_the_newest_dump_main_first():
    threads = latest_threads(window(), PID)
    assert [t.thread_name for t in threads] == ["MainThread", "QueueFeederThread"]
    assert {t.ts for t in threads} == {T0 + 9 * 0.2}
    assert latest_threads(window(), 999) == ()


def test_workers_of_the_target_with_their_newest_stack():
    procs = {
        PID: ProcSample(ts=T0 + 2, pid=PID, ppid=1, role="target"),
        W1: ProcSample(ts=T0 + 2, pid=W1, ppid=PID, role="worker", cpu_percent=80.0, status="running"),
        W2: ProcSample(ts=T0 + 2, pid=W2, ppid=PID, role="worker", cpu_percent=0.0, status="sleeping"),
        7: ProcSample(ts=T0 + 2, pid=7, ppid=1, role="worker"),  # someone else's
        8: ProcSample(ts=T0 - 30, pid=8, ppid=PID, role="worker"),  # gone long ago
    }
    samples = window() + [
        s(T0 + 1.0, WAIT, Category.DATA_FETCH, pid=W1, tid=5),
        s(T0 + 1.5, FWD, Category.IDLE, pid=W1, tid=5),
    ]
    rows = worker_views(procs, samples, now=T0 + 2.5, target=PID)
    assert [w.proc.pid for w in rows] == [W1, W2]
    assert rows[0].stack.category is Category.IDLE and rows[0].stack.ts == T0 + 1.5
    assert rows[1].stack is None and rows[1].threads == ()


def test_fault_is_the_newest_stacks_warning_until_resolved():
    ev = [Event(T0, "stacks", "py-spy failed", "warning"), Event(T0 + 1, "nvml", "x", "error")]
    assert latest_fault(ev).message == "py-spy failed"
    ev.append(Event(T0 + 2, "stacks", "stack sampling of PID 1 resumed", "info"))
    assert latest_fault(ev) is None


def test_view_from_store():
    store = Store()
    store.add(window())
    store.add([ProcSample(ts=T0 + 1.8, pid=PID, ppid=1, role="target", cmdline="python train.py")])
    v = stacks_view(store, PID, stuck_after=30.0)
    assert v.samples == 10 and v.shares[0][0] is Category.DATA_WAIT
    assert abs(v.span_s - 1.8) < 1e-6
    assert v.target.cmdline == "python train.py"
    assert not v.verdict.stuck and not v.exited and v.fault is None
