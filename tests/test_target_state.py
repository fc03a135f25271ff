"""The attached job's state is read in one typed form (the sampler's, else the session's reason),
and a failed attach is published through the pipeline, where a recording sees it too."""

from __future__ import annotations

import os

import pytest

from gputop.errors import UserError
from gputop.model import Event, TargetStatus
from gputop.pipeline import Pipeline
from gputop.session import Mode, Session
from gputop.sources.stacks import AttachError, PySpySource
from gputop.store import Store


def session(**kw) -> Session:
    store = Store()
    return Session(store=store, pipeline=Pipeline(store, []), **kw)


def test_nothing_attached_has_no_state_and_an_unsampleable_target_says_why():
    assert session().target_state is None
    s = session(target_pid=4242, attach_error="PID 4242 is not a Python process")
    state = s.target_state
    assert state is not None and state.status is TargetStatus.UNTRACEABLE
    assert state.pid == 4242 and state.reason == "PID 4242 is not a Python process"
    assert state.running_cost is None and state.exited_at is None


def test_the_samplers_state_follows_its_target(monkeypatch):
    def refuse(pid, pyspy, nonblocking, meter, nice=0):
        raise AttachError(f"PID {pid} is not a Python process", "not-python")

    monkeypatch.setattr("gputop.sources.stacks.dump_json", refuse)
    src = PySpySource(os.getpid(), pyspy="py-spy")
    s = session(target_pid=src.pid, stacks=src)
    assert s.target_state is not None and s.target_state.status is TargetStatus.ALIVE
    src.poll()
    state = s.target_state
    assert state is not None and state.status is TargetStatus.UNTRACEABLE and "not a Python process" in state.reason
    src.exited = 1060.0  # as _mark_exited leaves it
    state = s.target_state
    assert state is not None and state.status is TargetStatus.EXITED and state.exited_at == 1060.0
    assert state.running_cost is None


def test_a_failed_attach_is_published_through_the_pipeline():
    s = session(mode=Mode.REPLAY)
    seen: list[object] = []
    s.pipeline.subscribe(seen.extend)  # what a recorder would write
    with pytest.raises(UserError, match="a replay cannot attach"):
        s.attach(4242)
    events = [e for e in seen if isinstance(e, Event)]
    assert [(e.source, e.level) for e in events] == [("attach", "error")]
    assert events[0].message == "cannot attach to 4242: a replay cannot attach to a process"
    assert s.store.events()[-1] == events[0]


def test_a_target_read_as_python_before_is_not_called_not_python_when_it_ends(monkeypatch):
    """A job exiting while py-spy reads it fails as "not a Python process" (its interpreter is
    being torn down): after stacks were read from it, that is its end, not an untraceable target."""
    pid = os.getpid()
    dumps = [[{"pid": pid, "thread_id": 1, "thread_name": "MainThread", "os_thread_id": pid, "active": True,
               "owns_gil": True, "frames": [{"name": "main", "filename": "/home/u/train.py", "line": 3,
                                             "module": None}]}]]

    def dump(p, pyspy, nonblocking, meter, nice=0):
        if dumps:
            return dumps.pop()
        raise AttachError(f"PID {p} is not a Python process", "not-python")

    monkeypatch.setattr("gputop.sources.stacks.dump_json", dump)
    src = PySpySource(pid, pyspy="py-spy")
    s = session(target_pid=src.pid, stacks=src)
    first = src.poll()
    assert any(getattr(x, "pid", None) == pid for x in first)  # its stack was read
    src._retry_at = 0.0
    out = src.poll()
    assert not [e for e in out if isinstance(e, Event) and "not a Python process" in e.message]
    state = s.target_state
    assert state is not None and state.status is TargetStatus.ALIVE, state
