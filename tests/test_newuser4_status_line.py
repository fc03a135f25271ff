"""The status line stays in sight: a toast sat on it (Textual puts notifications just above the
footer), and a replay attached to a job at 80x24 pushed it off the screen altogether (its
timeline and verdict lines were not in the panels' layout), the screen's own scrollbar then
showing as stray blocks at the end of the bottom lines. A replay's seek notified the same warnings
again (read back from the file as new objects)."""

from __future__ import annotations

import pytest

from gputop.model import Event, GpuProcess

from gputop.record.writer import RecordWriter, SessionMeta
from gputop.session import open_replay
from gputop.ui.app import GputopApp
from synth_recording import TARGET_PID, SyntheticSession

T0 = 1_767_225_600.0


def _record(path, gpu_procs: bool = True):
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="fake", target_pid=TARGET_PID, interval=1.0))
    for k, b in enumerate(SyntheticSession(t0=T0).seconds(180)):
        if k in (60, 120):  # warnings a replay notifies as it comes to them
            b.append(Event(T0 + k + 0.5, "stacks", f"py-spy did not answer within 5 s ({k})", "warning"))
        if not gpu_procs:  # NVML listed no process (another PID namespace; or a cut took them)
            b = [x for x in b if not isinstance(x, GpuProcess)]
        w.flush(b)
    w.finish()
    return path


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("status") / "attached.gputop")


@pytest.fixture(scope="module")
def no_gpu_procs(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("status") / "no-procs.gputop", gpu_procs=False)


def _covered(app, region) -> bool:
    """Whether anything else is drawn over a part of ``region`` (the top widget at each cell)."""
    for x in range(region.x, region.right):
        widget, _ = app.screen.get_widget_at(x, region.y)
        if widget.id != "status":
            return True
    return False


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (120, 40)])
@pytest.mark.parametrize("which", ["recording", "no_gpu_procs"])
async def test_a_replay_attached_to_a_job_keeps_its_status_line_on_screen(request, which, size):
    session = open_replay(request.getfixturevalue(which), speed=1.0, paused=True, start="50%", advisor=False)
    assert session.target_pid == TARGET_PID  # the verdict line is shown
    app = GputopApp(session, interval=1.0)
    try:
        async with app.run_test(size=size, notifications=True) as pilot:
            session.pipeline.poll_once()
            app.tick(force=True)
            await pilot.pause()
            status = app.query_one("#status").region
            assert status.y == size[1] - 2 and status.height == 1  # just above the footer
            assert not _covered(app, status)
            table = app.query_one("#procs").region
            assert table.height >= 3 and table.bottom <= status.y  # the pane keeps its rows, above it
            # A notification comes up: it sits above the status line, not on it.
            app.clear_notifications()
            app.notify("charts show the last 1 min", timeout=30)
            for _ in range(100):  # up to 5 s: the toast is mounted within a frame or two
                await pilot.pause(0.05)
                if app.screen.query("Toast"):
                    break
            await pilot.pause()  # and laid out
            toasts = [t.region for t in app.screen.query("Toast")]
            assert toasts and all(t.bottom <= status.y for t in toasts)
            assert not _covered(app, status)
    finally:
        session.stop()


async def test_seeking_a_replay_does_not_notify_the_same_warnings_again(recording):
    session = open_replay(recording, speed=1.0, paused=True, advisor=False)
    app = GputopApp(session, interval=1.0)
    notes: list[str] = []
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            app.notify = lambda message, **kw: notes.append(message)  # type: ignore[method-assign]
            session.replay.seek(session.replay.end_ts)  # past the recording's warnings
            session.pipeline.poll_once()
            app.tick(force=True)
            await pilot.pause()
            first = list(notes)
            assert len(first) == 2 and "(120)" in first[-1]
            for where in (session.replay.end_ts - 1, session.replay.end_ts):
                session.replay.seek(where)  # each seek reads them back from the file
                session.pipeline.poll_once()
                app.tick(force=True)
                await pilot.pause()
            assert notes == first
    finally:
        session.stop()
