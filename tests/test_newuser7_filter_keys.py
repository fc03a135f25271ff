"""`/` and a word typed in one burst (a paste, a fast typist: `/secret` in one write) opened the
filter box empty, and the word's keys went to the app: the `r` of "secret" started a recording
(a gputop-DATE.gputop file). The filter box now takes the focus at once, and a key already on its
way to the widget focused before it is typed into the filter."""

from __future__ import annotations

import pytest
from textual import events
from textual.widgets import Input

from gputop.ui.app import GputopApp
from gputop.ui.process_table import ProcessTable
from test_ui import feed, make_session


async def _burst(pilot, keys: list[tuple[str, str]]) -> None:
    """The keys as one terminal write delivers them: queued together, none handled before the
    next arrives (``pilot.press`` waits for the app to go idle after each key)."""
    for key, char in keys:
        pilot.app._driver.send_message(events.Key(key, char))
    for _ in range(3):
        await pilot.pause()


@pytest.mark.parametrize("word", ["secret", "record", "python"])
async def test_a_word_typed_right_after_slash_goes_to_the_filter(clock, tmp_path, monkeypatch, word):
    monkeypatch.chdir(tmp_path)  # where `r` would write its recording
    s = make_session(clock, gpus=4)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    try:
        async with app.run_test(size=(140, 45)) as pilot:
            await _burst(pilot, [("slash", "/")] + [(c, c) for c in word])
            box = app.query_one("#filter", Input)
            assert box.has_focus and box.value == word
            assert app.query_one(ProcessTable).filter_text == word  # and the table is filtered by it
            assert s.recorder is None and not list(tmp_path.iterdir())  # no recording started
            assert app.active_tab == "processes" and not app.paused  # no other key acted
    finally:
        if s.recorder is not None:
            s.stop_recording()


async def test_keys_typed_slowly_still_act_once_the_filter_is_closed(clock, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = make_session(clock, gpus=4)
    feed(s, clock)
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.press("slash", *"bench", "escape")
        assert not app.query_one("#filter", Input).has_focus
        await pilot.press("p")  # an app key again
        assert app.paused
