"""Python stacks of a running training process, by PID, through the py-spy binary.

One ``py-spy dump --json`` per sample. py-spy has no streaming mode: ``record`` writes its
samples (raw, speedscope, chrometrace) only when it ends, so a long-lived ``record`` gives no
stack until its window closes, and it loses what the classifier and the stuck detector need:
py-spy's per-thread idle flag (waiting for data *is* idle), the kernel thread id and a time per
sample. So each sample is a short-lived py-spy process, and what it costs is managed instead:

- Routine dumps are ``--nonblocking``: py-spy reads the target's memory without stopping it,
  so the job loses no time to them (a blocking dump ptrace-stops every thread, which on a job
  with ~150 threads is what makes py-spy costly). Where ``--nonblocking`` loses a thread's
  kernel id (and with it the on-CPU flag), the id learnt from an earlier dump and
  ``/proc/PID/task/TID/stat`` (state R) give them back.
- Blocking dumps only where a consistent stack matters: the first look at the target, a thread
  not seen before, and a main stack that stopped moving (what the stuck detector will report).
  Each is charged to a pause budget at its whole wall time (an upper bound of the stop).
- The sampler's own CPU (its thread and its py-spy processes) is metered and charged to a CPU
  budget: the rate falls below ``rate`` when py-spy is costly on this machine. Both budgets are
  token buckets with a burst, so attaching gives a quick first look.
- DataLoader workers (the target's children) are dumped one at a time, round robin, every
  ``worker_interval``.

``cost`` is the latest reading (gputop.model.SamplingCost), also said once as an Event.
bench/attach_cost.py measures the slowdown on real jobs against what is shown here.

Samples carry ``clock()`` (``time.time()``) taken when py-spy returns, the clock NVML's samples
use.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import UserError
from ..model import Category, Event, Frame, ProcSample, SamplingCost, StackSample
from ..redact import perf_env, redact_cmdline, redact_code
from ..units import fmt_clock

# The most main-thread stacks per second (``--sample-rate``); the CPU budget may lower it.
DEFAULT_RATE = 5.0
# For the first ATTACH_BURST_S after attaching, main-thread stacks come this often (within the
# CPU budget's burst): the rules need MIN_MAIN_SAMPLES of them (advisor.rules.base), so a steady
# problem is named in ~2-3 s instead of waiting on the steady rate. Nonblocking dumps do not stop
# the target; the burst's ~20 dumps cost ~0.3 s of gputop's own CPU, once. Judgement.
ATTACH_BURST_RATE = 10.0
ATTACH_BURST_S = 2.0
# Routine dumps do not stop the target (see the module's docstring).
DEFAULT_NONBLOCKING = True
# The sampler's own CPU, py-spy processes included, as a long-run average in cores. A py-spy
# dump costs ~8-15 ms of CPU (it maps the target and reads the interpreter's symbols each
# time), so this, not DEFAULT_RATE, sets the steady rate: about 1-2 stacks/s.
DEFAULT_CPU_BUDGET = 0.015
# CPU seconds the sampler may spend ahead of its budget: about 30 dumps at attach, so the first
# diagnosis does not wait on the steady rate.
CPU_BURST_S = 0.4
# The share of the target's wall time blocking dumps may stop it, as a long-run average.
DEFAULT_PAUSE_BUDGET = 0.001
PAUSE_BURST_S = 0.1  # a few blocking dumps at attach
# A main stack unchanged this long is confirmed with a blocking dump (a stuck job is reported
# with this stack), and again every CONFIRM_EVERY_S while it stays.
CONFIRM_AFTER_S = 2.0
CONFIRM_EVERY_S = 30.0
# Consecutive failed nonblocking dumps before a fault is reported: reading a running process
# can catch a frame list being rewritten, and the next dump is then fine.
NONBLOCKING_FAILS = 3
# The published cost is measured over this window, recomputed this often.
COST_WINDOW_S = 30.0
COST_EVERY_S = 2.0
COST_EVENT_AFTER_S = 10.0  # the one Event comes once this much has been measured
MAX_INTERVAL_S = 5.0  # however costly py-spy is, a stack at least this often
# A dump takes ~10-20 ms; one that takes seconds means py-spy or the target is wedged.
DUMP_TIMEOUT_S = 5.0
# Native unwinding measured ~0.6 s on the H100 box; allow a slow, loaded machine.
NATIVE_TIMEOUT_S = 30.0
# Worker stacks and process details (psutil) change slowly compared with the main thread; a
# worker's stacks feed the data-fetch breakdown, which a dump every few seconds keeps.
WORKER_INTERVAL_S = 3.0
PROC_INTERVAL_S = 1.0
# After a py-spy failure that may pass (target busy forking, a timeout), try again this often.
RETRY_AFTER_S = 2.0
MAX_WORKERS = 64  # children followed at once (torch.compile can start dozens)
_SOURCE_MAX_BYTES = 4 << 20  # skip reading enormous generated files for line text
_CACHE_MAX = 20000  # interned frames / stacks before the caches start over

PYSPY_ENV = "GPUTOP_PYSPY"  # path to a py-spy binary, to override the search

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


class AttachError(UserError):
    """Why a process's stacks cannot be read. ``kind``: gone | not-python | permission |
    pyspy-missing | pyspy-failed. The live UI may carry on without stacks for the last four."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


# --------------------------------------------------------------------------- py-spy binary


def find_pyspy() -> str | None:
    """The py-spy executable of the installed py-spy package.

    pip puts it in the interpreter's scripts directory, which is often not on PATH (a venv
    that is not activated, ``python -m gputop``); PATH is the last resort (and may be a slow
    shim, e.g. pyenv's).
    """
    override = os.environ.get(PYSPY_ENV)
    if override:
        return override if os.access(override, os.X_OK) else None
    exe = "py-spy.exe" if os.name == "nt" else "py-spy"
    dirs: list[str] = []
    for scheme in (None, f"{os.name}_user"):
        try:
            d = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        if d:
            dirs.append(d)
    dirs.append(os.path.dirname(sys.executable))
    for d in dirs:
        cand = os.path.join(d, exe)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return shutil.which(exe)


def _pyspy_or_raise(pyspy: str | None) -> str:
    path = pyspy or find_pyspy()
    if not path:
        where = os.environ.get(PYSPY_ENV) or f"next to {sys.executable} and on PATH"
        raise AttachError(f"py-spy not found ({where}): pip install py-spy", "pyspy-missing")
    return path


def _classify_failure(pid: int, stderr: str, rc: int) -> AttachError:
    text = stderr.strip()
    low = text.lower()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), f"exit status {rc}")
    if "permission denied" in low or "operation not permitted" in low or "(os error 1)" in low or "(os error 13)" in low:
        return AttachError(f"permission denied reading PID {pid}'s stacks: {permission_advice(pid)}", "permission")
    if "failed to find python version" in low or "failed to find a python interpreter" in low:
        return AttachError(f"PID {pid} is not a Python process: no stacks (GPU and CPU monitoring still work)", "not-python")
    special = _not_a_job(pid)
    if special is not None:
        return special
    if not _alive(pid) or "check that the process is running" in low or "no such process" in low:
        return AttachError(f"no process with PID {pid}", "gone")
    return AttachError(f"py-spy failed on PID {pid}: {first.removeprefix('Error: ')}", "pyspy-failed")


# /proc/PID/stat's flags (field 9): the kernel's own threads carry PF_KTHREAD.
_PF_KTHREAD = 0x00200000


def _not_a_job(pid: int) -> AttachError | None:
    """Why ``pid`` is a process no stacks can come from, where /proc says so: a kernel thread,
    or a zombie (it exited and its parent has not reaped it). None otherwise or unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if not fields:
        return None
    if fields[0] == "Z":
        status = exit_status(pid)
        parent = f" {fields[1]}" if len(fields) > 1 else ""
        how = f"exited with {status}" if status else "exited"
        return AttachError(f"PID {pid} is a zombie ({how}, not reaped by its parent{parent}): it runs no code to sample",
                           "gone")
    try:
        flags = int(fields[6])
    except (IndexError, ValueError):
        return None
    if flags & _PF_KTHREAD:
        return AttachError(f"PID {pid} is a kernel thread, not a program: it has no Python stacks", "not-python")
    return None


# getrusage(RUSAGE_CHILDREN) is per process: a dump measured under this lock is the only child
# reaped meanwhile (gputop spawns no other processes while it samples), so its delta is the
# dump's own CPU.
_CHILD_LOCK = threading.Lock()


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run_pyspy(pyspy: str, args: list[str], pid: int, timeout: float,
               meter: Callable[[float, float], None] | None = None) -> str:
    """py-spy's stdout; ``meter(wall_s, cpu_s)`` is told what the run cost."""
    env = dict(os.environ, RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0")  # one-line errors
    with _CHILD_LOCK:
        t0, c0 = time.perf_counter(), _children_cpu()
        try:
            res = subprocess.run(
                [pyspy, *args, "--pid", str(pid)],
                capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise AttachError(f"py-spy did not answer within {timeout:g} s for PID {pid}", "pyspy-failed") from None
        except OSError as exc:
            raise AttachError(f"cannot run py-spy ({pyspy}): {exc.strerror or exc}", "pyspy-missing") from None
        finally:
            if meter is not None:
                meter(time.perf_counter() - t0, _children_cpu() - c0)
    if res.returncode != 0:
        raise _classify_failure(pid, res.stderr, res.returncode)
    return res.stdout


def dump_json(pid: int, pyspy: str | None = None, nonblocking: bool = False,
              meter: Callable[[float, float], None] | None = None) -> list[dict]:
    """One ``py-spy dump --json`` of ``pid``: py-spy's thread records as they come."""
    args = ["dump", "--json"] + (["--nonblocking"] if nonblocking else [])
    out = _run_pyspy(_pyspy_or_raise(pyspy), args, pid, DUMP_TIMEOUT_S, meter)
    try:
        data = json.loads(out)
    except ValueError:
        raise AttachError(f"py-spy gave unreadable output for PID {pid}", "pyspy-failed") from None
    if not isinstance(data, list):
        raise AttachError(f"py-spy gave unexpected output for PID {pid}", "pyspy-failed")
    return data


def thread_on_cpu(pid: int, tid: int) -> bool | None:
    """Whether thread ``tid`` of ``pid`` is running or runnable (state R in
    /proc/PID/task/TID/stat), the on-CPU flag py-spy gives when it knows the thread's kernel id.
    None when the thread is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    rest = stat.rsplit(b")", 1)[-1].split()
    return rest[0] == b"R" if rest else None


def native_dump(pid: int, pyspy: str | None = None, timeout: float = NATIVE_TIMEOUT_S) -> str:
    """Stacks with native (C/C++/CUDA) frames, as py-spy prints them. Costs ~0.6 s and
    pauses the target meanwhile: on demand only. Raises AttachError."""
    text = _run_pyspy(_pyspy_or_raise(pyspy), ["dump", "--native"], pid, timeout)
    # py-spy's header repeats the raw command line, secrets included.
    return re.sub(
        r"(?m)^(Process \d+: )(.*)$", lambda m: m.group(1) + redact_cmdline(m.group(2).split()), text, count=1
    )


def check_attachable(pid: int, pyspy: str | None = None) -> str:
    """Raise AttachError (a UserError) with the reason and the fix unless py-spy can read
    ``pid``'s stacks; returns the py-spy path. One dump, ~10-20 ms."""
    import psutil

    if not psutil.pid_exists(pid):
        raise AttachError(f"no process with PID {pid}", "gone")
    special = _not_a_job(pid)
    if special is not None:
        raise special
    path = _pyspy_or_raise(pyspy)
    dump_json(pid, path)
    return path


# --------------------------------------------------------------------------- helpers


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def exit_status(pid: int) -> str | None:
    """'code N' or 'signal NAME' for a zombie (exited, not yet reaped by its parent): the
    kernel keeps the wait status in /proc/PID/stat's last field. None when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    # fields[0] is the state (field 3); exit_code is field 52 (Linux >= 3.5).
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return None
    try:
        status = int(fields[49])
    except ValueError:
        return None
    if status & 0x7F:
        import signal

        sig = status & 0x7F
        try:
            return f"signal {signal.Signals(sig).name}"
        except ValueError:
            return f"signal {sig}"
    return f"code {(status >> 8) & 0xFF}"


class SourceLines:
    """Reads source lines as the target sees its files (through /proc/PID/root, so a target
    in another mount namespace is read correctly), cached per file."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._files: dict[str, list[str] | None] = {}

    def line(self, filename: str, lineno: int) -> str | None:
        if not filename or filename.startswith("<") or lineno <= 0:
            return None
        lines = self._files.get(filename, ...)
        if lines is ...:
            if len(self._files) > 2000:
                self._files.clear()
            lines = self._files[filename] = self._read(filename)
        if lines is None or lineno > len(lines):
            return None
        return lines[lineno - 1].strip() or None

    def _read(self, filename: str) -> list[str] | None:
        if os.path.isabs(filename):
            candidates = [f"/proc/{self.pid}/root{filename}", filename]
        else:
            candidates = [f"/proc/{self.pid}/cwd/{filename}"]
        for path in candidates:
            try:
                if os.path.getsize(path) > _SOURCE_MAX_BYTES:
                    return None
                with open(path, encoding="utf-8", errors="replace") as f:
                    return f.read().splitlines()
            except OSError:
                continue
        return None


# What the source is given to classify stacks with (the analysis layer's classifier): a stack's
# category from its frames and py-spy's on-CPU flag, and whether a file is library code (whose
# source lines are not read, but for the leaf frame).
Classify = Callable[[Sequence[Frame], bool], Category]
IsLibrary = Callable[[str], bool]


def _unclassified(frames: Sequence[Frame], active: bool) -> Category:
    return Category.OTHER


class StackParser:
    """Turns py-spy's JSON into StackSamples: frames interned (a long session repeats the
    same few stacks), the leaf and project frames given their source line, then classified."""

    def __init__(self, lines: Callable[[str, int], str | None] | None = None, classify: Classify = _unclassified,
                 is_library: IsLibrary = lambda filename: False) -> None:
        self._lines = lines
        self._classify = classify
        self._is_library = is_library
        self._frames: dict[tuple, Frame] = {}
        self._stacks: dict[tuple, tuple[tuple[Frame, ...], dict[bool, object]]] = {}

    def frame(self, raw: dict, leaf: bool) -> Frame:
        name = str(raw.get("name") or "?")
        filename = str(raw.get("filename") or "")
        line = int(raw.get("line") or 0)
        key = (name, filename, line, leaf)
        f = self._frames.get(key)
        if f is None:
            code = None
            if self._lines is not None and (leaf or not self._is_library(filename)):
                code = self._lines(filename, line)
                if code:
                    # Redacted here, once per distinct line (redact_code caches): every frame on
                    # screen, in `stacks --json`, in the advisor's evidence and in a recording
                    # comes from this one.
                    code = redact_code(code)
            f = Frame(name=name, filename=filename, line=line, module=raw.get("module"), code=code)
            if len(self._frames) > _CACHE_MAX:
                self._frames.clear()
            self._frames[key] = f
        return f

    def samples(self, data: list[dict], ts: float) -> list[StackSample]:
        out: list[StackSample] = []
        for th in data:
            raw_frames = th.get("frames") or []
            key = tuple((fr.get("name"), fr.get("filename"), fr.get("line")) for fr in raw_frames)
            cached = self._stacks.get(key)
            if cached is None:
                frames = tuple(self.frame(fr, i == 0) for i, fr in enumerate(raw_frames))
                if len(self._stacks) > _CACHE_MAX:
                    self._stacks.clear()
                cached = self._stacks[key] = (frames, {})
            frames, cats = cached
            active = bool(th.get("active", True))
            cat = cats.get(active)
            if cat is None:
                cat = cats[active] = self._classify(frames, active)
            pid = int(th.get("pid") or 0)
            os_tid = th.get("os_thread_id")
            name = str(th.get("thread_name") or "")
            out.append(
                StackSample(
                    ts=ts,
                    pid=pid,
                    thread_id=int(th.get("thread_id") or 0),
                    thread_name=name,
                    frames=frames,
                    active=active,
                    owns_gil=bool(th.get("owns_gil", False)),
                    is_main=(os_tid == pid) if os_tid is not None else name == "MainThread",
                    category=cat,  # type: ignore[arg-type]
                    os_thread_id=int(os_tid) if os_tid is not None else None,
                )
            )
        out.sort(key=lambda s: not s.is_main)
        return out


# --------------------------------------------------------------------------- the source


class PySpySource:
    """Stacks of one training process and of its child processes (DataLoader workers), with
    the workers' process details (CPU, state).

    The target's own process details come from the host source in a live session (it also has
    the IO rates); ``target_details=True`` adds them here too, for use without one.
    ``classify`` and ``is_library`` come from the analysis layer (the session passes them): a
    source turns the world into samples and decides nothing about them. Whether the job is
    stuck is decided over the store (gputop.analysis.stuck), not here.

    Never raises from ``poll`` for routine faults: py-spy failing, the target exiting or being
    unreadable become Events (each once); once the target is gone sampling stops and what was
    collected stays in the store.
    """

    name = "stacks"

    def __init__(
        self,
        pid: int,
        clock: Callable[[], float] = time.time,
        rate: float = DEFAULT_RATE,
        nonblocking: bool = DEFAULT_NONBLOCKING,
        pyspy: str | None = None,
        worker_interval: float = WORKER_INTERVAL_S,
        target_details: bool = False,
        classify: Classify = _unclassified,
        is_library: IsLibrary = lambda filename: False,
        cpu_budget: float = DEFAULT_CPU_BUDGET,
        pause_budget: float = DEFAULT_PAUSE_BUDGET,
        burst_rate: float | None = None,
    ) -> None:
        import psutil

        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.pid = pid
        self.clock = clock
        self.rate = rate
        self.interval = 1.0 / rate
        # The attach burst's rate (None: ATTACH_BURST_RATE when the rate is the default, else none:
        # a lower --sample-rate is a wish for less). One of n ranks' samplers gets 1/n of it.
        self.burst_rate = burst_rate if burst_rate is not None else (ATTACH_BURST_RATE if rate >= DEFAULT_RATE else rate)
        self.nonblocking = nonblocking
        self.worker_interval = worker_interval
        self.target_details = target_details
        self._pyspy = pyspy or find_pyspy()
        # Forked workers see the target's files and run the same code: one parser (and its
        # caches of source lines, frames and categories) serves them all.
        self._parser = StackParser(SourceLines(pid).line, classify, is_library)
        self._proc: psutil.Process | None
        try:
            self._proc = psutil.Process(pid)
        except psutil.Error:
            self._proc = None
        self._env: tuple[tuple[str, str], ...] | None = None
        self._target_last: ProcSample | None = None
        self._procs: dict[int, psutil.Process] = {}  # kept, so cpu_percent has a baseline
        self._workers: list[int] = []
        self._worker_next = 0
        self._no_stacks: set[int] = set()  # children that are not Python
        self._next_proc = 0.0
        self._next_worker = 0.0
        self._retry_at = 0.0
        self._fault: str | None = None  # the kind of the fault last reported
        self._stacks_off: str | None = None  # a permanent reason not to try again
        self.exited: float | None = None  # when the target was found gone
        self.exit_status: str | None = None  # "code N" / "signal NAME" when it could be read
        # What sampling costs: budgets on the monotonic clock (``clock`` may be a replayed one).
        t = time.monotonic()
        self._cpu = _Bucket(cpu_budget, CPU_BURST_S, t)
        self._pause = _Bucket(pause_budget, PAUSE_BURST_S, t)
        self._totals = _Totals()
        self._history: deque[tuple[float, _Totals]] = deque([(t, _Totals())])
        self._started = t
        self._next_cost = t + COST_EVERY_S
        self._cost_said = False
        self.cost: SamplingCost | None = None  # the latest measured cost
        self._tids: dict[tuple[int, int], int] = {}  # (pid, Python thread id) -> kernel thread id
        self._unknown_thread = False  # a thread whose kernel id is not known: learn it blocking
        self._main_key: tuple | None = None  # the main thread's last stack ...
        self._main_since = 0.0  # ... unchanged since (monotonic)
        self._confirmed_at = float("-inf")  # the last blocking dump (monotonic)
        self._nb_fails = 0

    # ----------------------------------------------------------------- Source protocol

    def poll(self) -> list[object]:
        if self.exited is not None:
            return []
        cpu0 = time.thread_time()
        out: list[object] = []
        now = self.clock()
        if not self._target_alive(now, out):
            return out
        if now >= self._next_proc:
            self._next_proc = now + PROC_INTERVAL_S
            out.extend(s for s in self._proc_samples(now) if self.target_details or s.role != "target")
        out.extend(self._sample_target())
        if self._stacks_off is None and self._workers and self.clock() >= self._next_worker:
            self._next_worker = self.clock() + self.worker_interval
            out.extend(self._sample_worker(self._workers[self._worker_next % len(self._workers)]))
            self._worker_next += 1
        # The poll's own CPU (parsing, classifying, psutil); py-spy's is metered per dump.
        spent = time.thread_time() - cpu0
        self._totals.cpu += spent
        self._cpu.charge(spent)
        self._pace(out)
        return out
    def close(self) -> None:
        self._procs.clear()

    def snapshot(self) -> list[object]:
        """Everything at once, now: the target's and every worker's details and stacks
        (``gputop stacks``)."""
        out: list[object] = []
        now = self.clock()
        if not self._target_alive(now, out):
            return out
        self._proc_samples(now)  # finds the workers and primes cpu_percent
        # One look, not a series: blocking dumps (consistent stacks; a few ms of pause once).
        routine, self.nonblocking = self.nonblocking, False
        try:
            stacks = self._sample_target()
            for w in list(self._workers):
                stacks.extend(self._sample_worker(w))
        finally:
            self.nonblocking = routine
        out.extend(self._proc_samples(self.clock()))
        out.extend(stacks)
        return out

    # ----------------------------------------------------------------- target liveness

    def _target_alive(self, now: float, out: list[object]) -> bool:
        import psutil

        if self._proc is None:
            self._mark_exited(now, out, f"no process with PID {self.pid}")
            return False
        try:
            running = self._proc.is_running() and self._proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            running = False
        except psutil.Error:
            running = True
        if not running:
            self.exit_status = exit_status(self.pid)
            how = f"with {self.exit_status}" if self.exit_status else "(exit code unknown: not our child)"
            self._mark_exited(now, out, f"target PID {self.pid} exited at {fmt_clock(now)} {how}")
        return running

    def _mark_exited(self, now: float, out: list[object], message: str) -> None:
        self.exited = now
        self.interval = PROC_INTERVAL_S  # nothing left to sample
        last = self._target_last
        out.append(ProcSample(ts=now, pid=self.pid, ppid=last.ppid if last else None, name=last.name if last else "",
                              cmdline=last.cmdline if last else "", status="exited", role="target"))
        out.append(Event(now, self.name, message, "warning"))

    # ----------------------------------------------------------------- sampling

    def _dump(self, pid: int, blocking: bool) -> list[dict]:
        """One metered dump; thread ids where ``--nonblocking`` lost them filled in."""
        def meter(wall: float, cpu: float) -> None:
            t = self._totals
            t.cpu += cpu
            t.dumps += 1
            self._cpu.charge(cpu)
            if blocking:
                # Every thread stays stopped at most for the dump's whole run: charged in full.
                t.pause += wall
                t.blocking += 1
                self._pause.charge(wall)

        data = dump_json(pid, self._pyspy, not blocking, meter)
        self._fill_thread_ids(pid, data)
        return data

    def _fill_thread_ids(self, pid: int, data: list[dict]) -> None:
        if len(self._tids) > _CACHE_MAX:
            self._tids.clear()
        for th in data:
            key = (pid, int(th.get("thread_id") or 0))
            tid = th.get("os_thread_id")
            if tid is not None:
                self._tids[key] = int(tid)
                continue
            tid = self._tids.get(key)
            if tid is None:
                self._unknown_thread = True
                continue
            th["os_thread_id"] = tid
            on_cpu = thread_on_cpu(pid, tid)
            if on_cpu is not None:
                # py-spy's own idle heuristics (known waiting frames) still hold: idle wins.
                th["active"] = bool(th.get("active", True)) and on_cpu
            else:
                del self._tids[key]

    def _want_blocking(self, t: float) -> bool:
        """A consistent stack matters now and the pause budget allows one."""
        if not self.nonblocking:
            return True
        if not self._pause.allows(t):
            return False
        if self._totals.dumps == 0 or self._unknown_thread:
            return True
        # The main stack stopped moving: the stuck detector may report it, so make sure it is
        # not a torn read; again now and then while it stays.
        held = self._main_key is not None and t - self._main_since >= CONFIRM_AFTER_S
        return held and (self._confirmed_at < self._main_since or t - self._confirmed_at >= CONFIRM_EVERY_S)

    def _sample_target(self) -> list[object]:
        now = self.clock()
        if self._stacks_off is not None or now < self._retry_at:
            return []
        t = time.monotonic()
        if not self._cpu.allows(t):
            return []  # over the CPU budget, however often poll is called
        blocking = self._want_blocking(t)
        try:
            data = self._dump(self.pid, blocking)
        except AttachError as exc:
            if exc.kind == "pyspy-failed" and not blocking:
                self._nb_fails += 1
                if self._nb_fails < NONBLOCKING_FAILS:
                    return []  # a torn read: the next dump is fine
            return self._fault_event(exc)
        self._nb_fails = 0
        if blocking:
            self._confirmed_at = t
            self._unknown_thread = False
        ts = self.clock()
        samples = self._parser.samples(data, ts)
        main = next((x for x in samples if x.is_main), None)
        key = main.frames if main is not None else None
        if key != self._main_key:
            self._main_key, self._main_since = key, t
        self._totals.main += 1
        out: list[object] = []
        if self._fault is not None:
            out.append(Event(ts, self.name, f"stack sampling of PID {self.pid} resumed", "info"))
            self._fault = None
        out.extend(samples)
        return out

    def _sample_worker(self, wpid: int) -> list[object]:
        if wpid in self._no_stacks or self._stacks_off is not None or not self._cpu.allows(time.monotonic()):
            return []
        try:
            data = self._dump(wpid, blocking=not self.nonblocking)
        except AttachError as exc:
            # A worker exiting between listing and dumping is routine; one that is not
            # Python (a shell, a compiler) is skipped from now on.
            if exc.kind in ("not-python", "permission"):
                self._no_stacks.add(wpid)
            return []
        return list(self._parser.samples(data, self.clock()))

    # ----------------------------------------------------------------- cost

    def _pace(self, out: list[object]) -> None:
        """The next poll's interval from the CPU budget, and the published cost."""
        t = time.monotonic()
        if self._stacks_off is None and self.exited is None:
            # Over budget: wait until the bucket is back to zero (the steady rate is then
            # budget / CPU per poll), never longer than MAX_INTERVAL_S.
            rate = self.rate
            if t - self._started < ATTACH_BURST_S:
                rate = max(rate, self.burst_rate)
            self.interval = min(MAX_INTERVAL_S, max(1.0 / rate, self._cpu.wait(t)))
        if t >= self._next_cost:
            self._next_cost = t + COST_EVERY_S
            self._measure(t, out)

    def _measure(self, t: float, out: list[object]) -> None:
        hist = self._history
        hist.append((t, self._totals.copy()))
        while len(hist) > 1 and t - hist[1][0] >= COST_WINDOW_S:
            hist.popleft()
        if len(hist) < 2:
            return
        (t0, a), (t1, b) = hist[0], hist[-1]
        span = t1 - t0
        cpu_pct = 100.0 * (b.cpu - a.cpu) / span
        pause_pct = 100.0 * (b.pause - a.pause) / span
        self.cost = SamplingCost(
            ts=self.clock(), pid=self.pid, window_s=round(span, 1), stacks_per_s=(b.main - a.main) / span,
            sampler_cpu_pct=cpu_pct, pause_pct=pause_pct, job_cost_pct=job_cost_pct(cpu_pct, pause_pct),
            blocking=b.blocking - a.blocking, dumps=b.dumps - a.dumps,
        )
        if not self._cost_said and t - self._started >= COST_EVENT_AFTER_S:
            self._cost_said = True
            c = self.cost
            out.append(Event(c.ts, self.name, f"sampling PID {self.pid} costs the job about {c.job_cost_pct:.2g} % "
                             f"({c.stacks_per_s:.1f} stacks/s; sampler {c.sampler_cpu_pct:.1f} % of a core, "
                             f"target stopped {c.pause_pct:.2f} % of the time)", "info"))

    def _fault_event(self, exc: AttachError) -> list[object]:
        now = self.clock()
        if exc.kind == "gone":
            out: list[object] = []
            if not self._target_alive(now, out):
                return out
        if exc.kind in ("not-python", "permission", "pyspy-missing"):
            self._stacks_off = exc.kind  # retrying cannot help; process details go on
            self.interval = PROC_INTERVAL_S
        else:
            self._retry_at = now + RETRY_AFTER_S
        if self._fault == exc.kind:
            return []
        self._fault = exc.kind
        return [Event(now, self.name, str(exc), "error" if self._stacks_off else "warning")]

    # ----------------------------------------------------------------- process details

    def _proc_samples(self, now: float) -> list[ProcSample]:
        import psutil

        assert self._proc is not None
        out: list[ProcSample] = []
        try:
            children = self._proc.children(recursive=True)[:MAX_WORKERS]
        except psutil.Error:
            children = []
        self._workers = [c.pid for c in children]
        by_pid = {c.pid: c for c in children}
        by_pid[self.pid] = self._proc
        for gone in set(self._procs) - set(by_pid):
            del self._procs[gone]
        self._no_stacks &= set(by_pid)
        for pid, proc in by_pid.items():
            first = pid not in self._procs
            if first:
                self._procs[pid] = proc
            s = self._proc_sample(self._procs[pid], "target" if pid == self.pid else "worker", now, first)
            if s is not None:
                out.append(s)
                if pid == self.pid:
                    self._target_last = s
        return out

    def _proc_sample(self, proc, role: str, now: float, first: bool) -> ProcSample | None:
        import psutil

        try:
            with proc.oneshot():
                cpu = proc.cpu_percent(None)
                info: dict = dict(
                    ppid=proc.ppid(),
                    name=proc.name(),
                    status=proc.status(),
                    num_threads=proc.num_threads(),
                    create_time=proc.create_time(),
                )
                try:
                    info["rss"] = proc.memory_info().rss
                except psutil.AccessDenied:
                    pass
                try:
                    info["user"] = proc.username()
                except (psutil.AccessDenied, KeyError):
                    pass
            try:
                info["cmdline"] = redact_cmdline(proc.cmdline())
            except psutil.AccessDenied:
                pass
            if role == "target":
                if self._env is None:
                    try:
                        self._env = perf_env(proc.environ())
                    except psutil.Error:
                        self._env = ()
                info["env"] = self._env
        except psutil.NoSuchProcess:
            return None
        except psutil.Error:
            return ProcSample(ts=now, pid=proc.pid, role=role)
        # The first cpu_percent reading has no baseline: say unknown, not 0 %.
        return ProcSample(ts=now, pid=proc.pid, role=role, cpu_percent=None if first else cpu, **info)


def job_cost_pct(sampler_cpu_pct: float, pause_pct: float, cpus: int | None = None) -> float:
    """What the job is estimated to lose, in %: the time it is stopped, plus the sampler's share
    of the machine's cores (a job that keeps every core busy gives that up; one that leaves
    cores idle loses less). bench/attach_cost.py checks the estimate against step rates."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    return pause_pct + sampler_cpu_pct / max(1, cpus)


class _Bucket:
    """A token bucket: ``rate`` units per second, at most ``burst`` ahead."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.level, self.t = rate, burst, burst, now

    def _refill(self, now: float) -> None:
        self.level = min(self.burst, self.level + (now - self.t) * self.rate)
        self.t = now

    def charge(self, amount: float) -> None:
        self.level -= amount

    def allows(self, now: float) -> bool:
        self._refill(now)
        return self.level >= 0

    def wait(self, now: float) -> float:
        """Seconds until the level is back to zero."""
        self._refill(now)
        if self.level >= 0:
            return 0.0
        return -self.level / self.rate if self.rate > 0 else MAX_INTERVAL_S


class _Totals:
    """Running totals of what sampling spent: CPU s, pause s, dumps, blocking dumps, main stacks."""

    __slots__ = ("cpu", "pause", "dumps", "blocking", "main")

    def __init__(self) -> None:
        self.cpu = self.pause = 0.0
        self.dumps = self.blocking = self.main = 0

    def copy(self) -> _Totals:
        c = _Totals()
        c.cpu, c.pause, c.dumps, c.blocking, c.main = self.cpu, self.pause, self.dumps, self.blocking, self.main
        return c
