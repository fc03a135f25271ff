"""The process table: every GPU process (or, without NVML, the busiest ones), sorted and
filtered as the user asks, the attached target highlighted."""

from __future__ import annotations

import os

from ..analysis import rank_map
from ..store import Store, StoreSnapshot
from ..present import (
    COLUMNS, DESCENDING_BY_DEFAULT, SORT_KEYS, ProcRow, attachable, build_rows, row_cells, table_columns,
)
from .gpu_panels import job_memory
from .proc_list import ProcList


class ProcessTable(ProcList):
    """A ProcList that knows its rows: ``show(view, target)`` on each redraw, ``sort_by`` /
    ``invert`` / ``set_filter`` for the user's intents, ``selected`` for Enter."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(COLUMNS, id=id, classes=classes)
        self.sort_key = "gpu_mem"
        self.sort_reverse = False
        self.filter_text = ""
        self._rows: list[ProcRow] = []
        self._shown: tuple | None = None  # (rows, target, columns) last drawn; None: draw again
        self._view = None
        self._target: int | None = None
        self._me = _me()  # (this user's name, whether root): which rows can be attached to

    def on_mount(self) -> None:
        self._update_titles()

    def on_resize(self) -> None:
        # Which columns fit depends on the width: lay the rows out again for the new one.
        # (ProcList's handler redraws as well: Textual calls each class's in the MRO.)
        self._shown = None
        if self._view is not None:
            self.show(self._view, self._target)

    def show(self, view, target: int | None) -> None:
        self._view, self._target = view, target
        # The workers' private memory from the memory view the job stage published (paused: the
        # paused moment's).
        rows = build_rows(view.gpu_processes(), view.procs_latest(), view.now, self.sort_key, self.sort_reverse,
                          self.filter_text, target, self._ranks(view) if target is not None else None,
                          memory=job_memory(view, target))
        columns = table_columns(rows, self.size.width or (self.app.size.width if self.is_attached else 0) or 80)
        if self._shown == (rows, target, columns):
            return
        self._rows, self._shown = rows, (rows, target, columns)
        if columns != self.columns:
            self.set_columns(columns)
            self._update_titles()  # a column back in sight keeps its sort arrow
        # The attached job stands out: its rows first, highlighted, its workers under it.
        self.set_rows([r.key for r in rows], [row_cells(r, columns) for r in rows],
                      highlight={r.key for r in rows if r.job})

    @staticmethod
    def _ranks(view: Store | StoreSnapshot) -> dict[int, int]:
        # A paused display's snapshot keeps no events: its rows name no ranks until it resumes.
        return rank_map(view.events()) if isinstance(view, Store) else {}

    def default_row(self) -> int:
        """Before the user moves the cursor: the top row gputop can attach to (not init, not a
        process of another user, not gputop itself), the top row where none is."""
        name, root = self._me
        return next((i for i, r in enumerate(self._rows) if attachable(r, name, root, os.getpid())), 0)

    @property
    def rows(self) -> list[ProcRow]:
        """The rows shown, in their order."""
        return list(self._rows)

    @property
    def selected(self) -> ProcRow | None:
        if not self._rows or not 0 <= self.cursor < len(self._rows):
            return None
        return self._rows[self.cursor]

    # ----------------------------------------------------------------- intents

    def sort_by(self, key: str) -> None:
        if key == self.sort_key:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_key, self.sort_reverse = key, False
        self._reshow()

    def sort_step(self, step: int) -> None:
        i = SORT_KEYS.index(self.sort_key)
        self.sort_by(SORT_KEYS[(i + step) % len(SORT_KEYS)])

    def invert(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._reshow()

    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip()
        self._reshow()

    def _reshow(self) -> None:
        self._update_titles()
        self._shown = None
        if self._view is not None:
            self.show(self._view, self._target)

    def _update_titles(self) -> None:
        titles = {}
        for key, title, _ in (c for c in COLUMNS if c[0] in self.titles):
            descending = (key in DESCENDING_BY_DEFAULT) != self.sort_reverse
            titles[key] = title + ((" ▼" if descending else " ▲") if key == self.sort_key else "")
        self.set_titles(titles)


def _me() -> tuple[str | None, bool]:
    """This process's user name (None: unknown) and whether it is root."""
    try:
        import pwd

        uid = os.geteuid()
        return pwd.getpwuid(uid).pw_name, uid == 0
    except (ImportError, KeyError, AttributeError, OSError):
        return None, False

