"""`gputop report` on the DataLoader workers' private memory (USS): the workers' sum over the
recording, each worker's figures and growth, the median rate and the copy-on-read judgement the
memory view makes, in the text, the JSON and the HTML (a chart of the sum). Synthetic recordings
(tests/synth_recording.py), ten minutes each, the workers' USS read every 12 s as live."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

from gputop.cli import main
from gputop.record.reader import Reader
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.report import collect, render_html, render_text, summary_dict

from synth_recording import TARGET_PID, SyntheticSession

MiB, GiB = 2**20, 2**30
T0 = 1_767_225_600.0
COPY = 40 * MiB / 60  # bytes/s: a Dataset of Python objects copied into each worker


def _record(path, worker_uss=None, target_rss=None, seconds: int = 600):
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="fake", target_pid=TARGET_PID, target_cmdline="python train.py"))
    for b in SyntheticSession(t0=T0, worker_uss=worker_uss, target_rss=target_rss).seconds(seconds):
        w.flush(b)
    w.finish()
    with Reader(path) as r:
        return collect(r)


@pytest.fixture(scope="module")
def copying(tmp_path_factory):
    """Two of three workers' USS grows 40 MB/min from 200 MB; the third stays flat; the main
    process's RSS is flat."""
    return _record(tmp_path_factory.mktemp("uss") / "cow.gputop",
                   worker_uss=lambda t, i: 200 * MiB + (COPY * t if i < 2 else 0.0), target_rss=lambda t: 9 * GiB)


@pytest.fixture(scope="module")
def leaking(tmp_path_factory):
    """The workers' USS flat; the main process's RSS grows 100 MB/min."""
    return _record(tmp_path_factory.mktemp("uss") / "leak.gputop", worker_uss=lambda t, i: 200 * MiB,
                   target_rss=lambda t: 9 * GiB + 100 * MiB / 60 * t)




def test_the_summary_has_each_worker_and_their_sum_over_the_run(copying):
    w = copying.workers_memory
    assert w is not None and [x.pid for x in w.workers] == [TARGET_PID + 1, TARGET_PID + 2, TARGET_PID + 3]
    grown, other, flat = w.workers
    assert grown.first == pytest.approx(200 * MiB, rel=0.01) and grown.last == pytest.approx(200 * MiB + COPY * 589, rel=0.01)
    assert grown.growth.growing and grown.growth.rate == pytest.approx(COPY, rel=0.01)
    assert flat.growth.kind == "flat" and flat.peak == 200 * MiB
    # The sum holds every worker from the start (a worker between two reads holds what it held)
    # to the end, never one worker alone as the reads are spread.
    assert w.total_first == pytest.approx(3 * 200 * MiB, rel=0.02)
    assert w.total_last == pytest.approx(3 * 200 * MiB + 2 * COPY * 590, rel=0.02)
    assert w.total_peak == w.total_last
    vals = [v for _, v in w.chart if v is not None]
    assert len(vals) == len(w.chart) and all(b >= a for a, b in zip(vals, vals[1:]))
    p = w.private
    assert (p.read, p.judged, p.growing) == (3, 3, 2) and p.cause == "copy-on-read" and p.grows
    assert p.median_rate == pytest.approx(COPY, rel=0.01)


def test_the_text_says_the_sum_the_median_and_copy_on_read(copying, utc):
    text = render_text(copying)
    host = text[text.index("\nhost   CPU"):text.index("\nfindings")]
    assert "\n  USS        ▄" in host and "█\n" in host  # from 600 MB to its peak, on a scale from 0
    said = " ".join(host.split())
    assert re.search(r"workers' private memory \(USS\): 3 DataLoader workers, their sum 60\d\.\dM → 1\.4G \(peak 1\.4G\); "
                     r"2 of 3 grew steadily, 40 MB/min each \(median\): copy-on-read", said), said
    assert "the main process's RSS flat" in said
    assert f"worker {TARGET_PID + 1}: 200.7M → 592.7M (peak 592.7M), grew 40 MB/min" in host
    assert f"worker {TARGET_PID + 3}: 200.0M → 200.0M (peak 200.0M), flat" in host


def test_a_leak_in_the_main_process_is_not_called_copy_on_read(leaking, utc):
    p = leaking.workers_memory.private
    assert p.growing == 0 and p.median_rate == 0.0 and p.cause == "main-process" and not p.grows
    said = " ".join(render_text(leaking).split())
    assert ("none of the 3 grew steadily: the main process's RSS grew instead (a leak in the main process, not "
            "copy-on-read)") in said


def test_the_json_has_the_figures_in_bytes(copying):
    d = json.loads(json.dumps(summary_dict(copying)))["workers_memory"]
    assert d["workers"] == 3 and d["judged"] == 3 and d["growing"] == 2 and d["grows"] is True
    assert d["cause"] == "copy-on-read"
    assert d["growth_median_bytes_per_s"] == pytest.approx(COPY, rel=0.01)
    assert d["growth_total_bytes_per_s"] == pytest.approx(2 * COPY, rel=0.01)
    assert d["total_first_bytes"] == pytest.approx(600 * MiB, rel=0.02) and d["total_peak_bytes"] > 1.3 * GiB
    assert [w["trend"] for w in d["per_worker"]] == ["growing", "growing", "flat"]
    assert d["per_worker"][2]["growth_bytes_per_s"] == 0.0
    assert d["text"].startswith("3 DataLoader workers, their sum")


def test_the_html_charts_the_sum_and_lists_the_workers(copying):
    page = render_html(copying)
    section = page[page.index("<h3>DataLoader workers' private memory</h3>"):]
    chart = section[section.index("<svg"):section.index("</svg>") + 6]
    ET.fromstring(chart)  # well-formed
    assert 'aria-label="workers&#x27; private memory"' in chart and "workers&#x27; USS (sum)" in chart
    assert "copy-on-read" in section and "40 MB/min each (median)" in section
    assert f"<td>PID {TARGET_PID + 1}</td>" in section and "<td>grew 40 MB/min</td>" in section
    assert section.index("workers&#x27; private memory") < page.index("<h2>Findings")


def test_a_recording_without_uss_says_nothing_of_it(tmp_path, utc):
    s = _record(tmp_path / "old.gputop", seconds=60)
    assert s.workers_memory is None
    assert "USS" not in render_text(s) and "private memory" not in render_html(s)
    assert summary_dict(s)["workers_memory"] is None


def test_report_command_json_carries_it(tmp_path, capsys):
    p = tmp_path / "cow.gputop"
    _record(p, worker_uss=lambda t, i: 200 * MiB + COPY * t, target_rss=lambda t: 9 * GiB, seconds=300)
    assert main(["report", str(p), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["workers_memory"]
    assert d["growing"] == 3 and d["cause"] == "copy-on-read"
