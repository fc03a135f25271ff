"""py-spy failing on a job in its first seconds (Python importing torch, CUDA starting) is start-up,
not a fault: no warning when the stacks then come; a warning when it keeps failing past it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("psutil")

from gputop.analysis.classify import classify, is_library  # noqa: E402
from gputop.model import Event, StackSample  # noqa: E402
from gputop.sources import stacks as stacks_mod  # noqa: E402
from gputop.sources.host_cpu import HostCpu  # noqa: E402
from gputop.sources.pyspy_binary import AttachError  # noqa: E402
from gputop.sources.stacks import STARTUP_GRACE_S, PySpySource  # noqa: E402

MAIN = [{"name": "train", "filename": "/job/train.py", "line": 42}]


@pytest.fixture
def young():
    """A process that has just started (what py-spy reads is faked: only its age matters)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield p.pid
    finally:
        p.kill()
        p.wait()


def _run(monkeypatch, pid: int, fails: int, start: float, seconds: float) -> list[object]:
    clock = [start]
    calls = [0]

    def dump(p, pyspy=None, nonblocking=False, meter=None, nice=0):
        calls[0] += 1
        if calls[0] <= fails:
            raise AttachError(f"py-spy failed on PID {pid}: Failed to get stack traces", "pyspy-failed")
        return [{"pid": pid, "thread_id": 1, "os_thread_id": pid, "thread_name": "MainThread", "frames": MAIN,
                 "active": True, "owns_gil": True}]

    monkeypatch.setattr(stacks_mod, "dump_json", dump)
    src = PySpySource(pid, clock=lambda: clock[0], classify=classify, is_library=is_library, pyspy="py-spy",
                      host_cpu=lambda: HostCpu(cpus=16, load1=0.5))
    monkeypatch.setattr(src, "_proc_samples", lambda now: [])
    out: list[object] = []
    end = clock[0] + seconds
    while clock[0] < end:
        out += src.poll()
        clock[0] += 0.25
    return out


def test_a_miss_while_the_job_starts_then_stacks_is_not_a_warning(monkeypatch, young):
    out = _run(monkeypatch, young, fails=2, start=time.time(), seconds=12)
    assert any(isinstance(x, StackSample) for x in out)
    said = [x for x in out if isinstance(x, Event)]
    assert not [e for e in said if "py-spy failed" in e.message], said
    assert not [e for e in said if "resumed" in e.message], said  # nothing stopped: nothing resumed


def test_it_is_a_warning_when_it_lasts_past_the_start_up(monkeypatch, young):
    out = _run(monkeypatch, young, fails=10_000, start=time.time(), seconds=STARTUP_GRACE_S + 5)
    warned = [x for x in out if isinstance(x, Event) and "py-spy failed" in x.message]
    assert len(warned) == 1 and warned[0].level == "warning"
    assert warned[0].ts >= time.time() - 1 + STARTUP_GRACE_S - 5  # once the job was past its start


def test_an_old_job_that_fails_is_warned_about_at_once(monkeypatch):
    out = _run(monkeypatch, os.getpid(), fails=1, start=time.time() + STARTUP_GRACE_S, seconds=1)
    assert [x.message for x in out if isinstance(x, Event) and "py-spy failed" in x.message]
