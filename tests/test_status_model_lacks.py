"""A metric the GPU model does not have (a fan on a datacenter GPU) is a fact of the model, not news:
recordings made before NVML noted it as debug still carry it as an info event, and their replay
held "nvml: GPU 0: not available: fan (not supported)" in the status line. A real failure stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputop.model import Event
from gputop.session import open_replay
from gputop.ui.app import GputopApp, _model_lacks
from gputop.ui.lines_view import LinesView

H100_RECORDING = Path(__file__).parent / "fixtures" / "recordings" / "h100-checkpoint-stall.gputop"


@pytest.mark.parametrize("message, lacks", [
    ("GPU 0: not available: fan (not supported)", True),
    ("GPU 1: not available: fan, ecc (not supported)", True),
    ("GPU 0: not available: fan (not supported); power (NVML error 999)", False),  # a failure is news
    ("GPU 0: not available: power (NVML error 999)", False),
    ("GPU 0 lost: GPU is lost", False),
])
def test_only_notes_of_metrics_the_model_lacks_are_left_out(message, lacks):
    assert _model_lacks(Event(0.0, "nvml", message, "info")) is lacks
    assert _model_lacks(Event(0.0, "stacks", message, "info")) is False  # another source's words


@pytest.mark.parametrize("filtered", [True, False])
async def test_the_replay_of_an_h100_recording_does_not_hold_the_fan_note_in_the_status_line(filtered, monkeypatch):
    if not filtered:  # the same replay without the filter shows the note: the test can fail
        monkeypatch.setattr("gputop.ui.app._model_lacks", lambda e: False)
    session = open_replay(str(H100_RECORDING), speed=1.0, paused=False, start="40%", advisor=False)
    app = GputopApp(session, interval=1.0)
    session.pipeline.start()
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause(1.0)
            app.tick(force=True)
            await pilot.pause(0.2)
            status = app.query_one("#status", LinesView).plain
            assert ("fan (not supported)" in status) is not filtered, status
    finally:
        session.pipeline.stop()
