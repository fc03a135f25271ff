"""`record -a --pid P` onto a recording of another process was accepted silently, and then `info`
showed only the new target ("sessions 2") while `report` counted only its stacks and called the
first session's time "left out: before the first sample". An append of another target now says so
on stderr; `info` and `report` describe every session (its span and its target), and the report
reads each session's stacks for that session's own target, the time between sessions said as such."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from gputop.cli import main
from gputop.model import Category, HostSample, SystemInfo
from gputop.record import Reader
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.report import collect, render_html, render_text, summary_dict
from gputop.units import fmt_length, fmt_time
from synth import stack

T0 = 1_767_225_600.0
FIRST, SECOND = 4_194_301, 4_194_302  # above Linux's pid_max: never a real process
GAP = 500.0  # between the sessions: nothing recorded


def _session(path: Path, pid: int, cmd: str, start: float, seconds: float, cat: Category, append: bool,
             system: SystemInfo | None = None) -> None:
    w = RecordWriter.create(path, append=append)
    sid = w.start_session(SessionMeta(mode="live", target_pid=pid, target_cmdline=cmd, interval=2.0))
    batch: list[object] = [system or SystemInfo(ts=start, hostname="cpu-box", nvml_error="NVIDIA driver not loaded")]
    batch += [HostSample(ts=start + k, cpu_percent=50.0) for k in range(int(seconds) + 1)]
    batch += [stack(start + k * 0.5, cat, pid=pid) for k in range(int(seconds * 2) + 1)]
    w.flush(batch)
    w.finish()
    # The session's row as the recorder would have written it at that time (not the test's now).
    with sqlite3.connect(path) as c:
        c.execute("UPDATE sessions SET started=?, ended=? WHERE id=?", (start, start + seconds, sid))


@pytest.fixture
def appended(tmp_path):
    p = tmp_path / "app.gputop"
    _session(p, FIRST, "python healthy.py", T0, 22.0, Category.FORWARD, append=False)
    _session(p, SECOND, "python evalstep.py", T0 + 22.0 + GAP, 5.0, Category.OTHER, append=True)
    return p


def test_info_names_every_sessions_target_and_span(appended, capsys):
    assert main(["info", str(appended)]) == 0
    out = capsys.readouterr().out
    assert "sessions    2 (appended), 2 targets" in out
    assert (f"session 1   {fmt_time(T0)} → {fmt_time(T0 + 22)}  ({fmt_length(22.0)})  PID {FIRST}  python healthy.py"
            in out), out
    assert f"session 2   {fmt_time(T0 + 522)} → " in out and f"PID {SECOND}  python evalstep.py" in out
    # One target line would name only the last session's: the sessions' lines say each.
    assert "\ntarget " not in out
    assert main(["info", str(appended), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [(s["session"], s["target_pid"], s["target_cmdline"]) for s in d["session_list"]] == [
        (1, FIRST, "python healthy.py"), (2, SECOND, "python evalstep.py")]
    assert d["session_list"][0]["start"] == pytest.approx(T0) and d["session_list"][0]["end"] == pytest.approx(T0 + 22)


def test_report_counts_each_sessions_own_target_and_says_the_gap(appended, capsys):
    with Reader(appended) as r:
        s = collect(r)
    # Every session's main-thread samples count, each read for its own target: 45 + 11.
    assert s.cpu is not None and s.cpu.samples == 45 + 11
    assert [x.stack_samples for x in s.sessions] == [45, 11]
    assert s.cpu.between_s == pytest.approx(GAP, abs=0.1)
    text = render_text(s, 120)
    assert "before the first sample" not in text
    assert f"{fmt_length(GAP)} between the sessions (nothing was recorded)" in text
    assert f"session 1  {fmt_time(T0)} → {fmt_time(T0 + 22)} ({fmt_length(22.0)})  PID {FIRST}  python healthy.py" in text
    assert f"PID {SECOND}  python evalstep.py" in text
    # The CPU section says each session's breakdown apart: two jobs, not one.
    head, cpu = text.split("CPU (no GPU): where the time went", 1)
    assert "each session's target" in cpu.splitlines()[0]
    assert f"session 1 (PID {FIRST})" in cpu and f"session 2 (PID {SECOND})" in cpu
    page = render_html(s)
    assert "python healthy.py" in page and "python evalstep.py" in page and "between the sessions" in page
    d = json.loads(json.dumps(summary_dict(s)))
    assert [(x["session"], x["target_pid"], x["stack_samples"]) for x in d["sessions"]] == [
        (1, FIRST, 45), (2, SECOND, 11)]
    assert d["cpu_device"]["left_out"]["between_sessions_s"] == pytest.approx(GAP, abs=0.1)
    assert d["cpu_device"]["stack_samples"] == 56


def test_one_session_reads_as_before(tmp_path):
    p = tmp_path / "one.gputop"
    _session(p, FIRST, "python healthy.py", T0, 10.0, Category.FORWARD, append=False)
    with Reader(p) as r:
        s = collect(r)
    text = render_text(s, 100)
    assert "session 1" not in text and "sessions" not in text
    assert f"target PID {FIRST}  python healthy.py" in text


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)


def test_appending_another_target_warns_on_stderr(tmp_path, capsys):
    out = tmp_path / "a.gputop"
    # Recorded from the fake GPU source, so that the append (--fake) is one whatever this host has.
    _session(out, FIRST, "python healthy.py", T0, 3.0, Category.FORWARD, append=False,
             system=SystemInfo(ts=T0, hostname="box", source="fake"))
    job = _sleeper()
    try:
        rc = main(["record", "-o", str(out), "-a", "--fake", "1", "--pid", str(job.pid), "--interval", "0.2",
                   "-d", "0.3s", "--no-advisor"])
    finally:
        job.kill()
        job.wait()
    err = capsys.readouterr().err
    assert rc == 0, err
    # (The sleeper is no Python process: its own warning says so, in the same form.)
    warning = [ln for ln in err.splitlines() if ln.startswith("gputop record: warning: appending")]
    assert len(warning) == 1, err
    assert (f"gputop record: warning: appending PID {job.pid} (sleep 60) to {out}, whose last session followed "
            f"PID {FIRST} (python healthy.py)") in warning[0]
    with Reader(out) as r:
        assert [s["target_pid"] for s in r.sessions] == [FIRST, job.pid]


def test_the_target_change_is_said_for_no_target_and_not_for_the_same_one():
    from gputop.record import target_change

    assert target_change((FIRST, "python a.py"), (FIRST, "python a.py")) is None
    assert target_change(None, (FIRST, "python a.py")) is None  # a new file: nothing before it
    assert target_change((None, None), (None, None)) is None  # both without --pid
    said = target_change((FIRST, "python a.py"), (None, None))
    assert said is not None and "no process" in said and f"PID {FIRST} (python a.py)" in said
    said = target_change((None, None), (SECOND, "python b.py"))
    assert said is not None and f"PID {SECOND} (python b.py)" in said and "followed no process" in said
    # A restarted job (same command line, new PID) is another process too.
    assert target_change((FIRST, "python a.py"), (SECOND, "python a.py")) is not None
