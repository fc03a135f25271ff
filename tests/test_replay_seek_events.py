"""A replay's jump moves the advisor's state without news: no "cleared" event for a finding that
was shown before the jump and is not (yet) at the new position."""

import dataclasses

from gputop.advisor.engine import AdvisorSource
from gputop.model import Category as C
from gputop.model import Event, Finding, Reset
from gputop.store import Store

from synth import T0, Job, periodic, phases


def _samples(store: Store, t0: float, t1: float) -> list:
    out = [store.system, *store.gpu_info.values()]
    for i in store.gpu_indices():
        out += store.util_window(i, t0, t1) + store.gpu_window(i, t0, t1)
    out += store.stack_window(t0, t1) + store.host_window(t0, t1)
    out += [p for pid in store.procs_latest() for p in store.proc_window(pid, t0, t1)]
    return out


def test_a_seek_back_to_before_a_finding_says_nothing_cleared():
    # Healthy for 20 s, then starved for data for 30 s: the finding appears late in the file.
    healthy = Job(seconds=20).store()
    starved = Job(seconds=30, util=periodic(1.0, 0.4), main=phases(1.0, 0.4, C.FORWARD, C.DATA_FETCH)).store()
    store = Store()
    src = AdvisorSource(store, window_s=10.0)
    src.advisor.appear_after_s = 0.0
    # Played to the end: the starved part, shifted after the healthy one.
    late = [dataclasses.replace(s, ts=s.ts + 20) if hasattr(s, "ts") else s for s in _samples(starved, 0, float("inf"))]
    store.add(_samples(healthy, 0, float("inf")))
    store.add(late)
    out = src.poll()
    store.add(out)
    assert [x.id for x in out if isinstance(x, Finding)] == ["data-starved"]
    # The user presses Home: the store is rebuilt at the recording's start, where the job was healthy.
    store.add([Reset(None), *_samples(healthy, 0, T0 + 5)])
    out = src.poll()
    said = [x.message for x in out if isinstance(x, Event)]
    assert not any(m.startswith("cleared:") for m in said), said
    assert [x.id for x in out if isinstance(x, Finding)] == []


# --------------------------------------------------------------------------- x and X in the UI

from types import SimpleNamespace  # noqa: E402

from gputop.record.writer import RecordWriter, SessionMeta  # noqa: E402
from gputop.session import open_replay  # noqa: E402
from gputop.ui.timeline import replay_action  # noqa: E402


class _At:
    """A replay source at ``pos`` whose navigation answers ``ts``: only the jump's direction
    is under test."""

    def __init__(self, pos: float, ts: float | None) -> None:
        self.start_ts, self.end_ts, self.position, self.ts = 0.0, 72.4, pos, ts
        self.seeks: list[float] = []

    def next_idle(self):
        return self.ts

    prev_idle = next_finding = prev_finding = next_idle

    def seek(self, ts: float) -> None:
        self.seeks.append(ts)


def test_next_idle_never_moves_back_nor_previous_forward():
    at_end = _At(72.4, 71.4)  # a period the navigator placed a second before the end
    assert replay_action(at_end, "next_idle") == "no idle period after this point"
    assert at_end.seeks == []
    past_end = _At(72.4, 80.0)  # past the recording: clamped to where the replay already is
    assert replay_action(past_end, "next_idle") == "no idle period after this point" and past_end.seeks == []
    at_start = _At(0.0, 5.0)
    assert replay_action(at_start, "prev_idle") == "no idle period before this point" and at_start.seeks == []
    ahead = _At(10.0, 30.0)
    assert replay_action(ahead, "next_idle").startswith("at ") and ahead.seeks == [30.0]


async def test_x_in_a_cpu_only_replay_says_so_on_the_status_line(tmp_path):
    from gputop.model import HostSample, ProcSample
    from gputop.ui.app import GputopApp

    path = tmp_path / "cpu.gputop"
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="live", interval=1.0))
    for i in range(20):
        ts = T0 + i
        w.flush([HostSample(ts=ts, cpu_percent=50.0, mem_total=2**34, mem_used=2**33),
                 ProcSample(ts=ts, pid=4_194_302, ppid=1, cmdline="python train.py", cpu_percent=90.0, role="cpu")])
    w.finish()
    session = open_replay(path, speed=1.0, paused=True, advisor=False)
    app = GputopApp(session, interval=1.0, refresh=60)
    session.pipeline.start()
    try:
        async with app.run_test(size=(140, 45)) as pilot:
            await pilot.pause(0.3)
            before = session.replay.position
            await pilot.press("x")
            await pilot.pause(0.3)
            app.tick(force=True)
            await pilot.pause()
            assert session.replay.position == before
            assert "no idle period after this point" in app.query_one("#status").plain
    finally:
        session.pipeline.stop()
