"""`--fake 64` at 80x24: GPUs 13-63 were below the fold with no word, and `[10] Fake H10…UTIL`
lost the space between its name and the next column."""

from __future__ import annotations

import re

from gputop.model import GpuInfo, GpuSample
from gputop.pipeline import Pipeline
from gputop.present import COMPACT, gpu_panel_lines, hidden_gpus_line
from gputop.session import Session
from gputop.sources.fake import FakeGpuSource
from gputop.store import Store
from gputop.ui.app import GputopApp
from gputop.ui.lines_view import LinesView


def _session(clock, gpus: int) -> Session:
    store = Store()
    src = FakeGpuSource(gpus=gpus, clock=clock)
    return Session(store=store, pipeline=Pipeline(store, [src], clock=clock), gpu=src, mode="fake")


def _columns(line: str) -> tuple[int, ...]:
    """Where each column of a compact panel line starts."""
    return tuple(line.index(word) for word in ("UTIL", "MEM", "°C", "W ", "TC"))


async def test_64_gpus_at_80x24_say_how_many_are_not_shown_and_line_up(clock):
    s = _session(clock, 64)
    for _ in range(3):
        clock.advance(1.0)
        s.pipeline.poll_once()
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        shown = [w for w in app.query(".gpu-panel") if w.id != "gpu-more"]
        more = app.query_one("#gpu-more", LinesView)
        m = re.match(r"\+(\d+) more \(GPUs (\d+)-63\)", more.plain)
        assert m, more.plain
        assert len(shown) + int(m.group(1)) == 64 and int(m.group(2)) == len(shown)
        # The line is on screen: inside the panels' area, nothing to scroll to.
        area = app.query_one("#gpus").region
        assert area.contains_region(more.region)
        lines = [w.plain for w in shown]
        assert len({_columns(x) for x in lines}) == 1, lines  # every column starts where the others do
        assert all(" UTIL" in x for x in lines)


def test_a_two_digit_index_keeps_its_columns_and_the_space_after_the_name(clock):
    src = FakeGpuSource(gpus=12, clock=clock)
    batch = src.poll()
    clock.advance(1.0)
    batch += src.poll()
    infos = {x.index: x for x in batch if isinstance(x, GpuInfo)}
    latest = {x.index: x for x in batch if isinstance(x, GpuSample)}
    lines = [gpu_panel_lines(infos[i], latest[i], None, 78, COMPACT, index_w=2)[0].plain for i in (2, 9, 10, 11)]
    assert lines[2].startswith("[10] Fake H10… UTIL")
    assert len({_columns(x) for x in lines}) == 1, lines


def test_the_hidden_gpus_line_names_the_idle_ones(clock):
    src = FakeGpuSource(gpus=12, clock=clock)
    latest = {x.index: x for x in src.poll() if isinstance(x, GpuSample)}
    idle = sorted(i for i, x in latest.items() if (x.util_gpu or 0) < 10)
    assert idle  # the script keeps some GPUs idle
    text = hidden_gpus_line([(i, latest[i]) for i in range(4, 12)], 200).plain
    assert text.startswith("+8 more (GPUs 4-11): ")
    assert f"{len([i for i in idle if i >= 4])} idle (" in text
