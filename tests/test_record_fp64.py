"""The GPU samples' FP64 readings (GPM's FP64 tensor cores and FP64 pipes) in recordings: written
(schema version 4), read back; a version 3 recording (from before the columns) still opens, its
readings None, and an --append to it keeps it version 3."""

from __future__ import annotations

import shutil
from pathlib import Path

from gputop.model import GpuSample
from gputop.record import schema
from gputop.record.reader import Reader
from gputop.record.writer import RecordWriter, SessionMeta

T0 = 1_767_225_600.0
# A real version 3 recording: a Lightning job on an H200, from before the FP64 columns.
OLD = Path(__file__).parent / "fixtures" / "recordings" / "h200-lightning-cudnn-benchmark.gputop"


def _version(p: Path) -> int:
    with Reader(p) as r:
        return r.schema_version


def _samples(t0: float, n: int, **kw) -> list[GpuSample]:
    return [GpuSample(ts=t0 + k, index=0, util_gpu=99.0, tensor_active=55.0, nvlink_tx_bps=1e9, **kw)
            for k in range(n)]


def test_fp64_readings_round_trip(tmp_path):
    p = tmp_path / "f.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake"))
    w.flush(_samples(T0, 4, dfma_active=52.5, fp64_active=11.25))
    w.flush([GpuSample(ts=T0 + 10, index=0, util_gpu=1.0)])
    w.finish()
    assert _version(p) == schema.SCHEMA_VERSION >= 4
    with Reader(p) as r:
        got = r.gpu_samples(T0 - 1, T0 + 20)
        assert [(s.dfma_active, s.fp64_active) for s in got[:4]] == [(52.5, 11.25)] * 4
        assert all(s.nvlink_tx_bps == 1e9 for s in got[:4])  # the fields before them still in place
        assert got[-1].dfma_active is None and got[-1].fp64_active is None
        assert r.bad_rows == 0


def test_a_version_3_recording_opens_and_an_append_keeps_its_layout(tmp_path):
    p = tmp_path / "old.gputop"
    shutil.copyfile(OLD, p)
    assert _version(p) == 3
    with Reader(p) as r:
        got = r.gpu_samples(r.start_ts - 1, r.end_ts + 1)
        assert len(got) > 5 and r.bad_rows == 0 and r.damage is None
        assert any(s.tensor_active is not None for s in got)
        assert all(s.dfma_active is None and s.fp64_active is None for s in got)
        before, later = len(got), r.end_ts + 100
    w = RecordWriter.create(p, append=True)
    w.start_session(SessionMeta(mode="fake"))
    w.flush(_samples(later, 3, dfma_active=50.0, fp64_active=10.0))
    w.finish()
    assert _version(p) == 3
    with Reader(p) as r:
        got = r.gpu_samples(r.start_ts - 1, r.end_ts + 1)
        assert len(got) == before + 3 and r.bad_rows == 0 and r.check_blocks() == 0
        new = [s for s in got if s.ts >= later]
        assert [s.tensor_active for s in new] == [55.0] * 3
        assert all(s.fp64_active is None for s in new)  # a version 3 file has no place for them

