"""One line of tab titles. The app shows the matching pane; a click posts `Changed`.

A single line instead of Textual's TabbedContent: that widget brings about ten containers, and
every one of them is repainted whenever the process list below it changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual import events
from textual.message import Message

from .lines_view import LinesView


class TabBar(LinesView):
    COMPONENT_CLASSES = {"tab-bar--active", "tab-bar--inactive"}

    DEFAULT_CSS = """
    TabBar {
        height: 1;
        background: $panel;
        & > .tab-bar--active {
            color: $accent;
            text-style: bold underline;
        }
        & > .tab-bar--inactive {
            color: $text-muted;
        }
    }
    """

    class Changed(Message):
        def __init__(self, tab_bar: TabBar, tab: str) -> None:
            super().__init__()
            self.tab_bar = tab_bar
            self.tab = tab

        @property
        def control(self) -> TabBar:
            return self.tab_bar

    def __init__(self, tabs: Sequence[tuple[str, str]], active: str, *, id: str | None = None) -> None:
        """``tabs``: (name, title) pairs, in order."""
        super().__init__(id=id)
        self.tabs = tuple(tabs)
        self._active = active
        self._ranges: list[tuple[int, int, str]] = []

    @property
    def active(self) -> str:
        return self._active

    @active.setter
    def active(self, tab: str) -> None:
        if tab not in {name for name, _ in self.tabs}:
            raise ValueError(f"no tab {tab!r}")
        self._active = tab
        self._redraw()

    def set_tabs(self, tabs: Sequence[tuple[str, str]]) -> None:
        """Show another set of tabs (a tab that appears with what it shows); the active one stays
        if it is still there, else the first is."""
        self.tabs = tuple(tabs)
        if self._active not in {name for name, _ in self.tabs}:
            self._active = self.tabs[0][0]
        self._redraw()

    def on_mount(self) -> None:
        self._redraw()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._redraw()

    def on_click(self, event: events.Click) -> None:
        for start, end, name in self._ranges:
            if start <= event.x < end:
                if name != self._active:
                    self.active = name
                    self.post_message(self.Changed(self, name))
                return

    def _redraw(self) -> None:
        if not self.is_mounted:
            return
        active = self.get_component_rich_style("tab-bar--active")
        inactive = self.get_component_rich_style("tab-bar--inactive")
        line = Text(" ")
        self._ranges = []
        for n, (name, title) in enumerate(self.tabs, 1):
            label = f" {n} {title} "
            start = line.cell_len
            line.append(label, style=active if name == self._active else inactive)
            self._ranges.append((start, line.cell_len, name))
            line.append(" ")
        self.set_lines([line])
