"""`gputop doctor`: can this machine be monitored, and what would get in the way?"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
import warnings

from .. import __version__

Check = tuple[str, bool, str]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="check the environment: driver, NVML, GPUs, py-spy, ptrace, torch",
        description="Check whether this machine can be monitored: Python packages, the NVIDIA driver and "
        "NVML, each GPU, py-spy and ptrace permissions, /dev/shm, and with --torch PyTorch's view of the "
        "GPUs. Prints one line per check; exits 1 when any check fails.",
    )
    p.add_argument("--torch", action="store_true", help="also import torch and run a small matmul on each GPU")
    p.set_defaults(func=run)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def python_checks() -> list[Check]:
    out: list[Check] = [
        ("python", sys.version_info >= (3, 10), f"{platform.python_version()} ({sys.executable})"),
        ("gputop", True, __version__),
    ]
    for dist in ("textual", "psutil", "nvidia-ml-py", "py-spy"):
        v = _version(dist)
        out.append((dist, v is not None, v or "not installed: pip install " + dist))
    return out


def ptrace_checks() -> list[Check]:
    """py-spy, and what governs attaching here: always a line, Yama or not (without Yama the
    kernel's plain rule applies: the same user, or CAP_SYS_PTRACE; and a container's seccomp)."""
    from ..sources import PYSPY_ENV, attach_policy, find_pyspy, is_native, ptrace_facts

    out: list[Check] = []
    pyspy = find_pyspy()
    if pyspy is not None and not is_native(pyspy):
        # A wrapper (pyenv's shim) starts a shell and another program for every dump.
        out.append(("py-spy binary", False, f"{pyspy} is a wrapper script, not py-spy itself: each stack costs several "
                                             f"times more, so fewer are taken; set {PYSPY_ENV}=/path/to/py-spy"))
    else:
        out.append(("py-spy binary", pyspy is not None, pyspy or "not found: pip install py-spy"))
    facts = ptrace_facts(os.getpid())  # the Yama scope and this process's capabilities
    ok, detail = attach_policy(facts.ptrace_scope, facts.cap_sys_ptrace, facts.euid)
    out.append(("ptrace", ok, detail))
    return out


def host_checks() -> list[Check]:
    import psutil

    out: list[Check] = [("cpu cores", True, f"{psutil.cpu_count(logical=True)} logical, {psutil.cpu_count(logical=False)} physical")]
    try:
        shm = psutil.disk_usage("/dev/shm")
        # DataLoader workers pass batches through /dev/shm; Docker's default is 64 MB.
        ok = shm.total >= 1024**3
        detail = f"{shm.total / 1024**3:.1f} GiB"
        if not ok:
            detail += " (small: multi-worker DataLoaders may fail; docker run --shm-size=8g or --ipc=host)"
        out.append(("/dev/shm", ok, detail))
    except OSError:
        pass
    return out


# What torch warns (from C++, as a UserWarning) when it cannot import numpy: the CPU wheels do not
# depend on it. gputop needs no numpy; doctor says so as a line rather than print torch's warning.
NUMPY_WARNING = "Failed to initialize NumPy"


def _import_torch():
    """``import torch`` with its numpy warning caught and returned (None without one); any other
    warning is shown as usual."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
    numpy_warning = None
    for w in caught:
        if issubclass(w.category, UserWarning) and NUMPY_WARNING in str(w.message):
            numpy_warning = str(w.message).split(" (Triggered internally", 1)[0]
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return torch, numpy_warning


def numpy_check(numpy_warning: str | None) -> Check:
    v = _version("numpy")
    if v is None:
        return ("numpy", True, "not installed (torch warns without it; gputop does not need it)")
    if numpy_warning:
        return ("numpy", False, f"{v} installed, but torch cannot use it: {numpy_warning}")
    return ("numpy", True, v)


def torch_checks() -> list[Check]:
    try:
        torch, numpy_warning = _import_torch()
    except ImportError:
        return [("torch", True, "not installed (optional)")]
    return _torch_device_checks(torch) + [numpy_check(numpy_warning)]


def _torch_device_checks(torch) -> list[Check]:
    built_for = getattr(torch.version, "cuda", None)
    if built_for is None:
        # torch.version.cuda is None for the CPU-only wheels (and ROCm builds say so in .hip).
        hip = getattr(torch.version, "hip", None)
        build = f"ROCm {hip} build" if hip else "CPU-only build: no CUDA support compiled in"
    else:
        build = f"built for CUDA {built_for}"
    out: list[Check] = [("torch", True, f"{torch.__version__}, {build}")]
    if not torch.cuda.is_available():
        if built_for is None and not getattr(torch.version, "hip", None):
            why = "this torch is a CPU-only build: for the GPU, install a CUDA build (pytorch.org/get-started)"
        else:
            why = "CUDA not available to torch (no GPU visible, or a driver/runtime mismatch)"
        out.append(("torch.cuda", False, why))
        return out
    out.append(("cudnn", True, str(torch.backends.cudnn.version())))
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        tc = "tensor cores" if p.major >= 7 else "no tensor cores (cc < 7.0)"
        try:
            a = torch.randn(512, 512, device=f"cuda:{i}")
            float((a @ a).sum())
            ok, mm = True, "matmul ok"
        except Exception as exc:  # the point of the check is to report any failure
            ok, mm = False, f"matmul failed: {exc}"
        out.append(
            (f"torch cuda:{i}", ok, f"{p.name}, cc {p.major}.{p.minor}, {p.total_memory / 1024**3:.0f} GiB, {p.multi_processor_count} SMs, {tc}, {mm}")
        )
    return out


def run(args: argparse.Namespace) -> int:
    from ..sources import describe_environment

    sections: list[tuple[str, list[Check]]] = [
        ("python", python_checks()),
        ("nvidia", describe_environment()),
        ("attach", ptrace_checks()),
        ("host", host_checks()),
    ]
    if args.torch:
        sections.append(("torch", torch_checks()))
    failed = 0
    for title, checks in sections:
        print(f"{title}:")
        for name, ok, detail in checks:
            failed += not ok
            print(f"  {'ok ' if ok else 'FAIL'} {name:<16} {detail}")
    print(f"\n{failed} problem{'' if failed == 1 else 's'} found." if failed else "\nall checks passed.")
    gpu_failed = sum(not ok for title, checks in sections if title == "nvidia" for _, ok, _ in checks)
    if gpu_failed and gpu_failed == failed:
        # Only the GPU is missing: say what still works, or a user with CPU jobs or recordings
        # reads the one FAIL as "gputop cannot run here".
        print(WITHOUT_GPU)
    return 1 if failed else 0


# What a machine without an NVIDIA GPU (or driver) can still do.
WITHOUT_GPU = ("Without a GPU gputop still watches the host and attaches to CPU jobs (gputop --pid PID, advise, "
               "record, stacks), replays and reports recordings, and shows fake GPUs (gputop --fake 2).")
