"""One span per recording, the same in info, report, replay and record --list; the buffered GPU
history from before the recorder started marked as such; idle jumps land on every stall."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gputop.analysis.idle import idle_intervals, util_slices
from gputop.cli import main
from gputop.model import GpuSample
from gputop.pipeline import Pipeline
from gputop.record.navigate import Navigator
from gputop.record.reader import Reader
from gputop.record.span import recording_span
from gputop.units import fmt_length
from gputop.report import collect, render_text, summary_dict
from gputop.record.replay import ReplaySource
from gputop.store import Store

REC = Path(__file__).parent / "fixtures" / "recordings" / "h100-checkpoint-stall.gputop"


@pytest.fixture
def rec(tmp_path):
    p = tmp_path / REC.name
    shutil.copyfile(REC, p)
    return p


def test_span_starts_with_the_recording_not_the_buffered_gpu_history(rec):
    with Reader(rec) as r:
        first_poll = r.gpu_samples(0, 2e10)[0].ts
        first_util = r.util_points(0, 2e10)[0].ts
        assert first_util < first_poll - 10  # NVML's buffer reached back before the recorder
        assert r.start_ts == pytest.approx(first_poll, abs=0.05)
        assert r.span.backfill_s == pytest.approx(first_poll - first_util, abs=0.05)
        assert fmt_length(r.duration) == "0:00:45"  # the recorder ran for --duration 45s


def test_info_report_and_list_give_the_same_length(rec, capsys):
    assert main(["info", str(rec)]) == 0
    info = capsys.readouterr().out
    assert "(0:00:45; plus 14 s of GPU utilisation history from before recording started" in info
    assert main(["info", str(rec), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["backfill_s"] == pytest.approx(14.0, abs=0.1)
    assert main(["record", "--list", str(rec.parent)]) == 0
    assert " 0:00:45 " in capsys.readouterr().out
    with Reader(rec) as r:
        s = collect(r)
    assert "(0:00:45)" in render_text(s) and "14 s of GPU utilisation history" in render_text(s)
    assert summary_dict(s)["duration_s"] == pytest.approx(d["duration_s"])


def test_replay_opens_on_data_at_the_start_of_the_span(rec):
    store = Store()
    src = ReplaySource(Reader(rec), paused=True)
    src.attach(Pipeline(store, [src]).publish)
    try:
        src.seek(src.start_ts)
        assert src.start_ts == src.reader.start_ts
        assert isinstance(store.latest_gpu(0), GpuSample)  # not "waiting for first sample"
    finally:
        src.close()


def test_idle_jumps_visit_every_stall_the_analysis_finds(rec):
    reader = Reader(rec)
    src = ReplaySource(reader, Navigator(reader), paused=True)
    try:
        r = src.reader
        slices = util_slices(r.util_points(r.start_ts - 2, r.end_ts), r.start_ts, r.end_ts)
        stalls = [iv.start for iv in idle_intervals(slices) if iv.duration >= 1.9]
        assert len(stalls) >= 6  # the checkpoint saves the chart shows
        jumps, t = [], src.start_ts
        while (nxt := src.next_idle(t)) is not None:
            jumps.append(nxt)
            t = nxt
        assert jumps == pytest.approx(stalls, abs=0.3)
        back, t = [], src.end_ts
        while (prv := src.prev_idle(t)) is not None:
            back.append(prv)
            t = prv
        assert back[::-1] == pytest.approx(stalls, abs=0.3)
    finally:
        src.close()


def test_recording_span_is_one_rule():
    s = recording_span([100.0, 100.5, None], [145.0, 144.0], backfill_first=86.0)
    assert (s.start, s.end, s.backfill_s, s.duration) == (100.0, 145.0, 14.0, 45.0)
    only_util = recording_span([], [10.0], backfill_first=0.0)
    assert (only_util.start, only_util.backfill_s) == (0.0, 0.0)
    assert recording_span([], [], fallback_start=5.0).duration == 0.0
    assert fmt_length(58.9) == "0:00:59" and fmt_length(3600 * 26 + 61) == "26:01:01"
