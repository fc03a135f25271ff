"""The Textual app driven by the fake source through the real pipeline (no GPU, no threads)."""

import pytest
from textual.widgets import Input

from gputop.session import Session
from gputop.model import Event, GpuSample
from gputop.pipeline import Pipeline
from gputop.sources.fake import FakeGpuSource
from gputop.store import Store
from gputop.ui.app import GputopApp, HelpScreen
from gputop.ui.lines_view import LinesView
from gputop.ui.proc_list import ProcList
from gputop.ui.process_table import ProcessTable


def make_session(clock, gpus=2, mode="fake"):
    store = Store()
    src = FakeGpuSource(gpus=gpus, clock=clock)
    pipe = Pipeline(store, [src], clock=clock)
    return Session(store=store, pipeline=pipe, gpu=src, mode=mode)


def feed(session, clock, polls=3):
    for _ in range(polls):
        clock.advance(1.0)
        session.pipeline.poll_once()


def plain(app, selector):
    return app.query_one(selector, LinesView).plain


async def test_shows_every_gpu_and_header(clock):
    s = make_session(clock, gpus=2)
    feed(s, clock)
    app = GputopApp(s, interval=1.0, refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        header = plain(app, "#header")
        assert "LIVE (FAKE GPUS)" in header
        gpu0 = plain(app, "#gpu-0")
        gpu1 = plain(app, "#gpu-1")
        assert "[0]" in gpu0 and "UTIL" in gpu0 and "61.0G/80.0G" in gpu0
        # GPU 1 is the scripted fp32 job: power-capped, tensor cores idle.
        assert "power cap" in gpu1 and "tensor 0%" in gpu1
        assert app.panel_mode == "full"
        table = app.query_one("#procs", ProcList)
        assert table.row_count == 2


async def test_eight_gpus_fit_80x24_compact(clock):
    s = make_session(clock, gpus=8)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.panel_mode == "compact"
        for i in range(8):
            text = plain(app, f"#gpu-{i}")
            assert text.startswith(f"[{i}]") and "\n" not in text
            assert len(text) <= 78
        # Growing the terminal gives room for richer panels.
        await pilot.resize_terminal(200, 80)
        await pilot.pause()
        assert app.panel_mode in ("medium", "charts", "full")


async def test_four_gpus_at_120x40_draw_the_charts_that_fit_without_scrolling(clock):
    """No history chart was drawn (medium panels) while 18 lines stayed blank: four GPUs at
    120x40 get charts panels (one line of numbers, two chart rows, the legend); fewer GPUs or a
    taller terminal get full panels with taller charts."""
    from gputop.ui.gpu_panels import choose_layout

    assert choose_layout(40, 4) == ("charts", 2) and choose_layout(45, 4) == ("charts", 3)
    assert choose_layout(40, 2) == ("full", 6) and choose_layout(24, 8) == ("compact", 0)
    assert choose_layout(40, 2, attached=True) == ("full", 5)
    # Without GPU processes to list, the table's space goes to the charts.
    assert choose_layout(40, 2, procs=False)[1] > choose_layout(40, 2)[1]
    assert choose_layout(70, 1) == ("full", 12)
    s = make_session(clock, gpus=4)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.panel_mode == "charts"
        for i in range(4):
            lines = plain(app, f"#gpu-{i}").splitlines()
            assert len(lines) == 4 and lines[3].startswith("util 2m")
        gpus = app.query_one("#gpus")
        assert gpus.virtual_size.height <= gpus.region.height  # all of it in sight, no scrolling


async def test_resize_to_tiny_terminal_keeps_running(clock):
    s = make_session(clock, gpus=2)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.resize_terminal(30, 8)
        await pilot.pause()
        feed(s, clock, 1)
        app.tick(force=True)
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert "[0]" in plain(app, "#gpu-0")


async def test_pause_freezes_display_but_not_collection(clock):
    s = make_session(clock, gpus=1)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("p")
        assert app.paused
        assert "PAUSED" in plain(app, "#header")
        shown = app._seen_version
        feed(s, clock, 2)  # collection goes on while paused
        app.tick()
        assert app._seen_version == shown
        await pilot.press("p")
        assert not app.paused and app._seen_version == s.store.version


async def test_a_paused_view_stays_at_its_moment_through_zoom_resize_and_sort(clock):
    s = make_session(clock, gpus=1)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("p")
        at_pause = s.store.latest_gpu(0)
        first_line = plain(app, "#gpu-0").splitlines()[0]
        feed(s, clock, 5)
        # The live store moved on: a new sample with a new timestamp.
        assert s.store.latest_gpu(0).ts > at_pause.ts
        await pilot.press("right_square_bracket")  # zoom out: a forced redraw
        await pilot.resize_terminal(130, 42)
        await pilot.press("N")  # re-sort: the table is rebuilt
        await pilot.pause()
        assert plain(app, "#gpu-0").splitlines()[0] == first_line
        assert app.view.now == at_pause.ts and app.view.latest_gpu(0) is at_pause
        assert all(p.ts <= at_pause.ts for p in app.view.util_window(0, 0))
        await pilot.press("p")
        await pilot.pause()
        assert app.view is s.store and app.view.latest_gpu(0).ts > at_pause.ts


async def test_help_opens_and_closes(clock):
    s = make_session(clock)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test() as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_filter_and_sort_process_table(clock):
    s = make_session(clock, gpus=4)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        table = app.query_one("#procs", ProcessTable)
        assert table.row_count == 3  # GPU 2 is idle in the script
        # Default sort: GPU memory, largest first.
        assert [r.gpu for r in table.rows] == [3, 0, 1]
        await pilot.press("N")  # by PID
        assert table.sort_key == "pid"
        assert [r.pid for r in table.rows] == sorted(r.pid for r in table.rows)
        await pilot.press("i")
        assert [r.pid for r in table.rows] == sorted((r.pid for r in table.rows), reverse=True)
        await pilot.press("slash")
        box = app.query_one("#filter", Input)
        assert box.has_focus
        await pilot.press(*"bench")
        await pilot.pause()
        assert table.row_count == 1 and "bench_matmul" in table.rows[0].command
        await pilot.press("escape")
        await pilot.pause()
        assert table.row_count == 3


async def test_vim_keys_move_selection(clock):
    s = make_session(clock, gpus=4)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        table = app.query_one("#procs", ProcList)
        table.focus()
        assert table.cursor == 0
        await pilot.press("j")
        assert table.cursor == 1
        await pilot.press("k")
        assert table.cursor == 0


async def test_no_nvml_says_why_and_keeps_host_and_processes(clock, monkeypatch):
    import gputop.sources.nvml as nvml_mod
    from gputop.session import Config, open_live

    def refuse(**kw):
        raise nvml_mod.NvmlUnavailable("NVIDIA driver not loaded (libnvidia-ml.so.1 not found)")

    monkeypatch.setattr(nvml_mod.NvmlSource, "open", staticmethod(refuse))
    session = open_live(Config(advisor=False), clock=clock)
    assert session.gpu is None
    clock.advance(1)
    session.pipeline.poll_once()
    clock.advance(1)
    session.pipeline.poll_once()
    app = GputopApp(session, refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        header = plain(app, "#header")
        assert "NVML unavailable: NVIDIA driver not loaded" in header
        assert "Host and process monitoring continue" in app.query_one("#gpus").children[0].plain
        assert "CPU" in plain(app, "#host") and "MEM" in plain(app, "#host")
        assert "NVML unavailable" in plain(app, "#status")


async def test_lost_gpu_is_marked_and_others_keep_updating(clock):
    s = make_session(clock, gpus=2)
    feed(s, clock)
    s.store.add(
        [
            GpuSample(ts=clock.advance(1), index=0, error="GPU lost: fell off the bus"),
            Event(ts=clock(), source="nvml", message="GPU 0 lost", level="warning"),
        ]
    )
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        assert "GPU lost: fell off the bus" in plain(app, "#gpu-0")
        assert "UTIL" in plain(app, "#gpu-1")
        assert "GPU 0 lost" in plain(app, "#status")


def test_no_color_is_honoured(monkeypatch, clock):
    monkeypatch.setenv("NO_COLOR", "1")
    app = GputopApp(make_session(clock), refresh=60)
    assert app.no_color


async def test_quit_key_exits(clock):
    s = make_session(clock)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test() as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
async def test_chart_zoom_keys(clock, size):
    s = make_session(clock)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=size) as pilot:
        before = app.chart_window
        await pilot.press("right_square_bracket")
        assert app.chart_window > before
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert app.chart_window < before


async def test_zoom_shows_the_window_on_the_chart_and_says_so_at_the_ends(clock):
    s = make_session(clock)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        assert "util 2m " in plain(app, "#gpu-0")
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert "util 5m " in plain(app, "#gpu-0")
        await pilot.press(*["left_square_bracket"] * 5)
        await pilot.pause()
        assert "util 30s " in plain(app, "#gpu-0")
        assert any("shortest window (30 s)" in str(n.message) for n in app._notifications)


async def test_enter_on_a_fake_process_attaches_to_nothing(clock):
    s = make_session(clock)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert s.target_pid is None and s.stacks is None
        assert any("fake GPUs" in str(n.message) for n in app._notifications)


async def test_help_says_how_to_close_it(clock):
    s = make_session(clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert "closes this help" in str(app.screen.query_one("#help").render())
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


async def test_the_status_line_fades_and_holds_no_metric_the_model_lacks(clock):
    s = make_session(clock, gpus=1)
    feed(s, clock)
    s.store.add([Event(ts=clock(), source="nvml", message="GPU 0: not available: fan (not supported)", level="debug"),
                 Event(ts=clock(), source="attach", message="attached to process 42", level="info")])
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        assert "attached to process 42" in plain(app, "#status")  # what changed recently
        assert "fan" not in plain(app, "#status")
        s.store.add([GpuSample(ts=clock.advance(40), index=0, util_gpu=50.0)])  # 40 s on, nothing new
        app.tick(force=True)
        await pilot.pause()
        assert "attached to process 42" not in plain(app, "#status") and "ready" in plain(app, "#status")


async def test_nothing_is_drawn_once_an_exit_is_asked_for(clock):
    """A SIGTERM in CI: a tick fired while the screens came down and mounted a GPU panel into a
    detached widget (MountError in Textual's shutdown: a traceback and status 1)."""
    from gputop.ui.gpu_panels import GpuPanels

    s = make_session(clock, gpus=1)
    feed(s, clock)
    app = GputopApp(s, interval=1.0, refresh=60)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        panels = app.query_one("#gpus", GpuPanels)
        before = dict(panels._panels)
        app.exit(return_code=143)
        feed(s, clock)
        app.tick(force=True)  # a timer that fires after the exit was asked for draws nothing
        assert panels._panels == before
    # Detached (the app is gone), the panels mount nothing and raise nothing.
    panels._sync([0, 1])
    panels._replace({})
    assert app.return_code == 143
