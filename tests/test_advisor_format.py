"""Findings and breakdowns as text, JSON and the pane (the Textual widget included)."""

import json

import pytest
from textual.app import App

from gputop.ui.pane import PaneContext
from gputop.present.advice import (
    bar_segments,
    bar_text,
    breakdown_dict,
    breakdown_rows,
    breakdown_summary,
    breakdown_table,
    findings_text,
    advice_pane_lines,
    report_dict,
)
from gputop.analysis.breakdown import CPU_DEVICE, Breakdown, Bucket
from gputop.model import Finding, Severity, Verdict
from gputop.store import Store
from gputop.ui.advisor_pane import AdvisorPane

BD = Breakdown(0, 0.0, 60.0, {Bucket.BUSY: 35.4, Bucket.DATA: 24.6 - 1.0, Bucket.UNKNOWN: 1.0}, attributed=True)
FINDING = Finding(
    id="workers-saturated",
    title="GPU 0 waits for data 41 % of the time: loader workers saturated",
    severity=Severity.WARNING,
    confidence=0.87,
    evidence=("GPU 0 idle 41 % of the last 60 s; 39 % waiting for data",
              "during idle, main thread in __next__ (train.py:57) 93 % of samples"),
    action="DataLoader(..., num_workers=8, pin_memory=True, persistent_workers=True, prefetch_factor=2)",
    expected_gain="up to 1.7x steps/s",
    cost_s=24.6,
    gpu_index=0,
    ts=1060.0,
    first_seen=1004.5,
)


def test_rows_and_bar_add_up():
    rows = breakdown_rows(BD)
    assert [b for b, _, _ in rows] == [Bucket.BUSY, Bucket.DATA, Bucket.UNKNOWN]
    assert sum(p for *_, p in rows) == 100
    for width in (7, 33, 50, 101):
        assert sum(n for _, n in bar_segments(BD, width)) == width
        assert len(bar_text(BD, width)) == width
    assert bar_segments(Breakdown(0, 0, 0, {}, False), 10) == []


def test_summary_and_table():
    assert breakdown_summary(BD) == "GPU 0 over 60 s: busy 59 %, waiting for data 39 %, other/unknown 2 %"
    table = breakdown_table([BD, Breakdown(CPU_DEVICE, 0, 10, {Bucket.BUSY: 10.0}, attributed=False)])
    assert "GPU 0: where the time went over the last 60 s" in table
    assert "CPU (no GPU)" in table and "idle time not attributed" in table
    assert "waiting for data" in table and " 39 %" in table


def test_findings_text_has_evidence_action_and_gain():
    text = findings_text([FINDING], since=1000.0)
    assert text.splitlines()[0].startswith("! 1. GPU 0 waits for data 41 %")
    assert "since +4 s" in text and "cost 24.6 GPU-s" in text
    assert "- during idle, main thread in __next__" in text
    assert "do: DataLoader(..., num_workers=8" in text
    assert "gain: up to 1.7x" in text
    assert findings_text([]).startswith("No findings")


def test_report_json_has_first_seen_relative_to_the_start():
    rep = report_dict([FINDING], [BD], since=1000.0, history={"workers-saturated": (1004.5, 1060.0), "io-bound": (1002.0, 1003.0)},
                      extra={"pid": 42})
    json.dumps(rep)  # serialisable
    assert rep["pid"] == 42 and rep["top"] == "workers-saturated"
    f = rep["findings"][0]
    assert f["first_seen_s"] == 4.5 and f["severity"] == "warning" and f["evidence"][1].startswith("during idle")
    assert [s["id"] for s in rep["seen"]] == ["io-bound", "workers-saturated"]
    bd = rep["breakdown"][0]
    assert sum(b["percent"] for b in bd["buckets"]) == 100
    assert breakdown_dict(BD)["gpu_index"] == 0


def test_pane_lines():
    lines = advice_pane_lines([FINDING], [BD], width=80)
    flat = ["".join(seg for seg, _ in ln) for ln in lines]
    assert flat[0].startswith("GPU 0 last 60 s")
    assert any(ln and all(style.startswith("bucket.") for _, style in ln) for ln in lines)  # the bar
    assert any("waiting for data 39 %" in ln for ln in flat)
    assert any(ln.startswith("! 1. GPU 0 waits for data") for ln in flat)
    assert any(ln.strip().startswith("do: DataLoader") for ln in flat)
    empty = ["".join(seg for seg, _ in ln) for ln in advice_pane_lines([], [], attached=False)]
    assert any("Attach to the training process" in ln for ln in empty)


class PaneApp(App):
    def compose(self):
        yield AdvisorPane(id="advisor-pane")


@pytest.mark.timeout(60)
async def test_advisor_pane_renders_the_store():
    store = Store()
    store.add([Verdict(1060.0, (FINDING,), (BD,))])
    app = PaneApp()
    async with app.run_test(size=(100, 30)) as pilot:
        pane = app.query_one(AdvisorPane)
        pane.update_view(PaneContext(store))
        await pilot.pause()
        text = "\n".join("".join(seg for seg, _ in ln) for ln in pane.last_lines)
        assert "GPU 0 waits for data 41 %" in text
        assert "busy 59 %" in text
        before = pane.last_lines
        pane.update_view(PaneContext(store))  # nothing changed: no redraw
        assert pane.last_lines is before
        store.add([Verdict(1061.0)])
        pane.update_view(PaneContext(store))
        assert not any("waits for data" in "".join(s for s, _ in ln) for ln in pane.last_lines)


@pytest.mark.timeout(60)
async def test_just_after_attaching_to_another_job_the_tab_does_not_show_the_previous_jobs_verdict():
    """The warm-up finding said 'the job started 9 s ago' of a job attached 1 s before: the
    latest verdict was still the previous job's. The tab shows a verdict only for the job
    attached now; before it, what is being collected."""
    from gputop.advisor.engine import warmup_finding

    old = warmup_finding("the job started 9 s ago (first steps)", 1060.0)
    store = Store()
    app = PaneApp()
    async with app.run_test(size=(100, 30)) as pilot:
        pane = app.query_one(AdvisorPane)
        text = lambda: "\n".join("".join(seg for seg, _ in ln) for ln in pane.last_lines)  # noqa: E731
        pane.update_view(PaneContext(store, 2))  # before the advisor's first evaluation: not "No findings"
        await pilot.pause()
        assert "Collecting evidence: 0 of ~20 stacks" in text() and "No findings" not in text()
        store.add([Verdict(1060.0, (old,), (BD,), target_pid=1)])  # the previous job's
        pane.update_view(PaneContext(store, 2))
        await pilot.pause()
        assert "9 s ago" not in text() and "Collecting evidence: 0 of ~20 stacks" in text()
        new = warmup_finding("the job started 1 s ago (first steps)", 1061.0)
        store.add([Verdict(1061.0, (new,), (BD,), target_pid=2)])
        pane.update_view(PaneContext(store, 2))
        await pilot.pause()
        assert "the job started 1 s ago" in text() and "9 s ago" not in text()


@pytest.mark.timeout(60)
async def test_the_apps_advisor_tab_shows_the_advisors_findings(clock):
    from gputop.advisor.stage import add_job_stage
    from gputop.session import Session
    from gputop.pipeline import Pipeline
    from gputop.sources.fake import FakeGpuSource
    from gputop.ui.app import GputopApp

    store = Store()
    src = FakeGpuSource(gpus=2, clock=clock)
    session = Session(store=store, pipeline=Pipeline(store, [src], clock=clock), gpu=src, mode="fake")
    add_job_stage(session)
    for _ in range(5):
        clock.advance(1.0)
        session.pipeline.poll_once()
    app = GputopApp(session, refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        pane = app.query_one(AdvisorPane)
        pane.update_view(app.pane_context())
        text = "\n".join("".join(seg for seg, _ in ln) for ln in pane.last_lines)
        assert "GPU 1 busy but tensor cores idle" in text  # the fake fp32 GPU
        assert "GPU 0 last" in text and "busy" in text


CKPT = Finding(
    id="checkpoint-stall",
    title="Checkpoint saves stall GPU 0 31 % of the time",
    severity=Severity.WARNING,
    confidence=0.9,
    evidence=("GPU 0 idle 31 % of the last 60 s in torch.save (train.py:88), every 20 s",),
    action=(
        "save in the background: torch.distributed.checkpoint.async_save(state_dict, "
        "checkpoint_id=path) (torch >= 2.3), or copy the state to CPU "
        "({k: v.detach().cpu() for k, v in sd.items()}) and torch.save it in a thread; "
        "or save less often"
    ),
    expected_gain="up to 1.4x steps/s if the saves no longer stopped the GPU (31 % of the time back)",
    cost_s=18.6,
    gpu_index=0,
)


def _plain(ln):
    return "".join(t for t, _ in ln)


@pytest.mark.parametrize("width", [40, 57, 72, 86, 97, 120])
def test_pane_lines_fit_the_width_and_keep_every_token_of_the_code(width):
    lines = advice_pane_lines([CKPT, FINDING], [BD], width)
    assert all(len(_plain(ln)) <= width for ln in lines), [(len(_plain(ln)), _plain(ln)) for ln in lines]
    # The action, read back from its wrapped lines, is the action: no token dropped or split.
    rows = [_plain(ln) for ln in lines]
    start = next(i for i, r in enumerate(rows) if r.lstrip().startswith("do: "))  # the first finding's
    chunks = [rows[start].split("do: ", 1)[1]]
    for r in rows[start + 1:]:
        if not r.startswith("         ") or r.lstrip().startswith(("gain:", "- ")):
            break
        chunks.append(r.strip())
    if max(map(len, CKPT.action.split())) + len("     do: ") <= width:
        assert " ".join(chunks) == CKPT.action
    else:  # a token wider than the pane is split (`y` copies it whole), but nothing is lost
        assert "".join(chunks).replace(" ", "") == CKPT.action.replace(" ", "")


def test_cost_of_a_cpu_only_finding_is_not_gpu_seconds():
    from dataclasses import replace

    cpu = replace(FINDING, gpu_index=None)
    assert "GPU-s" not in findings_text([cpu]) and "s of the job's time" in findings_text([cpu])
    assert "cost 24.6 GPU-s" in findings_text([FINDING])


@pytest.mark.parametrize("cols", [80, 100, 132])
async def test_the_advisor_tab_never_cuts_advice_at_the_edge_and_y_copies_it(cols):
    from gputop.session import Session
    from gputop.pipeline import Pipeline
    from gputop.ui.app import GputopApp
    from gputop.ui.lines_view import LinesView

    store = Store()
    session = Session(store=store, pipeline=Pipeline(store, []), mode="fake", target_pid=4242)
    store.add([Verdict(1060.0, (CKPT, FINDING), (BD,), target_pid=4242)])
    app = GputopApp(session, refresh=60)
    async with app.run_test(size=(cols, 40)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        pane = app.query_one(AdvisorPane)
        pane.update_view(app.pane_context())
        await pilot.pause()
        view = pane.query_one(LinesView)
        shown = [t.plain for t in view._lines]
        rendered = [_plain(ln) for ln in pane.last_lines]
        visible = view.size.width  # the columns the text really gets, scrollbar excluded
        assert all(len(r) <= visible for r in rendered), (visible, max(map(len, rendered)))
        assert "k, v in sd.items()}" in " ".join(rendered)
        assert not any(s.endswith("…") for s in shown)
        await pilot.press("y")
        await pilot.pause()
        assert app.clipboard == CKPT.action  # the first finding on screen


def test_no_gpu_and_no_job_says_what_to_do_instead_of_collecting_forever():
    text = " ".join(_plain(ln) for ln in advice_pane_lines([], [], 100, attached=False, has_gpu=False))
    assert "Collecting" not in text and "No GPU here and no job attached" in text and "--pid" in text
    # with a GPU, or a job, the breakdown is on its way
    assert "Collecting" in " ".join(_plain(ln) for ln in advice_pane_lines([], [], 100, attached=False, has_gpu=True))
    assert "Collecting" in " ".join(_plain(ln) for ln in advice_pane_lines([], [], 100, attached=True, has_gpu=False))


def test_a_cause_seen_but_not_yet_held_reads_as_confirming_not_as_no_findings():
    text = " ".join(_plain(ln) for ln in advice_pane_lines([], [BD], 100, pending=[FINDING]))
    assert "No findings" not in text and "Confirming: GPU 0 waits for data 41 %" in text


def test_no_gpu_and_unreadable_stacks_says_so_instead_of_collecting():
    text = " ".join(_plain(ln) for ln in advice_pane_lines([], [], 100, attached=True, has_gpu=False,
                                                     no_stacks="cannot sample stacks of PID 7: not Python"))
    assert "Collecting" not in text and "cannot be read (cannot sample stacks of PID 7: not Python)" in text


def test_an_exited_job_is_said_first_and_its_findings_read_as_past():
    from gputop.present.advice import advice_pane_lines

    text = lambda lines: "\n".join("".join(t for t, _ in ln) for ln in lines)  # noqa: E731
    gone = text(advice_pane_lines([], [], 100, exited="PID 42 at 12:00:05"))
    assert gone.startswith("The attached job exited (PID 42 at 12:00:05): no finding was showing")
    assert "No findings: nothing costs the job" not in gone
    live = text(advice_pane_lines([], [], 100))
    assert "exited" not in live and "No findings" in live


@pytest.mark.timeout(60)
async def test_the_advisor_tab_follows_each_verdict_not_the_slower_display_refresh():
    """A 2 s display refresh showed the advisor's verdicts up to 2 s late ('the job started 8 s
    ago' of a job 10 s old): the tab looks for the next verdict every ADVISOR_TAB_EVERY_S."""
    from gputop.pipeline import Pipeline
    from gputop.session import Session
    from gputop.ui.app import ADVISOR_TAB_EVERY_S, GputopApp

    store = Store()
    session = Session(store=store, pipeline=Pipeline(store, []), mode="fake", target_pid=4242)
    store.add([Verdict(1060.0, (), (BD,), target_pid=4242)])
    app = GputopApp(session, refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        pane = app.query_one(AdvisorPane)
        store.add([Verdict(1061.0, (FINDING,), (BD,), target_pid=4242)])
        await pilot.pause(ADVISOR_TAB_EVERY_S * 2.5)
        assert any("waits for data" in _plain(ln) for ln in pane.last_lines)


def test_the_verdict_line_is_the_advisor_tabs_top_finding_in_one_line():
    from dataclasses import replace

    from gputop.model import Evidence
    from gputop.present.advice import verdict_line

    def text(line):
        return "".join(t for t, _ in line)

    f = replace(FINDING, gain_predicted=3.2)
    line = text(verdict_line([f, CKPT], 100))
    assert FINDING.title[:40] in line and "at most 3.2x" in line and "(+1)" in line and line.endswith("2: details")
    assert len(text(verdict_line([f], 40))) <= 40  # it fits the terminal's width
    assert text(verdict_line([], 100, pending=[CKPT])).startswith("weighing: ")
    waiting = text(verdict_line([], 100, collecting=Evidence(stacks=3, stacks_needed=20, gpu_s=1.0, gpu_needed_s=2.0)))
    assert waiting.startswith("Collecting evidence: 3 of ~20 stacks") and "No findings" not in waiting
    assert text(verdict_line([f], 100, exited="PID 4 at 10:00:00")).startswith("the attached job exited (PID 4")
    # A job whose stacks cannot be read (not Python): never "collecting" stacks that never come.
    stackless = text(verdict_line([], 100, collecting=Evidence(stacks=0, stacks_needed=20, gpu_s=5.0, gpu_needed_s=2.0),
                                  no_stacks="PID 9 is not a Python process"))
    assert "Collecting" not in stackless and "not a Python process" in stackless, stackless


def test_no_finding_under_a_bar_of_unknown_time_does_not_say_nothing_costs_the_job():
    from gputop.present.advice import advice_pane_lines

    bd = Breakdown(0, 0.0, 60.0, {Bucket.BUSY: 10.0, Bucket.UNKNOWN: 41.0, Bucket.DATA: 9.0}, attributed=True)
    text = "\n".join("".join(t for t, _ in line) for line in advice_pane_lines([], [bd], 100))
    assert "nothing costs the job" not in text
    assert "68% of the time is other/unknown" in text and "Stacks tab (3)" in text
    healthy = Breakdown(0, 0.0, 60.0, {Bucket.BUSY: 58.0, Bucket.UNKNOWN: 2.0}, attributed=True)
    text = "\n".join("".join(t for t, _ in line) for line in advice_pane_lines([], [healthy], 100))
    assert "No findings: nothing costs the job a visible share of its time." in text
