"""`gputop export --pid PID`: after the job exited, the exporter still published
gputop_job_info{pid=PID,attached="1"} for as long as it ran (80 s after the exit and on), as if
the job were still there and sampled."""

from __future__ import annotations

from types import SimpleNamespace

from gputop.export.server import _attached
from gputop.model import TargetState, TargetStatus


def _session(state: TargetState | None, pid: int = 4321):
    return SimpleNamespace(target_pid=pid, stacks=object() if state else None, target_state=state, job=None)


def test_a_running_target_is_attached():
    assert _attached(_session(TargetState(4321)), None)() == {4321}


def test_a_target_that_exited_is_attached_no_more():
    gone = TargetState(4321, status=TargetStatus.EXITED, exited_at=1000.0, exit_status="code 0")
    assert _attached(_session(gone), None)() == set()


def test_a_target_without_a_sampler_is_not_attached():
    assert _attached(_session(None), None)() == set()


def test_attach_all_pids_stay():
    attacher = SimpleNamespace(pids=lambda: [7, 8])
    gone = TargetState(4321, status=TargetStatus.EXITED, exited_at=1000.0)
    assert _attached(_session(gone), attacher)() == {7, 8}
