"""Why an attach failed is never hidden: the UI shows it where the stacks would be, and the
headless commands whose one question is the target's stacks say it and exit non-zero."""

import subprocess
import sys

import pytest

from gputop.session import Config, open_live

PY = sys.executable


@pytest.fixture
def sleeper():
    """A process that is not Python: py-spy cannot read its stacks."""
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def gputop(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "gputop", *args], capture_output=True, text=True, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_advise_on_a_process_it_cannot_sample_says_why_and_fails(sleeper):
    # No --fake: on a machine without a GPU the NVML note is stored just after the attach note.
    proc = gputop("advise", "--pid", str(sleeper.pid), "--duration", "3", "--json")
    one_line_error(proc, str(sleeper.pid), "not a Python process")
    assert proc.stdout == ""  # no report that reads as "No findings"


def test_record_of_a_process_it_cannot_sample_says_why_and_records_without_stacks(sleeper, tmp_path):
    """Its GPUs and host are still worth a recording (a native trainer): the reason said once on
    stderr, the file written (it used to refuse and write nothing, while saying monitoring works)."""
    out = tmp_path / "run.gputop"
    proc = gputop("record", "--pid", str(sleeper.pid), "-o", str(out), "--duration", "3s")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("not a Python process") == 1 and "without stacks" in proc.stderr
    assert out.exists()


def test_the_session_keeps_the_reason_and_the_event(sleeper):
    session = open_live(Config(pid=sleeper.pid))
    try:
        assert session.attach_error and "not a Python process" in session.attach_error
        stacks_events = [e for e in session.store.events() if e.source == "stacks"]
        assert stacks_events and stacks_events[-1].level == "error"
    finally:
        session.pipeline.stop()


async def test_the_stacks_tab_shows_why_there_are_no_stacks(sleeper):
    from gputop.ui.app import GputopApp

    session = open_live(Config(pid=sleeper.pid, views=True))  # a UI session: the panes' views on the pipeline
    session.pipeline.poll_once()
    app = GputopApp(session, refresh=60)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("3")
            await pilot.pause()
            pane = app.query_one("#stacks-pane")
            pane.update_view(app.pane_context())
            text = "\n".join("".join(seg for seg, _ in ln) for ln in pane.last_lines)
            assert f"PID {sleeper.pid} is not a Python process" in " ".join(text.split())
            assert "no samples yet" not in text
    finally:
        session.pipeline.stop()


def _kernel_thread() -> int | None:
    """A kernel thread's PID (kthreadd's, usually 2), None where /proc shows none."""
    import os

    for pid in (2, *range(3, 50)):
        try:
            with open(f"/proc/{pid}/stat") as f:
                flags = int(f.read().rsplit(")", 1)[-1].split()[6])
        except (OSError, ValueError, IndexError):
            continue
        if flags & 0x00200000 and os.path.exists(f"/proc/{pid}"):
            return pid
    return None


def test_a_zombie_and_a_kernel_thread_are_named_as_such_not_as_missing(capsys):
    """'no process with PID N' for a process that is there: say what it is."""
    import time

    from gputop.cli import main
    from gputop.sources.stacks import AttachError, check_attachable

    child = subprocess.Popen(["true"])  # exits at once; not reaped until wait(): a zombie
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    break
            time.sleep(0.02)
        with pytest.raises(AttachError, match=rf"PID {child.pid} is a zombie \(exited with code 0, not reaped"):
            check_attachable(child.pid)
        assert main(["advise", "--pid", str(child.pid), "--duration", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"PID {child.pid} is a zombie (exited" in err and "no process" not in err
    finally:
        child.wait()
    kt = _kernel_thread()
    if kt is None:
        pytest.skip("no kernel thread visible in /proc here")
    with pytest.raises(AttachError, match=rf"PID {kt} is a kernel thread"):
        check_attachable(kt)


def test_a_target_that_exits_while_py_spy_reads_it_is_gone_not_not_python():
    # py-spy says "Failed to find python version" of a process whose maps go as it exits: advise
    # printed "PID N is not a Python process" beside "the target exited" (a new user's job whose
    # DataLoader worker was killed).
    from gputop.sources.pyspy_binary import _classify_failure

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    exc = _classify_failure(p.pid, "Error: Failed to find python version from target process", 1)
    assert exc.kind == "gone" and "not a Python process" not in str(exc)
