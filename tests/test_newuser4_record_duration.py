"""`record --duration` records what was asked: `--duration 1s` at the default 2 s polls recorded
0:00:02 (the poll that closes the file, taken after the end, was written whole)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from gputop.record.reader import Reader

ROOT = Path(__file__).resolve().parents[1]


def test_a_one_second_recording_at_two_second_polls_lasts_one_second(tmp_path):
    out = tmp_path / "one.gputop"
    res = subprocess.run(
        [sys.executable, "-m", "gputop", "record", "--fake", "1", "--interval", "2", "--duration", "1s", "-o", str(out)],
        capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert res.returncode == 0, res.stderr
    # Said to the tenth (0.7 to 1.0 s), not rounded to a whole second.
    assert re.search(r"recorded (0\.[789]|1\.0) s ", res.stderr), res.stderr
    with Reader(out) as r:
        # Ends at the last 200 ms utilisation point up to the asked end: within one of them.
        assert 0.7 <= r.duration <= 1.0 + 1e-3
        assert r.gpu_samples(r.start_ts - 1, r.end_ts)  # the first poll is there
        assert not r.gpu_samples(r.end_ts, r.end_ts + 60)  # nothing past the end
        d = r.describe()
    assert d["duration_s"] == r.duration  # what `info` prints
