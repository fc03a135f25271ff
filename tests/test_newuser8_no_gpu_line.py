"""A CPU-only machine at 80x24: the line under the header that says what still works was cut at
the terminal's edge mid-sentence ("the table lists the busiest"), in the live UI and in a replay."""

from __future__ import annotations

from gputop.model import SystemInfo
from gputop.pipeline import Pipeline
from gputop.session import Session
from gputop.store import Store
from gputop.ui.app import GputopApp
from gputop.ui.lines_view import LinesView


class NoGpuSource:
    """NVML could not load: one SystemInfo that says why, and no GPU samples."""

    name = "nvml"

    def __init__(self, clock) -> None:
        self.clock = clock

    def poll(self):
        return [SystemInfo(ts=self.clock(), hostname="laptop", nvml_error="NVIDIA driver not loaded")]


def _app(clock) -> GputopApp:
    store = Store()
    src = NoGpuSource(clock)
    s = Session(store=store, pipeline=Pipeline(store, [src], clock=clock), gpu=src, mode="live")
    clock.advance(1.0)
    s.pipeline.poll_once()
    app = GputopApp(s, refresh=60)
    return app


def _whole(text: str) -> str:
    return " ".join(line.strip() for line in text.split("\n"))


async def test_the_no_gpu_line_is_whole_at_80_columns(clock):
    app = _app(clock)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = app.query_one(".gpu-panel", LinesView).plain
        assert _whole(text).startswith("No GPU data. Host and process monitoring continue")
        assert _whole(text).endswith("the table lists the busiest processes."), text
        # Every line fits the panel (80 columns less its padding), none cut at the edge.
        assert all(len(line.rstrip()) <= 78 for line in text.split("\n")), text


async def test_the_replay_wording_is_whole_at_80_columns(clock):
    app = _app(clock)
    async with app.run_test(size=(80, 24)) as pilot:
        app.query_one("#gpus").recorded = True  # as a replay of a file recorded without a GPU
        app.tick(force=True)
        await pilot.pause()
        text = app.query_one(".gpu-panel", LinesView).plain
        assert _whole(text).startswith("No GPU data: recorded without a GPU")
        assert _whole(text).endswith("the table lists the busiest."), text
        assert all(len(line.rstrip()) <= 78 for line in text.split("\n")), text
