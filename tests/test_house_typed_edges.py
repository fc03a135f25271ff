"""The house's typed edges: lists of the model's types that code dispatches on stay whole, and a
default repeated for a light import stays equal to the one it repeats."""

from __future__ import annotations

import dataclasses

import gputop.model as model
from gputop.record.recorder import TIMED


def test_every_model_type_with_its_own_time_is_cut_by_a_recording_s_stop_time():
    timed = {c for c in vars(model).values()
             if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == model.__name__
             and "ts" in {f.name for f in dataclasses.fields(c)}}
    assert timed == set(TIMED)


def test_the_exporter_s_light_default_window_is_the_advisor_s():
    from gputop.analysis import DEFAULT_WINDOW_S
    from gputop.export.config import DEFAULT_WINDOW_S as EXPORT_WINDOW_S

    assert float(EXPORT_WINDOW_S) == float(DEFAULT_WINDOW_S)
