"""`advise` says how the watched job ended, from the sampler's reading of its exit status."""

from types import SimpleNamespace

import pytest

from gputop.commands.advise import _target_exited, exit_words
from gputop.model import TargetState, TargetStatus


def _session(exited_at, status):
    return SimpleNamespace(target_state=TargetState(101, TargetStatus.EXITED, exited_at=exited_at, exit_status=status))


@pytest.mark.parametrize("status, says", [
    ("code 1", "the target exited with status 1 (an error) after 12 s"),
    ("code 0", "the target exited with status 0 (success) after 12 s"),
    ("signal SIGKILL", "the target was killed by SIGKILL after 12 s"),
])
def test_a_known_exit_status_is_said(status, says):
    assert _target_exited(_session(1012.0, status), 1000.0) == says


def test_an_unknown_one_is_said_to_be_unknown_not_left_out():
    text = _target_exited(_session(1012.0, None), 1000.0)
    assert text.startswith("the target exited after 12 s (exit status unknown")


def test_a_running_target_gives_nothing():
    assert _target_exited(SimpleNamespace(target_state=TargetState(101)), 1000.0) is None
    assert _target_exited(SimpleNamespace(target_state=None), 1000.0) is None
    assert exit_words("code 2") == "exited with status 2 (an error)"
