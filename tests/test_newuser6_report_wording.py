"""A report is a static document of a recording, and a replay shows the past: the HTML report of a
run without a GPU was headed "GPU run report"; reports said "phase: warming up: the job started 10 s
ago" (ago of when?); a replay of a CPU recording said "NVML unavailable: …" in its header as if this
machine's NVML were missing now."""

from __future__ import annotations

from dataclasses import replace

from gputop.advisor.engine import warmup_finding
from gputop.model import GpuSample, HostSample, SystemInfo
from gputop.present.panels import header_text
from gputop.record import Reader
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.report import collect, render_html, render_text
from gputop.units import fmt_time

T0 = 1_767_225_600.0


def _recording(path, gpu: bool, warm: str = "the job started 10 s ago (first steps)"):
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(target_pid=4242, target_cmdline="python train.py"))
    w.flush([SystemInfo(ts=T0, hostname="box", nvml_error=None if gpu else "NVIDIA driver not loaded")])
    w.flush([HostSample(ts=T0 + k, cpu_percent=10.0) for k in range(31)])
    if gpu:
        w.flush([GpuSample(ts=T0 + k, index=0, util_gpu=90.0) for k in range(31)])
    w.flush([replace(warmup_finding(warm, T0 + 2), first_seen=T0 + 2)])
    w.finish()
    with Reader(path) as r:
        return collect(r)


def test_the_html_report_of_a_run_without_a_gpu_is_not_a_gpu_run_report(tmp_path):
    cpu = render_html(_recording(tmp_path / "cpu.gputop", gpu=False))
    assert "GPU run report" not in cpu
    assert "<h1>CPU run report: box</h1>" in cpu
    gpu = render_html(_recording(tmp_path / "gpu.gputop", gpu=True))
    assert "<h1>GPU run report: box</h1>" in gpu


def test_the_warm_up_is_said_with_the_recordings_times_not_ago(tmp_path):
    s = _recording(tmp_path / "w.gputop", gpu=False)
    text = render_text(s, 120)
    page = render_html(s)
    started = fmt_time(T0 + 2 - 10)  # the finding was written at +2, 10 s after the job started
    for out in (text, page):
        assert " ago" not in out
        assert f"warming up: first steps (the job started {started})" in out, out
    # "job N s old" (a warm-up named by what it does) is said so too.
    s = _recording(tmp_path / "c.gputop", gpu=False, warm="torch.compile is compiling, job 12 s old")
    text = render_text(s, 120)
    assert " s old" not in text
    assert f"warming up: torch.compile is compiling (the job started {fmt_time(T0 + 2 - 12)})" in text


def test_a_replay_header_says_the_recording_had_no_nvml():
    cpu = SystemInfo(ts=0, hostname="laptop", nvml_error="NVIDIA driver not loaded")
    live = header_text(cpu, "0.1.0", 2.0, "live", 200).plain
    assert "NVML unavailable: NVIDIA driver not loaded" in live
    for state in ("replay", "paused · replay"):
        h = header_text(cpu, "0.1.0", 2.0, state, 200).plain
        assert "NVML unavailable" not in h
        assert "recorded without NVML (NVIDIA driver not loaded)" in h


def test_a_replay_without_gpus_says_the_recording_has_none():
    from gputop.present import no_gpu_text

    cpu = SystemInfo(ts=0, hostname="laptop", nvml_error="NVIDIA driver not loaded")
    assert "monitoring continue" in no_gpu_text(cpu, recorded=False).plain
    said = no_gpu_text(cpu, recorded=True).plain
    assert "continue" not in said and "recorded without a GPU" in said
