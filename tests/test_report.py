"""Reports: the numbers from a recording, and the text/HTML/JSON that present them."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

from gputop.cli import main
from gputop.model import Finding, GpuSample, Severity, SystemInfo
from gputop.record.reader import Reader
from synth_recording import SyntheticSession
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.units import fmt_length
from gputop.report import collect, render_html, render_text, summary_dict

T0 = 1_767_225_600.0


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    p = tmp_path_factory.mktemp("rep") / "run.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake", target_pid=4_194_300, target_cmdline="python train.py --bs 256"))
    ss = SyntheticSession(t0=T0, checkpoint_every_s=300, checkpoint_len_s=60)
    for b in ss.seconds(600):
        w.flush(b)
    w.flush([Finding(id="evil", title="<script>alert(1)</script> & co", severity=Severity.INFO, confidence=0.1,
                     evidence=("<img src=x onerror=alert(1)>",), action="rm -rf </code>", ts=T0 + 601)])
    w.finish()
    return p


@pytest.fixture(scope="module")
def summary(recording):
    with Reader(recording) as r:
        return collect(r)


def test_summary_accounts_for_every_second_and_finds_the_checkpoints(summary):
    assert len(summary.gpus) == 1
    g = summary.gpus[0]
    bd = g.breakdown
    assert bd.total_s == pytest.approx(600, abs=3)  # all measured time lands in some bucket
    assert sum(bd.seconds.values()) == pytest.approx(bd.total_s)
    # Two 60 s checkpoints (20 % of the run) plus short data stalls.
    assert 0.65 < g.busy_fraction < 0.85
    assert g.idle_period_count == 2
    for p in g.idle_periods:
        assert 55 <= p.duration <= 65
        assert p.cause == "checkpoint save"
        assert "save" in p.detail
    assert summary.attributed
    from gputop.analysis.breakdown import Bucket

    assert bd.get(Bucket.CHECKPOINT) == pytest.approx(120, abs=10)
    assert g.mem_max is not None and g.tensor_mean is not None
    assert summary.host_cpu_mean is not None and summary.host_cores == 16


def test_findings_are_grouped_with_first_and_last_seen(summary):
    ids = [fs.finding.id for fs in summary.findings]
    assert sorted(ids) == ["checkpoint-stall", "data-stall", "evil"]
    data = next(fs for fs in summary.findings if fs.finding.id == "data-stall")
    assert data.reports >= 1
    assert data.first_seen < data.last_seen
    assert data.last_seen >= T0 + 590


def test_text_report_has_the_headline_sections(summary):
    text = render_text(summary, 100)
    assert "busy" in text and "where the idle time went" in text
    assert "checkpoint save" in text
    assert "findings (3)" in text
    assert "python train.py --bs 256" in text
    assert all(len(line) <= 140 for line in text.splitlines())


def test_html_report_is_self_contained_and_escaped(summary):
    page = render_html(summary)
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower()
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page)
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) >= 4
    for s in svgs:
        ET.fromstring(s)  # well-formed XML


def test_summary_json_is_serialisable(summary):
    d = json.loads(json.dumps(summary_dict(summary)))
    assert d["gpus"][0]["busy_fraction"] == pytest.approx(summary.gpus[0].busy_fraction, abs=1e-3)
    assert d["hostname"] == "synthetic-host"


def test_report_of_a_recording_without_gpu_data(tmp_path):
    p = tmp_path / "nogpu.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([SystemInfo(ts=T0, hostname="cpu-box", nvml_error="no driver")])
    w.finish()
    with Reader(p) as r:
        s = collect(r)
    assert s.gpus == []
    assert "cpu-box" in render_text(s)
    assert "<svg" in render_html(s)


def test_report_on_a_single_gpu_poll_only(tmp_path):
    p = tmp_path / "one.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([GpuSample(ts=T0 + 1, index=0, util_gpu=50.0), GpuSample(ts=T0 + 2, index=0, util_gpu=0.0)])
    w.finish()
    with Reader(p) as r:
        s = collect(r)
    assert s.gpus[0].breakdown.total_s == pytest.approx(1.0)
    render_html(s)


# --------------------------------------------------------------------------- the command


def test_report_command_writes_html_and_refuses_to_overwrite(recording, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(recording), "-o", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(recording), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "Traceback" not in err
    assert main(["report", str(recording), "-o", str(out), "--force"]) == 0


def test_report_command_text_and_json(recording, capsys):
    assert main(["report", str(recording)]) == 0
    assert "where the idle time went" in capsys.readouterr().out
    assert main(["report", str(recording), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"][0]["index"] == 0


@pytest.mark.parametrize("make", ["missing", "text", "dir"])
def test_report_command_bad_inputs(tmp_path, capsys, make):
    p = tmp_path / "x.gputop"
    if make == "text":
        p.write_text("not a recording")
    elif make == "dir":
        p.mkdir()
    assert main(["report", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gputop report: error:") and len(err.splitlines()) == 1


# --------------------------------------------------------------------------- charts with a 2 s poll


def _chart_paths(page: str, title: str) -> list[str]:
    """The ``d`` of every line in the SVG titled ``title``."""
    m = re.search(rf'<svg[^>]*aria-label="{re.escape(title)}".*?</svg>', page, re.S)
    assert m, title
    return re.findall(r'<path d="([^"]*)"', m.group(0))


def test_report_charts_of_a_short_recording_draw_lines():
    """The bundled 45 s recording polled every 2 s: charts bucket by 1 s, so every other bucket
    is empty; the lines must still be drawn, not left as lone moves."""
    from pathlib import Path

    rec = Path(__file__).parent / "fixtures" / "recordings" / "h100-checkpoint-stall.gputop"
    with Reader(rec) as r:
        page = render_html(collect(r))
    for title in ("GPU memory", "GPU power", "host CPU"):
        for d in _chart_paths(page, title):
            moves, lines = d.count("M"), d.count("L")
            assert lines >= 10 and moves <= 2, (title, d[:200])


def test_chart_lines_bridge_poll_gaps_but_show_real_gaps():
    from gputop.report.svg import line_chart

    # Polls every 2 s in 1 s buckets, then 30 s with nothing, then polls again.
    pts = [(float(t), (10.0 if t % 2 == 0 else None)) for t in range(0, 20)]
    pts += [(float(t), None) for t in range(20, 50)]
    pts += [(float(t), (20.0 if t % 2 == 0 else None)) for t in range(50, 70)]
    svg = line_chart(0, 70, [("x", pts, "line")], max_gap=4.0)
    (d,) = re.findall(r'<path d="([^"]*)"', svg)
    assert d.count("M") == 2  # one break: the 30 s silence
    assert d.count("L") == 18  # 9 joins on each side
    lone = line_chart(0, 70, [("x", [(5.0, 1.0)], "line")], max_gap=4.0)
    assert "h1.5" in re.findall(r'<path d="([^"]*)"', lone)[0]  # a single sample still shows


def test_a_cpu_only_run_says_so_and_costs_the_job_time_not_gpu_seconds(tmp_path):
    from gputop.model import HostSample

    p = tmp_path / "cpu.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="live", host="vm"))
    w.flush([HostSample(ts=T0 + k, cpu_percent=50.0) for k in range(10)])
    w.flush([Finding(id="data-starved", title="The job waits for data", severity=Severity.WARNING,
                     confidence=0.9, evidence=("97 % of samples wait in next()",), action="num_workers=8",
                     gpu_index=None, cost_s=27.0, ts=T0 + 9)])
    w.finish()
    with Reader(p) as r:
        s = collect(r)
    text, page = render_text(s), render_html(s)
    for out in (text, page):
        assert "0×" not in out and "no GPU data" not in out and "GPU-s" not in out
        assert "no GPU (CPU only)" in out
        assert "up to 27 s of the job" in out


def test_text_sparklines_are_not_dotted_by_buckets_shorter_than_the_polls():
    from gputop.report.text import _resample

    polls_every_other_bucket = [50.0, None, 50.0, None, 50.0, None, 50.0]
    assert None not in _resample(polls_every_other_bucket, 80)
    long_silence = [50.0] + [None] * 10 + [50.0]
    assert _resample(long_silence, 80).count(None) == 10  # a real gap stays a gap


# --------------------------------------------------------------------------- -o - is standard output


@pytest.mark.parametrize("extra, check", [
    ([], lambda out: "where the idle time went" in out),
    (["--json"], lambda out: json.loads(out)["gpus"][0]["index"] == 0),
    (["--html"], lambda out: out.startswith("<!DOCTYPE html>")),
])
def test_report_dash_output_is_stdout_not_a_file(recording, tmp_path, monkeypatch, capsys, extra, check):
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(recording), "-o", "-", *extra]) == 0
    cap = capsys.readouterr()
    assert check(cap.out)
    assert "wrote" not in cap.err
    assert not (tmp_path / "-").exists() and list(tmp_path.iterdir()) == []


def test_report_dash_output_when_a_file_named_dash_exists(recording, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-").write_text("keep me")
    assert main(["report", str(recording), "-o", "-"]) == 0  # not "already exists"
    assert "where the idle time went" in capsys.readouterr().out
    assert (tmp_path / "-").read_text() == "keep me"


def test_report_formats_to_print_are_exclusive(recording, capsys):
    with pytest.raises(SystemExit) as e:
        main(["report", str(recording), "--json", "--html"])
    assert e.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


# --------------------------------------------------------------------------- the GPU named once per finding


def _finding_summary(title: str, gpu: int | None):
    from gputop.report.summary import summarise_findings

    f = Finding(id="x", title=title, severity=Severity.WARNING, confidence=0.5, evidence=(), action="",
                gpu_index=gpu, ts=T0)
    return summarise_findings([(f, T0 + 10)])


@pytest.mark.parametrize("title, gpu, heading", [
    ("GPU 1 busy but tensor cores idle: fp32 math", 1, "[warning] GPU 1 busy but tensor cores idle"),
    ("GPU 0 idle 22 % of the time, cause unknown", 0, "[warning] GPU 0 idle 22 %"),
    ("GPU 10 throttled", 1, "[warning] GPU 1 GPU 10 throttled"),  # names another GPU: say which
    ("DataLoader workers restart every epoch", 2, "[warning] GPU 2 DataLoader workers restart"),
    ("CPU (no GPU) waits for data 40 % of the time", -1, "[warning] CPU (no GPU) waits"),
    ("Debug settings in the job's environment", None, "[warning] Debug settings"),
])
def test_report_names_the_gpu_of_a_finding_once(summary, title, gpu, heading):
    import dataclasses

    s = dataclasses.replace(summary, findings=_finding_summary(title, gpu))
    text = render_text(s, 100)
    assert heading in text
    assert not re.search(r"\b(GPU \d+) \1\b", text) and "GPU -1" not in text
    page = render_html(s)
    assert "GPU -1" not in page
    block = re.search(r'<div class="finding">.*?</div>', page, re.S).group(0)
    named = len(re.findall(rf"\bGPU {gpu}\b", block))
    assert named == (1 if gpu is not None and gpu >= 0 else 0)


# --------------------------------------------------------------------------- reports are private


@pytest.mark.parametrize("name", ["r.html", "r.txt", "r.json"])
def test_report_files_are_owner_only(recording, tmp_path, name):
    import os
    import stat

    out = tmp_path / name
    old = os.umask(0o022)
    try:
        assert main(["report", str(recording), "-o", str(out)]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
        out.chmod(0o644)  # overwritten with --force: private again
        assert main(["report", str(recording), "-o", str(out), "--force"]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
    finally:
        os.umask(old)


# --------------------------------------------------------------------------- a job that used no GPU


@pytest.fixture(scope="module")
def cpu_recording(tmp_path_factory):
    from synth_recording import TARGET_PID, Rates

    p = tmp_path_factory.mktemp("cpu") / "cpu.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(target_pid=TARGET_PID, target_cmdline="python train.py --device cpu"))
    for b in SyntheticSession(t0=T0, rates=Rates(gpus=0), checkpoint_every_s=300, checkpoint_len_s=30).seconds(120):
        w.flush(b)
    w.finish()
    return p


def test_cpu_only_report_has_the_breakdown_advise_shows(cpu_recording):
    """live, advise and the report reach one verdict on the same data: the report's CPU device
    is advise's (context_from_samples' CPU view) over the whole recording."""
    from synth_recording import TARGET_PID

    from gputop.advisor.context import context_from_samples
    from gputop.analysis.breakdown import CPU_DEVICE, Bucket

    with Reader(cpu_recording) as r:
        s = collect(r)
        start, end = r.start_ts, r.end_ts
        procs: dict = {}
        for p in r.proc_samples(start - 1, end):
            procs.setdefault(p.pid, []).append(p)
        ctx = context_from_samples(now=end, window_s=end - start + 1, host=r.host_samples(start - 1, end),
                                   procs=procs, stacks=r.stack_samples(start - 1, end), target_pid=TARGET_PID,
                                   system=r.system_info())
    (view,) = ctx.gpus
    assert view.index == CPU_DEVICE
    assert s.gpus == [] and s.cpu is not None and s.cpu.samples == 600
    mine, theirs = s.cpu.breakdown, view.breakdown
    assert mine.total_s == pytest.approx(theirs.total_s, rel=0.01)
    for b in Bucket:
        assert mine.get(b) == pytest.approx(theirs.get(b), abs=0.5), b
    assert mine.get(Bucket.BUSY) > 0 and mine.idle_s > 0


def test_cpu_only_report_text_json_and_html(cpu_recording, capsys):
    assert main(["report", str(cpu_recording)]) == 0
    text = capsys.readouterr().out
    assert "CPU (no GPU): where the time went over" in text
    assert "600 stack samples" in text and "no GPU in the recording" in text
    assert re.search(r"█ busy\s+\S+\s+\d+ %", text)
    assert main(["report", str(cpu_recording), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["cpu_device"]
    assert d["device"] == "CPU (no GPU)" and d["stack_samples"] == 600
    assert sum(b["percent"] for b in d["buckets"]) == 100
    assert main(["report", str(cpu_recording), "--html"]) == 0
    assert "CPU (no GPU): where the time went</h2>" in capsys.readouterr().out


def test_gpu_report_has_no_cpu_device(summary):
    assert summary.cpu is None and summary_dict(summary)["cpu_device"] is None
    assert "CPU (no GPU)" not in render_text(summary)


def test_report_of_a_job_on_someone_elses_gpu_adds_its_own_time_line(tmp_path):
    """NVML lists only another user's process on the GPU: advise judges the job on its own time
    line (holds_no_gpu); so does the report, beside the GPU's own numbers."""
    import dataclasses

    from synth_recording import TARGET_PID

    from gputop.model import GpuProcess, ProcSample

    other = 777
    p = tmp_path / "elsewhere.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(target_pid=TARGET_PID))
    for batch in SyntheticSession(t0=T0).seconds(60):
        out = []
        for x in batch:
            if isinstance(x, GpuProcess):
                out.append(dataclasses.replace(x, pid=other))
                out.append(ProcSample(ts=x.ts, pid=other, ppid=1, name="someone-else", user="other", cmdline="x",
                                      cpu_percent=100.0, rss=1, num_threads=1, status="running",
                                      create_time=T0 - 500, io_read_bps=0.0, io_write_bps=0.0, role="other"))
            else:
                out.append(x)
        w.flush(out)
    w.finish()
    with Reader(p) as r:
        s = collect(r)
    assert len(s.gpus) == 1
    assert s.cpu is not None and s.cpu.why == "the job held none of the GPUs"


# --------------------------------------------------------------------------- sparse stack samples


def _sparse_cpu_recording(path, silence_s: float = 0.0):
    """A CPU job watched as the sampler does: an attach burst (10/s for 2 s, 5/s for 2.4 s), then
    its steady rate of about one main-thread stack a second; optionally a silence mid-run."""
    from gputop.model import Category, HostSample, StackSample

    pid = 4_194_301
    ts = [T0 + 0.1 * i for i in range(1, 21)] + [T0 + 2 + 0.2 * i for i in range(1, 13)]
    while ts[-1] < T0 + 21.5:
        ts.append(ts[-1] + 1.05 + (silence_s if len(ts) == 40 else 0.0))
    stacks = []
    for i, t in enumerate(ts):
        cat = Category.FORWARD if i % 3 else Category.DATA_WAIT
        stacks.append(StackSample(ts=t, pid=pid, thread_id=1, is_main=True, category=cat,
                                  active=cat is Category.FORWARD))
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(target_pid=pid, target_cmdline="python train.py --device cpu"))
    w.flush([HostSample(ts=T0 + k, cpu_percent=50.0) for k in range(int(ts[-1] - T0) + 2)])
    w.flush(stacks)
    w.finish()
    return pid


def test_sparse_stack_samples_report_agrees_with_advise_and_says_what_it_covers(tmp_path, capsys):
    """Stacks ~1 s apart after the attach burst (the sampler's steady rate): the report's CPU
    breakdown is advise's over the same span, and it never passes a part of the recording off as
    the whole: either it covers (nearly) all of it, or it says which part and why."""
    from gputop.advisor.context import context_from_samples

    p = tmp_path / "sparse.gputop"
    pid = _sparse_cpu_recording(p)
    with Reader(p) as r:
        s = collect(r)
        ctx = context_from_samples(now=r.end_ts, window_s=r.end_ts - r.start_ts + 1, target_pid=pid,
                                   stacks=r.stack_samples(r.start_ts - 1, r.end_ts))
    c, theirs = s.cpu, ctx.gpus[0].breakdown
    assert c is not None and c.span_s == pytest.approx(s.duration)
    assert c.covered_s == pytest.approx(theirs.total_s, abs=0.6)  # one verdict: advise's time line
    # What it covers and what it leaves out add up to the recording.
    assert c.covered_s + c.before_s + c.after_s + c.gap_s == pytest.approx(c.span_s, abs=0.6)
    assert main(["report", str(p)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the note wraps to the terminal
    assert main(["report", str(p), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["cpu_device"]
    assert d["span_s"] == pytest.approx(s.duration, abs=0.1) and d["covered_s"] == pytest.approx(c.covered_s, abs=0.1)
    if c.covered_s < 0.95 * c.span_s:
        # The samples 1.05 s apart are left out (as advise leaves them out): said, with why.
        assert c.partial and not d["whole_recording"]
        assert f"covers {fmt_length(c.covered_s)} of the {fmt_length(c.span_s)} recorded" in text
        assert "1.05 s apart" in text and "as advise takes them" in text
        assert d["left_out"]["gaps"] == c.gaps > 10 and d["note"]
    else:
        assert d["whole_recording"] and "recorded; left out" not in text


def test_a_silence_in_the_stack_samples_is_named_with_its_length(tmp_path):
    p = tmp_path / "silence.gputop"
    _sparse_cpu_recording(p, silence_s=12.0)
    with Reader(p) as r:
        s = collect(r)
    c = s.cpu
    assert c.partial and c.gap_max_s == pytest.approx(13.05, abs=0.01)
    assert c.covered_s + c.before_s + c.after_s + c.gap_s == pytest.approx(c.span_s, abs=0.6)
    lines = render_text(s, 100).splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("CPU (no GPU)"))
    assert lines[head + 1].startswith("  covers ") and all(len(x) <= 100 for x in lines[head + 1:head + 5])
    note = " ".join(" ".join(lines[head + 1:head + 5]).split())
    assert f"covers {fmt_length(c.covered_s)} of the {fmt_length(c.span_s)} recorded" in note
    assert "13.05 s apart" in note
    assert "Not the whole recording" in render_html(s)


# --------------------------------------------------------------------------- when a finding ended


def test_a_finding_still_showing_at_the_end_says_so_and_a_cleared_one_says_when(tmp_path, capsys):
    """The advisor re-writes a finding showing every RECORD_REFRESH_S and says "cleared: <title>"
    when it goes: the last row is not when it ended. One still showing at the end is "until the
    end"; one that cleared gives the clear's time; one whose end is not in the file says so."""
    from gputop.advisor.engine import RECORD_REFRESH_S
    from gputop.model import Event, HostSample

    end = T0 + 20.0
    def f(fid, title, ts, first):
        return Finding(id=fid, title=title, severity=Severity.WARNING, confidence=0.9, evidence=("e",),
                       action="do it", ts=ts, first_seen=first)
    p = tmp_path / "ends.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([HostSample(ts=T0 + k, cpu_percent=10.0) for k in range(21)])
    # "stays": shown from T0+2, still showing at the end (+35), last written at +32.
    # "goes": shown from T0+1, written at +1, cleared at +6. "old": written at +1, no clear.
    w.flush([f("stays", "Data stalls", T0 + 2, T0 + 2), f("goes", "Slow save", T0 + 1, T0 + 1),
             f("old", "Old news", T0 + 1, T0 + 1)])
    w.flush([Event(T0 + 6, "advisor", "cleared: Slow save", "info")])
    for k in range(1, 4):  # ... and every RECORD_REFRESH_S while it shows, to +32
        w.flush([f("stays", "Data stalls", T0 + 2 + k * RECORD_REFRESH_S, T0 + 2)])
    w.flush([HostSample(ts=end + 15.0, cpu_percent=10.0)])  # the recording ends at +35
    w.finish()
    with Reader(p) as r:
        s = collect(r)
    by = {fs.finding.id: fs for fs in s.findings}
    assert by["stays"].until_end and by["stays"].cleared is None and by["stays"].shown_until == pytest.approx(s.end)
    assert by["goes"].cleared == pytest.approx(T0 + 6) and not by["goes"].until_end
    assert not by["old"].until_end and by["old"].cleared is None  # its end is not in the file
    from gputop.units import fmt_time as clock

    text = render_text(s, 100)
    assert f"first {clock(T0 + 2)}, until the end ({clock(s.end)})" in text
    assert f"first {clock(T0 + 1)}, cleared {clock(T0 + 6)}" in text
    assert f"last reported {clock(T0 + 1)} (no record of when it cleared)" in text
    assert f"last {clock(T0 + 2 + 3 * RECORD_REFRESH_S)}" not in text
    assert "until the end" in render_html(s)
    assert main(["report", str(p), "--json"]) == 0
    d = {x["id"]: x for x in json.loads(capsys.readouterr().out)["findings"]}
    assert d["stays"]["until_end"] is True and d["stays"]["cleared"] is None
    assert d["goes"]["until_end"] is False and d["goes"]["cleared"] == pytest.approx(T0 + 6)
    assert d["stays"]["shown_until"] == pytest.approx(s.end)


def test_a_finding_showing_when_an_appended_session_ended_ends_there(tmp_path):
    """Two sessions in one file (record --append): a finding showing when the first ended was
    shown until then, not until the end of the file."""
    from gputop.model import HostSample
    from gputop.report.collect import session_spans
    from gputop.report.summary import FindingSummary, finding_ends

    fs = FindingSummary(Finding(id="x", title="X", severity=Severity.INFO, confidence=1.0, evidence=(), action="",
                                ts=T0), T0, T0 + 8, 2, 0.0,
                        titles={"X"})
    spans = session_spans([{"started": T0, "ended": T0 + 10}, {"started": T0 + 100, "ended": None}], T0, T0 + 130)
    assert spans == [(T0, T0 + 10), (T0 + 100, T0 + 130)]
    finding_ends([fs], [], spans)
    assert fs.until_end and fs.session_end == T0 + 10
    from gputop.report.summary import finding_when
    from gputop.units import fmt_time as clock

    assert finding_when(fs, clock, T0 + 130).endswith(f"until its recording session ended ({clock(T0 + 10)})")


def test_report_json_findings_carry_advise_fields_and_gain_predicted(summary, monkeypatch):
    """report --json's findings have advise --json's fields, gain_predicted among them, with the
    same names and meaning; a file that does not keep gain_predicted says so."""
    import dataclasses

    from gputop.present.advice import finding_dict

    d = json.loads(json.dumps(summary_dict(summary)))
    advise_keys = set(finding_dict(summary.findings[0].finding))
    assert "gain_predicted" in advise_keys
    for f in d["findings"]:
        assert advise_keys <= set(f), advise_keys - set(f)
    assert d["gain_predicted_recorded"] is True  # a file gputop writes now keeps the bound
    # A finding read back with its bound: the report gives it as advise does.
    fs = summary.findings[0]
    monkeypatch.setattr(fs, "finding", dataclasses.replace(fs.finding, gain_predicted=1.8))
    monkeypatch.setattr(summary, "gain_predicted_recorded", True)
    d = summary_dict(summary)
    assert d["findings"][0]["gain_predicted"] == finding_dict(fs.finding)["gain_predicted"] == 1.8
    assert d["gain_predicted_recorded"] is True


def test_wrapped_finding_lines_hang_under_their_first_line(tmp_path):
    """A long action, evidence line or expected gain wraps with its continuation lines under the
    text after "→ " / "· " / "expected: ", not under the arrow."""
    p = tmp_path / "wrap.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    words = " ".join(f"word{k}" for k in range(40))
    w.flush([GpuSample(ts=T0 + 1, index=0, util_gpu=50.0), GpuSample(ts=T0 + 2, index=0, util_gpu=0.0)])
    w.flush([Finding(id="long", title="Long", severity=Severity.WARNING, confidence=0.9, evidence=("E " + words,),
                     action="A " + words, expected_gain="G " + words, ts=T0 + 2)])
    w.finish()
    with Reader(p) as r:
        lines = render_text(collect(r), 60).splitlines()
    for lead, first in (("· ", "E"), ("→ ", "A"), ("  expected: ", "G")):
        k = next(i for i, x in enumerate(lines) if x.startswith(" " * 6 + lead + first + " "))
        col = 6 + len(lead)
        cont = []
        for x in lines[k + 1:]:
            if not x.startswith(" " * col) or x[col] == " " or x.lstrip().startswith(("· ", "→ ", "expected: ")):
                break
            cont.append(x)
        assert len(cont) >= 3, (lead, lines[k:k + 4])  # it wrapped, every continuation at the text's column
        assert all(len(x) <= 60 for x in [lines[k], *cont])
        assert " ".join(x.strip() for x in [lines[k], *cont]).endswith("word39")  # nothing left at another indent


def test_html_idle_bands_are_coloured_by_their_cause(summary):
    """The report's utilisation chart shows the idle time by cause, as the terminal's chart does:
    the two checkpoint saves as checkpoint-coloured bands, named in the legend."""
    from gputop.analysis import Bucket
    from gputop.report.html import CAUSE_COLOURS

    html = render_html(summary)
    bands = re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})" fill-opacity="0.35"><title>([^<]*)</title>', html)
    assert len(bands) == 2 and all(c == CAUSE_COLOURS[Bucket.CHECKPOINT] for c, _ in bands), bands
    assert all(t.startswith("checkpoint save") for _, t in bands)
    assert f'color:{CAUSE_COLOURS[Bucket.CHECKPOINT]}">&#9632;</span> checkpoint save' in html


def test_the_host_memory_is_drawn_over_the_run(tmp_path):
    # A new user's CPU job leaked host memory: the report had a CPU chart and a forecast line but no
    # memory over time.
    from gputop.model import HostSample

    GiB = 2**30
    p = tmp_path / "hostleak.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([SystemInfo(ts=T0, hostname="cpu-box", nvml_error="no driver")])
    for k in range(120):
        w.flush([HostSample(ts=T0 + k, cpu_percent=50.0, mem_total=24 * GiB, mem_used=int((1 + k / 40) * GiB),
                            mem_available=int((23 - k / 40) * GiB))])
    w.finish()
    with Reader(p) as r:
        s = collect(r)
    text = render_text(s)
    assert "memory: the host's used 1.0G → 4.0G (peak 4.0G) of 24.0G" in text, text
    assert "host memory" in render_html(s)
