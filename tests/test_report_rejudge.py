"""A report and a replay of one file reach one verdict: a recording whose findings another
advisor showed is judged again from its samples (a new user found the report of three held-out
jobs' files printing the verdict their recording session showed: launch-bound, pinned batches,
where a replay of the same file named cuDNN re-tuning, anomaly detection, an EMA on the host)."""

from pathlib import Path

from gputop.advisor import advisor_fingerprint
from gputop.cli import main
from gputop.model import Finding, GpuSample, Severity
from gputop.record import Reader
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.report.collect import collect
from gputop.report.rejudge import needs_rejudging, rejudge
from gputop.report.text import render_text

RECORDINGS = Path(__file__).parent / "fixtures" / "recordings"
T0 = 1_700_000_000.0


def test_a_file_from_another_advisor_is_judged_again_and_says_what_it_held(capsys):
    path = RECORDINGS / "h200-timm-ema-on-cpu.gputop"
    with Reader(path) as r:
        assert r.advisor_fingerprints() == {}  # written before the stamp was kept
        assert needs_rejudging(r)
        s = collect(r)
    assert s.judged_again and s.recorded_ids == ("pageable-h2d",)
    assert [fs.finding.id for fs in s.findings] == ["copies-to-host"]
    text = " ".join(render_text(s, 100).split())
    assert "judged again from the recorded samples by this gputop" in text
    assert "recorded then: pageable-h2d" in text
    assert "copy from pinned memory" not in text  # the older verdict's action is not printed as today's


def test_the_report_and_the_replay_name_the_same_findings():
    from gputop.advisor import Advisor
    from gputop.store import Store

    path = RECORDINGS / "h200-lightning-detect-anomaly.gputop"
    with Reader(path) as r:
        judged = rejudge(r)
        # replay's way: the samples in time order, one evaluation a second, to one advisor
        store, adv = Store(), Advisor(target_pid=r.sessions[-1]["target_pid"])
        store.add(r.samples(r.start_ts - 3600, r.start_ts))
        t, shown = r.start_ts, []
        while t < r.end_ts:
            store.add(r.samples(t, t + 1.0))
            t += 1.0
            shown = adv.evaluate(store, now=t)
    last = max(ts for _, ts in judged.rows)
    assert {f.id for f, ts in judged.rows if ts == last} == {f.id for f in shown} == {"anomaly-detection"}


def test_a_file_this_advisor_wrote_keeps_its_own_findings(tmp_path):
    p = tmp_path / "now.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    f = Finding(id="host-sync", title="Host-device syncs every step", severity=Severity.WARNING, confidence=0.9,
                evidence=("x",), action="y",
                ts=T0 + 2, first_seen=T0 + 1, cost_s=2.0)
    w.flush([GpuSample(ts=T0 + 1, index=0, util_gpu=40.0), f])
    w.finish()
    with Reader(p) as r:
        assert set(r.advisor_fingerprints().values()) == {advisor_fingerprint()}
        assert not needs_rejudging(r)
        s = collect(r)
    assert not s.judged_again and [fs.finding.id for fs in s.findings] == ["host-sync"]


def test_a_long_recording_is_judged_in_a_bounded_number_of_evaluations(tmp_path):
    p = tmp_path / "long.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([GpuSample(ts=T0 + k * 60.0, index=0, util_gpu=50.0) for k in range(0, 600)])  # 10 h
    w.finish()
    with Reader(p) as r:
        j = rejudge(r, max_evals=100)
    assert j.step_s >= (599 * 60.0) / 100 - 1e-6


def test_the_json_report_says_the_findings_were_judged_again(capsys):
    assert main(["report", str(RECORDINGS / "h200-lightning-cudnn-benchmark.gputop"), "--json"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["judged_again_step_s"] == 1.0 and "launch-bound" in d["recorded_finding_ids"]
    assert d["findings"][0]["id"] == "cudnn-retune"


def test_info_says_when_a_files_findings_are_another_advisors(tmp_path, capsys):
    assert main(["info", str(RECORDINGS / "h200-timm-ema-on-cpu.gputop")]) == 0
    assert "shown by another version of gputop's advisor" in capsys.readouterr().out
    p = tmp_path / "now.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([GpuSample(ts=T0 + 1, index=0, util_gpu=40.0)])
    w.finish()
    assert main(["info", str(p), "--json"]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["findings_other_advisor"] is False
