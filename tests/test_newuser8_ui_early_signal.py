"""`gputop --fake 1 --record FILE` sent SIGTERM 5 s after it started, on a loaded host where
Textual's start-up had not finished: the process died by the signal where it stood (status -15 to
its parent, no 143 of its own) and the recording was left "not closed cleanly", 0 s long. A stop
signal that comes before the app is up now ends it as soon as it is, the recording closed."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from pty_helper import PtyProcess

ROOT = Path(__file__).resolve().parents[1]

# gputop's command line (its argv[0] is named gputop, so start-up signals are held as in the
# console script) with Textual's start-up made slow, as on a loaded 2-core host.
SLOW_START = """
import sys, time
from gputop.ui import app as app_mod
real = app_mod.GputopApp.run
def slow(self, *a, **k):
    print("SLOW-START", file=sys.stderr, flush=True)
    time.sleep(6)
    return real(self, *a, **k)
app_mod.GputopApp.run = slow
from gputop.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_before_the_ui_is_up_ends_it_with_the_recording_closed(tmp_path, sig):
    from gputop.record.reader import Reader

    script = tmp_path / "gputop"
    script.write_text(SLOW_START)
    out = tmp_path / "early.gputop"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with PtyProcess([sys.executable, str(script), "--fake", "1", "-i", "0.5", "--record", str(out)], cols=100,
                    rows=30, env=env, cwd=str(tmp_path)) as p:
        p.wait_for("SLOW-START", timeout=60)
        time.sleep(3.5)  # past the start-up hold (3 s), before the app is mounted
        os.kill(p.pid, sig)
        assert p.wait(60) == 128 + sig, p.text[-3000:]
    assert not Path(f"{out}-wal").exists()
    with Reader(out) as r:
        assert r.state == "closed"
