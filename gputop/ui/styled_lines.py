"""Turn the panes' plain (text, style-name) lines into Rich text with one style table per pane.

The formatting code stays free of Rich and Textual: it names styles, and this maps the names.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from rich.text import Text

Line = Sequence[tuple[str, str]]


def lines_to_text(lines: Sequence[Line], styles: Mapping[str, str]) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    for i, ln in enumerate(lines):
        if i:
            text.append("\n")
        for seg, style in ln:
            text.append(seg, styles.get(style, ""))
    return text
