"""Turn the panes' plain (text, style-name) lines into Rich text with one style table per pane.

The formatting code stays free of Rich and Textual: it names styles, and this maps the names.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from rich.text import Text

Line = Sequence[tuple[str, str]]


def lines_to_texts(lines: Sequence[Line], styles: Mapping[str, str], width: int | None = None) -> list[Text]:
    """One Rich text per line; with ``width``, longer lines end in an ellipsis."""
    out = []
    for ln in lines:
        text = Text(no_wrap=True, overflow="ellipsis")
        for seg, style in ln:
            text.append(seg, styles.get(style, ""))
        if width is not None:
            text.truncate(width, overflow="ellipsis")
        out.append(text)
    return out


def lines_to_text(lines: Sequence[Line], styles: Mapping[str, str]) -> Text:
    return Text("\n", no_wrap=True, overflow="ellipsis").join(lines_to_texts(lines, styles))
