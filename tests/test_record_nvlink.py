"""The GPU samples' NVLink rates in recordings: written (schema version 2), read back, replayed
into the store; a version 1 recording (from before the columns) still opens, its rates None, and
an --append to it keeps it version 1."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from gputop.model import GpuSample
from gputop.pipeline import Pipeline
from gputop.record import schema
from gputop.record.navigate import Navigator
from gputop.record.reader import Reader
from gputop.record.replay import ReplaySource
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.store import Store

T0 = 1_767_225_600.0
# A real version 1 recording: a 2-rank NCCL job on two H100s, from before the NVLink columns.
OLD = Path(__file__).parent / "fixtures" / "nccl" / "healthy-h100x2.gputop"
TX, RX = 46.5e9, 45.25e9


def _samples(t0: float, n: int, **kw) -> list[GpuSample]:
    return [GpuSample(ts=t0 + k, index=g, util_gpu=90.0, error="odd" if k == 1 else None, **kw)
            for k in range(n) for g in (0, 1)]


def _version(p: Path) -> int:
    c = sqlite3.connect(p)
    try:
        return c.execute("PRAGMA user_version").fetchone()[0]
    finally:
        c.close()


def test_nvlink_rates_round_trip_to_the_byte(tmp_path):
    p = tmp_path / "n.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake"))
    w.flush(_samples(T0, 5, nvlink_tx_bps=TX, nvlink_rx_bps=RX))
    w.flush([GpuSample(ts=T0 + 10, index=0, util_gpu=1.0)])  # a poll without rates stays None
    w.finish()
    assert _version(p) == schema.SCHEMA_VERSION >= 2
    with Reader(p) as r:
        got = r.gpu_samples(T0 - 1, T0 + 20)
        assert len(got) == 11
        rated = [s for s in got if s.ts < T0 + 10]
        assert all(s.nvlink_tx_bps == TX and s.nvlink_rx_bps == RX for s in rated)
        assert [s.error for s in rated if s.error] == ["odd", "odd"]  # the string column is still found
        assert got[-1].nvlink_tx_bps is None and got[-1].nvlink_rx_bps is None
        assert r.bad_rows == 0


def test_a_version_1_recording_opens_with_no_rates(tmp_path):
    p = tmp_path / "old.gputop"
    shutil.copyfile(OLD, p)
    assert _version(p) == 1
    with Reader(p) as r:
        got = r.gpu_samples(r.start_ts - 1, r.end_ts + 1)
        assert len(got) > 20 and r.bad_rows == 0 and r.damage is None
        assert any(s.util_gpu is not None and s.power_w is not None for s in got)
        assert all(s.nvlink_tx_bps is None and s.nvlink_rx_bps is None for s in got)
        assert r.check_blocks() == 0


def test_an_append_to_a_version_1_recording_keeps_its_layout(tmp_path):
    p = tmp_path / "old.gputop"
    shutil.copyfile(OLD, p)
    with Reader(p) as r:
        before = len(r.gpu_samples(r.start_ts - 1, r.end_ts + 1))
        later = r.end_ts + 100
    w = RecordWriter.create(p, append=True)
    w.start_session(SessionMeta(mode="fake"))
    w.flush(_samples(later, 3, nvlink_tx_bps=TX, nvlink_rx_bps=RX))
    w.finish()
    assert _version(p) == 1  # the gputop that wrote it still reads it
    with Reader(p) as r:
        got = r.gpu_samples(r.start_ts - 1, r.end_ts + 1)
        assert len(got) == before + 6 and r.bad_rows == 0 and r.check_blocks() == 0
        new = [s for s in got if s.ts >= later]
        assert [s.util_gpu for s in new] == [90.0] * 6
        assert all(s.nvlink_tx_bps is None for s in new)  # a version 1 file has no place for them


def test_a_replay_puts_the_rates_in_the_store(tmp_path):
    p = tmp_path / "r.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake"))
    w.flush(_samples(T0, 30, nvlink_tx_bps=TX, nvlink_rx_bps=RX))
    w.finish()
    mono = [1000.0]
    store = Store()
    reader = Reader(p)
    src = ReplaySource(reader, Navigator(reader), monotonic=lambda: mono[0])
    pipe = Pipeline(store, [src])
    src.attach(pipe.publish)
    pipe.poll_once()
    mono[0] += 10_000  # play through to the end
    pipe.poll_once()
    for g in (0, 1):
        s = store.latest_gpu(g)
        assert s is not None and (s.nvlink_tx_bps, s.nvlink_rx_bps) == (TX, RX)
    reader.close()


def test_a_replayed_session_hands_the_ranks_pane_the_recorded_rates(tmp_path):
    from gputop.session import open_replay

    p = tmp_path / "s.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake"))
    w.flush(_samples(T0, 20, nvlink_tx_bps=TX, nvlink_rx_bps=RX))
    w.finish()
    session = open_replay(p, speed=1000.0, advisor=False)
    try:
        session.replay.seek(T0 + 10)
        session.pipeline.poll_once()
        assert session.nvlink_bps == {0: (TX, RX), 1: (TX, RX)}
    finally:
        session.pipeline.stop()


def test_a_version_1_replay_has_no_rates_for_the_pane():
    from gputop.session import open_replay

    session = open_replay(OLD, speed=1000.0, advisor=False)
    try:
        session.replay.seek(session.replay.start_ts + 5)
        session.pipeline.poll_once()
        assert session.store.gpu_indices() and session.nvlink_bps is None
    finally:
        session.pipeline.stop()
