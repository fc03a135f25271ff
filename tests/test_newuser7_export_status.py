"""`gputop export` exited 0 on SIGTERM where `record` and `advise` exit 143 (128 + SIGTERM): a
scheduler or `timeout` could not tell it was stopped. It now exits 143 on SIGTERM (systemd's unit
says 143 is a clean stop) and 0 on Ctrl-C, as they do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 0)])
def test_export_stops_with_the_status_record_and_advise_give(sig, status):
    p = subprocess.Popen([sys.executable, "-m", "gputop", "export", "--fake", "1", "--listen", "127.0.0.1:0",
                          "--interval", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        line = p.stderr.readline()
        assert "serving http://127.0.0.1:" in line, line
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == status, err
    assert "Traceback" not in err and "gputop export: stopped" in err


def test_the_systemd_unit_takes_143_as_a_clean_stop():
    unit = (ROOT / "deploy" / "systemd" / "gputop-export.service").read_text()
    assert "SuccessExitStatus=143" in unit
