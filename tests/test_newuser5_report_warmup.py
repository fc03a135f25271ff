"""The advisor's "warming up" is the job's phase: the report says when it was and never counts
it as a finding (as advise's progress line does)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gputop.advisor import WARMUP_ID
from gputop.advisor.engine import warmup_finding
from gputop.cli import main
from gputop.model import Event, Finding, HostSample, Severity
from gputop.record import Reader
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.report import collect, render_html, render_text

T0 = 1_767_225_600.0


@pytest.fixture
def recording(tmp_path):
    p = tmp_path / "warm.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([HostSample(ts=T0 + k, cpu_percent=10.0) for k in range(31)])
    warm = warmup_finding("torch.compile is compiling the model", T0 + 1)
    w.flush([replace(warm, first_seen=T0 + 1)])
    w.flush([Event(T0 + 12, "advisor", "cleared: " + warm.title, "info")])
    w.flush([Finding(id="data-starved", title="Data loader starves GPU 0", severity=Severity.WARNING,
                     confidence=0.9, evidence=("e",), action="do it", ts=T0 + 20, first_seen=T0 + 20)])
    w.finish()
    return p


def test_warming_up_is_the_phase_not_a_finding(recording):
    with Reader(recording) as r:
        s = collect(r)
    assert [fs.finding.id for fs in s.findings] == ["data-starved"]
    assert [ph.finding.id for ph in s.phases] == [WARMUP_ID]
    text = render_text(s, 100)
    assert "findings (1)" in text
    head, findings = text.split("findings (1)")
    assert "phase: warming up: torch.compile is compiling the model" in head
    assert "Warming up" not in findings and "warming up" not in findings
    page = render_html(s)
    assert "Findings (1)" in page and "phase: warming up: torch.compile" in page


def test_json_and_info_count_no_warm_up(recording, capsys):
    assert main(["report", str(recording), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [f["id"] for f in d["findings"]] == ["data-starved"]
    assert d["phases"][0]["id"] == WARMUP_ID and d["phases"][0]["cleared"] == pytest.approx(T0 + 12)
    assert main(["info", str(recording)]) == 0
    assert "findings    1 " in capsys.readouterr().out


def test_the_exporter_says_warming_up_as_a_gauge_not_a_finding(clock):
    pytest.importorskip("prometheus_client")
    from test_export import collector_for, fake_session, scrape, value

    from gputop.model import Verdict

    start = clock()
    store, _ = fake_session(clock, seconds=5)
    real = Finding("data-starved", "GPU waits for data", Severity.WARNING, 0.9, ("e",), "num_workers=8",
                   cost_s=3.0, gpu_index=0)
    store.add([Verdict(store.now, (warmup_finding("compiling", store.now), real))])
    m = scrape(collector_for(store, clock, start))
    assert {s.labels["id"] for s in m["gputop_finding"]} == {"data-starved"}
    assert value(m["gputop_job_warming_up"]) == 1
    store.add([Verdict(store.now, (real,))])
    assert value(scrape(collector_for(store, clock, start))["gputop_job_warming_up"]) == 0


def test_the_phase_says_its_span(recording):
    from gputop.units import fmt_time

    with Reader(recording) as r:
        s = collect(r)
    assert (f"phase: warming up: torch.compile is compiling the model, from {fmt_time(T0 + 1)} to "
            f"{fmt_time(T0 + 12)}") in render_text(s, 200)
