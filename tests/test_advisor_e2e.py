"""End to end on CPU: a real workload, real py-spy and psutil, the real pipeline and advisor.

Without a GPU the training thread's own time line stands in for the device, so the scenarios
that a CPU shows are diagnosed here exactly as on a GPU machine (bench/advisor_bench.py runs all
of them on CUDA).

One advisor, one verdict: a real CPU job starved by a slow dataset in the main process is
watched by the live UI (in-process, the real pipeline on threads) while it records the session,
then by `gputop advise --json` as the user runs it (one after the other: two samplers stopping
the same process at once would disturb each other); the recording is then replayed through the
UI. All must name the same top finding, and the Advisor pane must show it rather than "No
findings". The starved job is started once for this and for the headless diagnosis before it:
starting torch and waiting out the job's warm-up is most of what either costs.
"""

import asyncio
import importlib.util
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gputop.errors import UserError
from gputop.model import Severity

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the workloads need torch"),
]

# How long the UI and `advise` each watch the starved job.
WATCH_S = 10.0


def _wait_past_warmup(work) -> None:
    """Throughput findings wait out a job's first seconds: attach once they are over."""
    import psutil

    from gputop.advisor.context import WARMUP_AGE_S

    age = time.time() - psutil.Process(work.pid).create_time()
    time.sleep(max(0.0, WARMUP_AGE_S + 0.5 - age))


def _open_live(config):
    from gputop.session import open_live

    try:
        return open_live(config)
    except UserError as exc:  # no ptrace permission here
        pytest.skip(f"cannot attach py-spy: {exc}")


def _watch_session(session, seconds: float, until=None) -> None:
    """Run the session's pipeline for ``seconds``, or until ``until(session)`` holds."""
    session.pipeline.start()
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if until is not None and until(session):
                break
            time.sleep(0.2)
    finally:
        session.pipeline.stop()


def watch(scenario: str, seconds: float, stuck_after: float = 30.0, until=None):
    """A fresh job of ``scenario`` watched from the moment it is ready."""
    from gputop.commands.demo import start_workload
    from gputop.session import Config

    work = start_workload(scenario, "cpu")
    session = None
    try:
        work.wait_ready(120)
        session = _open_live(Config(pid=work.pid, stuck_after=stuck_after, window=60.0))
        _watch_session(session, seconds, until)
        return session.store.findings(), session.advisor
    finally:
        if session is not None:
            session.pipeline.stop()
        work.stop()


def top_is(finding_id: str):
    def holds(session) -> bool:
        findings = session.store.findings()
        return bool(findings) and findings[0].id == finding_id

    return holds


def top_and_seen_before_now(finding_id: str):
    """``finding_id`` on top, and the store has moved on since the advisor first saw it."""
    top = top_is(finding_id)

    def holds(session) -> bool:
        seen = session.advisor.history.get(finding_id)
        return top(session) and seen is not None and seen[0] < session.store.now

    return holds


class StarvedJob:
    """The dataloader-starved job the tests below share: started at once, handed out once ready
    and past its warm-up; started again if a test stopped it."""

    def __init__(self) -> None:
        self.work = None
        self.ready = False
        self._start()

    def _start(self) -> None:
        from gputop.commands.demo import start_workload

        self.work, self.ready = start_workload("dataloader-starved", "cpu"), False

    def get(self):
        if self.work.proc.poll() is not None and self.ready:
            self._start()
        if not self.ready:
            self.work.wait_ready(120)
            self.ready = True
        _wait_past_warmup(self.work)
        return self.work

    def stop(self) -> None:
        if self.work is not None:
            self.work.stop()


@pytest.fixture(scope="module")
def starved():
    """The shared starved job, started when first asked for (see ``watched``)."""
    job = StarvedJob()
    try:
        yield job
    finally:
        job.stop()


def blocking(findings):
    return [f for f in findings if f.severity is not Severity.INFO]


@pytest.fixture(scope="module")
def watched(starved):
    """The healthy job and the stuck job, each watched from the moment it is ready, side by side
    from the start of the module: name -> a future of (findings, advisor). The shared starved job
    (``starved``) starts with them and is past its warm-up when they are done. The healthy job is
    young through its watch, so its throughput findings are held whatever else runs; the stuck
    job is idle once stalled."""
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        yield {
            "healthy": pool.submit(watch, "healthy", 9.0),
            # The CPU variant stalls 1 s after it is ready; the finding must come during the watch.
            # It comes ~8 s after ready alone (stall 1 s + attach + 3 s + the hold); the watch ends
            # when it does, and lasts up to 14 s for a loaded 2-core machine (seen: no verdict by 8 s).
            "stuck": pool.submit(watch, "stuck", 14.0, stuck_after=3.0, until=top_is("stuck")),
        }
    finally:
        pool.shutdown(wait=True)


@pytest.mark.timeout(90)
def test_healthy_job_raises_no_warning(watched):
    findings, advisor = watched["healthy"].result()  # 9 s: 4+ evaluations
    assert blocking(findings) == [], [(f.id, f.evidence) for f in findings]
    assert advisor.evaluations >= 4


@pytest.mark.timeout(90)
def test_stuck_job_is_diagnosed(watched):
    findings, _ = watched["stuck"].result()
    assert findings and findings[0].id == "stuck", [f.id for f in findings]
    assert findings[0].severity is Severity.CRITICAL
    assert "timeout=" in findings[0].action


@pytest.mark.timeout(90)
def test_dataloader_starved_is_diagnosed(starved):
    from gputop.session import Config

    work = starved.get()
    session = _open_live(Config(pid=work.pid, stuck_after=30.0, window=60.0))
    # Up to 10 s: the sampler takes fewer stacks when py-spy costs more CPU (a loaded 2-core
    # machine). The finding must come during the watch.
    _watch_session(session, 10.0, until=top_and_seen_before_now("data-starved"))
    findings, advisor = session.store.findings(), session.advisor
    assert findings and findings[0].id == "data-starved", [f.id for f in findings]
    f = findings[0]
    assert "num_workers=" in f.action
    assert any("__getitem__" in e or "data.py" in e for e in f.evidence)
    assert advisor.history["data-starved"][0] - advisor.store.now < 0


# --------------------------------------------------------------------------- one verdict


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
            pane.update_view(app.pane_context())
            text = "\n".join("".join(seg for seg, _ in ln) for ln in pane.last_lines)
            return [f.id for f in session.store.findings()], text
    finally:
        session.stop()


@pytest.mark.timeout(180)
def test_ui_advise_record_and_replay_reach_the_same_verdict(starved, tmp_path):
    from gputop.record.reader import Reader
    from gputop.session import UI_IDLE_ADVISOR_EVERY_S, Config, open_replay

    # Past the job's warm-up (throughput findings wait out its first seconds), so the UI, the
    # recording, its replay and `advise` all watch the steady job.
    work = starved.get()
    try:
        # as `gputop --pid P` opens it
        live = _open_live(Config(pid=work.pid, advisor_idle_every=UI_IDLE_ADVISOR_EVERY_S))
        rec_path = tmp_path / "run.gputop"
        ui_ids, ui_text = asyncio.run(_watch_in_ui(live, WATCH_S, record=rec_path))
        advise = _gputop("advise", "--pid", str(work.pid), "--duration", str(WATCH_S), "--json")
        try:
            # The recording replayed through the UI while `advise` watches the job (the replay
            # reads the file only): the advisor runs again on the recorded data.
            replay = open_replay(rec_path, speed=2.0)
            replay_ids, _ = asyncio.run(_watch_in_ui(replay, WATCH_S / 2 + 2))
            out, err = advise.communicate(timeout=60)
        finally:
            if advise.poll() is None:
                advise.kill()
                advise.wait()
        job_exit = work.proc.poll()  # the job must outlive both watches
        assert advise.returncode == 0, (err, f"job exit status {job_exit}", work.stderr_tail())
    finally:
        starved.stop()

    advise_ids = [f["id"] for f in json.loads(out)["findings"]]
    with Reader(rec_path) as reader:
        recorded_ids = [f.id for f in reader.findings()]

    assert ui_ids and ui_ids[0] == "data-starved", ui_ids
    assert "No findings" not in ui_text
    assert advise_ids and advise_ids[0] == ui_ids[0], (advise_ids, ui_ids, out[-800:])
    assert ui_ids[0] in recorded_ids, recorded_ids
    assert replay_ids and replay_ids[0] == ui_ids[0], replay_ids
