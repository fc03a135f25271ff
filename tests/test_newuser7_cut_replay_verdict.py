"""A replay of a cut copy whose findings and frames the cut took: `info` and `report` said the
findings were "lost in the cut", while the replay's verdict line said "no findings: nothing costs
the job a visible share of its time", and its Stacks tab showed `<no Python frames>` as the job's
hottest frame. The replay now says what the cut took, as info and the report do."""

from __future__ import annotations

import asyncio
import time
from unittest import mock

import pytest

from gputop.present.advice import verdict_line
from gputop.record.reader import Reader
from gputop.record.writer import RecordWriter, SessionMeta
from synth_recording import SyntheticSession

T0 = 1_767_225_600.0


class _Healthy(SyntheticSession):
    """A job whose GPU is always busy: the replay's advisor finds nothing to name."""

    def util_at(self, t: float) -> float:
        return float(self.rng.choice((97, 98, 99, 100)))


@pytest.fixture(scope="module")
def cut(tmp_path_factory):
    """A copy cut where the findings and the frames are lost and stack samples survive."""
    folder = tmp_path_factory.mktemp("cutverdict")
    whole = folder / "whole.gputop"
    w = RecordWriter.create(whole)
    with mock.patch("gputop.record.writer.time.time", return_value=T0):
        w.start_session(SessionMeta(mode="fake", target_pid=4_194_300, interval=1.0))
    for batch in _Healthy(t0=T0, checkpoint_every_s=1e9).seconds(60):
        w.flush(batch)
    w.finish()
    data = whole.read_bytes()
    for kb in range(32, len(data) // 1024, 4):
        p = folder / f"cut{kb}.gputop"
        p.write_bytes(data[: kb * 1024])
        with Reader(p) as r:
            if r.lost("findings") == "lost" and r.lost("frames") == "lost" and r.lost("stacks") != "lost":
                return p
    pytest.fail("no cut of the synthetic recording loses its findings and frames but keeps stacks")


def _plain(lines) -> str:
    return "\n".join("".join(seg for seg, _ in ln) for ln in lines)


async def _replay_screens(path) -> tuple[str, str, str]:
    """The verdict line, the Advisor tab and the Stacks tab of ``gputop replay PATH --speed 20``."""
    from gputop.session import open_replay
    from gputop.ui.app import GputopApp

    session = open_replay(path, speed=20, views=True)  # as `gputop replay` opens it
    app = GputopApp(session, interval=session.interval)
    session.start()
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            deadline = time.monotonic() + 30
            # Until the advisor has judged (past "collecting evidence") and the Stacks tab's view is in.
            while (not session.store.verdict_target()[0] or session.store.collecting() is not None
                   or session.store.pane_views() is None):
                assert time.monotonic() < deadline, "the replay's advisor never published"
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)
            await pilot.pause()
            verdict = app.query_one("#verdict").text.plain
            panes = []
            for key, pane_id in (("2", "#advisor-pane"), ("3", "#stacks-pane")):
                await pilot.press(key)
                await pilot.pause()
                pane = app.query_one(pane_id)
                pane.update_view(app.pane_context())
                panes.append(_plain(pane.last_lines))
            return verdict, panes[0], panes[1]
    finally:
        session.stop()


def test_the_replay_of_a_cut_says_its_findings_and_frames_were_lost(cut):
    verdict, advisor, stacks = asyncio.run(_replay_screens(cut))
    assert "lost in the cut" in verdict and "nothing costs" not in verdict, verdict
    assert "the recorded ones were lost in the cut" in advisor and "nothing costs" not in advisor, advisor
    assert "frames were lost in the cut" in stacks, stacks
    assert "<no Python frames>" not in stacks and "(no Python frames)" not in stacks, stacks


def test_a_whole_recording_and_a_live_job_keep_their_words():
    assert verdict_line([], 100)[0][0] == "no findings: nothing costs the job a visible share of its time"
    assert verdict_line([], 100, findings_lost="partly")[0][0].endswith("(more may have been lost in the cut)")
