"""A block of styled text lines that repaints only the lines whose text changed.

A `Static` turns its whole text into a `Content` and re-renders every line of it on each update;
for panels that change a few numbers every tick that was most of gputop's own CPU. Here each
line is a rich `Text`, rendered to a `Strip` once, and an update marks only the changed lines
dirty, so the compositor repaints (and writes to the terminal) just those.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from ..units import word_cut


def same_text(a: Text, b: Text) -> bool:
    return a.plain == b.plain and a.spans == b.spans and a.style == b.style


_NULL = Style.null()


def text_segments(text: Text, console: Console) -> list[Segment]:
    """A line's segments. Panels append styled runs one after another, which needs no style
    stack: walking the spans in order is several times cheaper than `Text.render`."""
    spans = text.spans
    plain = text.plain
    pos = 0
    for start, end, _ in spans:
        if start < pos or end < start:
            return list(text.render(console, end=""))  # overlapping spans: rich resolves them
        pos = end
    get_style = console.get_style
    base = get_style(text.style) if text.style else _NULL
    segments = []
    pos = 0
    for start, end, style in spans:
        if start > pos:
            segments.append(Segment(plain[pos:start], base))
        if end > start:
            st = style if isinstance(style, Style) else get_style(style, default=_NULL)
            segments.append(Segment(plain[start:end], base + st if base is not _NULL else st))
        pos = end
    if pos < len(plain):
        segments.append(Segment(plain[pos:], base))
    return segments


class LinesView(Widget):
    """Lines of rich text, as tall as they are; wider lines are cropped, not wrapped. With
    ``cut_words`` a wider line ends at its last whole word and an ellipsis instead: a sentence
    (an event on the status line) cropped mid-word reads as whole, or as a different word."""

    DEFAULT_CSS = """
    LinesView {
        height: auto;
    }
    """

    def __init__(self, text: Text | str = "", *, id: str | None = None, classes: str | None = None,
                 cut_words: bool = False) -> None:
        super().__init__(id=id, classes=classes)
        self._cut_words = cut_words
        self._lines: list[Text] = []
        self._strips: list[Strip | None] = []
        self._strip_width = -1
        self._base_style: Style | None = None  # computed from the CSS of every ancestor: not cheap
        if text:
            self.set_text(text)

    # ------------------------------------------------------------------ content

    @property
    def text(self) -> Text:
        """Everything shown, as one text (what a test or a screen reader would read)."""
        return Text("\n").join(self._lines)

    @property
    def plain(self) -> str:
        return "\n".join(line.plain for line in self._lines)

    def set_text(self, text: Text | str) -> None:
        if isinstance(text, str):
            text = Text(text)
        self.set_lines(text.split("\n", allow_blank=True) if text.plain else [])

    def set_lines(self, lines: Sequence[Text]) -> None:
        old = self._lines
        if len(lines) != len(old):
            self._lines = list(lines)
            self._strips = [None] * len(lines)
            self.refresh(layout=True)
            return
        changed = [y for y, (a, b) in enumerate(zip(old, lines)) if not same_text(a, b)]
        if not changed:
            return
        self._lines = list(lines)
        for y in changed:
            self._strips[y] = None
        width = max(1, self.size.width)
        self.refresh(*(Region(0, y, width, 1) for y in changed))

    # ------------------------------------------------------------------ rendering

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return max((line.cell_len for line in self._lines), default=0)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self._base_style
        if width != self._strip_width or base is None:
            self._strip_width = width
            self._strips = [None] * len(self._lines)
            base = self._base_style = self.rich_style
        if not 0 <= y < len(self._lines):
            return Strip.blank(width, base)
        strip = self._strips[y]
        if strip is None:
            line = self._lines[y]
            if self._cut_words and line.cell_len > width:
                line = cut_line(line, width)
            segments = text_segments(line, self.app.console)
            strip = Strip(segments).apply_style(base).crop_extend(0, width, base)
            self._strips[y] = strip
        return strip

    def notify_style_update(self) -> None:
        # A class change (theme, warning colour) changes the base style every strip was made with.
        super().notify_style_update()
        self._base_style = None


def cut_line(line: Text, width: int) -> Text:
    """``line`` ended at its last whole word that fits ``width``, then an ellipsis (styled as the
    text it follows)."""
    k = word_cut(line.plain, width)
    out = line[:k]
    out.append("…")
    return out
