"""The process list: a header, one line per process, a cursor; htop-style keys.

Built on `LinesView`, so a tick that changes one process's CPU% repaints that one line; the
DataTable it replaced re-rendered every visible row and was the largest piece of gputop's CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len, set_cell_size
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message

from .lines_view import LinesView

# Column keys whose values read better right-aligned (numbers).
RIGHT_ALIGNED = {"pid", "gpu_mem", "sm", "cpu", "rss", "time"}


class ProcList(LinesView, can_focus=True):
    """Rows of cells under column titles; `Selected` is posted on Enter or a click on the cursor row."""

    BINDINGS = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(-1)", "Last", show=False),
        Binding("enter", "select", "Attach", show=False),
    ]

    COMPONENT_CLASSES = {"proc-list--header", "proc-list--even", "proc-list--cursor", "proc-list--cursor-blurred"}

    DEFAULT_CSS = """
    ProcList {
        height: auto;
        max-height: 100%;
        background: $surface;
        & > .proc-list--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        & > .proc-list--even {
            background: $surface-lighten-1 50%;
        }
        & > .proc-list--cursor {
            background: $block-cursor-background;
            color: $block-cursor-foreground;
            text-style: $block-cursor-text-style;
        }
        & > .proc-list--cursor-blurred {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
        }
        &:ansi > .proc-list--header {
            background: ansi_bright_blue;
            color: ansi_default;
        }
    }
    """

    class Selected(Message):
        def __init__(self, proc_list: ProcList, index: int, key: str) -> None:
            super().__init__()
            self.proc_list = proc_list
            self.index = index
            self.key = key

        @property
        def control(self) -> ProcList:
            return self.proc_list

    def __init__(
        self,
        columns: Sequence[tuple[str, str, int]],
        *,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.columns = tuple(columns)
        self.titles = {key: title for key, title, _ in self.columns}
        self.keys: list[str] = []
        self.cells: list[tuple[str, ...]] = []
        self.highlight: set[str] = set()  # row keys drawn in the highlight style (the attached job)
        self.cursor = 0
        self.top = 0
        # The cursor stays on its process as rows re-sort; where that process is gone it goes to
        # the first row ``default_row`` allows, until the user has moved it.
        self.user_moved = False
        self._styles: dict[str, Style] = {}  # component styles; Textual recomputes them per refresh

    # ------------------------------------------------------------------ data

    @property
    def row_count(self) -> int:
        return len(self.keys)

    def set_columns(self, columns: Sequence[tuple[str, str, int]]) -> None:
        """Draw these columns from now on (the rows' cells must follow them), keeping the titles
        already set for the keys that stay."""
        columns = tuple(columns)
        if columns == self.columns:
            return
        self.columns = columns
        self.titles = {key: self.titles.get(key, title) for key, title, _ in columns}
        self._redraw()

    def set_titles(self, titles: dict[str, str]) -> None:
        self.titles = {key: titles.get(key, title) for key, title, _ in self.columns}
        self._redraw()

    def set_rows(self, keys: Sequence[str], cells: Sequence[tuple[str, ...]], highlight: set[str] | None = None) -> None:
        """Replace the rows; the cursor stays on the same key while it exists; where it is gone (or
        before any row was shown) it goes to the first row ``default_row`` allows until the user
        has moved it."""
        selected = self.keys[self.cursor] if 0 <= self.cursor < len(self.keys) else None
        count_changed = len(keys) != len(self.keys)
        self.keys, self.cells = list(keys), [tuple(c) for c in cells]
        self.highlight = set(highlight or ())
        if selected in self.keys:
            # The row under the cursor stays under it as the table re-sorts, moved or not: a
            # cursor that followed whatever came on top had Enter attach to another user's
            # process that had just jumped above the user's job.
            self.cursor = self.keys.index(selected)
        elif not self.user_moved:
            self.cursor = self.default_row()
        self.cursor = max(0, min(self.cursor, len(self.keys) - 1))
        if count_changed:
            self.refresh(layout=True)  # the list is as tall as its rows
        self._redraw()

    # ------------------------------------------------------------------ cursor

    def default_row(self) -> int:
        """The row the cursor rests on before the user moves it: the top one."""
        return 0

    def move_cursor(self, row: int) -> None:
        if not self.keys:
            return
        self.user_moved = True
        self.cursor = max(0, min(row, len(self.keys) - 1))
        self._redraw()

    def action_move(self, step: int) -> None:
        self.move_cursor(self.cursor + step)

    def action_page(self, step: int) -> None:
        self.move_cursor(self.cursor + step * max(1, self._visible_rows() - 1))

    def action_jump(self, row: int) -> None:
        self.move_cursor(row if row >= 0 else len(self.keys) - 1)

    def action_select(self) -> None:
        if 0 <= self.cursor < len(self.keys):
            self.user_moved = True  # chosen: the cursor stays with it
            self.post_message(self.Selected(self, self.cursor, self.keys[self.cursor]))

    def on_click(self, event: events.Click) -> None:
        row = self.top + event.y - 1
        if event.y < 1 or not 0 <= row < len(self.keys):
            return
        if row == self.cursor:
            self.action_select()
        else:
            self.move_cursor(row)

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self.action_move(1)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self.action_move(-1)

    def on_focus(self) -> None:
        self._redraw()

    def on_blur(self) -> None:
        self._redraw()

    def on_resize(self) -> None:
        self._redraw()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._redraw()

    def _component_style(self, name: str) -> Style:
        style = self._styles.get(name)
        if style is None:
            style = self._styles[name] = self.get_component_rich_style(name)
        return style

    # ------------------------------------------------------------------ drawing

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return 1 + max(1, len(self.keys))

    def _visible_rows(self) -> int:
        height = self.size.height or (1 + len(self.keys))
        return max(1, height - 1)

    def _widths(self, width: int) -> list[int]:
        fixed = sum(w for _, _, w in self.columns if w) + len(self.columns) - 1
        rest = max(8, width - fixed)
        return [w or rest for _, _, w in self.columns]

    def _line(self, cells: Sequence[str], widths: list[int], width: int) -> str:
        # Widths in terminal cells, not characters: a CJK path or an emoji takes two.
        parts = []
        for (key, _, _), cell, w in zip(self.columns, cells, widths):
            cell = str(cell)
            n = cell_len(cell)
            if n > w:
                cell = set_cell_size(cell, w - 1) + "…" if w > 1 else set_cell_size(cell, w)
                n = w
            pad = " " * (w - n)
            parts.append(pad + cell if key in RIGHT_ALIGNED else cell + pad)
        return set_cell_size(" ".join(parts), width)

    def _redraw(self) -> None:
        if not self.is_mounted:
            return
        width = max(1, self.size.width)
        visible = self._visible_rows()
        # Keep the cursor on screen, scrolling as little as possible.
        if self.cursor < self.top:
            self.top = self.cursor
        elif self.cursor >= self.top + visible:
            self.top = self.cursor - visible + 1
        self.top = max(0, min(self.top, max(0, len(self.keys) - visible)))
        widths = self._widths(width)
        style = self._component_style
        lines = [Text(self._line([self.titles[k] for k, _, _ in self.columns], widths, width), style=style("proc-list--header"))]
        cursor_style = style("proc-list--cursor" if self.has_focus else "proc-list--cursor-blurred")
        even = style("proc-list--even")
        mark = Style(bold=True, color="cyan")
        for n in range(self.top, min(len(self.keys), self.top + visible)):
            text = Text(self._line(self.cells[n], widths, width))
            if n == self.cursor:
                text.stylize(cursor_style)
            else:
                if n % 2 == 0:
                    text.stylize(even)
                if self.keys[n] in self.highlight:
                    text.stylize(mark)
            lines.append(text)
        if not self.keys:
            lines.append(Text("(no processes)".ljust(width), style="dim"))
        self.set_lines(lines)
