"""A finding's gain_predicted (the bound advise --json gives) is recorded, read back and reported;
files from before the column still read (None) and still take --append without gaining it."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from gputop.cli import main
from gputop.model import Finding, GpuSample, Severity
from gputop.record import codec, schema
from gputop.record.reader import Reader
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.report import collect, summary_dict
from gputop.record.replay import HistoryWindows

T0 = 1_767_225_600.0
OLD = Path(__file__).parent / "fixtures" / "recordings" / "h100-checkpoint-stall.gputop"


def _finding(fid: str, ts: float, gain: float | None, **kw) -> Finding:
    return Finding(id=fid, title=f"title {fid}", severity=Severity.WARNING, confidence=0.8, evidence=("e",),
                   action="do it", ts=ts, first_seen=ts, gain_predicted=gain, **kw)


def _columns(p: Path) -> list[str]:
    c = sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True)
    try:
        return [r[1] for r in c.execute("PRAGMA table_info(findings)")]
    finally:
        c.close()


def _old_copy(tmp_path: Path) -> Path:
    p = tmp_path / "old.gputop"
    shutil.copyfile(OLD, p)
    assert "gain_predicted" not in _columns(p)  # the fixture is from before the column
    return p


def test_codec_round_trips_gain_predicted_and_reads_short_rows_as_none():
    f = _finding("x", T0, 2.5)
    row = codec.finding_row(f)
    assert codec.finding_from_row(row).gain_predicted == 2.5
    assert codec.finding_from_row(row[:12]).gain_predicted is None  # a row from an old file
    for bad in (float("nan"), float("inf"), -1.0, 0.0):
        assert codec.finding_row(dataclasses.replace(f, gain_predicted=bad))[12] is None
    assert codec.finding_from_row(codec.finding_row(dataclasses.replace(f, gain_predicted=None))).gain_predicted is None


def test_a_recorded_finding_keeps_its_gain_predicted_and_the_newest_while_still_seen(tmp_path):
    p = tmp_path / "g.gputop"
    # An added nullable column was no version bump: version 1 files, from before it or after,
    # are still appended to (version 2 widened the GPU blocks, not this table).
    assert 1 in schema.APPENDABLE_VERSIONS
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([GpuSample(ts=T0 + 1, index=0, util_gpu=50.0)])
    w.flush([_finding("a", T0 + 1, 1.8), _finding("none", T0 + 1, None)])
    w.flush([_finding("a", T0 + 5, 1.6)])  # same words, newer numbers: the same row
    w.finish()
    assert "gain_predicted" in _columns(p)
    with Reader(p) as r:
        rows = {f.id: (f, last) for f, last in r.finding_rows()}
        assert rows["a"][0].gain_predicted == 1.6 and rows["a"][1] == T0 + 5
        assert rows["none"][0].gain_predicted is None
        assert {f.id: f.gain_predicted for f in r.findings()} == {"a": 1.6, "none": None}
        assert {f.id: f.gain_predicted for f in r.findings(last=5)} == {"a": 1.6, "none": None}


def test_report_json_gives_the_recorded_gain_predicted(tmp_path, capsys):
    p = tmp_path / "rep.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([GpuSample(ts=T0 + k, index=0, util_gpu=50.0) for k in range(1, 6)])
    w.flush([_finding("a", T0 + 2, 2.25), _finding("none", T0 + 2, None)])
    w.finish()
    assert main(["report", str(p), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["gain_predicted_recorded"] is True
    by = {f["id"]: f for f in d["findings"]}
    assert by["a"]["gain_predicted"] == 2.25
    assert by["none"]["gain_predicted"] is None  # recorded: no throughput claim


def test_an_old_recording_without_the_column_still_reads_with_none(tmp_path, capsys):
    p = _old_copy(tmp_path)
    with Reader(p) as r:
        rows = r.finding_rows()
        assert rows and all(f.gain_predicted is None for f, _ in rows)
        assert r.findings() and all(f.gain_predicted is None for f in r.findings())
        assert not r.damage and not r.bad_rows
        s = collect(r)
    # A file from before the column is from before the advisor's fingerprint too: its report judges
    # the samples again (report.rejudge), so the findings it prints are this advisor's, bounds and all.
    assert s.judged_again and s.gain_predicted_recorded is True
    assert summary_dict(s)["gain_predicted_recorded"] is True
    assert main(["report", str(p), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["judged_again_step_s"] == 1.0 and d["recorded_finding_ids"]


def test_append_to_an_old_recording_keeps_its_format(tmp_path):
    """--append to a file from before the column writes findings without it (no ALTER TABLE):
    the file's findings all stay 'not recorded', rather than the old ones reading as 'no claim'."""
    p = _old_copy(tmp_path)
    with Reader(p) as r:
        before = len(r.finding_rows())
        end = r.end_ts
    w = RecordWriter.create(p, append=True)
    w.start_session(SessionMeta())
    w.flush([_finding("appended", end + 1, 3.0)])
    w.flush([_finding("appended", end + 2, 2.0)])  # still seen: the UPDATE path
    w.finish()
    assert "gain_predicted" not in _columns(p)
    with Reader(p) as r:
        rows = r.finding_rows()
        assert len(rows) == before + 1
        new = [f for f, _ in rows if f.id == "appended"]
        assert new and new[0].gain_predicted is None
        # The first session is unstamped: judged again, whatever the appended one's findings say.
        s = collect(r)
        assert s.judged_again and s.gain_predicted_recorded is True


def test_append_to_a_new_recording_keeps_gain_predicted(tmp_path):
    p = tmp_path / "n.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([GpuSample(ts=T0 + 1, index=0, util_gpu=50.0), _finding("a", T0 + 1, 1.5)])
    w.finish()
    w = RecordWriter.create(p, append=True)
    w.start_session(SessionMeta())
    w.flush([GpuSample(ts=T0 + 10, index=0, util_gpu=50.0), _finding("b", T0 + 10, 4.0)])
    w.finish()
    with Reader(p) as r:
        assert {f.id: f.gain_predicted for f, _ in r.finding_rows()} == {"a": 1.5, "b": 4.0}


@pytest.mark.parametrize("gain", [None, 1.7])
def test_replay_emits_the_recorded_findings_as_written(tmp_path, gain):
    """A replay's seek (Reader.history/between) hands on recorded findings with their bound;
    the advisor's own findings in a replay are derived again from the samples, not from these."""
    p = tmp_path / "h.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([GpuSample(ts=T0 + 1, index=0, util_gpu=50.0), _finding("a", T0 + 1, gain)])
    w.finish()
    with Reader(p) as r:
        found = [x for x in r.samples(T0, T0 + 2) if isinstance(x, Finding)]
        assert [f.gain_predicted for f in found] == [gain]
        seek = [x for x in r.history(T0 + 2, HistoryWindows()) if isinstance(x, Finding)]
        assert [f.gain_predicted for f in seek] == [gain]
