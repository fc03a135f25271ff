"""One advisor, one verdict: the live UI, `advise`, `record` and `replay` watching the same job.

A real CPU job starved by a slow dataset in the main process is watched by the live UI
(in-process, the real pipeline on threads) while it records the session, then by
`gputop advise --json` as the user runs it (one after the other: two samplers stopping the same
process at once would disturb each other); the recording is then replayed through the UI. All
must name the same top finding, and the Advisor pane must show it rather than "No findings".
"""

import asyncio
import importlib.util
import json
import subprocess
import sys
import time

import pytest

from gputop.errors import UserError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the workloads need torch"),
]

WATCH_S = 10.0


def _gputop(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gputop", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


async def _watch_in_ui(session, seconds: float, record=None) -> tuple[list[str], str]:
    """What ``run_app`` does, in a test harness: the finished session, the app, then stop."""
    from gputop.ui.app import GputopApp

    if record is not None:
        session.start_recording(record)
    app = GputopApp(session, interval=session.interval)
    session.start()
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("2")  # the Advisor tab
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await pilot.pause()
            pane = app.query_one("#advisor-pane")
            pane.update_view(session.store)
            text = "\n".join("".join(seg for seg, _ in ln) for ln in pane.last_lines)
            return [f.id for f in session.store.findings()], text
    finally:
        session.stop()


@pytest.mark.timeout(180)
def test_ui_advise_record_and_replay_reach_the_same_verdict(tmp_path):
    from gputop.commands.demo import start_workload
    from gputop.record.reader import Reader
    from gputop.session import UI_IDLE_ADVISOR_EVERY_S, Config, open_live, open_replay

    work = start_workload("dataloader-starved", "cpu")
    try:
        work.wait_ready(120)
        # Past the job's warm-up (throughput findings wait out its first seconds), so the UI, the
        # recording, its replay and `advise` all watch the steady job.
        import psutil

        from gputop.advisor.context import WARMUP_AGE_S

        time.sleep(max(0.0, WARMUP_AGE_S + 0.5 - (time.time() - psutil.Process(work.pid).create_time())))
        try:
            # as `gputop --pid P` opens it
            live = open_live(Config(pid=work.pid, advisor_idle_every=UI_IDLE_ADVISOR_EVERY_S))
        except UserError as exc:  # no ptrace permission here
            pytest.skip(f"cannot attach py-spy: {exc}")
        rec_path = tmp_path / "run.gputop"
        ui_ids, ui_text = asyncio.run(_watch_in_ui(live, WATCH_S, record=rec_path))
        advise = _gputop("advise", "--pid", str(work.pid), "--duration", str(WATCH_S), "--json")
        out, err = advise.communicate(timeout=60)
        assert advise.returncode == 0, err
    finally:
        work.stop()

    advise_ids = [f["id"] for f in json.loads(out)["findings"]]
    with Reader(rec_path) as reader:
        recorded_ids = [f.id for f in reader.findings()]

    assert ui_ids and ui_ids[0] == "data-starved", ui_ids
    assert "No findings" not in ui_text
    assert advise_ids and advise_ids[0] == ui_ids[0], (advise_ids, ui_ids, out[-800:])
    assert ui_ids[0] in recorded_ids, recorded_ids

    # The recording replayed through the UI: the advisor runs again on the recorded data.
    replay = open_replay(rec_path, speed=2.0)
    replay_ids, _ = asyncio.run(_watch_in_ui(replay, WATCH_S / 2 + 2))
    assert replay_ids and replay_ids[0] == ui_ids[0], replay_ids
