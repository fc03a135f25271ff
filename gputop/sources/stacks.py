"""Python stacks of a running training process, by PID, through the py-spy binary.

One ``py-spy dump --json`` per sample (a fresh py-spy process each time, ~10 ms). The
alternative, back-to-back one-second ``py-spy record`` windows, costs gputop less CPU but loses
what the classifier and the stuck detector need: py-spy's per-thread idle flag (waiting for data
*is* idle, and ``record`` only says which frames, not whether the thread was blocked), the
kernel thread id, a time per sample, and a stack within ~0.2 s instead of after the window.
bench/pyspy_overhead.py measures both (and ``--nonblocking``) against a training loop.

Samples carry ``clock()`` (``time.time()``) taken when py-spy returns, the clock NVML's samples
use. DataLoader workers (the target's child processes) are dumped one at a time, round robin,
so their cost stays one extra dump per second however many there are.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from typing import Callable, Sequence

from ..errors import UserError
from ..model import Category, Event, Frame, ProcSample, StackSample
from ..redact import perf_env, redact_cmdline

# The default sampling: 5 stacks/s, blocking dumps (py-spy pauses the target ~1 ms while it
# reads the stacks, so they are never torn). bench/pyspy_overhead.py measures the slowdown this
# costs (the 1 % budget) against --nonblocking and `py-spy record` windows; see its results.
DEFAULT_RATE = 5.0
DEFAULT_NONBLOCKING = False
# A dump takes ~10-20 ms; one that takes seconds means py-spy or the target is wedged.
DUMP_TIMEOUT_S = 5.0
# Native unwinding measured ~0.6 s on the H100 box; allow a slow, loaded machine.
NATIVE_TIMEOUT_S = 30.0
# Worker stacks and process details (psutil) change slowly compared with the main thread.
WORKER_INTERVAL_S = 1.0
PROC_INTERVAL_S = 1.0
# After a py-spy failure that may pass (target busy forking, a timeout), try again this often.
RETRY_AFTER_S = 2.0
MAX_WORKERS = 64  # children followed at once (torch.compile can start dozens)
_SOURCE_MAX_BYTES = 4 << 20  # skip reading enormous generated files for line text
_CACHE_MAX = 20000  # interned frames / stacks before the caches start over

PYSPY_ENV = "GPUTOP_PYSPY"  # path to a py-spy binary, to override the search

PERMISSION_FIX = (
    "run gputop as the same user as the target or as root; in a container add CAP_SYS_PTRACE "
    "(docker run --cap-add SYS_PTRACE); with kernel.yama.ptrace_scope >= 1 run as root or "
    "'sudo sysctl kernel.yama.ptrace_scope=0'"
)


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
        return AttachError(f"permission denied reading PID {pid}'s stacks: {PERMISSION_FIX}", "permission")
    if "failed to find python version" in low or "failed to find a python interpreter" in low:
        return AttachError(f"PID {pid} is not a Python process: no stacks (GPU and CPU monitoring still work)", "not-python")
    if not _alive(pid) or "check that the process is running" in low or "no such process" in low:
        return AttachError(f"no process with PID {pid}", "gone")
    return AttachError(f"py-spy failed on PID {pid}: {first.removeprefix('Error: ')}", "pyspy-failed")


def _run_pyspy(pyspy: str, args: list[str], pid: int, timeout: float) -> str:
    env = dict(os.environ, RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0")  # one-line errors
    try:
        res = subprocess.run(
            [pyspy, *args, "--pid", str(pid)],
            capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise AttachError(f"py-spy did not answer within {timeout:g} s for PID {pid}", "pyspy-failed") from None
    except OSError as exc:
        raise AttachError(f"cannot run py-spy ({pyspy}): {exc.strerror or exc}", "pyspy-missing") from None
    if res.returncode != 0:
        raise _classify_failure(pid, res.stderr, res.returncode)
    return res.stdout


def dump_json(pid: int, pyspy: str | None = None, nonblocking: bool = False) -> list[dict]:
    """One ``py-spy dump --json`` of ``pid``: py-spy's thread records as they come."""
    args = ["dump", "--json"] + (["--nonblocking"] if nonblocking else [])
    out = _run_pyspy(_pyspy_or_raise(pyspy), args, pid, DUMP_TIMEOUT_S)
    try:
        data = json.loads(out)
    except ValueError:
        raise AttachError(f"py-spy gave unreadable output for PID {pid}", "pyspy-failed") from None
    if not isinstance(data, list):
        raise AttachError(f"py-spy gave unexpected output for PID {pid}", "pyspy-failed")
    return data


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
    ) -> None:
        import psutil

        self.pid = pid
        self.clock = clock
        self.interval = 1.0 / rate
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

    # ----------------------------------------------------------------- Source protocol

    def poll(self) -> list[object]:
        if self.exited is not None:
            return []
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
        stacks = self._sample_target()
        for w in list(self._workers):
            stacks.extend(self._sample_worker(w))
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
            self._mark_exited(now, out, f"target PID {self.pid} exited at {_hms(now)} {how}")
        return running

    def _mark_exited(self, now: float, out: list[object], message: str) -> None:
        self.exited = now
        self.interval = PROC_INTERVAL_S  # nothing left to sample
        last = self._target_last
        out.append(ProcSample(ts=now, pid=self.pid, ppid=last.ppid if last else None, name=last.name if last else "",
                              cmdline=last.cmdline if last else "", status="exited", role="target"))
        out.append(Event(now, self.name, message, "warning"))

    # ----------------------------------------------------------------- sampling

    def _sample_target(self) -> list[object]:
        now = self.clock()
        if self._stacks_off is not None or now < self._retry_at:
            return []
        try:
            data = dump_json(self.pid, self._pyspy, self.nonblocking)
        except AttachError as exc:
            return self._fault_event(exc)
        ts = self.clock()
        samples = self._parser.samples(data, ts)
        out: list[object] = []
        if self._fault is not None:
            out.append(Event(ts, self.name, f"stack sampling of PID {self.pid} resumed", "info"))
            self._fault = None
        out.extend(samples)
        return out

    def _sample_worker(self, wpid: int) -> list[object]:
        if wpid in self._no_stacks or self._stacks_off is not None:
            return []
        try:
            data = dump_json(wpid, self._pyspy, self.nonblocking)
        except AttachError as exc:
            # A worker exiting between listing and dumping is routine; one that is not
            # Python (a shell, a compiler) is skipped from now on.
            if exc.kind in ("not-python", "permission"):
                self._no_stacks.add(wpid)
            return []
        return list(self._parser.samples(data, self.clock()))

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


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))
