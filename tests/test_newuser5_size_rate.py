"""`info` extrapolates a recording's size per GPU-hour only from a recording long enough for the
rate to mean something (record.reader.MIN_RATE_SPAN_S); a short one gets its size and length."""

from __future__ import annotations

import json

from gputop.cli import main
from gputop.model import GpuSample, HostSample
from gputop.record.reader import MIN_RATE_SPAN_S
from gputop.record.writer import RecordWriter, SessionMeta

T0 = 1_767_225_600.0


def _recording(path, seconds: float, step: float):
    w = RecordWriter.create(path)
    w.start_session(SessionMeta())
    n = int(seconds / step) + 1
    w.flush([GpuSample(ts=T0 + k * step, index=0, util_gpu=50.0) for k in range(n)]
            + [HostSample(ts=T0 + k * step, cpu_percent=10.0) for k in range(n)])
    w.finish()
    return path


def test_a_six_second_recording_gives_no_rate(tmp_path, capsys):
    p = _recording(tmp_path / "six.gputop", 6.0, 1.0)
    assert main(["info", str(p)]) == 0
    size = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("size"))
    assert "per GPU-hour)" not in size
    assert "in 0:00:06: too short to estimate the size per GPU-hour (that takes at least 30 min)" in size
    assert main(["info", str(p), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bytes_per_gpu_hour"] is None and d["rate_min_s"] == MIN_RATE_SPAN_S


def test_a_long_enough_recording_gives_its_rate(tmp_path, capsys):
    p = _recording(tmp_path / "long.gputop", MIN_RATE_SPAN_S + 60, 30.0)
    assert main(["info", str(p), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bytes_per_gpu_hour"] == round(d["size_bytes"] / (d["duration_s"] / 3600))
    assert main(["info", str(p)]) == 0
    assert "per GPU-hour)" in capsys.readouterr().out
