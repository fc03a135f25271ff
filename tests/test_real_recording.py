"""A session recorded on a real H100 (a checkpoint-stall job) drives replay, report and UI on CPU.

The file was made with ``gputop record --pid`` while ``gputop.workloads checkpoint-stall`` ran on
CUDA; paths inside it were replaced with neutral ones.
"""

from pathlib import Path

from gputop.ui.lines_view import LinesView

from gputop.analysis.breakdown import Bucket
from gputop.session import open_replay
from gputop.model import GpuSample, StackSample
from gputop.record.reader import Reader
from gputop.report.collect import collect
from gputop.ui.app import GputopApp

REC = Path(__file__).parent / "fixtures" / "recordings" / "h100-checkpoint-stall.gputop"


def test_report_of_the_real_session_finds_the_checkpoint_stalls():
    with Reader(REC) as r:
        summary = collect(r)
    gpu = summary.gpus[0]
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    bd = gpu.breakdown
    # The job saved synchronously every few seconds: a third of the time or more went to saves.
    assert bd.get(Bucket.CHECKPOINT) / bd.total_s > 0.25
    assert 0.3 < gpu.busy_fraction < 0.7
    assert gpu.tensor_mean is not None and gpu.tensor_mean > 5  # GPM was recorded
    assert [f.finding.id for f in summary.findings] == ["checkpoint-stall"]


def test_replay_of_the_real_session_feeds_the_same_samples():
    session = open_replay(REC, speed=1000.0, advisor=False)
    replay = session.replay
    try:
        replay.seek(replay.end_ts)
        session.pipeline.poll_once()
        store = session.store
        last = store.latest_gpu(0)
        assert isinstance(last, GpuSample) and last.mem_total and last.power_limit_w == 700.0
        stacks = store.stack_window(replay.end_ts - 60)
        assert stacks and all(isinstance(s, StackSample) for s in stacks)
        assert any(s.category.value == "checkpoint-io" for s in stacks)
        assert store.system is not None and store.system.driver_version == "580.159.04"
    finally:
        session.pipeline.stop()


async def test_the_ui_shows_the_real_session():
    session = open_replay(REC, speed=1.0, start="60%", paused=True)
    app = GputopApp(session, refresh=60)
    session.pipeline.poll_once()
    async with app.run_test(size=(140, 45)) as pilot:
        session.pipeline.poll_once()
        app.tick(force=True)
        await pilot.pause()
        assert "REPLAY" in app.query_one("#header", LinesView).plain
        panel = app.query_one("#gpu-0", LinesView).plain
        assert "H100 80GB HBM3" in panel and "79.6G" in panel
    session.pipeline.stop()
