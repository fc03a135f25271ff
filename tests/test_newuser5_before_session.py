"""A window that reaches back before the session (NVML's buffer of the GPU's utilisation, handed
to the first poll) says how much of it is from before: "over 44 s" on a 30 s session is not what
the session measured."""

from __future__ import annotations

from gputop.analysis.breakdown import Breakdown, Bucket
from gputop.model import GpuSample, UtilPoint
from gputop.present import advice_pane_lines, breakdown_table, session_start_in
from gputop.present.stacks import plain
from gputop.store import Store

T0 = 1_767_225_600.0


def _store(backfill_s: float = 14.0, seconds: int = 30) -> Store:
    st = Store()
    st.add([UtilPoint(T0 - backfill_s + 0.2 * k, 0, 50.0) for k in range(int((backfill_s + seconds) / 0.2))])
    st.add([GpuSample(T0 + k, 0, util_gpu=50.0) for k in range(seconds + 1)])
    return st


def _bd(t0: float, t1: float) -> Breakdown:
    return Breakdown(0, t0, t1, {Bucket.BUSY: (t1 - t0) / 2, Bucket.UNKNOWN: (t1 - t0) / 2}, attributed=False)


def test_the_session_starts_at_its_first_poll_inside_the_window():
    st = _store()
    bd = _bd(T0 - 14.0, T0 + 30.0)
    assert session_start_in(st, [bd]) == T0
    # A window that starts after the first poll has nothing from before the session.
    assert session_start_in(st, [_bd(T0 + 5.0, T0 + 30.0)]) is None


def test_advise_and_the_advisor_tab_say_how_much_predates_the_session():
    st = _store()
    bd = _bd(T0 - 14.0, T0 + 30.0)
    start = session_start_in(st, [bd])
    table = breakdown_table([bd], start)
    assert "over the last 44 s, 14 s of it from before the session (the GPU's buffer)" in table
    pane = plain(advice_pane_lines([], [bd], 100, attached=False, session_start=start))
    assert "last 44 s, 14 s of it from before the session" in pane
    # Without the note's cause, no note.
    assert "before the session" not in breakdown_table([_bd(T0, T0 + 30.0)], start)


def test_a_window_the_polls_do_not_reach_has_no_start_to_say():
    # The polls are all after the window (a breakdown of other times): nothing to say about it.
    assert session_start_in(_store(), [_bd(T0 - 1000.0, T0 - 900.0)]) is None


def test_a_session_older_than_the_window_has_nothing_before_it():
    # Polled every 2 s for 200 s: a window of the last 60 s starts between two polls, and none of
    # it predates the session (only the polls just before the window are looked at).
    st = Store()
    st.add([GpuSample(T0 + 2.0 * k, 0, util_gpu=50.0) for k in range(101)])
    assert session_start_in(st, [_bd(T0 + 139.0, T0 + 200.0)]) is None
