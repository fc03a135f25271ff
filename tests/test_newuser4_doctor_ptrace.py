"""`gputop doctor` always has a ptrace line: where the kernel has no Yama
(/proc/sys/kernel/yama/ptrace_scope missing) it said nothing about attaching."""

from __future__ import annotations

import pytest

from gputop.commands import doctor
from gputop.sources import attach_policy
from gputop.sources import pyspy_permissions
from gputop.sources.pyspy_permissions import PtraceFacts


@pytest.mark.parametrize("cap", [True, False])
def test_doctor_says_what_governs_attaching_without_yama(monkeypatch, cap):
    facts = PtraceFacts(euid=1000, target_uid=1000, ptrace_scope=None, cap_sys_ptrace=cap, exe_readable=True)
    monkeypatch.setattr(pyspy_permissions, "ptrace_facts", lambda pid: facts)
    monkeypatch.setattr("gputop.sources.ptrace_facts", lambda pid: facts)
    lines = {name: (ok, detail) for name, ok, detail in doctor.ptrace_checks()}
    ok, detail = lines["ptrace"]
    assert ok and "no Yama" in detail
    if cap:
        assert "with CAP_SYS_PTRACE" in detail and "any process" in detail
    else:
        # Same user allowed; another user's needs root or the capability; a container's seccomp.
        assert "own processes" in detail and "CAP_SYS_PTRACE" in detail and "seccomp" in detail


@pytest.mark.parametrize("scope, cap, euid, ok, words", [
    (0, False, 1000, True, "own processes"),
    (1, False, 1000, False, "only to its own children"),
    (1, True, 0, True, "any process"),
    (2, False, 0, False, "only CAP_SYS_PTRACE may attach"),  # root in a container without the capability
    (3, True, 0, False, "until a reboot"),
])
def test_the_yama_scopes_are_judged_with_the_capability(scope, cap, euid, ok, words):
    got, detail = attach_policy(scope, cap, euid)
    assert got is ok and words in detail and f"ptrace_scope={scope}" in detail
