"""Sessions to a file and back: ``recorder.Recorder`` records a pipeline through
``writer.RecordWriter``, ``reader.Reader`` reads a recording by time (for ``report`` and the
replay), ``replay.ReplaySource`` plays a recording back as a session's source; ``schema``
describes the format."""

from __future__ import annotations

from .files import looks_like_recording, refuse_overwriting_recording
from .navigate import Navigator
from .reader import LOST_FINDINGS, Reader
from .recorder import Recorder
from .replay import ReplaySource, parse_position
from .sessions import session_spans, target_change, target_text
from .span import backfill_note
from .writer import OutputExists

__all__ = [
    "LOST_FINDINGS", "Navigator", "OutputExists", "Reader", "Recorder", "ReplaySource", "backfill_note",
    "looks_like_recording", "parse_position", "refuse_overwriting_recording", "session_spans", "target_change",
    "target_text",
]
