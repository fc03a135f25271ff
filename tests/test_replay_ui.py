"""The replay in the UI: the timeline's rendering, its controls, and the live app on a replay."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from textual.app import App, ComposeResult

from gputop.session import open_replay
from synth_recording import SyntheticSession
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.ui.timeline import (
    REPLAY_BINDINGS,
    ReplayControls,
    ReplayTimeline,
    render_bar,
    replay_action,
    status_text,
    step_for,
    timeline_cells,
)

T0 = 1_767_225_600.0


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    p = tmp_path_factory.mktemp("ui") / "ui.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake"))
    for b in SyntheticSession(t0=T0, checkpoint_every_s=300, checkpoint_len_s=60).seconds(600):
        w.flush(b)
    w.finish()
    return p


# --------------------------------------------------------------------------- pure rendering


def row(ts, span, covered, busy):
    return SimpleNamespace(ts=ts, span=span, covered_s=covered, busy_s=busy)


def test_cells_shade_by_utilisation_and_mark_idle_and_findings():
    overview = [row(T0 + 10 * i, 10, 10, 9 if i < 5 else 0.5) for i in range(10)]
    idle = [SimpleNamespace(start=T0 + 50, end=T0 + 100)]
    marks = [SimpleNamespace(ts=T0 + 12, severity="warning"), SimpleNamespace(ts=T0 + 14, severity="critical")]
    cells = timeline_cells(overview, idle, marks, T0, T0 + 100, 10)
    assert [round(c.util) for c in cells] == [90] * 5 + [5] * 5
    assert [c.idle for c in cells] == [False] * 5 + [True] * 5
    assert cells[1].finding == "critical" and cells[0].finding is None
    top, bar = render_bar(cells, position=0.55)
    assert len(top.plain) == len(bar.plain) == 10
    assert top.plain[5] == "▼" and top.plain[1] == "◆"


def test_cells_without_data_are_marked_as_such():
    cells = timeline_cells([row(T0, 10, 10, 10)], [], [], T0, T0 + 100, 10)
    assert cells[0].util == 100 and all(c.util is None for c in cells[1:])
    assert render_bar(cells)[1].plain[1:] == "·" * 9


def test_status_line_says_state_speed_and_time():
    st = {"position": T0 + 3725, "start": T0, "end": T0 + 86400, "speed": 60.0, "playing": True, "at_end": False,
          "damage": None}
    text = status_text(st, 200).plain
    assert text.startswith("▶ 60×") and "1:02:05 / 24:00:00" in text and "space" in text
    assert status_text(dict(st, playing=False), 40).plain.startswith("❚❚")
    assert "damaged" in status_text(dict(st, damage="cut"), 200).plain


def test_step_grows_with_speed():
    assert step_for(1) == 10 and step_for(60) == 60 and step_for(600) == 600


def test_replay_actions_drive_the_source(recording):
    session = open_replay(recording, speed=1.0, paused=True, advisor=False)
    src = session.replay
    try:
        assert replay_action(src, "next_idle").startswith("at ")
        assert T0 + 238 <= src.position <= T0 + 242
        replay_action(src, "faster")
        assert src.speed > 1
        replay_action(src, "end")
        assert src.position == src.end_ts
        assert replay_action(src, "next_finding") == "no finding after this point"
        assert replay_action(None, "toggle") == "not a replay"
    finally:
        src.close()


# --------------------------------------------------------------------------- widgets


class TimelineApp(ReplayControls, App):
    BINDINGS = REPLAY_BINDINGS

    def __init__(self, session) -> None:
        super().__init__()
        self.session = session

    def compose(self) -> ComposeResult:
        yield ReplayTimeline(self.session.replay, id="timeline")


async def test_timeline_widget_keys_and_goto(recording):
    session = open_replay(recording, speed=1.0, paused=True, advisor=False)
    src = session.replay
    app = TimelineApp(session)
    try:
        async with app.run_test(size=(100, 10)) as pilot:
            widget = app.query_one(ReplayTimeline)
            text = widget.render().plain
            assert "❚❚ 1×" in text and "▼" in text
            await pilot.press("space")
            assert src.playing
            await pilot.press("space")
            assert not src.playing
            await pilot.press("x")
            assert T0 + 238 <= src.position <= T0 + 242
            await pilot.press("g")
            await pilot.press(*"50%")
            await pilot.press("enter")
            await pilot.pause()
            mid = src.start_ts + 0.5 * (src.end_ts - src.start_ts)
            assert src.position == pytest.approx(mid, abs=1)
            await pilot.click(ReplayTimeline, offset=(1 + 10, 2))  # the bar row, a tenth in
            assert src.position < mid
    finally:
        src.close()


async def test_the_live_app_shows_a_replay_with_the_same_panels(recording):
    from gputop.ui.app import GputopApp

    session = open_replay(recording, speed=10.0, advisor=False)
    app = GputopApp(session, interval=1.0)
    session.pipeline.start()
    try:
        async with app.run_test(size=(140, 45)) as pilot:
            await pilot.pause(0.5)
            app.tick(force=True)
            header = app.screen.query_one("#header").plain
            assert "REPLAY" in header and "synthetic-host" in header
            panels = [w.plain for w in app.screen.query(".gpu-panel")]
            assert panels and "H100" in panels[0] and "UTIL" in panels[0]
            assert "CPU" in app.screen.query_one("#host").plain
    finally:
        session.pipeline.stop()


def test_replay_command_bad_inputs_are_one_line_errors(recording, tmp_path, capsys):
    from gputop.cli import main

    assert main(["replay", str(tmp_path / "missing.gputop")]) == 2
    assert capsys.readouterr().err.strip() == f"gputop replay: error: {tmp_path / 'missing.gputop'}: no such file"
    assert main(["replay", str(recording), "--start", "next tuesday"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gputop replay: error: --start: not a time: 'next tuesday' (try ") and "\n" not in err
    with pytest.raises(SystemExit):
        main(["replay", str(recording), "--speed", "0"])
    err = capsys.readouterr().err
    # The range, not only the refusal; said as --start's refusal is (the command, the option, the value).
    assert err.startswith("gputop replay: error: -s/--speed: must be greater than 0 and at most 1000000: '0'"), err


async def test_home_and_end_move_the_replay_from_the_processes_tab(recording):
    # The process list has the focus on the Processes tab and knows Home/End too: in a replay the
    # keys move in time, as the help and the timeline say.
    from gputop.ui.app import GputopApp

    session = open_replay(recording, speed=1.0, paused=True, start="50%", advisor=False)
    src = session.replay
    app = GputopApp(session, interval=1.0, refresh=60)
    try:
        async with app.run_test(size=(140, 45)) as pilot:
            await pilot.pause()
            assert app.focused is app.query_one("#procs")
            await pilot.press("end")
            await pilot.pause()
            assert src.position == pytest.approx(src.end_ts, abs=1)
            await pilot.press("home")
            await pilot.pause()
            assert src.position == pytest.approx(src.start_ts, abs=1)
            await pilot.press("slash", "a", "end")  # typing a filter: End is the input's
            await pilot.pause()
            assert src.position == pytest.approx(src.start_ts, abs=1)
    finally:
        src.close()


def test_a_paused_replay_after_a_jump_shows_the_findings_at_once(recording):
    # Paused, the replay's clock does not move, so a finding could never "hold" by watching: the
    # advisor looks back over the history the jump loaded instead.
    from gputop.session import open_replay

    session = open_replay(recording, speed=1.0, paused=True, start="+280s")  # inside a checkpoint stall
    try:
        for _ in range(3):
            session.pipeline.poll_once()
        ids = [f.id for f in session.store.findings()]
        assert ids and ids[0] == "checkpoint-stall", (ids, [f.id for f in session.store.pending_findings()])
        session.replay.seek(session.replay.start_ts + 560)  # a jump: the store starts over
        for _ in range(3):
            session.pipeline.poll_once()
        assert session.store.resets >= 1
        assert [f.id for f in session.store.findings()][:1] == ["checkpoint-stall"]
    finally:
        session.stop()


@pytest.mark.parametrize("start, says", [
    ("+99h", "--start: after the end of the recording: '+99h' (it is "),
    ("-99h", "--start: before the start of the recording: '-99h' (it is "),
    ("2001-01-01 00:00", "before the start of the recording: '2001-01-01 00:00'"),
    ("2099-01-01 00:00", "after the end of the recording: '2099-01-01 00:00'"),
])
def test_replay_start_outside_the_recording_is_refused_not_clamped(recording, capsys, start, says):
    from gputop.cli import main

    assert main(["replay", str(recording), "--start", start]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gputop replay: error: --start: ") and says in err and "\n" not in err, err


@pytest.mark.parametrize("start", ["+0", "-1s", "100%", "0%"])
def test_replay_start_at_the_edges_is_accepted(recording, start):
    from gputop.commands.replay import outside_problem
    from gputop.record.reader import Reader

    with Reader(recording) as r:
        outside_problem(start, r.start_ts, r.end_ts)  # no error


async def test_a_replay_without_gpus_sorts_the_processes_by_cpu_as_live_does(recording, tmp_path):
    """A CPU-only recording's replay sorted the process table by GPU memory, n/a for every row:
    an arbitrary order, where live without NVML sorts by CPU. A recording with GPUs keeps GPU memory."""
    from gputop.model import HostSample, ProcSample
    from gputop.ui.app import GputopApp

    path = tmp_path / "cpu.gputop"
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="live", interval=1.0))
    for i in range(10):
        ts = T0 + i
        w.flush([HostSample(ts=ts, cpu_percent=50.0, mem_total=2**34, mem_used=2**33)]
                + [ProcSample(ts=ts, pid=p, ppid=1, cmdline=f"cmd{p}", cpu_percent=c, role="cpu")
                   for p, c in ((4_194_301, 5.0), (4_194_302, 90.0), (4_194_303, 40.0))])
    w.finish()
    for rec, key in ((path, "cpu"), (recording, "gpu_mem")):
        session = open_replay(rec, speed=1.0, paused=True, start="50%", advisor=False)
        app = GputopApp(session, interval=1.0, refresh=60)
        session.pipeline.start()
        try:
            async with app.run_test(size=(140, 45)) as pilot:
                await pilot.pause(0.5)
                app.tick(force=True)
                table = app.query_one("#procs")
                assert table.sort_key == key
                if key == "cpu":
                    assert [r.pid for r in table.rows] == [4_194_302, 4_194_303, 4_194_301]
        finally:
            session.pipeline.stop()
