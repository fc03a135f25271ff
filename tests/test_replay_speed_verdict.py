"""A replay reaches the verdict that `advise` and a 1x replay reach, whatever its speed: at 60x a
minute of data passes between the advisor's evaluations, and a cause first seen at the last one
stayed "confirming" at the file's end (new user: the ViT validating every step)."""

from __future__ import annotations

from pathlib import Path

from gputop.advisor.engine import AdvisorSource
from gputop.record import Reader
from gputop.model import Verdict
from gputop.store import Store

RECORDING = Path(__file__).parent / "fixtures" / "recordings" / "cpu-evalstep.gputop"  # a new user's CPU job


def _shown(step_s: float, first_s: float | None = None) -> set[str]:
    """The findings shown at the file's end, the advisor evaluated once per ``step_s`` of data
    (after a first tick of ``first_s``: a replay's first tick at attach delivers a little)."""
    with Reader(RECORDING) as reader:
        target = (reader.sessions[-1] if reader.sessions else {}).get("target_pid")
        store = Store()
        src = AdvisorSource(store, target_pid=target)
        t0 = t = reader.start_ts
        store.add(reader.samples(t0 - 3600.0, t0))
        verdict = None
        first = True
        while t < reader.end_ts:
            nxt = min(reader.end_ts, t + (first_s if first and first_s else step_s))
            first = False
            store.add(reader.samples(t, nxt))
            t = nxt
            verdict = next(x for x in src.poll() if isinstance(x, Verdict))
        return {f.id for f in verdict.findings}


def test_a_fast_replay_ends_on_the_verdict_a_slow_one_reaches():
    slow = _shown(1.0)
    assert "eval-every-step" in slow
    assert _shown(60.0) == slow
    # a first tick of 3 s (too little for the cause), then the rest of the file in one tick of 60x
    assert _shown(60.0, first_s=3.0) == slow


async def test_the_ui_replaying_at_60x_ends_on_the_confirmed_finding():
    """The same file in the UI at 60x, as the new user saw it: the verdict line at the end."""
    from gputop.session import open_replay
    from gputop.ui.app import GputopApp

    session = open_replay(RECORDING, speed=60.0, views=True)
    app = GputopApp(session, interval=2.0)
    session.pipeline.start()
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.pause(3.0)
            app.tick(force=True)
            await pilot.pause(0.3)
            shown = {f.id for f in session.store.findings()}
            assert "eval-every-step" in shown, shown
    finally:
        session.pipeline.stop()
