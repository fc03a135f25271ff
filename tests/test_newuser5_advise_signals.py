"""`advise` stopped by SIGTERM or SIGHUP (`timeout`, a scheduler's limit, a closed SSH session)
printed nothing: `timeout 8 gputop advise --json > f` left an empty file. It now stops as on
Ctrl-C, prints what it judged (the JSON complete), closes its --record file, and exits with
128 + the signal's number, the status a scheduler reads as "ended by that signal"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gputop.record.reader import Reader
from proc_helpers import as_from_a_terminal

ROOT = Path(__file__).resolve().parents[1]


def _advise(*extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "gputop", "advise", "--fake", "1", "--duration", "60", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_from_a_terminal,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _wait_for_progress(p: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until advise prints its first progress line (it is watching)."""
    deadline = time.monotonic() + timeout
    line = p.stderr.readline()
    while "gputop advise:" not in line:
        assert time.monotonic() < deadline and line, "advise never started watching"
        line = p.stderr.readline()


def _stopped_by(sig: int, extra: tuple[str, ...], watch_s: float = 0.0) -> tuple[int, str, str]:
    """An advise run stopped by ``sig`` once it watches (and ``watch_s`` later): (exit status,
    stdout, stderr)."""
    p = _advise(*extra)
    try:
        _wait_for_progress(p)
        time.sleep(watch_s)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, out, err


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """The three runs below, side by side (each mostly waits on its fake GPU's polls): signal ->
    a future of ``_stopped_by``; the SIGTERM run records to ``stopped["record"]``."""
    rec = tmp_path_factory.mktemp("advise") / "a.gputop"
    runs = {signal.SIGTERM: (("--json", "--record", str(rec)), 2.0), signal.SIGHUP: ((), 0.0),
            signal.SIGINT: (("--json",), 0.0)}
    pool = ThreadPoolExecutor(max_workers=len(runs))
    try:
        out: dict = {sig: pool.submit(_stopped_by, sig, extra, watch_s) for sig, (extra, watch_s) in runs.items()}
        out["record"] = rec
        yield out
    finally:
        pool.shutdown(wait=True)


def test_sigterm_prints_the_json_complete_and_exits_143(stopped):
    rec = stopped["record"]
    returncode, out, err = stopped[signal.SIGTERM].result()
    assert returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    report = json.loads(out)  # complete, not cut
    assert report["interrupted"] is True and report["terminated_by"] == "terminated"
    assert report["duration_s"] < 30
    with Reader(rec) as r:  # the --record file is closed and whole
        assert r.state == "closed" and r.damage is None


def test_sighup_prints_the_text_with_the_reason(stopped):
    returncode, out, err = stopped[signal.SIGHUP].result()
    assert returncode == 128 + signal.SIGHUP, err
    first = out.splitlines()[0]
    assert first.startswith("gputop advise: ") and first.endswith("(hung up)")


def test_ctrl_c_keeps_its_status(stopped):
    returncode, out, err = stopped[signal.SIGINT].result()
    assert returncode == 0, err
    report = json.loads(out)
    assert report["interrupted"] is True and report["terminated_by"] is None
