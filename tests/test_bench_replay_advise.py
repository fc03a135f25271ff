"""bench/replay_advise.py: a recording replayed through today's advisor, and its table."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import replay_advise  # noqa: E402


def test_a_real_recordings_replay_logs_severity_changes_and_renders_its_row():
    r = replay_advise.replay(ROOT / "tests" / "fixtures" / "nccl" / "ad_ctr-h200x2.gputop")
    steps = [(t["top"], t["severity"]) for t in r["top_timeline"]]
    # launch-bound's warning gives way to what it weighs (info) before host-sync names the cause
    assert ("launch-bound", "warning") in steps and ("launch-bound", "info") in steps
    assert steps.index(("launch-bound", "info")) < steps.index(("host-sync", "warning"))
    md = replay_advise.markdown([r])
    row = next(line for line in md.splitlines() if line.startswith("| ad_ctr-h200x2.gputop"))
    assert "launch-bound (warning) → 4 s: launch-bound (info)" in row and "host-sync (warning)" in row
