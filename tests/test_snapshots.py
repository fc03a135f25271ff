"""Snapshot tests: what a user sees on the main screens, as SVG screenshots kept in
tests/__snapshots__/test_snapshots/.

Each screen is drawn from a session fed by hand on a fixed clock (no collection threads, no wall
clock, the local time zone fixed), so a screenshot changes only when what the app draws changes.
A change to the UI that is meant shows here as a failed test: look at the report pytest names
(snapshot_report.html), then accept the new screens with ``pytest tests/test_snapshots.py
--snapshot-update`` and review the changed SVG files in the commit.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dataclasses import replace

from gputop.advisor import JobStage, MemoryWatch
from gputop.analysis.breakdown import Breakdown, Bucket
from gputop.analysis.views import ViewsStage
from gputop.session import open_replay
from gputop.session import Session
from gputop.model import CoreTimes, Finding, GpuProcess, GpuSample, HostSample, ProcSample, Severity, Verdict
from gputop.pipeline import Pipeline
from gputop.sources.fake import FAKE_PID_BASE, FakeGpuSource
from gputop.analysis.classify import classify, is_library
from gputop.sources.stacks import StackParser
from gputop.store import Store
from gputop.ui.app import GputopApp

FIXTURES = Path(__file__).parent / "fixtures"
RECORDING = FIXTURES / "recordings" / "h100-checkpoint-stall.gputop"
HOSTNAME = "train-node-01"  # the fake source names the machine it runs on: here, always this one


@pytest.fixture(autouse=True)
def fixed_environment(monkeypatch):
    """Times on screen (status line, replay timeline, stacks) are local times: make local UTC.
    Colours are part of the screenshot: NO_COLOR in the caller's environment would drop them."""
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.delenv("NO_COLOR", raising=False)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


GiB = 1024**3


def host_sample(ts: float) -> HostSample:
    """The machine's side, fixed (the host source reads the real machine)."""
    cores = tuple(CoreTimes(user=60.0 if i < 4 else 3.0, system=8.0 if i < 4 else 1.0) for i in range(16))
    return HostSample(
        ts=ts, cpu_percent=19.5, cores=cores, iowait_percent=0.4, load1=4.1, load5=3.9, load15=3.2,
        mem_total=256 * GiB, mem_used=41 * GiB, mem_available=210 * GiB, disk_read_bps=52e6,
        disk_write_bps=1.5e6, net_rx_bps=2e5, net_tx_bps=1e5, shm_total=64 * GiB, shm_used=3 * GiB,
    )


async def open_tab(pilot, key: str) -> None:
    """Press a tab's key, then draw what the app's next refresh draws: a pane that was hidden
    is laid out for its width once it is shown."""
    await pilot.press(key)
    await pilot.pause()
    pilot.app.tick(force=True)


def fake_session(clock, gpus: int, polls: int = 5) -> Session:
    """The scripted fake GPUs, polled by hand once a second of the fixed clock."""
    store = Store()
    src = FakeGpuSource(gpus=gpus, clock=clock, hostname=HOSTNAME)
    session = Session(store=store, pipeline=Pipeline(store, [src], clock=clock), gpu=src, mode="fake")
    for _ in range(polls):
        clock.advance(1.0)
        session.pipeline.poll_once()
        store.add([host_sample(clock.t)])
    return session


def publish_views(session: Session) -> None:
    """What a UI session's views stage (gputop.analysis.views) publishes, once, by hand: the Stacks
    and Ranks panes lay out the latest, as they do live and in a replay."""
    session.pipeline.publish(ViewsStage(session.store, lambda: session.target_pid, session.stuck_after).poll())


def test_processes_tab_two_gpus_120x40(snap_compare, clock):
    """Full GPU panels with their charts, the host line and the process table."""
    app = GputopApp(fake_session(clock, gpus=2), interval=1.0, refresh=60)
    assert snap_compare(app, terminal_size=(120, 40))


def test_processes_tab_eight_gpus_80x24_compact(snap_compare, clock):
    """Eight GPUs on a small terminal: one line per GPU."""
    app = GputopApp(fake_session(clock, gpus=8), interval=1.0, refresh=60)
    assert snap_compare(app, terminal_size=(80, 24))


BREAKDOWN = Breakdown(0, 0.0, 60.0, {Bucket.BUSY: 35.4, Bucket.DATA: 23.6, Bucket.UNKNOWN: 1.0}, attributed=True)
FINDINGS = [
    Finding(
        id="checkpoint-stall",
        title="Checkpoint saves stall GPU 0 31 % of the time",
        severity=Severity.WARNING,
        confidence=0.9,
        evidence=("GPU 0 idle 31 % of the last 60 s in torch.save (train.py:88), every 20 s",),
        action=(
            "save in the background: torch.distributed.checkpoint.async_save(state_dict, "
            "checkpoint_id=path) (torch >= 2.3), or save less often"
        ),
        expected_gain="up to 1.4x steps/s if the saves no longer stopped the GPU (31 % of the time back)",
        cost_s=18.6,
        gpu_index=0,
    ),
    Finding(
        id="workers-saturated",
        title="GPU 0 waits for data 39 % of the time: loader workers saturated",
        severity=Severity.WARNING,
        confidence=0.87,
        evidence=(
            "GPU 0 idle 41 % of the last 60 s; 39 % waiting for data",
            "during idle, main thread in __next__ (train.py:57) 93 % of samples",
        ),
        action="DataLoader(..., num_workers=8, pin_memory=True, persistent_workers=True, prefetch_factor=2)",
        expected_gain="up to 1.7x steps/s",
        cost_s=23.6,
        gpu_index=0,
    ),
]


def test_advisor_tab_with_findings(snap_compare, clock):
    """The Advisor tab: where GPU 0's time went, then each finding with its evidence and fix."""
    session = fake_session(clock, gpus=2)
    session.store.add([Verdict(session.store.now, tuple(FINDINGS), (BREAKDOWN,))])
    app = GputopApp(session, interval=1.0, refresh=60)
    assert snap_compare(app, run_before=lambda pilot: open_tab(pilot, "2"), terminal_size=(120, 40))


def test_stacks_tab_attached_to_a_data_starved_job(snap_compare, clock):
    """The Stacks tab of an attached job: py-spy stacks recorded from a job waiting for data."""
    doc = json.loads((FIXTURES / "stacks" / "data-wait.json").read_text())
    session = fake_session(clock, gpus=2, polls=0)
    parser = StackParser(lambda fn, ln: doc.get("source_lines", {}).get(f"{fn}:{ln}"), classify, is_library)
    for _ in range(10):  # 10 s: a poll of the GPUs and five stack samples a second
        clock.advance(1.0)
        session.pipeline.poll_once()
        session.store.add([host_sample(clock.t)])
        for k in range(5):
            session.store.add(parser.samples(doc["dump"], clock.t - 0.8 + 0.2 * k))
    session.target_pid = doc["dump"][0]["pid"]
    publish_views(session)
    app = GputopApp(session, interval=1.0, refresh=60)
    assert snap_compare(app, run_before=lambda pilot: open_tab(pilot, "3"), terminal_size=(120, 40))


def test_help_screen(snap_compare, clock):
    app = GputopApp(fake_session(clock, gpus=2), interval=1.0, refresh=60)
    assert snap_compare(app, press=["question_mark"], terminal_size=(100, 36))


def replay_paused_at_60_percent(snap_compare, size: tuple[int, int]) -> bool:
    """The bundled H100 recording (attached to its job), replayed and paused at 60 %, drawn at ``size``."""
    session = open_replay(RECORDING, speed=1.0, start="60%", paused=True)
    session.pipeline.poll_once()
    app = GputopApp(session, refresh=60)
    try:
        return snap_compare(app, terminal_size=size)
    finally:
        session.pipeline.stop()


def test_replay_of_a_recording_paused_at_60_percent(snap_compare):
    """The bundled H100 recording replayed, paused: the timeline above the same panels."""
    assert replay_paused_at_60_percent(snap_compare, (120, 40))


# The main screen at the sizes people run it, with the GPUs a node has: the charts fill what the
# table leaves (1, 4 and 8 scripted GPUs at 80x24, 120x40 and 200x50), not attached.
@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_main_screen_sizes(snap_compare, clock, gpus, size):
    app = GputopApp(fake_session(clock, gpus=gpus, polls=60), interval=1.0, refresh=60)
    assert snap_compare(app, terminal_size=size)


def test_replay_attached_idle_coloured_by_cause_200x50(snap_compare):
    """The bundled H100 recording, attached to its job: the utilisation chart's idle columns
    in the colour of their cause (the checkpoint saves), with the legend."""
    assert replay_paused_at_60_percent(snap_compare, (200, 50))


class LeakingGpu0:
    """The scripted GPUs, the job on GPU 0 leaking 300 MiB a minute (its card's figure with it)."""

    name = "fake"

    def __init__(self, src: FakeGpuSource, t0: float) -> None:
        self.src, self.t0 = src, t0

    def _job(self, ts: float) -> int:
        return int(50 * GiB + 5 * 2**20 * (ts - self.t0))

    def poll(self) -> list[object]:
        out = []
        for s in self.src.poll():
            if isinstance(s, GpuProcess) and s.gpu_index == 0:
                s = replace(s, used_memory=self._job(s.ts))
            elif isinstance(s, GpuSample) and s.index == 0:
                s = replace(s, mem_used=self._job(s.ts) + GiB)
            out.append(s)
        return out

    def close(self) -> None:
        pass


def test_gpu_panel_of_a_job_whose_memory_grows_120x40(snap_compare, clock):
    """Attached to a job leaking on GPU 0: its panel's memory figure carries the forecast
    (rate, time to full with its interval, in the warning colour), the status line says it once;
    GPU 1, whose job is flat, says nothing more."""
    store = Store()
    src = FakeGpuSource(gpus=2, clock=clock, hostname=HOSTNAME)
    session = Session(store=store, pipeline=Pipeline(store, [LeakingGpu0(src, clock.t)], clock=clock), gpu=src, mode="fake")
    for _ in range(120):  # two minutes: the forecast needs one at least
        clock.advance(1.0)
        session.pipeline.poll_once()
        store.add([host_sample(clock.t)])
    session.target_pid = FAKE_PID_BASE
    stage = JobStage(store, FAKE_PID_BASE, views=ViewsStage(store, FAKE_PID_BASE, session.stuck_after),
                     memory_watch=MemoryWatch())
    for _ in range(2):  # the watch tells a forecast two evaluations agree on
        session.pipeline.publish(stage.poll())
    app = GputopApp(session, interval=1.0, refresh=60)
    assert snap_compare(app, terminal_size=(120, 40))


def test_processes_tab_two_gpus_80x24_with_charts(snap_compare, clock):
    """Two GPUs on a small terminal: their history charts are drawn where they fit (they were left
    out while the rows kept for a two-process table stood empty)."""
    app = GputopApp(fake_session(clock, gpus=2), interval=1.0, refresh=60)
    assert snap_compare(app, terminal_size=(80, 24))


def test_replay_attached_80x24(snap_compare):
    """The smallest terminal, attached (the bundled H100 recording): the verdict line, the
    charts and the table share 24 rows, and the status line stays in sight."""
    assert replay_paused_at_60_percent(snap_compare, (80, 24))


def copy_on_read_session(clock) -> Session:
    """Attached to a job on one scripted GPU whose four DataLoader workers' private memory grows
    (copy-on-read: three at 40 MB/min, one flat), read every 12 s each as the host source reads
    it, over two and a half minutes; the memory view published as the job stage does."""
    store = Store()
    src = FakeGpuSource(gpus=1, clock=clock, hostname=HOSTNAME)
    session = Session(store=store, pipeline=Pipeline(store, [src], clock=clock), gpu=src, mode="fake")
    t0 = clock.t
    rates = (40, 40, 0, 40)
    for k in range(150):
        clock.advance(1.0)
        session.pipeline.poll_once()
        store.add([host_sample(clock.t)])
        store.add([ProcSample(ts=clock.t, pid=FAKE_PID_BASE + 10 + w, ppid=FAKE_PID_BASE, name="pt_data_worker",
                              user="fake", cmdline="python train.py --config vit_b16.yaml  [fake]",
                              cpu_percent=60.0 + w, rss=int(1.9 * GiB), num_threads=3, status="running",
                              create_time=t0 - 600, role="worker",
                              uss=int(300 * 2**20 + rate * 2**20 / 60 * (clock.t - t0)) if k % 12 == 3 * w % 12 else None)
                   for w, rate in enumerate(rates)])
    session.target_pid = FAKE_PID_BASE
    stage = JobStage(store, FAKE_PID_BASE, views=ViewsStage(store, FAKE_PID_BASE, session.stuck_after),
                     memory_watch=MemoryWatch())
    session.pipeline.publish(stage.poll())
    return session


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_workers_private_memory(snap_compare, clock, size):
    """The workers' private memory where it shows: each worker's USS in the process table, with its
    rate while it grows; the workers' total on the host's memory line. At 80 columns the table
    gives TIME and USER up so the command keeps its room."""
    app = GputopApp(copy_on_read_session(clock), interval=1.0, refresh=60)
    assert snap_compare(app, terminal_size=size)
