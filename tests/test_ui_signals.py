"""The live UI recording when SIGTERM or SIGHUP arrives (a scheduler's kill, an SSH drop): it
ends like `q`, and the recording is left as one complete file with nothing beside it."""

import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gputop.record.reader import Reader
from pty_helper import PtyProcess

ROOT = Path(__file__).resolve().parents[1]


SIGNALS = [signal.SIGTERM, signal.SIGHUP]


def _session_ended_by(sig: int, folder: Path) -> tuple[int, str, Path]:
    """A live session with --record, ended by ``sig`` after a few polls: (exit status, what it
    printed, the recording)."""
    path = folder / "ui.gputop"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "gputop", "--fake", "1", "--interval", "0.5", "--record", str(path)]
    with PtyProcess(argv, cols=100, rows=30, env=env, cwd=str(folder)) as p:
        p.wait_for("RECORDING", timeout=30)
        time.sleep(2.0)  # a few polls recorded
        os.kill(p.pid, sig)
        code = p.wait(15)
        return code, p.text, path


@pytest.fixture(scope="module")
def ended(tmp_path_factory):
    """One session per signal, run side by side (each mostly waits on its fake GPU's polls):
    signal -> a future of ``_session_ended_by``."""
    pool = ThreadPoolExecutor(max_workers=len(SIGNALS))
    try:
        yield {sig: pool.submit(_session_ended_by, sig, tmp_path_factory.mktemp(f"sig{int(sig)}")) for sig in SIGNALS}
    finally:
        pool.shutdown(wait=True)


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", SIGNALS)
def test_the_ui_closes_its_recording_on_a_signal(sig, ended):
    code, text, path = ended[sig].result()
    assert "Traceback" not in text
    assert code == 128 + sig
    assert path.exists()
    assert not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()
    with Reader(path) as r:
        assert r.end_ts > r.start_ts
        assert r.samples(r.start_ts - 60, r.end_ts + 1)
