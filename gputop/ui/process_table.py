"""The process table: every GPU process (or, without NVML, the busiest ones), sorted and
filtered as the user asks, the attached target highlighted."""

from __future__ import annotations

import os

from ..analysis import rank_map
from ..store import Store, StoreSnapshot
from ..present import COLUMNS, DESCENDING_BY_DEFAULT, SORT_KEYS, ProcRow, attachable, build_rows
from ..units import fmt_bytes, fmt_duration, fmt_pct, truncate
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
        self._shown: tuple | None = None  # (rows, target) last drawn; None: draw again
        self._view = None
        self._target: int | None = None
        self._me = _me()  # (this user's name, whether root): which rows can be attached to

    def on_mount(self) -> None:
        self._update_titles()

    def show(self, view, target: int | None) -> None:
        self._view, self._target = view, target
        rows = build_rows(view.gpu_processes(), view.procs_latest(), view.now, self.sort_key, self.sort_reverse,
                          self.filter_text, target, self._ranks(view) if target is not None else None)
        if self._shown == (rows, target):
            return
        self._rows, self._shown = rows, (rows, target)
        # The attached job stands out: its rows first, highlighted, its workers under it.
        self.set_rows([r.key for r in rows], [_cells(r, target) for r in rows],
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
        for key, title, _ in COLUMNS:
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


def _cells(r: ProcRow, target: int | None = None) -> tuple[str, ...]:
    command = r.command
    if r.job:
        label = "" if r.job == "job" else f"{r.job}  "
        command = ("● " if r.pid == target else "└ ") + label + command
    return (
        str(r.pid),
        truncate(r.user or "?", 10),
        "-" if r.gpu is None else str(r.gpu),
        fmt_bytes(r.gpu_mem),
        fmt_pct(r.sm),
        "n/a" if r.cpu is None else f"{r.cpu:.0f}",
        fmt_bytes(r.rss),
        fmt_duration(r.elapsed),
        command,
    )
