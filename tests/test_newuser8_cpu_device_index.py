"""A CPU-only job's findings said GPU -1: the advisor's stand-in for a job without a GPU (its
training thread, ``CPU_DEVICE``) leaked as a GPU index into `advise --json` (`"gpu_index": -1`
beside another finding's null), the report's JSON (`"gpu": -1`) and the exporter's label
(`gputop_finding{gpu="-1"}` beside `gpu=""` for the job's other findings)."""

from __future__ import annotations

from gputop.analysis import CPU_DEVICE
from gputop.model import Finding, Severity, Verdict
from gputop.present import finding_dict
from gputop.record.reader import Reader
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.report import collect, summary_dict
from synth_recording import SyntheticSession

T0 = 1_767_225_600.0


def _finding(fid: str, gpu: int | None) -> Finding:
    return Finding(id=fid, title=fid, severity=Severity.WARNING, confidence=0.7, evidence=("e",), action="a",
                   cost_s=4.0, gpu_index=gpu, ts=T0 + 30, first_seen=T0 + 20)


def test_advise_json_says_no_gpu_for_a_job_without_one():
    assert finding_dict(_finding("blocking-in-loop", CPU_DEVICE))["gpu_index"] is None
    assert finding_dict(_finding("cpu-work-in-loop", None))["gpu_index"] is None
    assert finding_dict(_finding("data-starved", 0))["gpu_index"] == 0
    assert finding_dict(_finding("data-starved", 3))["gpu_index"] == 3


def test_the_report_json_says_no_gpu_for_a_job_without_one(tmp_path):
    p = tmp_path / "cpu.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake", target_pid=4_194_300, target_cmdline="python train.py"))
    for b in SyntheticSession(t0=T0).seconds(40):
        w.flush(b)
    w.flush([_finding("blocking-in-loop", CPU_DEVICE), _finding("data-starved", 0)])
    w.finish()
    with Reader(p) as r:
        d = summary_dict(collect(r))
    by_id = {f["id"]: f for f in d["findings"]}
    assert "blocking-in-loop" in by_id, sorted(by_id)
    assert by_id["blocking-in-loop"]["gpu"] is None
    assert by_id["blocking-in-loop"]["gpu_index"] is None
    assert by_id["data-starved"]["gpu"] == 0


def test_the_exporter_labels_no_gpu_for_a_job_without_one(clock):
    from test_export import collector_for, fake_session, scrape

    start = clock()
    store, _ = fake_session(clock, seconds=5)
    a, b = _finding("blocking-in-loop", CPU_DEVICE), _finding("cpu-work-in-loop", None)
    store.add([Verdict(store.now, (a, b))])
    m = scrape(collector_for(store, clock, start))
    gpus = {s.labels["id"]: s.labels["gpu"] for s in m["gputop_finding"]}
    assert gpus == {"blocking-in-loop": "", "cpu-work-in-loop": ""}
