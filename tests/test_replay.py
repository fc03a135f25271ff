"""Replaying a recording: the same samples as live, the virtual clock, seeks, jumps, the timeline."""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest

from gputop.model import Event, GpuSample, StackSample
from gputop.pipeline import Pipeline
from gputop.record.navigate import Navigator
from gputop.record.reader import Reader
from synth_recording import SyntheticSession
from gputop.record.recorder import Recorder
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.sources.fake import FakeGpuSource
from gputop.record.replay import HistoryWindows, ReplaySource, parse_position
from gputop.store import Store

T0 = 1_767_225_600.0


def same(a, b):
    """Lists of samples equal field by field, floats to the recorded resolution (0.01 %, 1 mW)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert type(x) is type(y)
        for f in dataclasses.fields(x):
            u, v = getattr(x, f.name), getattr(y, f.name)
            if isinstance(u, float) and isinstance(v, float):
                assert v == pytest.approx(u, rel=1e-6, abs=0.006), f.name
            else:
                assert u == v, f.name
    return True


class Clock:
    """A hand-driven monotonic clock for the replay's wall time."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """Ten minutes of a synthetic job that idles 60 s every 5 minutes."""
    p = tmp_path_factory.mktemp("rec") / "ten.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake", target_pid=4_194_300))
    for b in SyntheticSession(t0=T0, checkpoint_every_s=300, checkpoint_len_s=60).seconds(600):
        w.flush(b)
    w.finish()
    return p


def open_source(path, **kw):
    clock = Clock()
    store = Store()
    reader = Reader(path)
    src = ReplaySource(reader, Navigator(reader), monotonic=clock, **kw)
    pipe = Pipeline(store, [src])
    src.attach(pipe.publish)
    return src, store, pipe, clock


# --------------------------------------------------------------------------- live == replay


def test_replayed_store_equals_the_live_store(tmp_path):
    """Record a fake live session through the real pipeline, replay it: the panes' data match."""
    p = tmp_path / "live.gputop"
    t = [T0]
    live = Store()
    src = FakeGpuSource(gpus=2, clock=lambda: t[0])
    pipe = Pipeline(live, [src], clock=lambda: t[0])
    rec = Recorder.open(p, store=live, meta=SessionMeta(mode="fake"))
    pipe.subscribe(rec.on_batch)
    extra = []
    for k in range(90):
        t[0] += 1.0
        pipe.poll_once()
        batch = [StackSample(ts=t[0], pid=7, thread_id=1, thread_name="MainThread", is_main=True)]
        extra += batch
        pipe.publish(batch)
    rec.close()

    replay_src, replayed, rpipe, clock = open_source(p, speed=1.0)
    rpipe.poll_once()
    clock.t += 10_000  # play through to the end, in one go
    rpipe.poll_once()
    now = live.now
    assert replayed.now == now
    for i in live.gpu_indices():
        assert same(replayed.gpu_window(i, 0), live.gpu_window(i, 0))
        assert same(replayed.util_window(i, 0), live.util_window(i, 0))
        assert replayed.gpu_info[i] == live.gpu_info[i]
    assert same(replayed.gpu_processes(), live.gpu_processes())
    assert replayed.procs_latest().keys() == live.procs_latest().keys()
    assert same(list(replayed.procs_latest().values()), list(live.procs_latest().values()))
    assert replayed.stack_window(0) == live.stack_window(0)
    assert replayed.system == live.system


def test_position_follows_wall_time_times_speed(recording):
    src, store, pipe, clock = open_source(recording, speed=60.0)
    start = src.position
    assert start == src.reader.first_poll_ts()
    pipe.poll_once()
    assert store.now == pytest.approx(start, abs=1.0)
    clock.t += 2.0
    assert src.position == pytest.approx(start + 120.0)
    pipe.poll_once()
    assert start + 119 <= store.now <= start + 120.0 + 1e-6
    # Every GPU poll up to the position is in the store, none after it.
    got = [s.ts for s in store.gpu_window(0, 0)]
    want = [s.ts for s in src.reader.gpu_samples(start - 400, src.position)]
    assert got == want[-len(got):] and got[-1] == want[-1]


def test_pause_freezes_and_play_resumes(recording):
    src, store, pipe, clock = open_source(recording)
    pipe.poll_once()
    src.pause()
    p = src.position
    clock.t += 50
    assert src.position == p
    src.play()
    clock.t += 5
    assert src.position == pytest.approx(p + 5)
    src.set_speed(10)
    clock.t += 1
    assert src.position == pytest.approx(p + 15)
    assert src.faster() > 10 and src.slower() == 10


def test_seek_back_rebuilds_the_store_at_that_time(recording):
    src, store, pipe, clock = open_source(recording, speed=100.0)
    pipe.poll_once()
    clock.t += 5  # 500 s in
    pipe.poll_once()
    target = T0 + 200.5
    src.seek(target)
    assert store.now <= target
    assert max(s.ts for s in store.gpu_window(0, 0)) <= target
    assert max(s.ts for s in store.stack_window(0)) <= target
    # The panes' history is there right after the jump.
    windows = HistoryWindows()
    gpu = store.gpu_window(0, 0)
    assert gpu[0].ts <= target - windows.gpu + 2 or gpu[0].ts <= src.start_ts + 2
    assert store.stack_window(target - 60, target)
    assert store.system is not None and 0 in store.gpu_info


def test_seek_is_atomic_against_a_running_pipeline(recording):
    src, store, pipe, clock = open_source(recording, speed=1.0)
    src.interval = 0.01
    clock_lock = threading.Lock()
    rnd = random.Random(3)
    pipe.start()
    try:
        for _ in range(25):
            with clock_lock:
                clock.t += rnd.uniform(0, 30)
            src.pause()
            target = rnd.uniform(src.start_ts, src.end_ts)
            src.seek(target)
            # A batch read before the seek must not land after it.
            assert store.now <= target + 1e-6
            assert all(s.ts <= target + 1e-6 for s in store.stack_window(0))
            src.play()
    finally:
        pipe.stop()


def test_playing_past_the_end_stops_and_says_so(recording):
    src, store, pipe, clock = open_source(recording, speed=1000.0)
    pipe.poll_once()
    clock.t += 10
    pipe.poll_once()
    assert src.at_end and not src.playing
    assert src.position == src.end_ts
    assert any(e.source == "replay" and "end of recording" in e.message for e in store.events())
    src.play()  # from the start again
    assert src.position == src.start_ts and src.playing


def test_step_forward_and_back(recording):
    src, store, pipe, clock = open_source(recording, paused=True)
    pipe.poll_once()
    p = src.position
    src.step(10)
    assert src.position == pytest.approx(p + 10)
    assert store.now == pytest.approx(p + 10, abs=1.0)
    src.step(-5)
    assert src.position == pytest.approx(p + 5)
    assert store.now <= p + 5 + 1e-6


def test_jumps_to_idle_periods_and_findings(recording):
    src, store, pipe, clock = open_source(recording, paused=True)
    periods = src.idle_periods()
    assert len(periods) == 2
    first = src.next_idle()
    # The checkpoint idles from minute 4 (T0 + 240 s) on; the jump lands at its first idle slice.
    assert T0 + 238 <= first <= T0 + 242
    src.seek(first)
    assert src.reader.util_points(first, first + 1.0)[0].util < 10
    second = src.next_idle()
    assert T0 + 538 <= second <= T0 + 542
    assert src.prev_idle(second) == pytest.approx(first, abs=0.5)
    f = src.next_finding(src.start_ts)
    assert f is not None and f > src.start_ts
    assert src.next_finding(src.end_ts) is None


def test_recorded_events_and_findings_are_replayed(recording):
    src, store, pipe, clock = open_source(recording, paused=True)
    src.seek(src.end_ts)
    assert any(e.message.startswith("checkpoint started") for e in store.events())
    assert {f.id for f in store.findings_window(0)} >= {"data-stall", "checkpoint-stall"}


def test_standalone_source_returns_batches_when_not_attached(recording):
    store = Store()
    clock = Clock()
    src = ReplaySource(Reader(recording), monotonic=clock)
    first = src.poll()
    assert any(isinstance(s, GpuSample) for s in first)
    clock.t += 3
    more = src.poll()
    assert [s.ts for s in more if isinstance(s, GpuSample)] == pytest.approx(
        [src.reader.first_poll_ts() + k for k in (1, 2, 3)]
    )


def test_damaged_file_replays_and_warns(tmp_path):
    p = tmp_path / "d.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    for b in SyntheticSession(t0=T0).seconds(300):
        w.flush(b)
    w.finish()
    data = p.read_bytes()
    p.write_bytes(data[: len(data) * 2 // 3])
    src, store, pipe, clock = open_source(p, speed=1000.0)
    assert src.damage
    pipe.poll_once()
    clock.t += 10
    pipe.poll_once()
    assert src.at_end
    assert any(isinstance(e, Event) and e.level == "warning" and "damaged" in e.message for e in store.events()) or \
        any("damaged" in e.message or "truncated" in e.message for e in store.events())


# --------------------------------------------------------------------------- positions


@pytest.mark.parametrize(
    "text, offset",
    [("+90s", 90), ("+1h30m", 5400), ("90", 90), ("2m", 120), ("50%", 43200), ("-10m", 86400 - 600),
     ("0%", 0), ("100%", 86400)],
)
def test_parse_position(text, offset):
    assert parse_position(text, T0, T0 + 86400) == pytest.approx(T0 + offset)


def test_parse_position_clock_times_and_errors():
    import time as _time

    noon = _time.mktime(_time.localtime(T0)[:3] + (12, 0, 0, 0, 0, -1))
    assert parse_position("12:00", T0, T0 + 86400) == pytest.approx(noon)
    for bad in ("soon", "+x", "25:61", "200%", "", "12:00"):
        with pytest.raises(ValueError):
            parse_position(bad, T0 + 86400 * 3 + 13 * 3600, T0 + 86400 * 3 + 13 * 3600 + 60)
