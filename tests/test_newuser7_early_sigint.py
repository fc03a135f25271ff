"""Ctrl-C (SIGINT) while gputop is still starting printed a ~30-line KeyboardInterrupt traceback
(status -2), and `record` left no file, where SIGTERM at the same moment left a recording. SIGINT
is now held while gputop loads, as SIGTERM is: `record` takes it (a readable recording, status 0
as Ctrl-C gives once it runs), any other command ends in one line with status 130 (or, once it is
already watching, as Ctrl-C does there: `advise` prints what it has and exits 0)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputop.cli import main
from proc_helpers import as_from_a_terminal, signal_state
from gputop.record.reader import Reader

ROOT = Path(__file__).resolve().parents[1]
DELAYS = (0.05, 0.2, 0.4)


def _caught(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("SigCgt:")).split()[1], 16)


def _interrupt_at(args: list[str], delay: float) -> tuple[int, str, str]:
    """Run ``gputop ARGS`` and send it SIGINT ``delay`` s after it started, but not before gputop's
    own code runs (its SIGTERM handler, put in place with the SIGINT one, is there): before that
    it is Python's own start (~0.1 s here), which no program's code can answer."""
    started = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "gputop", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=as_from_a_terminal,
                         text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        deadline = started + 30
        while not _caught(p.pid) >> (signal.SIGTERM - 1) & 1:
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.002)
        time.sleep(max(0.0, started + delay - time.monotonic()))
        state = signal_state(p.pid)
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SIGINT did not end it; its signals when sent: {state}") from None
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, out, err


@pytest.fixture(scope="module")
def target():
    """A Python process to attach to."""
    p = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    yield p.pid
    p.kill()
    p.wait()


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "r.gputop"
    assert main(["record", "-o", str(out), "--fake", "1", "--interval", "0.2", "--duration", "1s"]) == 0
    return out


def _one_line_or_done(rc: int, out: str, err: str, done: str, command: str) -> None:
    assert "Traceback" not in err, err
    if rc == 130:  # interrupted before the command had anything to say: one line, naming the command
        assert err.strip() == f"gputop {command}: interrupted" and out == "", err
    elif rc == -signal.SIGINT:
        # The command had finished: the signal came while the interpreter shut down, which then
        # ends by it (a shell reads 130), its output whole.
        assert err == "" and done in out, (rc, err)
    else:  # it was already done or watching: what Ctrl-C gives there
        assert rc == 0 and done in out, (rc, err)


@pytest.mark.parametrize("delay", DELAYS)
def test_advise(target, delay):
    rc, out, err = _interrupt_at(["advise", "--pid", str(target), "-d", "60"], delay)
    _one_line_or_done(rc, out, err, "(interrupted)", "advise")


@pytest.mark.parametrize("delay", DELAYS)
def test_report(recording, delay):
    rc, out, err = _interrupt_at(["report", str(recording)], delay)
    _one_line_or_done(rc, out, err, "gputop report: ", "report")


@pytest.mark.parametrize("delay", DELAYS)
def test_record_leaves_a_readable_recording(tmp_path, target, delay):
    out = tmp_path / "x.gputop"
    rc, _, err = _interrupt_at(["record", "-o", str(out), "--pid", str(target)], delay)
    assert rc == 0, err  # as Ctrl-C once it runs (SIGTERM at this moment: 143)
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("gputop record: recorded ") and "(interrupted)" in err
    with Reader(out) as r:
        assert r.state == "closed" and r.damage is None
    info = subprocess.run([sys.executable, "-m", "gputop", "info", str(out)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60, check=False)
    assert info.returncode == 0 and str(out) in info.stdout, info.stderr


def test_record_list_interrupted_while_starting_is_one_line(tmp_path):
    rc, _, err = _interrupt_at(["record", "--list", str(tmp_path)], 0.0)
    assert "Traceback" not in err
    # Listing is quick: it may be done before the signal is seen.
    assert (rc, err.strip()) == (130, "gputop record: interrupted") or rc == 0, err


def test_a_ctrl_c_that_went_through_exec_still_exits_130(tmp_path):
    # CPython marks a KeyboardInterrupt that leaves code run by exec() of a string (dataclasses
    # make their methods so, as modules load) as "unhandled" even once caught, and a program run
    # with -m (`python -m gputop`) then ends by SIGINT (-2): one Ctrl-C in ~15 while advise started.
    (tmp_path / "exec_interrupted.py").write_text(
        "import sys\n"
        "from gputop import cli\n"
        "from gputop.commands import info\n"
        "def run(args):\n"
        "    exec('raise KeyboardInterrupt')\n"
        "info.run = run\n"
        "raise SystemExit(cli.main(['info', 'x.gputop']))\n"
    )
    res = subprocess.run([sys.executable, "-m", "exec_interrupted"], capture_output=True, text=True, timeout=60,
                         check=False, env=dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}"))
    assert (res.returncode, res.stderr.strip()) == (130, "gputop info: interrupted")
