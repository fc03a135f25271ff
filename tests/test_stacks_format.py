"""Text of the stacks pane and of `gputop stacks`, without a terminal."""

import json
import os

from gputop.analysis.window import stacks_view
from gputop.analysis.stuck import judge
from gputop.model import Category, Event, Frame, ProcSample
from gputop.analysis.classify import classify, is_library
from gputop.sources.stacks import StackParser
from gputop.present.stacks import (
    category_bar,
    dump_dict,
    dump_text,
    frame_line,
    stacks_pane_lines,
    plain,
    stack_lines,
    stuck_lines,
)
from gputop.store import Store

T0 = 1_700_000_000.0
FIX = os.path.join(os.path.dirname(__file__), "fixtures", "stacks")


def fixture_store(name, n=20, dt=0.2):
    with open(os.path.join(FIX, f"{name}.json")) as f:
        doc = json.load(f)
    parser = StackParser(lambda fn, ln: doc["source_lines"].get(f"{fn}:{ln}"), classify, is_library)
    store = Store()
    for i in range(n):
        store.add(parser.samples(doc["dump"], T0 + i * dt))
    return store, doc["dump"][0]["pid"]


def test_project_frames_are_marked_and_styled_apart_from_library():
    proj = frame_line(Frame("train_step", "/home/u/proj/train.py", 42, code="loss.item()"), "  ▸ ")
    lib = frame_line(Frame("Queue.get", "/usr/lib/python3.11/queue.py", 171, code="self.not_empty.wait()"))
    assert plain([proj]) == "  ▸ train_step (proj/train.py:42)  loss.item()"
    assert plain([lib]) == "    Queue.get (queue.py:171)"  # library code lines are not shown
    assert ("train_step", "project") in proj and ("Queue.get", "lib") in lib


def test_stack_newest_first_and_fork_frames_left_out():
    store, pid = fixture_store("worker-fetch", n=1)
    main = next(s for s in store.stack_window(0) if s.is_main)
    text = plain(stack_lines(main, None))
    lines = text.splitlines()
    assert lines[0].startswith("MainThread") and "data-fetch" in lines[0]
    assert "SlowDataset.__getitem__" in lines[1] and "▸" in lines[1]
    assert "frames of the parent at fork time" in lines[-1]
    assert "mode_loader" not in text  # the parent's loop, inherited at fork


def test_category_bar_fills_width_and_has_a_legend():
    bar, legend = category_bar([(Category.DATA_WAIT, 0.62), (Category.FORWARD, 0.28), (Category.IDLE, 0.1)], 50)
    assert sum(len(t) for t, _ in bar) == 50
    assert {st for _, st in bar} == {"cat.data-wait", "cat.forward", "cat.idle"}
    assert plain([legend]) == "▓ data-wait 62%  ▉ forward 28%  ░ idle 10%"
    assert plain(category_bar([], 50)) == "no samples yet"


def test_stuck_lines_say_where_and_what_else_is_happening():
    store, pid = fixture_store("deadlock", n=25)
    main = [s for s in store.stack_window(0) if s.is_main]
    others = [s for s in store.stack_window(0) if not s.is_main][-1:]
    v = judge(main, store.now, 3.0, others=others)
    text = plain(stuck_lines(v, pid))
    first, at = text.splitlines()[:2]
    assert first.startswith(f"STUCK: PID {pid} has not moved for 4s")
    assert "project/stack_targets.py:" in at and "in mode_deadlock" in at and "GPU: unknown" in at
    assert "with lock_b:" in text  # the line of code it is stuck on
    assert "thread metrics-writer" in text and "idle at project/stack_targets.py" in text
    assert "press n for a native" in text


def test_pane_shows_fault_exit_and_workers():
    store, pid = fixture_store("data-wait", n=5)
    store.add([
        ProcSample(ts=T0 + 1, pid=pid, ppid=1, role="target", cmdline="python train.py", cpu_percent=12.0,
                   rss=1 << 30, num_threads=4, status="sleeping"),
        ProcSample(ts=T0 + 1, pid=pid + 1, ppid=pid, role="worker", cpu_percent=88.0, status="running"),
        Event(T0 + 1, "stacks", "target PID 1 exited at 10:00:00 with code 3", "warning"),
    ])
    text = plain(stacks_pane_lines(stacks_view(store, pid, 30.0), 80))
    assert text.splitlines()[0].startswith(f"PID {pid}  python train.py   CPU 12%  RSS 1.0G")
    assert "exited at 10:00:00 with code 3" in text
    assert "Main thread, last" in text and "data-wait" in text
    assert "Workers (1)" in text and "88%" in text and "running" in text
    assert "Other threads (2)" in text and "QueueFeederThread" in text
    assert "STUCK" not in text


def test_dump_text_and_json_list_every_thread_with_category():
    store, pid = fixture_store("data-wait", n=1)
    view = stacks_view(store, pid, float("inf"))
    text = dump_text(view)
    assert text.count("QueueFeederThread") == 2 and "data-wait" in text
    doc = dump_dict(view)
    json.dumps(doc)  # serialisable
    assert doc["pid"] == pid and len(doc["threads"]) == 3
    main = doc["threads"][0]
    assert main["main"] and main["category"] == "data-wait" and main["active"] is False
    assert main["frames"][0]["name"] == "_PollLikeSelector.select" and not main["frames"][0]["project"]
    assert any(f["project"] for f in main["frames"])
