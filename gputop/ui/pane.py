"""What the tabs' panes share: one context a tick, and one way to hand it to them.

The app builds a ``PaneContext`` once per redraw from the session it was handed and gives it to
whichever pane is shown through the ``Pane`` protocol, so it calls every pane alike and no pane
reaches back into the app for the session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the store sits below the UI; only its type is named here
    from ..store import Store


@dataclass(frozen=True)
class PaneContext:
    """What a pane draws from: the store the derived stage published to, and the session's facts
    about the attached job that the store does not hold."""

    store: Store
    target_pid: int | None = None  # the attached job, None: nothing attached
    no_stacks: str | None = None  # why the job's stacks could not be sampled at attach
    # A cut recording's replay: what the cut took of its findings and of its stacks' frames
    # (``Session.findings_lost``, ``Session.frames_lost``).
    findings_lost: str | None = None
    frames_lost: str | None = None
    # GPU -> (tx, rx) NVLink bytes/s of the store's latest GPU samples (live and replay alike).
    nvlink_bps: Mapping[int, tuple[float, float]] | None = None


class Pane(Protocol):
    """A tab's pane: redraws from ``ctx`` when what it shows changed, else does nothing."""

    def update_view(self, ctx: PaneContext) -> None: ...
