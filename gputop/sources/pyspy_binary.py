"""The py-spy binary: finding it, running it on a PID (``dump --json``, ``dump --native``) with
its own CPU metered, and turning its failures into an ``AttachError`` that says why and what to
do; what /proc says of a process py-spy cannot sample (a kernel thread, a zombie and its exit).
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
from typing import Callable

from ..errors import UserError, os_reason
from ..redact import redact_cmdline
from .pyspy_permissions import permission_advice

# A dump takes ~10-20 ms; one that takes seconds means py-spy or the target is wedged.
DUMP_TIMEOUT_S = 5.0
# On a saturated host a nonblocking dump runs at the lowest CPU priority (the sampler asks for it):
# it does not stop the job, so it can wait for a CPU no one else wants, and the job keeps its share
# of the CPUs. (A blocking dump runs at gputop's own priority: the job is stopped until it ends.)
NONBLOCKING_NICE = 19
# Native unwinding measured ~0.6 s on the H100 box; allow a slow, loaded machine.
NATIVE_TIMEOUT_S = 30.0

PYSPY_ENV = "GPUTOP_PYSPY"  # path to a py-spy binary, to override the search


class AttachError(UserError):
    """Why a process's stacks cannot be read. ``kind``: gone | not-python | permission |
    pyspy-missing | pyspy-failed. The live UI may carry on without stacks for the last four."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def find_pyspy() -> str | None:
    """The py-spy executable of the installed py-spy package.

    pip puts it in the interpreter's scripts directory, which is often not on PATH (a venv
    that is not activated, ``python -m gputop``) and, for a venv made with
    ``--system-site-packages``, may be the base interpreter's, not the venv's; the package's own
    record of its files says where it is. PATH is the last resort, and there a native binary is
    taken before a wrapper script (pyenv's shim runs bash and pyenv for every dump: 5-9x the cost
    of the binary, so the sampler's budget bought a fraction of the stacks and the advisor
    stayed silent).
    """
    override = os.environ.get(PYSPY_ENV)
    if override:
        return override if os.access(override, os.X_OK) else None
    exe = "py-spy.exe" if os.name == "nt" else "py-spy"
    for cand in (*_installed(exe), *_script_dirs(exe)):
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    on_path = [c for c in (os.path.join(d, exe) for d in os.environ.get("PATH", "").split(os.pathsep) if d)
               if os.path.isfile(c) and os.access(c, os.X_OK)]
    return next((c for c in on_path if is_native(c)), on_path[0] if on_path else None)


def _installed(exe: str) -> list[str]:
    """Where the installed py-spy distribution says its executable is."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("py-spy")
    except (ImportError, PackageNotFoundError):
        return []
    except Exception:  # a broken installation's metadata: fall back to the search
        return []
    return [str(dist.locate_file(f).resolve()) for f in (dist.files or ()) if os.path.basename(str(f)) == exe]


def _script_dirs(exe: str) -> list[str]:
    dirs: list[str] = []
    for scheme in (None, f"{os.name}_user"):
        try:
            d = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        if d:
            dirs.append(d)
    dirs.append(os.path.dirname(sys.executable))
    # A venv made with --system-site-packages sees the base interpreter's packages, whose
    # scripts are beside the base interpreter.
    dirs.append(os.path.join(sys.base_prefix, "Scripts" if os.name == "nt" else "bin"))
    return [os.path.join(d, exe) for d in dirs]


def is_native(path: str) -> bool:
    """A compiled executable (ELF, Mach-O, PE), not a script that starts another program."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head in (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe") or head[:2] == b"MZ"


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
        if not _alive(pid):
            # It exited while py-spy read it (its maps going): the job ended, it was not "not Python"
            # (advise printed that beside "the target exited").
            return AttachError(f"no process with PID {pid}", "gone")
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
               meter: Callable[[float, float], None] | None = None, nice: int = 0) -> str:
    """py-spy's stdout; ``meter(wall_s, cpu_s)`` is told what the run cost; ``nice``: how much
    lower than gputop's own its CPU priority is."""
    env = dict(os.environ, RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0")  # one-line errors
    with _CHILD_LOCK:
        t0, c0 = time.perf_counter(), _children_cpu()
        try:
            with subprocess.Popen(
                [pyspy, *args, "--pid", str(pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=env, stdin=subprocess.DEVNULL,
            ) as proc:
                if nice:
                    _lower_priority(proc.pid, nice)
                try:
                    out, err = proc.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
                    raise AttachError(f"py-spy did not answer within {timeout:g} s for PID {pid}",
                                      "pyspy-failed") from None
        except OSError as exc:
            raise AttachError(f"cannot run py-spy ({pyspy}): {os_reason(exc)}", "pyspy-missing") from None
        finally:
            if meter is not None:
                meter(time.perf_counter() - t0, _children_cpu() - c0)
    if proc.returncode != 0:
        raise _classify_failure(pid, err, proc.returncode)
    return out


def _lower_priority(pid: int, nice: int) -> None:
    """Lower a child's CPU priority by ``nice`` (it may already have run its first millisecond:
    the rest of its run is what counts)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
    except (OSError, AttributeError):
        pass  # gone already, or no priorities here: it runs as it is


def dump_json(pid: int, pyspy: str | None = None, nonblocking: bool = False,
              meter: Callable[[float, float], None] | None = None, nice: int = 0) -> list[dict]:
    """One ``py-spy dump --json`` of ``pid``: py-spy's thread records as they come. ``nice``: run
    py-spy that much below gputop's CPU priority (only ever for a nonblocking dump)."""
    args = ["dump", "--json"] + (["--nonblocking"] if nonblocking else [])
    out = _run_pyspy(_pyspy_or_raise(pyspy), args, pid, DUMP_TIMEOUT_S, meter, nice=nice if nonblocking else 0)
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
    ``pid``'s stacks; returns the py-spy path. One nonblocking dump, ~10-20 ms: whether the stacks
    can be read needs no stopped job (on a loaded host a blocking one stopped it for as long as
    py-spy waited for a CPU); a blocking one only if that read came out torn."""
    import psutil

    if not psutil.pid_exists(pid):
        raise AttachError(f"no process with PID {pid}", "gone")
    special = _not_a_job(pid)
    if special is not None:
        raise special
    path = _pyspy_or_raise(pyspy)
    try:
        dump_json(pid, path, nonblocking=True)
    except AttachError as exc:
        if exc.kind != "pyspy-failed":
            raise
        dump_json(pid, path)
    return path


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


__all__ = ["DUMP_TIMEOUT_S", "NATIVE_TIMEOUT_S", "NONBLOCKING_NICE", "PYSPY_ENV", "AttachError", "check_attachable", "dump_json",
           "exit_status", "find_pyspy", "native_dump", "thread_on_cpu"]
