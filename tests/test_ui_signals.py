"""The live UI recording when SIGTERM or SIGHUP arrives (a scheduler's kill, an SSH drop): it
ends like `q`, and the recording is left as one complete file with nothing beside it."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from gputop.record.reader import Reader
from pty_helper import PtyProcess

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_the_ui_closes_its_recording_on_a_signal(sig, tmp_path):
    path = tmp_path / "ui.gputop"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "gputop", "--fake", "1", "--interval", "0.5", "--record", str(path)]
    with PtyProcess(argv, cols=100, rows=30, env=env, cwd=str(tmp_path)) as p:
        p.wait_for("RECORDING", timeout=30)
        time.sleep(2.0)  # a few polls recorded
        os.kill(p.pid, sig)
        code = p.wait(15)
        assert "Traceback" not in p.text
    assert code == 128 + sig
    assert path.exists()
    assert not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()
    with Reader(path) as r:
        assert r.end_ts > r.start_ts
        assert r.samples(r.start_ts - 60, r.end_ts + 1)
