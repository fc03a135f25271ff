"""The panes' views as a derived stage (gputop.analysis.views): what the Stacks and Ranks panes show
is computed on the pipeline's thread and published through the store, live and in a replay; the
panes lay out what was published and read no samples themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.app import App

from gputop.ui.pane import PaneContext
from gputop.analysis.classify import classify, is_library
from gputop.analysis.ranks import ranks_message
from gputop.analysis.window import job_view
from gputop.analysis.window import stacks_view
from gputop.analysis.views import ViewsStage, pane_views
from gputop.model import Category, Event, Frame, GpuProcess, GpuSample, PaneViews, Reset, StackSample, Verdict
from gputop.present.ranks import ranks_pane_lines as rank_lines
from gputop.present.stacks import stacks_pane_lines as stack_lines, plain
from gputop.record.reader import Reader
from gputop.session import Config, open_live, open_replay
from gputop.sources.stacks import StackParser
from gputop.store import Store
from gputop.ui.ranks_pane import RanksPane
from gputop.ui.stacks_pane import StacksPane

FIXTURES = Path(__file__).parent / "fixtures"
RECORDING = FIXTURES / "recordings" / "h100-checkpoint-stall.gputop"
T0 = 1_700_000_000.0
DIST = "/usr/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py"
TRAIN = "/home/ml/job/train.py"
WAIT = (Frame("all_reduce", DIST, 2501), Frame("train_step", TRAIN, 71), Frame("main", TRAIN, 90))
LOAD = (Frame("load_batch", TRAIN, 41), Frame("main", TRAIN, 86))
R0, R1 = 31337, 31338


def deadlock_store(seconds: float = 5.0) -> tuple[Store, int]:
    doc = json.loads((FIXTURES / "stacks" / "deadlock.json").read_text())
    parser = StackParser(lambda fn, ln: doc["source_lines"].get(f"{fn}:{ln}"), classify, is_library)
    store = Store()
    for i in range(int(seconds * 5) + 1):
        store.add(parser.samples(doc["dump"], T0 + i * 0.2))
    return store, doc["dump"][0]["pid"]


def two_rank_store() -> Store:
    """Rank 0 waits in all_reduce 70 % of its 50 samples, rank 1 loads its batch 80 % of them."""
    store = Store()
    store.add([Event(T0, "ranks", ranks_message({R0: 0, R1: 1}, 31300))])
    for i in range(50):
        ts = T0 + i * 0.2
        r0 = (WAIT, Category.COLLECTIVE) if i % 10 < 7 else (LOAD, Category.DATA_FETCH)
        r1 = (LOAD, Category.DATA_FETCH) if i % 10 < 8 else (WAIT, Category.COLLECTIVE)
        store.add([StackSample(ts, R0, R0, "MainThread", r0[0], is_main=True, category=r0[1]),
                   StackSample(ts, R1, R1, "MainThread", r1[0], active=True, is_main=True, category=r1[1])])
    store.add([GpuSample(store.now, 0, util_gpu=50.0), GpuSample(store.now, 1, util_gpu=90.0),
               GpuProcess(store.now, 0, R0, 1 << 30), GpuProcess(store.now, 1, R1, 1 << 30)])
    return store


# --------------------------------------------------------------------------- the stage


def test_the_stage_publishes_the_targets_stacks_with_its_threshold():
    store, pid = deadlock_store(5.0)
    (views,) = ViewsStage(store, pid, stuck_after=3.0).poll()
    assert isinstance(views, PaneViews) and views.ts == store.now and views.target_pid == pid
    assert views.job is None  # one process, not a multi-rank job
    v = views.stacks
    assert v.verdict.stuck and "mode_deadlock" in v.verdict.where  # stuck after 3 s: 5 s unchanged
    assert v.samples == 26 and v.shares and v.hot
    assert v == stacks_view(store, pid, 3.0)  # the pane's view, as it was computed on the UI thread
    # The session's own threshold decides: 30 s is not reached in 5 s.
    (views,) = ViewsStage(store, pid, stuck_after=30.0).poll()
    assert not views.stacks.verdict.stuck


def test_the_stage_publishes_each_ranks_view_of_a_multi_rank_job():
    store = two_rank_store()
    (views,) = ViewsStage(store, R0, stuck_after=30.0).poll()
    job = views.job
    assert job is not None and job.launcher == 31300 and job.window_s == 60.0
    r0, r1 = job.ranks
    assert (r0.rank, r0.pid, r0.gpu, r0.samples) == (0, R0, 0, 50)
    assert r0.collective == pytest.approx(0.7) and r0.collective_fn == "all_reduce"
    assert r1.collective == pytest.approx(0.2) and r1.hot == "load_batch (job/train.py:41)"
    assert job == job_view(store, 60.0)
    assert views.stacks is not None and views.stacks.pid == R0


def test_no_target_no_stacks_view_and_nothing_before_any_data():
    assert ViewsStage(Store(), 42, 30.0).poll() == []  # the store's clock has not started
    store = two_rank_store()
    (views,) = ViewsStage(store, None, 30.0).poll()
    assert views.target_pid is None and views.stacks is None and views.job is not None


def test_the_stage_looks_again_only_when_the_data_the_target_or_a_jump_changed():
    store, pid = deadlock_store(2.0)
    target = [pid]
    stage = ViewsStage(store, lambda: target[0], 30.0)
    first = stage.poll()
    assert len(first) == 1
    store.add(first)  # its own publication changes nothing it reads
    store.add([Verdict(store.now)])  # nor does another stage's
    assert stage.poll() == []
    store.add([StackSample(store.now + 0.2, pid, 1, "MainThread", is_main=True)])
    (again,) = stage.poll()
    assert again.ts == store.now and again.stacks.samples == first[0].stacks.samples + 1
    target[0] = pid + 1  # the user attached to another process
    (other,) = stage.poll()
    assert other.target_pid == pid + 1 and other.stacks.samples == 0
    now = store.now
    store.add([Reset(now), StackSample(now, pid, 1, "MainThread", is_main=True)])  # a replay jumped, same clock
    assert len(stage.poll()) == 1


def test_the_store_keeps_the_latest_views_and_a_jump_forgets_them():
    store = Store()
    assert store.pane_views() is None
    a, b = PaneViews(1.0), PaneViews(2.0)
    av = store.analysis_version
    store.add([a])
    store.add([b])
    assert store.pane_views() is b
    assert store.analysis_version == av  # the advisor's pane need not redraw for it
    store.add([Reset(3.0)])
    assert store.pane_views() is None


def test_views_are_not_recorded(tmp_path):
    from gputop.record.writer import RecordWriter, SessionMeta

    path = tmp_path / "v.gputop"
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="fake", host="testhost"))
    st = StackSample(T0, 7, 7, "MainThread", (Frame("f", "/src/f.py", 1),), is_main=True)
    w.flush([st, PaneViews(T0 + 50.0, 7)])
    w.finish()
    assert w.samples == 1 and w.last_ts == T0  # derived, like the Verdict: a replay derives it again
    assert Reader(path).stack_samples(T0 - 1, T0 + 100) == [st]


# --------------------------------------------------------------------------- sessions: live and replay alike


def test_ui_sessions_live_and_replay_run_the_stage_headless_ones_do_not():
    live = open_live(Config(fake=1, views=True))
    headless = open_live(Config(fake=1))
    replay = open_replay(RECORDING, start="60%", paused=True, views=True)
    try:
        # The views are a part of the session's one stage (advisor.stage), which is on the pipeline.
        assert isinstance(live.stage.views, ViewsStage) and live.stage in live.pipeline.sources
        assert headless.stage.views is None and not any(isinstance(s, ViewsStage) for s in headless.pipeline.sources)
        assert isinstance(replay.stage.views, ViewsStage) and replay.stage in replay.pipeline.sources
        assert live.stage.views.stuck_after == live.stuck_after and replay.stage.views.stuck_after == replay.stuck_after
        # The stage follows the session's target (an attach changes it).
        live.target_pid = 4_000_000
        live.pipeline.poll_once()
        assert live.store.pane_views().target_pid == 4_000_000
    finally:
        for s in (live, headless, replay):
            s.pipeline.stop()


def test_a_replay_publishes_the_recorded_targets_stacks_as_a_live_session_would():
    session = open_replay(RECORDING, start="60%", paused=True, views=True)
    try:
        session.pipeline.poll_once()
        views = session.store.pane_views()
        assert views is not None and views.target_pid == session.target_pid is not None
        assert views.stacks == pane_views(session.store, session.target_pid, session.stuck_after).stacks
        assert views.stacks.samples > 0 and dict(views.stacks.shares).get(Category.CHECKPOINT_IO, 0) > 0
        # Paused: nothing changes, nothing is computed again.
        assert session.stage.views.poll() == [] and not session.stage.views.due()
    finally:
        session.pipeline.stop()


# --------------------------------------------------------------------------- the panes only lay it out


class NoSamples(Store):
    """A store whose samples cannot be read: a pane that analysed them would fail here."""

    def _refuse(self, *args, **kwargs):
        raise AssertionError("a pane read samples: the analysis belongs to the views stage")

    stack_window = proc_window = task_windows = util_window = gpu_window = procs_latest = _refuse
    events = latest_proc = gpu_processes = _refuse


class Host(App):
    def __init__(self, pane):
        super().__init__()
        self.pane = pane

    def compose(self):
        yield self.pane


def _published(store: Store, pid: int | None) -> NoSamples:
    """``store``'s published views in a store that refuses every read of samples."""
    out = NoSamples()
    out.add([*ViewsStage(store, pid, 3.0).poll(), Verdict(store.now)])
    return out


async def test_the_stacks_pane_lays_out_the_published_view_and_reads_no_samples():
    store, pid = deadlock_store(5.0)
    published = _published(store, pid)
    pane = StacksPane()
    async with Host(pane).run_test(size=(120, 40)):
        pane.update_view(PaneContext(published, pid))
        text = plain(pane.last_lines)
        assert text == plain(stack_lines(published.pane_views().stacks, pane.text_width))
        assert "STUCK: PID" in text and "mode_deadlock" in text
        # A target the stage has not looked at yet (just attached): a waiting line, not the old view.
        pane.update_view(PaneContext(published, pid + 1))
        assert plain(pane.last_lines).splitlines()[0] == f"PID {pid + 1}" and "reading its stacks" in plain(pane.last_lines)


async def test_the_stacks_pane_redraws_when_new_views_are_published_only():
    store, pid = deadlock_store(2.0)
    pane = StacksPane()
    async with Host(pane).run_test(size=(120, 40)):
        pane.update_view(PaneContext(store, pid))
        assert "reading its stacks" in plain(pane.last_lines)  # no stage has published yet
        store.add(ViewsStage(store, pid, 30.0).poll())
        pane.update_view(PaneContext(store, pid))
        first = pane.last_lines
        assert "STUCK" not in plain(first) and "Main thread" in plain(first)
        store.add([StackSample(store.now + 0.2, pid, 1, "MainThread", is_main=True)])
        pane.update_view(PaneContext(store, pid))
        assert pane.last_lines is first  # new samples alone: the pane waits for the stage
        store.add(ViewsStage(store, pid, 30.0).poll())
        pane.update_view(PaneContext(store, pid))
        assert pane.last_lines is not first and "(12 samples)" in plain(pane.last_lines)


async def test_the_ranks_pane_lays_out_the_published_job_and_reads_no_samples():
    store = two_rank_store()
    published = _published(store, R0)
    pane = RanksPane()
    async with Host(pane).run_test(size=(120, 30)):
        pane.update_view(PaneContext(published))
        text = plain(pane.last_lines)
        assert text == plain(rank_lines(published.pane_views().job, pane.text_width))
    assert text.startswith("2 local ranks of the job launched by PID 31300")
    assert "rank 1 spends the least time in collectives" in text
    assert "communication share: rank 0 70% in all_reduce, rank 1 20% in all_reduce" in text
    pane = RanksPane()
    async with Host(pane).run_test(size=(120, 30)):
        pane.update_view(PaneContext(Store()))
        assert "reading the ranks' stacks" in plain(pane.last_lines)  # before the stage's first look
