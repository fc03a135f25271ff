"""A scrolling pane of formatted lines: what the Advisor and Stacks panes have in common.

The formatting modules produce plain (text, style-name) lines; a pane maps the names to Rich
styles with its own table and shows them in a `LinesView`, so only changed lines repaint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget

from .lines_view import LinesView
from .styled_lines import Line, lines_to_texts

MIN_TEXT_WIDTH = 40  # the formatters' narrowest layout; a narrower pane crops


class LinesPane(Widget):
    DEFAULT_CSS = """
    LinesPane { height: 1fr; }
    LinesPane > VerticalScroll { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
    """
    # Padding (left and right) and the vertical scrollbar: lines are laid out for what remains,
    # scrollbar or not, so a scrollbar appearing never cuts the last column of text.
    CHROME = 2 + 1

    STYLES: Mapping[str, str] = {}  # style name -> Rich style, per pane
    BODY_ID = "pane-body"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._last: tuple | None = None
        self.last_lines: Sequence[Line] = []  # what is shown, for tests and screenshots

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield LinesView(id=self.BODY_ID)

    @property
    def text_width(self) -> int:
        """The width the formatters lay lines out for (the pane less its padding)."""
        return max(MIN_TEXT_WIDTH, self.size.width - self.CHROME)

    def show(self, lines: Sequence[Line]) -> None:
        self.last_lines = lines
        self.query_one(LinesView).set_lines(lines_to_texts(lines, self.STYLES, max(1, self.size.width - self.CHROME)))
