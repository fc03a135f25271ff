"""Recordings keep a multi-rank job's ranks: the rank map and topology said before recording
started are written first, a seek far past them still gets them, and the text, HTML and JSON
reports have a per-rank section."""

from __future__ import annotations

import json

from gputop.analysis.ranks import rank_map, ranks_message, topology
from gputop.model import Category, Event, Frame, GpuProcess, GpuSample, StackSample
from gputop.pipeline import Pipeline
from gputop.record.reader import Reader
from gputop.record.recorder import Recorder
from gputop.report import collect, render_html, render_text, summary_dict
from gputop.session import Session
from gputop.record.replay import HistoryWindows
from gputop.store import Store

T0 = 1_700_000_000.0
DIST = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"
WAIT = (Frame("all_reduce", DIST, 2501), Frame("main", "/home/u/job/train.py", 90))
LOAD = (Frame("load_batch", "/home/u/job/train.py", 41), Frame("main", "/home/u/job/train.py", 86))
FWD = (Frame("forward", "/home/u/job/model.py", 33), Frame("main", "/home/u/job/train.py", 88))
R0, R1 = 4_194_301, 4_194_302  # above pid_max: never real processes


def record_job(path, seconds=30, chatter=0):
    """Record a 2-rank job (rank 1 the straggler) that named its ranks before recording began,
    then ``chatter`` routine events."""
    store = Store()
    clock = [T0]
    session = Session(store=store, pipeline=Pipeline(store, [], clock=lambda: clock[0]), clock=lambda: clock[0])
    store.add([Event(T0, "ranks", ranks_message({R0: 0, R1: 1}, 4_194_300)),
               Event(T0, "topology", "GPU pairs: 0-1 NVLink, P2P ok")])
    session.start_recording(path)
    for i in range(seconds * 5):
        ts = T0 + 1 + i / 5
        r0 = (WAIT, Category.COLLECTIVE) if i % 4 else (FWD, Category.FORWARD)
        r1 = (LOAD, Category.DATA_FETCH) if i % 4 else (WAIT, Category.COLLECTIVE)
        batch = [StackSample(ts, R0, R0, "MainThread", r0[0], is_main=True, category=r0[1]),
                 StackSample(ts, R1, R1, "MainThread", r1[0], is_main=True, category=r1[1])]
        if i % 5 == 0:
            batch += [GpuSample(ts, 0, util_gpu=30.0), GpuSample(ts, 1, util_gpu=90.0),
                      GpuProcess(ts, 0, R0), GpuProcess(ts, 1, R1)]
        session.pipeline.publish(batch)
    for k in range(chatter):
        session.pipeline.publish([Event(T0 + seconds + 1 + k * 0.01, "stacks", f"note {k}")])
    session.stop_recording()


def test_the_ranks_survive_a_late_recording_and_a_far_seek(tmp_path):
    path = tmp_path / "job.gputop"
    record_job(path, chatter=600)
    with Reader(path) as r:
        got = r.history(r.end_ts, HistoryWindows())
    events = [x for x in got if isinstance(x, Event)]
    assert rank_map(events) == {R0: 0, R1: 1}
    assert topology(events).between(0, 1) == ("NVLink", "ok")


def test_reports_have_a_per_rank_section(tmp_path):
    path = tmp_path / "job.gputop"
    record_job(path)
    with Reader(path) as r:
        s = collect(r)
    text = render_text(s)
    section = text[text.index("ranks (2)"):].splitlines()
    assert section[1].split() == ["rank", "pid", "gpu", "samples", "compute", "data", "comm", "ckpt", "other", "hot", "function"]
    assert section[2].split()[:9] == ["0", str(R0), "0", "150", "25%", "0%", "75%", "0%", "0%"], section[2]
    assert section[3].split()[:9] == ["1", str(R1), "1", "150", "0%", "75%", "25%", "0%", "0%"], section[3]
    assert section[3].endswith("load_batch (job/train.py:41) 75%")
    assert section[4] == "  communication: rank 0 75%, rank 1 25%; the others wait in all_reduce for rank 1 most"
    html = render_html(s)
    assert "<h2>Ranks (2)</h2>" in html and "load_batch (job/train.py:41) (75%)" in html
    ranks = json.loads(json.dumps(summary_dict(s)))["ranks"]
    assert [(x["rank"], x["gpu"], round(x["shares"]["comm"], 2)) for x in ranks] == [(0, 0, 0.75), (1, 1, 0.25)]


def test_a_recording_of_one_process_has_no_rank_section(tmp_path):
    path = tmp_path / "one.gputop"
    store = Store()
    session = Session(store=store, pipeline=Pipeline(store, [], clock=lambda: T0), clock=lambda: T0)
    session.start_recording(path)
    session.pipeline.publish([GpuSample(T0 + 1, 0, util_gpu=50.0), GpuSample(T0 + 3, 0, util_gpu=50.0)])
    session.stop_recording()
    with Reader(path) as r:
        s = collect(r)
    assert s.ranks == () and "ranks (" not in render_text(s) and summary_dict(s)["ranks"] == []


def test_a_cpu_ranks_report_counts_ddps_backward_wait_as_communication(tmp_path):
    # gloo DDP: rank 0's main thread off the CPU in backward waits in the gradient all-reduce for
    # rank 1, which loads; the report judges it as the ranks view and the advisor do
    autograd = "/usr/lib/python3/site-packages/torch/autograd/graph.py"
    back = (Frame("_engine_run_backward", autograd, 829), Frame("main", "/home/u/job/train.py", 89))
    path = tmp_path / "cpu.gputop"
    store = Store()
    clock = [T0]
    session = Session(store=store, pipeline=Pipeline(store, [], clock=lambda: clock[0]), clock=lambda: clock[0])
    store.add([Event(T0, "ranks", ranks_message({R0: 0, R1: 1}, 4_194_300))])
    session.start_recording(path)
    for i in range(50):
        ts = T0 + 1 + i / 5
        session.pipeline.publish([
            StackSample(ts, R0, R0, "MainThread", back, active=False, is_main=True, category=Category.BACKWARD),
            StackSample(ts, R1, R1, "MainThread", LOAD, is_main=True, category=Category.DATA_FETCH)])
    session.stop_recording()
    with Reader(path) as r:
        ranks = {x.rank: dict(x.groups) for x in collect(r).ranks}
    assert ranks[0]["comm"] == 1.0 and ranks[0]["compute"] == 0.0
    assert ranks[1]["data"] == 1.0


def test_the_reports_cpu_time_line_judges_a_cpu_ranks_backward_wait_as_advise_does(tmp_path):
    """A gloo DDP job recorded from its launcher: rank 0 off the CPU in `loss.backward()` is
    DDP's all-reduce wait (analysis.ranks.as_ranks). The report's CPU time line read the
    samples as recorded and said "busy 100 %" beside advise's and its own ranks table's 69 %."""
    engine = Frame("_engine_run_backward", "/usr/lib/python3/site-packages/torch/autograd/graph.py", 829)
    back = (engine, Frame("backward", "/usr/lib/python3/site-packages/torch/autograd/__init__.py", 347),
            Frame("main", "/home/u/job/train.py", 39))
    store = Store()
    clock = [T0]
    session = Session(store=store, pipeline=Pipeline(store, [], clock=lambda: clock[0]), clock=lambda: clock[0])
    store.add([Event(T0, "ranks", ranks_message({R0: 0, R1: 1}, 4_194_300))])
    path = tmp_path / "gloo.gputop"
    session.target_pid = R0  # advise attached to the launcher follows rank 0
    session.start_recording(path)
    for i in range(150):
        ts = T0 + 1 + i / 5
        waits = i % 10 < 7  # 70 % of rank 0's samples off the CPU in backward: the all-reduce
        batch = [StackSample(ts, R0, R0, "MainThread", back, active=not waits, is_main=True, category=Category.BACKWARD),
                 StackSample(ts, R1, R1, "MainThread", LOAD, active=True, is_main=True, category=Category.OTHER)]
        session.pipeline.publish(batch)
    session.stop_recording()
    with Reader(path) as r:
        s = collect(r)
    text = render_text(s)
    wait = next(line for line in text.splitlines() if "collective/communication wait" in line)
    assert wait.rstrip().endswith("70 %"), text
    # The target advise followed is one rank of the launcher's job: said beside its PID.
    assert f"target PID {R0} (rank 0 of 2: the ranks below)" in text, text[:600]


def test_the_reports_hot_function_is_the_ranks_tabs_a_straggler_sleeping_in_its_own_code(tmp_path):
    """A 2-rank gloo job whose rank 1 sleeps 20 ms in `load_batch` each step: off the CPU there
    (IDLE), on it a few % on the loop's line. The Ranks tab named `load_batch` 88 %; the text and
    HTML reports counted on-CPU places only and named `<module>` 2 %, and the HTML said the
    straggler "waits in all_reduce"."""
    from gputop.analysis import hot_line, rank_views

    loop = Frame("<module>", "/home/u/jobs/ddp.py", 15)
    sleep = (Frame("load_batch", "/home/u/jobs/ddp.py", 10), loop)
    wait = (Frame("all_reduce", DIST, 2501), loop)
    path = tmp_path / "ddp.gputop"
    store = Store()
    clock = [T0]
    session = Session(store=store, pipeline=Pipeline(store, [], clock=lambda: clock[0]), clock=lambda: clock[0])
    store.add([Event(T0, "ranks", ranks_message({R0: 0, R1: 1}, 4_194_300))])
    session.start_recording(path)
    stacks = []
    for i in range(50):
        ts = T0 + 1 + i / 5
        r0 = (wait, Category.COLLECTIVE, False) if i % 50 else ((loop,), Category.OTHER, True)
        r1 = ((sleep, Category.IDLE, False) if i % 50 > 5 else (wait, Category.COLLECTIVE, False) if i % 50
              else ((loop,), Category.OTHER, True))
        batch = [StackSample(ts, R0, R0, "MainThread", r0[0], active=r0[2], is_main=True, category=r0[1]),
                 StackSample(ts, R1, R1, "MainThread", r1[0], active=r1[2], is_main=True, category=r1[1])]
        stacks += batch
        session.pipeline.publish(batch)
    session.stop_recording()
    with Reader(path) as r:
        s = collect(r)
    # the Ranks tab's choice over the same samples
    tab = {v.rank: hot_line(v) for v in rank_views({R0: 0, R1: 1}, stacks, T0)}
    assert tab[1][:2] == ("load_batch (jobs/ddp.py:10)", 0.88), tab
    got = {x.rank: (x.hot, round(x.hot_share, 2), x.hot_own) for x in s.ranks}
    assert got == {k: (p, round(sh, 2), own) for k, (p, sh, own) in tab.items()}, got
    text = render_text(s)
    row = next(line for line in text.splitlines() if line.split()[:2] == ["1", str(R1)])
    assert row.endswith("load_batch (jobs/ddp.py:10) 88%"), row
    html = render_html(s)
    assert "load_batch (jobs/ddp.py:10) (88%)" in html
    straggler_row = next(x for x in html.split("<tr>") if x.startswith(f"<td>1</td><td>{R1}</td>")).split("</tr>")[0]
    assert "all_reduce" not in straggler_row and "the others wait for it" in straggler_row, straggler_row
    assert "the others wait in all_reduce for rank 1 most" in html
