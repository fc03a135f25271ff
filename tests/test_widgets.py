"""The UI's own widgets: line-diffing text, the process list and the tab bar."""

import random

from rich.cells import cell_len
from rich.console import Console
from rich.style import Style
from rich.text import Span, Text
from textual import events
from textual.app import App, ComposeResult

from gputop.ui.lines_view import LinesView, text_segments
from gputop.ui.proc_list import ProcList
from gputop.ui.tab_bar import TabBar

COLUMNS = (("pid", "PID", 6), ("user", "USER", 6), ("command", "COMMAND", 0))


def cells(segments):
    return [(ch, seg.style or Style.null()) for seg in segments for ch in seg.text]


def test_text_segments_match_rich_rendering_for_appended_and_overlapping_styles():
    console = Console(width=200)
    rnd = random.Random(7)
    styles = ["bold", "dim", "red", "bold red", "", "green on black", Style(italic=True), "reverse"]
    for _ in range(200):
        t = Text(style=rnd.choice(["", "bold", "on blue"]))
        for _ in range(rnd.randint(0, 8)):
            t.append("x" * rnd.randint(0, 5) + "█▏", style=rnd.choice(styles))
        if rnd.random() < 0.3 and t.plain:
            t.stylize("underline", 0, rnd.randint(1, len(t.plain)))  # overlaps: the fallback path
        t.truncate(rnd.randint(1, 40), overflow="ellipsis")
        # Reference: rich's renderer, with the text's own style as the lowest span (rich drops it
        # when a text has no spans; a status line in one style must keep it).
        ref = Text(t.plain, spans=[Span(0, len(t.plain), t.style)] + list(t.spans)) if t.style else t
        assert cells(text_segments(t, console)) == cells(ref.render(console, end="")), repr(t)


class LinesApp(App):
    def compose(self) -> ComposeResult:
        yield LinesView(id="lines")


async def test_lines_view_repaints_only_changed_lines():
    app = LinesApp()
    async with app.run_test(size=(40, 10)) as pilot:
        view = app.query_one(LinesView)
        view.set_lines([Text("a"), Text("b", style="bold"), Text("c")])
        await pilot.pause()
        assert view.plain == "a\nb\nc" and view.size.height == 3
        rendered = [view.render_line(y).text.rstrip() for y in range(3)]
        assert rendered == ["a", "b", "c"]
        view._dirty_regions.clear()
        view.set_lines([Text("a"), Text("B", style="bold"), Text("c")])
        assert {r.y for r in view._dirty_regions} == {1}  # only the changed line
        assert view._strips[0] is not None and view._strips[1] is None
        view._dirty_regions.clear()
        view.set_lines([Text("a"), Text("B", style="bold"), Text("c")])
        assert not view._dirty_regions  # nothing changed: nothing to repaint
        view.set_text(Text("one\ntwo\nthree\nfour"))
        await pilot.pause()
        assert view.size.height == 4  # a new line count lays out again


class ListApp(App):
    def __init__(self):
        super().__init__()
        self.selected = []

    def compose(self) -> ComposeResult:
        yield ProcList(COLUMNS, id="procs")

    def on_proc_list_selected(self, event: ProcList.Selected) -> None:
        self.selected.append(event.key)


def rows(n):
    keys = [f"{100 + i}:0" for i in range(n)]
    return keys, [(str(100 + i), "me", f"python job{i}.py") for i in range(n)]


async def test_proc_list_keys_scrolling_selection_and_a_stable_cursor():
    app = ListApp()
    async with app.run_test(size=(60, 8)) as pilot:
        plist = app.query_one(ProcList)
        plist.focus()
        plist.set_rows(*rows(20))
        await pilot.pause()
        assert plist.plain.splitlines()[0].split() == ["PID", "USER", "COMMAND"]
        assert plist.size.height == 8 and plist.cursor == 0
        await pilot.press("down", "down")
        assert plist.cursor == 2
        await pilot.press("end")
        assert plist.cursor == 19
        shown = plist.plain.splitlines()
        assert "job19.py" in shown[-1] and plist.top == 13  # scrolled so the cursor shows
        await pilot.press("pageup")
        assert plist.cursor == 13
        await pilot.press("home", "enter")
        assert app.selected == ["100:0"]
        # New data in another order: the cursor stays on the same process.
        await pilot.press("down")
        keys, cells = rows(20)
        plist.set_rows(list(reversed(keys)), list(reversed(cells)))
        assert plist.keys[plist.cursor] == "101:0"
        # A click on another row moves the cursor; a click on the cursor row selects it.
        plist.set_rows(*rows(3))
        await pilot.pause()
        await pilot.click(ProcList, offset=(2, 3))
        assert plist.cursor == 2
        await pilot.click(ProcList, offset=(2, 3))
        assert app.selected[-1] == "102:0"
        plist.post_message(events.MouseScrollUp(plist, 2, 2, 0, -1, 0, False, False, False))
        await pilot.pause()
        assert plist.cursor == 1  # the wheel moves the selection
        plist.post_message(events.MouseScrollDown(plist, 2, 2, 0, 1, 0, False, False, False))
        await pilot.pause()
        assert plist.cursor == 2
        plist.set_rows([], [])
        await pilot.pause()
        assert "(no processes)" in plist.plain


async def test_proc_list_cuts_long_cells_and_keeps_columns_aligned():
    app = ListApp()
    async with app.run_test(size=(30, 6)) as pilot:
        plist = app.query_one(ProcList)
        plist.set_rows(["1:0"], [("1", "averylongusername", "x" * 100)])
        await pilot.pause()
        line = plist.plain.splitlines()[1]
        assert len(line) == 30 and "averyl…" not in line and "avery…" in line
        assert line.startswith("     1 ")  # numbers right-aligned in their column
        # Wide characters count as two cells: the line still fills exactly the width.
        plist.set_rows(["2:0"], [("2", "用户", "python 训练/train.py " + "数" * 40)])
        await pilot.pause()
        line = plist.plain.splitlines()[1]
        assert cell_len(line) == 30 and line.endswith("…") and "用户" in line


class TabsApp(App):
    def __init__(self):
        super().__init__()
        self.changes = []

    def compose(self) -> ComposeResult:
        yield TabBar((("a", "Alpha"), ("b", "Beta")), "a", id="tabs")

    def on_tab_bar_changed(self, event: TabBar.Changed) -> None:
        self.changes.append(event.tab)


async def test_tab_bar_click_switches_and_reports():
    app = TabsApp()
    async with app.run_test(size=(40, 3)) as pilot:
        bar = app.query_one(TabBar)
        assert bar.plain.split() == ["1", "Alpha", "2", "Beta"]
        beta = bar.plain.index("2 Beta")
        await pilot.click(TabBar, offset=(beta + 1, 0))
        assert bar.active == "b" and app.changes == ["b"]
        await pilot.click(TabBar, offset=(beta + 1, 0))
        assert app.changes == ["b"]  # already active: no second message
