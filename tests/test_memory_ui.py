"""The memory forecast where people look: the GPU panel's figure, the status line's one-time
event, and the report (the forecast shown live, how the job ended)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gputop.advisor import JobStage, MemoryWatch
from gputop.analysis import GpuMemory, Growth, MemoryView, ViewsStage
from gputop.analysis.memory_growth import FLAT, GROWING, PLATEAU, SAWTOOTH
from gputop.model import Event, Finding, GpuInfo, GpuProcess, GpuSample, PaneViews, ProcSample, Severity
from gputop.present.memory import forecast_style, forecast_text, forecast_texts
from gputop.present.panels import CHARTS, COMPACT, FULL, gpu_panel_lines
from gputop.record.reader import Reader
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.report import collect, render_html, render_text
from gputop.store import StoreSnapshot
from gputop.ui.gpu_panels import job_memory
from synth import GiB, TARGET, Job

MiB = 2**20
LIMIT = 80 * GiB


def growing(rate=310 * MiB / 60, eta=14 * 60.0, low=10 * 60.0, high=20 * 60.0, source="process", index=0):
    g = Growth(GROWING, rate=rate, rate_low=rate * 0.7, rate_high=rate * 1.4, used=LIMIT - rate * eta, limit=LIMIT,
               span_s=600.0, eta_s=eta, eta_low_s=low, eta_high_s=high)
    return GpuMemory(index, g, source)


# --------------------------------------------------------------------------- the words


def test_growth_reads_as_rate_and_time_to_full_with_its_interval():
    texts = forecast_texts(growing())
    assert texts[0] == "+310 MB/min, full in ~14 min (10-20)"
    assert texts[-1] == "full ~14 min"
    # the longest that fits, else the shortest
    assert forecast_text(growing(), 200).plain == texts[0]
    assert forecast_text(growing(), 25).plain == "+310 MB/min, full ~14 min"
    assert forecast_text(growing(), 3).plain == "full ~14 min"


def test_the_whole_cards_figure_says_it_is_the_card():
    assert forecast_texts(growing(source="device"))[0] == "card +310 MB/min, full in ~14 min (10-20)"
    assert forecast_texts(growing(source="device"))[-1] == "card full ~14 min"


@pytest.mark.parametrize("kind", [FLAT, PLATEAU, SAWTOOTH, "too short"])
def test_warm_up_plateau_saw_tooth_say_nothing(kind):
    gm = GpuMemory(0, Growth(kind, used=20 * GiB, limit=LIMIT, span_s=600.0, sawtooth=kind == SAWTOOTH), "process")
    assert forecast_texts(gm) == [] and forecast_text(gm, 100) is None
    assert forecast_text(None, 100) is None


def test_colour_by_urgency():
    assert forecast_style(10 * 60.0) == "bold red"
    assert forecast_style(60 * 60.0) == "yellow"
    assert forecast_style(5 * 3600.0) == "dim"
    assert forecast_style(None) == "dim"
    # growth with no limit known: the rate alone, quietly
    gm = GpuMemory(0, replace(growing().growth, limit=None, eta_s=None, eta_low_s=None, eta_high_s=None), "process")
    assert forecast_texts(gm) == ["+310 MB/min"]
    assert forecast_text(gm, 80).style == "dim"


def _sample(used=40 * GiB):
    return GpuSample(ts=1.0, index=0, util_gpu=90.0, mem_used=int(used), mem_total=LIMIT, temperature_c=60.0,
                     power_w=400.0, power_limit_w=700.0)


@pytest.mark.parametrize("mode", [FULL, CHARTS, COMPACT])
def test_panel_says_it_beside_the_memory_figure(mode):
    line = gpu_panel_lines(None, _sample(), None, 160, mode, 3, growing())[0]
    plain = line.plain
    assert "40.0G/80.0G +310 MB/min, full in ~14 min (10-20)" in plain
    assert plain.index("80.0G") < plain.index("60°C")  # temperature and power after it
    span = next(s for s in line.spans if line.plain[s.start:s.end].startswith("+310"))
    assert span.style == "bold red"  # 14 min: too soon to checkpoint at leisure
    # nothing to say: the line as before
    assert gpu_panel_lines(None, _sample(), None, 160, mode, 3, None)[0].plain == \
        gpu_panel_lines(None, _sample(), None, 160, mode, 3, GpuMemory(0, Growth(FLAT), "process"))[0].plain


def test_narrow_panel_keeps_the_forecast_over_the_last_figures():
    plain = gpu_panel_lines(None, _sample(), None, 80, FULL, 3, growing(eta=5 * 60.0, low=4 * 60.0, high=7 * 60.0))[0].plain
    assert "full ~5 min" in plain and len(plain) <= 80


# --------------------------------------------------------------------------- published, and said once


def leaking_store(rate=50 * MiB):
    mem = lambda t: 4 * GiB + rate * t  # noqa: E731
    return Job(seconds=150, gpu={"mem_used": mem}, proc_mem=mem).store()


def test_the_job_stage_publishes_the_memory_view_and_says_the_forecast_once():
    st = leaking_store()
    stage = JobStage(st, TARGET, views=ViewsStage(st, TARGET, 30.0), memory_watch=MemoryWatch())
    first = stage.poll()
    views = next(x for x in first if isinstance(x, PaneViews))
    assert views.memory.gpu(0).growth.growing
    assert not [x for x in first if isinstance(x, Event)]  # one evaluation is not yet news
    st.add(first)
    assert job_memory(st, TARGET) is views.memory
    assert job_memory(st, TARGET + 1) is None and job_memory(st, None) is None  # another target, none
    paused = StoreSnapshot(st)
    st.add([replace(views, memory=None)])
    assert job_memory(paused, TARGET) is views.memory  # paused: the forecast of the paused moment
    told = [x for x in stage.poll() if isinstance(x, Event)]
    assert len(told) == 1 and told[0].level == "warning" and told[0].source == "memory"
    # A sentence with its verb, and no pointer to a tab: a text report prints this event too.
    assert told[0].message == "GPU 0 runs out of memory in ~23 min: the job's memory grows 2.9 GB/min"
    assert not [x for x in stage.poll() if isinstance(x, Event)]  # once


def test_memory_watch_is_quiet_for_far_or_flat_growth_and_tells_a_new_target_again():
    w = MemoryWatch()
    far = MemoryView((growing(eta=5 * 3600.0, low=4 * 3600.0, high=7 * 3600.0),))
    flat = MemoryView((GpuMemory(0, Growth(FLAT), "process"),))
    soon = MemoryView((growing(),))
    for view in (far, far, flat, flat, None):
        assert w.events_for(view, 1, 0.0) == []
    assert w.events_for(soon, 1, 0.0) == [] and len(w.events_for(soon, 1, 1.0)) == 1
    assert w.events_for(soon, 1, 2.0) == []
    assert w.events_for(soon, 2, 3.0) == [] and len(w.events_for(soon, 2, 4.0)) == 1


def test_memory_watch_says_the_hosts_forecast_as_a_sentence_and_whose_memory_grows():
    # A new user's text report read "the host out of memory in ~62 min (61-63): its used memory
    # grows 356 MB/min (Advisor tab)": no verb, the job's growth called the host's used memory,
    # and a tab a text report does not have.
    host = growing(eta=62 * 60.0, low=61 * 60.0, high=63 * 60.0).growth
    w = MemoryWatch()
    w.events_for(MemoryView(host=host), 1, 0.0)
    told = w.events_for(MemoryView(host=host), 1, 1.0)
    assert [e.message for e in told] == ["the host runs out of memory in ~62 min (61-63): the job's memory grows "
                                         "310 MB/min"]
    w = MemoryWatch()
    w.events_for(MemoryView(host=host, host_cgroup=True), 1, 0.0)
    told = w.events_for(MemoryView(host=host, host_cgroup=True), 1, 1.0)
    assert told[0].message.startswith("the job's control group runs out of memory in ~62 min")


# --------------------------------------------------------------------------- the report


T0 = 1_767_225_600.0




@pytest.fixture(scope="module")
def leaked(tmp_path_factory):
    """A job whose memory on GPU 0 grew until the card was full, with what the advisor said."""
    p = tmp_path_factory.mktemp("mem") / "leak.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake", target_pid=TARGET))
    w.flush([GpuInfo(ts=T0, index=0, name="NVIDIA H100 80GB HBM3", memory_total=LIMIT)])
    for k in range(300):
        ts = T0 + k
        job = 40 * GiB + 130 * MiB * k
        w.flush([GpuSample(ts=ts, index=0, util_gpu=95.0, mem_used=int(job + GiB), mem_total=LIMIT),
                 GpuProcess(ts=ts, gpu_index=0, pid=TARGET, used_memory=int(job)),
                 ProcSample(ts=ts, pid=TARGET, ppid=1, name="python", status="running", role="target")])
    w.flush([
        Finding(id="memory-growth", title="GPU 0 memory grows 7.6 GB/min: out of memory in ~3 min (2-4)",
                severity=Severity.WARNING, confidence=0.85, gpu_index=0, ts=T0 + 120, first_seen=T0 + 120,
                evidence=("GPU 0: the job's memory grows 7.6 GB/min (95 %: 7.5 GB/min-7.8 GB/min) over the last 2 min",),
                action="train.py:57: total_loss += loss  →  loss.item()"),
        Finding(id="oom-exit", title="Job ended: likely CUDA out of memory", severity=Severity.CRITICAL,
                confidence=0.7, ts=T0 + 299, first_seen=T0 + 299,
                evidence=("likely CUDA out of memory: GPU 0's memory was at 99 % of its 80 GiB just before the job exited",
                          "likely, not certain"), action="the job's error output says for sure"),
    ])
    w.finish()
    with Reader(p) as r:
        return collect(r)


def test_report_text_has_the_memory_over_time_the_forecast_and_the_end(leaked, utc):
    text = render_text(leaked)
    gpu = text[text.index("\nGPU 0 "):text.index("\nhost   CPU")]
    assert "\n  memory       ▅" in gpu and "█\n" in gpu  # rising to the card's total
    assert "memory: the job's 40.0G → 78.0G (peak 78.0G); the card's peak 79.0G of 80.0G" in gpu
    said = " ".join(gpu.split())  # wrapped to the report's width
    assert "forecast shown live (2026-01-01 00:02:00): GPU 0 memory grows 7.6 GB/min: out of memory in ~3 min (2-4)" \
        in said
    assert "how the job ended (2026-01-01 00:04:59): likely CUDA out of memory: GPU 0's memory was at 99 %" in said


def test_report_html_draws_the_jobs_memory_beside_the_cards(leaked):
    page = render_html(leaked)
    chart = page[page.index('aria-label="GPU memory"'):]
    chart = chart[:chart.index("</svg>")]
    assert "the job&#x27;s memory" in chart and "memory used (card)" in chart
    assert "Forecast shown live" in page and "out of memory in ~3 min (2-4)" in page
    assert "How the job ended" in page


def test_report_without_memory_findings_says_nothing_of_them(leaked):
    plain = replace(leaked, findings=[])
    assert "forecast shown live" not in render_text(plain) and "Forecast shown live" not in render_html(plain)
