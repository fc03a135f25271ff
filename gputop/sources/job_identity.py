"""Which distributed job a process belongs to, and its place in it, read from its environment.

The launchers say who a rank is in environment variables (torchrun: ``TORCHELASTIC_RUN_ID``,
``MASTER_ADDR``/``MASTER_PORT``, ``RANK``...; Slurm: ``SLURM_JOB_ID``). Only the keys in
``IDENTITY_KEYS`` are ever read out of an environment, and each value still goes through the
project's redaction: an environment carries tokens and passwords, and what this returns becomes
Prometheus labels that every dashboard reader sees. Nothing else of the environment leaves here.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Mapping

from ..redact import REDACTED, redact_value

# The only environment keys this module reads. Each is an id, an address, a port or a number.
IDENTITY_KEYS = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID", "SLURM_STEP_ID",
                 "RANK", "LOCAL_RANK", "WORLD_SIZE")
# torchrun's default --rdzv-id is "none": every job started without one shares it, so it names no job.
_NO_RUN_ID = {"", "none"}
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}
# A label value longer than this is cut: ids are short, and a runaway value must not bloat a series.
MAX_ID_CHARS = 96


@dataclass(frozen=True)
class JobIdentity:
    job: str  # one value for every rank of the job, on every host
    source: str  # where ``job`` came from: torchelastic | master | slurm | launcher
    rank: int
    local_rank: int | None
    world_size: int | None
    host: str


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _clean(key: str, value: str) -> str:
    v = redact_value(key, value.strip())
    return "" if REDACTED in v else v[:MAX_ID_CHARS]


def identity_of(environ: Mapping[str, str], host: str, launcher_pid: int | None = None) -> JobIdentity | None:
    """The rank's identity from its environment, None when it has no ``RANK`` (not a rank).

    The job id is the first of: the elastic run id (unless torchrun's default "none"), the
    rendezvous address MASTER_ADDR:MASTER_PORT, the Slurm job (and step), or, for a launcher that
    sets none of them, the launcher's pid on this host (such a job cannot span hosts anyway). A
    loopback MASTER_ADDR is the same string in every single-host job of the fleet, so the host
    is put in front of it."""
    env = {k: _clean(k, environ[k]) for k in IDENTITY_KEYS if k in environ}
    rank = _int(env.get("RANK"))
    if rank is None:
        return None
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    slurm = env.get("SLURM_JOB_ID", "")
    if run_id not in _NO_RUN_ID:
        job, source = run_id, "torchelastic"
    elif addr and port:
        job = f"{host}/{addr}:{port}" if addr in _LOOPBACK else f"{addr}:{port}"
        source = "master"
    elif slurm:
        step = env.get("SLURM_STEP_ID", "")
        job, source = (f"{slurm}.{step}" if step else slurm), "slurm"
    elif launcher_pid is not None:
        job, source = f"{host}/pid{launcher_pid}", "launcher"
    else:
        return None
    return JobIdentity(job[:MAX_ID_CHARS], source, rank, _int(env.get("LOCAL_RANK")), _int(env.get("WORLD_SIZE")),
                       host)


def host_name() -> str:
    """This machine's short host name (the label the job view groups ranks by)."""
    return socket.gethostname().split(".", 1)[0]


def read_identity(pid: int, host: str | None = None) -> JobIdentity | None:
    """``identity_of`` a live process; None when it is gone, not a rank, or its environment
    cannot be read (another user's process without ptrace rights)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        environ = proc.environ()
        launcher = proc.ppid()
    except (psutil.Error, OSError):
        return None
    return identity_of(environ, host or host_name(), launcher)
