"""May this process read another's stacks? The facts that decide it (the user, /proc/PID/exe,
kernel.yama.ptrace_scope, CAP_SYS_PTRACE) and the one fix that applies when py-spy is refused.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# CAP_SYS_PTRACE's bit in /proc/self/status CapEff (linux/capability.h).
CAP_SYS_PTRACE_BIT = 19
YAMA_SCOPE_FILE = "/proc/sys/kernel/yama/ptrace_scope"


@dataclass(frozen=True)
class PtraceFacts:
    """What decides whether this process may read another's memory (``ptrace_facts``)."""

    euid: int
    target_uid: int | None  # None: /proc/PID unreadable
    ptrace_scope: int | None  # None: no Yama (no /proc/sys/kernel/yama)
    cap_sys_ptrace: bool | None  # in CapEff; None: unreadable
    exe_readable: bool  # /proc/PID/exe: what py-spy opens first


def ptrace_facts(pid: int) -> PtraceFacts:
    def read(path: str) -> str | None:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    try:
        target_uid: int | None = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        target_uid = None
    scope_text = read(YAMA_SCOPE_FILE)
    scope = int(scope_text) if scope_text and scope_text.strip().isdigit() else None
    cap = None
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", read("/proc/self/status") or "", re.M)
    if m:
        cap = bool(int(m.group(1), 16) >> CAP_SYS_PTRACE_BIT & 1)
    try:
        with open(f"/proc/{pid}/exe", "rb"):
            exe = True
    except OSError:
        exe = False
    return PtraceFacts(os.geteuid(), target_uid, scope, cap, exe)


def _user(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


def permission_advice(pid: int, facts: PtraceFacts | None = None) -> str:
    """Why reading ``pid``'s stacks was refused, and the one fix that applies: the first of the
    user, /proc/PID/exe, kernel.yama.ptrace_scope and CAP_SYS_PTRACE that explains it (checked
    in gputop's own process: py-spy runs with its credentials). One line."""
    f = facts or ptrace_facts(pid)
    cap = f.cap_sys_ptrace is not False  # unreadable: do not blame it
    me = "root" if f.euid == 0 else _user(f.euid)
    if f.target_uid is not None and f.target_uid != f.euid and not cap:
        if f.euid == 0:
            return (f"PID {pid} belongs to {_user(f.target_uid)} and gputop runs as root without CAP_SYS_PTRACE "
                    "(a container drops it): add it (docker run --cap-add SYS_PTRACE)")
        owner = "root" if f.target_uid == 0 else _user(f.target_uid)
        return (f"PID {pid} belongs to {owner} and gputop runs as {me}: "
                + ("run gputop as root" if f.target_uid == 0 else f"run gputop as {owner} or as root"))
    if not f.exe_readable:
        why = (f"gputop runs as {me}" + (" with CAP_SYS_PTRACE" if f.cap_sys_ptrace else "")
               + (", no kernel.yama.ptrace_scope" if f.ptrace_scope is None else ""))
        return (f"{why}, yet /proc/{pid}/exe is unreadable: PID {pid} is likely in another container or PID "
                "namespace, or a security module (AppArmor, SELinux) forbids tracing it; run gputop inside "
                "the target's container (or on the host, for a container's process)")
    if f.ptrace_scope == 3:
        return ("kernel.yama.ptrace_scope=3 forbids attaching for every user, root included, "
                "and cannot be lowered until a reboot")
    if f.ptrace_scope == 2 and not cap:
        return ("kernel.yama.ptrace_scope=2 lets only CAP_SYS_PTRACE attach: run gputop as root "
                "(in a container: docker run --cap-add SYS_PTRACE)")
    if f.ptrace_scope == 1 and not cap:
        return ("kernel.yama.ptrace_scope=1 lets a user attach only to its own children: run gputop as root, "
                "or 'sudo sysctl kernel.yama.ptrace_scope=0'")
    if not cap:
        return ("gputop runs without CAP_SYS_PTRACE and a container's seccomp profile may forbid ptrace "
                "without it: add it (docker run --cap-add SYS_PTRACE)")
    return (f"gputop runs as {me} with CAP_SYS_PTRACE"
            + (f", kernel.yama.ptrace_scope={f.ptrace_scope}" if f.ptrace_scope is not None else ", no Yama")
            + f" and /proc/{pid}/exe readable: a security module (AppArmor, SELinux) or seccomp profile "
            "likely forbids ptrace here")


def attach_policy(scope: int | None, cap_sys_ptrace: bool | None, euid: int) -> tuple[bool, str]:
    """What this process may attach to, as ``gputop doctor`` says it: (whether attaching to the
    user's own training jobs can work, one line naming what governs it). ``scope``:
    kernel.yama.ptrace_scope, None where the kernel has no Yama; ``cap_sys_ptrace``: in this
    process's effective set (None: unreadable)."""
    me = "root" if euid == 0 else _user(euid)
    cap = ("with CAP_SYS_PTRACE" if cap_sys_ptrace else
           "without CAP_SYS_PTRACE" if cap_sys_ptrace is False else "CAP_SYS_PTRACE unknown")
    seccomp = ("; in a container, its seccomp profile may forbid ptrace without CAP_SYS_PTRACE "
               "(docker run --cap-add SYS_PTRACE)")
    if scope is None:
        # No Yama: the kernel's plain rule (ptrace_may_access): the same user, or CAP_SYS_PTRACE.
        if cap_sys_ptrace:
            return True, (f"no Yama (no {YAMA_SCOPE_FILE}): gputop runs as {me} {cap}, so it may attach "
                          "to any process here")
        return True, (f"no Yama (no {YAMA_SCOPE_FILE}): gputop runs as {me} {cap}, so it may attach to "
                      f"{me}'s own processes; another user's need root or CAP_SYS_PTRACE" + seccomp)
    head = f"kernel.yama.ptrace_scope={scope}, gputop runs as {me} {cap}"
    if scope >= 3:
        return False, f"{head}: no process may be attached to, root included, until a reboot"
    if cap_sys_ptrace:
        return True, f"{head}: it may attach to any process here"
    if scope == 2:
        return False, (f"{head}: only CAP_SYS_PTRACE may attach: run gputop as root "
                       "(in a container: docker run --cap-add SYS_PTRACE)")
    if scope == 1:
        return False, (f"{head}: it may attach only to its own children (gputop demo), not to a job "
                       "started elsewhere: run gputop as root, or 'sudo sysctl kernel.yama.ptrace_scope=0'")
    return True, (f"{head}: it may attach to {me}'s own processes; another user's need root or "
                  "CAP_SYS_PTRACE" + seccomp)


__all__ = ["CAP_SYS_PTRACE_BIT", "YAMA_SCOPE_FILE", "PtraceFacts", "attach_policy", "permission_advice",
           "ptrace_facts"]
