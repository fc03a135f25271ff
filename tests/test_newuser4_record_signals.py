"""`gputop record` stopped by SIGTERM or SIGHUP while it is still starting: it exited 143 with no
file and no word (killed 0.4 s in, while its modules loaded). It now writes what it has."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputop.commands import startup_signals
from gputop.record.reader import Reader

ROOT = Path(__file__).resolve().parents[1]


def _caught(pid: int) -> int:
    """The signals ``pid`` has a handler for (SigCgt in /proc/PID/status), as a bit mask."""
    with open(f"/proc/{pid}/status") as f:
        line = next(ln for ln in f if ln.startswith("SigCgt:"))
    return int(line.split()[1], 16)


def _start(out: Path, **popen) -> subprocess.Popen:
    argv = [sys.executable, "-m", "gputop", "record", "--fake", "1", "--interval", "0.5", "-o", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), **popen)


def _wait_until(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.002)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_while_record_starts_still_leaves_a_recording(tmp_path, sig):
    out = tmp_path / "early.gputop"
    p = _start(out)
    try:
        # As soon as gputop's own code runs (its handler is in place), long before the recorder
        # has opened its sources or its file.
        _wait_until(lambda: _caught(p.pid) >> (sig - 1) & 1)
        assert not out.exists()
        os.kill(p.pid, sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + sig, err  # a clean stop by a signal says which (advise does the same)
    assert "Traceback" not in err
    why = "terminated" if sig == signal.SIGTERM else "hung up"
    assert err.strip().splitlines()[-1].startswith("gputop record: recorded ") and f"({why})" in err
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with Reader(out) as r:  # a valid, closed recording
        assert r.state == "closed" and r.damage is None


def test_sighup_ignored_by_nohup_does_not_stop_the_recording(tmp_path):
    out = tmp_path / "nohup.gputop"
    p = _start(out, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        _wait_until(out.exists)
        os.kill(p.pid, signal.SIGHUP)  # the SSH session drops: nohup's point is to go on
        os.kill(p.pid, signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, err
    assert "(terminated)" in err and "hung up" not in err


def test_a_program_importing_gputop_keeps_its_own_signal_handlers():
    # This test process imported gputop.commands: it is not gputop's command line.
    assert not startup_signals.is_gputop_process()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert startup_signals.is_gputop_process("/usr/local/bin/gputop")
    assert startup_signals.is_gputop_process("/src/gputop/__main__.py")
    assert not startup_signals.is_gputop_process("/usr/bin/pytest")


def test_record_help_names_every_signal_it_stops_on():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "gputop", "record", "--help"], capture_output=True, text=True).stdout
    assert "SIGTERM" in out and "SIGHUP" in out
