"""bench/replay_advise.py: a recording replayed through today's advisor, and its table."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import replay_advise  # noqa: E402


def test_a_real_recordings_replay_logs_each_top_with_its_severity_and_renders_its_row():
    r = replay_advise.replay(ROOT / "tests" / "fixtures" / "nccl" / "ad_ctr-h200x2.gputop")
    steps = [(t["top"], t["severity"]) for t in r["top_timeline"]]
    # launch-bound weighed (info: its rank 0 waits in backward) before host-sync names the cause
    assert ("launch-bound", "info") in steps and ("launch-bound", "warning") not in steps
    assert steps.index(("launch-bound", "info")) < steps.index(("host-sync", "warning"))
    md = replay_advise.markdown([r])
    row = next(line for line in md.splitlines() if line.startswith("| ad_ctr-h200x2.gputop"))
    assert "launch-bound (info) → 10 s: host-sync (warning)" in row


def test_a_change_of_severity_alone_is_a_step_of_the_timeline(monkeypatch):
    """The same finding going from warning to information is a change of what is shown."""
    from types import SimpleNamespace

    from gputop.model import Severity
    import gputop.report.rejudge as rejudge

    def shown(sev):
        return [SimpleNamespace(id="launch-bound", severity=sev, title="t", evidence=(), action="a")]

    evaluations = [(100.0, [], None), (101.0, shown(Severity.WARNING), None), (102.0, shown(Severity.WARNING), None),
                   (103.0, shown(Severity.INFO), None)]
    monkeypatch.setattr(rejudge, "judged", lambda reader, step: iter(evaluations))
    r = replay_advise.replay(ROOT / "tests" / "fixtures" / "nccl" / "ad_ctr-h200x2.gputop")
    steps = [(t["top"], t["severity"]) for t in r["top_timeline"]]
    assert steps == [(None, None), ("launch-bound", "warning"), ("launch-bound", "info")], r["top_timeline"]
