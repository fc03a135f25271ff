"""The Ranks tab: a synthetic 2-rank job on the fake GPUs (a snapshot, as in test_snapshots.py),
the pure lines behind it, and the tab appearing only for a multi-rank job."""

from __future__ import annotations

from gputop.analysis.breakdown import Breakdown, Bucket
from gputop.analysis.ranks import ranks_message
from gputop.analysis.window import job_view
from gputop.model import Category, Event, Frame, GpuProcess, StackSample, Verdict
from gputop.present.ranks import ranks_pane_lines
from gputop.ui.app import GputopApp

from test_snapshots import fake_session, fixed_environment, open_tab, publish_views  # noqa: F401 (fixture)

DIST = "/usr/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py"
TRAIN = "/home/ml/job/train.py"
WAIT = (Frame("all_reduce", DIST, 2501), Frame("train_step", TRAIN, 71), Frame("main", TRAIN, 90))
FWD = (Frame("forward", "/home/ml/job/model.py", 33), Frame("train_step", TRAIN, 66), Frame("main", TRAIN, 90))
LOAD = (Frame("load_batch", TRAIN, 41), Frame("main", TRAIN, 86))
R0, R1 = 31337, 31338


def two_rank_session(clock):
    """Rank 0 waits in all_reduce 70 % of its samples; rank 1 builds its batch in Python."""
    session = fake_session(clock, gpus=2)
    store = session.store
    store.add([Event(clock.t, "ranks", ranks_message({R0: 0, R1: 1}, 31300)),
               Event(clock.t, "topology", "GPU pairs: 0-1 NVLink, P2P ok | NVLinks up: GPU 0 18, GPU 1 18")])
    for i in range(50):
        ts = clock.t - 10 + i * 0.2
        r0 = (WAIT, Category.COLLECTIVE) if i % 10 < 7 else (FWD, Category.FORWARD)
        r1 = (LOAD, Category.DATA_FETCH) if i % 10 < 8 else (WAIT, Category.COLLECTIVE)
        store.add([StackSample(ts, R0, R0, "MainThread", r0[0], is_main=True, category=r0[1]),
                   StackSample(ts, R1, R1, "MainThread", r1[0], active=True, is_main=True, category=r1[1])])
    polls = [store.latest_gpu(i) for i in (0, 1)]
    store.add([*polls, GpuProcess(polls[0].ts, 0, R0, 30 << 30), GpuProcess(polls[1].ts, 1, R1, 29 << 30)])
    t = store.now
    store.add([Verdict(t, (), (Breakdown(0, t - 60, t, {Bucket.BUSY: 18.0, Bucket.COLLECTIVE: 40.0, Bucket.UNKNOWN: 2.0}, attributed=True),
                               Breakdown(1, t - 60, t, {Bucket.BUSY: 45.0, Bucket.DATA: 12.0, Bucket.UNKNOWN: 3.0}, attributed=True)))])
    publish_views(session)
    return session


def test_ranks_tab_of_a_two_rank_job(snap_compare, clock):
    """A row per rank (PID, GPU, what it does now, its time by group, its hot function), each GPU's
    breakdown under its rank, and the NVLink between them."""
    app = GputopApp(two_rank_session(clock), interval=1.0, refresh=60)
    assert snap_compare(app, run_before=lambda pilot: open_tab(pilot, "4"), terminal_size=(120, 40))


def test_ranks_lines_name_the_owner_of_each_gpu_and_the_straggler(clock):
    store = two_rank_session(clock).store
    text = ["".join(t for t, _ in line) for line in ranks_pane_lines(job_view(store, 60.0), 116, store.breakdowns())]
    assert text[0] == "2 local ranks of the job launched by PID 31300 · main threads over the last 60 s"
    r0 = next(t for t in text if t.startswith("    0    31337    0 "))
    r1 = next(t for t in text if t.startswith("    1    31338    1 "))
    assert "70%" in r0 and "forward (job/model.py:33)" in r0, r0
    assert "GPU 1 · rank 1 (pid 31338): busy 75% · waiting for data 20%" in "\n".join(text)
    assert "load_batch (job/train.py:41)" in r1 and "80%" in r1, r1
    assert "rank 1 spends the least time in collectives" in "\n".join(text)
    assert "communication share: rank 0 70% in all_reduce, rank 1 20% in all_reduce" in text
    assert any(t.startswith("GPU 0 · rank 0 (pid 31337): collective/communication wait 67% · busy 30%") for t in text), text
    assert "GPU 0 ↔ GPU 1: NVLink, P2P ok" in text


def test_the_ranks_tab_is_there_only_for_a_multi_rank_job(clock):
    import asyncio

    async def tabs(session):
        app = GputopApp(session, interval=1.0, refresh=60)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            names = [n for n, _ in app.query_one("#tabs").tabs]
            await pilot.press("4")
            await pilot.pause()
            return names, app.active_tab

    assert asyncio.run(tabs(fake_session(clock, gpus=1))) == (["processes", "advisor", "stacks"], "processes")
    names, active = asyncio.run(tabs(two_rank_session(clock)))
    assert names == ["processes", "advisor", "stacks", "ranks"] and active == "ranks"
