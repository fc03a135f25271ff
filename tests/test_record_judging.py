"""A recording keeps the settings its session's advisor judged with (the stuck threshold, the
window), and a report or replay judges it again with them: `advise --stuck-after 6 --record F`
called a job stuck at 6 s that `report F` judged at the default 30 s."""

from __future__ import annotations

import sqlite3

from gputop.record import Reader
from gputop.record.schema import judging_key
from gputop.record.writer import SessionMeta
from gputop.report.rejudge import judged


def _record(tmp_path, monkeypatch, stuck_after: float, window: float):
    from gputop.cli import main

    out = tmp_path / "r.gputop"
    assert main(["advise", "--fake", "1", "--interval", "0.5", "--duration", "1", "--json", "--record", str(out),
                 "--stuck-after", f"{stuck_after:g}s", "--window", f"{window:g}s"]) == 0
    return out


def test_the_session_keeps_its_judging_settings_and_the_rejudge_uses_them(tmp_path, monkeypatch):
    out = _record(tmp_path, monkeypatch, 6.0, 20.0)
    with Reader(out) as r:
        sid = r.sessions[-1]["id"]
        assert r.judging() == {sid: {"stuck_after": 6.0, "window": 20.0}}
        advisors = [adv for _, _, adv in judged(r, 1.0)]
    assert advisors and advisors[-1].stuck_after_s == 6.0 and advisors[-1].window_s == 20.0


def test_a_file_without_them_or_with_nonsense_is_judged_with_the_defaults(tmp_path, monkeypatch):
    from gputop.advisor.engine import Advisor

    out = _record(tmp_path, monkeypatch, 6.0, 20.0)
    with Reader(out) as r:
        sid = r.sessions[-1]["id"]
    conn = sqlite3.connect(out)
    conn.execute("UPDATE meta SET value = ? WHERE key = ?", ('{"stuck_after": -1, "window": "x"}', judging_key(sid)))
    conn.commit()
    conn.close()
    with Reader(out) as r:
        assert r.judging() == {sid: {}}
        adv = [a for _, _, a in judged(r, 1.0)][-1]
    assert adv.stuck_after_s == Advisor().stuck_after_s and adv.window_s == Advisor().window_s
    assert SessionMeta().stuck_after is None  # a writer told nothing keeps nothing


def test_the_replay_session_judges_with_the_recorded_settings(tmp_path, monkeypatch):
    from gputop.session import open_replay

    out = _record(tmp_path, monkeypatch, 6.0, 20.0)
    session = open_replay(out)
    try:
        assert session.stuck_after == 6.0 and session.window == 20.0
    finally:
        session.pipeline.stop()
