"""The workers' private memory in recordings: USS/PSS written at the end of the process rows in
schema version 2 and read back; a version 1 recording (from before them) opens, replays and
takes an --append in its own layout, with USS None."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from gputop.model import ProcSample
from gputop.pipeline import Pipeline
from gputop.record import schema
from gputop.record.navigate import Navigator
from gputop.record.reader import Reader
from gputop.record.replay import ReplaySource
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.store import Store

from synth import T0

MiB = 2**20
# A real version 1 recording (an H100 job's checkpoint stall), from before the USS columns.
OLD = Path(__file__).parent / "fixtures" / "recordings" / "h100-checkpoint-stall.gputop"


def _version(p: Path) -> int:
    c = sqlite3.connect(p)
    try:
        return c.execute("PRAGMA user_version").fetchone()[0]
    finally:
        c.close()


def _procs(t0: float, n: int) -> list[ProcSample]:
    return [ProcSample(ts=t0 + k, pid=77, ppid=76, name="pt_data_worker", rss=400 * MiB, status="sleeping",
                       role="worker", uss=(10 + k) * MiB if k % 3 == 0 else None,
                       pss=(100 + k) * MiB if k % 3 == 0 else None) for k in range(n)]


def test_uss_and_pss_round_trip(tmp_path):
    p = tmp_path / "u.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake"))
    w.flush(_procs(T0, 9))
    w.finish()
    assert _version(p) == schema.SCHEMA_VERSION >= 2
    with Reader(p) as r:
        got = r.proc_samples(T0 - 1, T0 + 20)
        assert [s.uss for s in got] == [s.uss for s in _procs(T0, 9)]
        assert [s.pss for s in got] == [s.pss for s in _procs(T0, 9)]
        assert all(s.status == "sleeping" and s.rss == 400 * MiB for s in got)  # the columns before still line up
        assert r.bad_rows == 0


def test_version_1_layouts_are_the_narrower_ones():
    v1, v2 = schema.series_layouts(1), schema.series_layouts(2)
    assert len(v2["procs"]) - len(v1["procs"]) == 2
    assert [f.name for f in schema.PROC_FIELDS[-2:]] == ["uss", "pss"]


def test_a_version_1_recording_replays_with_no_uss(tmp_path):
    assert _version(OLD) == 1
    with Reader(OLD) as r:
        got = r.proc_samples(r.start_ts - 1, r.end_ts + 1)
        assert got and r.bad_rows == 0 and r.damage is None
        assert any(s.rss for s in got)
        assert all(s.uss is None and s.pss is None for s in got)
        start, end = r.start_ts, r.end_ts
    mono = [1000.0]
    store = Store()
    reader = Reader(OLD)
    src = ReplaySource(reader, Navigator(reader), monotonic=lambda: mono[0])
    pipe = Pipeline(store, [src])
    src.attach(pipe.publish)
    pipe.poll_once()
    mono[0] += 10 * (end - start + 10)
    pipe.poll_once()
    latest = store.procs_latest()
    assert latest and all(s.uss is None for s in latest.values())
    reader.close()


def test_an_append_to_a_version_1_recording_keeps_its_proc_layout(tmp_path):
    p = tmp_path / "old.gputop"
    shutil.copyfile(OLD, p)
    with Reader(p) as r:
        before = len(r.proc_samples(r.start_ts - 1, r.end_ts + 1))
        later = r.end_ts + 100
    w = RecordWriter.create(p, append=True)
    w.start_session(SessionMeta(mode="fake"))
    w.flush(_procs(later, 3))
    w.finish()
    assert _version(p) == 1
    with Reader(p) as r:
        got = r.proc_samples(r.start_ts - 1, r.end_ts + 1)
        assert len(got) == before + 3 and r.bad_rows == 0 and r.check_blocks() == 0
        new = [s for s in got if s.ts >= later]
        assert [s.rss for s in new] == [400 * MiB] * 3 and all(s.uss is None for s in new)
