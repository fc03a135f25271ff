"""The stacks pane widget, mounted in a small Textual app and fed a store the views stage
(gputop.analysis.views) published to."""

import json
import os

from textual.app import App

from gputop.ui.pane import PaneContext
from gputop.analysis.classify import classify, is_library
from gputop.analysis.views import ViewsStage
from gputop.sources.stacks import StackParser, native_dump
from gputop.present.stacks import plain
from gputop.store import Store
from gputop.ui.stacks_pane import StacksPane, to_text

T0 = 1_700_000_000.0
FIX = os.path.join(os.path.dirname(__file__), "fixtures", "stacks", "deadlock.json")


def publish_views(store, pid, stuck_after):
    """What a UI session's views stage publishes: the pane lays it out."""
    store.add(ViewsStage(store, pid, stuck_after).poll())


def deadlock_store(seconds=5.0):
    with open(FIX) as f:
        doc = json.load(f)
    parser = StackParser(lambda fn, ln: doc["source_lines"].get(f"{fn}:{ln}"), classify, is_library)
    store = Store()
    for i in range(int(seconds * 5) + 1):
        store.add(parser.samples(doc["dump"], T0 + i * 0.2))
    return store, doc["dump"][0]["pid"]


class Host(App):
    def __init__(self, pane):
        super().__init__()
        self.pane = pane

    def compose(self):
        yield self.pane


async def test_not_attached_says_how_to_attach():
    pane = StacksPane(id="stacks-pane")
    async with Host(pane).run_test(size=(100, 30)):
        pane.update_view(PaneContext(Store(), None))
        text = plain(pane.last_lines)
    assert "Not attached" in text and "gputop --pid PID" in text


async def test_stuck_job_shown_with_threshold_from_the_views_stage():
    store, pid = deadlock_store(5.0)
    publish_views(store, pid, 3.0)
    pane = StacksPane()
    async with Host(pane).run_test(size=(120, 40)):
        pane.update_view(PaneContext(store, pid))
        text = plain(pane.last_lines)
        rendered = pane.query_one("#stacks-body").plain
    assert "STUCK: PID" in text and "in mode_deadlock" in text
    assert "STUCK: PID" in rendered
    # Same store, default threshold (30 s): not stuck yet.
    store2, _ = deadlock_store(5.0)
    publish_views(store2, pid, 30.0)
    pane2 = StacksPane()
    async with Host(pane2).run_test(size=(120, 40)):
        pane2.update_view(PaneContext(store2, pid))
        assert "STUCK" not in plain(pane2.last_lines)


async def test_native_dump_failure_is_a_message_in_the_pane():
    gone = 4_000_000  # above Linux's pid_max: no such process
    pane = StacksPane(native_dump=native_dump)
    async with Host(pane).run_test(size=(120, 40)) as pilot:
        pane.update_view(PaneContext(Store(), gone))
        pane.request_native_dump(gone)
        assert "running py-spy dump --native" in plain(pane.last_lines)
        for _ in range(200):
            await pilot.pause(0.05)
            if "failed" in plain(pane.last_lines):
                break
        text = plain(pane.last_lines)
    assert f"Native dump of PID {gone} failed: no process with PID {gone}" in text


def test_styles_follow_segment_names():
    text = to_text([(("x", "project"), ("y", "cat.data-wait")), (("z", "unknown-style"),)])
    assert text.plain == "xy\nz"
    assert [str(sp.style) for sp in text.spans] == ["bold cyan", "red"]
