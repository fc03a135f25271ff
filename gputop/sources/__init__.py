"""Sources: they turn the world into samples and decide nothing (NVML, psutil, py-spy, /proc,
NCCL's RAS, the fake GPUs; a multi-rank job's ranks and identity; Prometheus's query API;
PyTorch's flight-recorder dumps and its analyzer's reading of them).

This is its face: the layers above import from here, never from its modules (an import-linter
contract keeps it so), so a module can be split or renamed without touching them. NVML itself
is loaded only when a source opens it, not on import.
"""

from __future__ import annotations

from .fake import FAKE_PID_BASE, SAMPLE_PERIOD, FakeGpuSource
from .flight_recorder import AnalyzerUnavailable, DumpError, DumpSet, check_analyzer, find_dumps, load_dump, run_analyzer
from .host import HostSource, job_env
from .job_identity import JobIdentity, host_name, identity_of, read_identity
from .nccl_ras import NcclRasSource, environ_of
from .nvml import NvmlSource, describe_environment
from .nvml_binding import NvmlUnavailable
from .procfs import ProcfsSource
# Prometheus's names are prefixed: ``query`` alone would be NCCL's RAS query as much as its.
from .prometheus_api import BadPrometheusUrl, PrometheusError
from .prometheus_api import query as prometheus_query, shown as prometheus_shown
from .ranks import Job, Rank, find_ranks
from .pyspy_binary import PYSPY_ENV, is_native
from .stacks import (
    ATTACH_BURST_RATE, DEFAULT_CPU_BUDGET, DEFAULT_PAUSE_BUDGET, DEFAULT_RATE, AttachError, PySpySource,
    StackParser, attach_policy, check_attachable, find_pyspy, job_cost_pct, native_dump, ptrace_facts,
)

__all__ = [
    "AnalyzerUnavailable", "DumpError", "DumpSet", "check_analyzer", "find_dumps", "load_dump", "run_analyzer",
    "ATTACH_BURST_RATE", "DEFAULT_CPU_BUDGET", "DEFAULT_PAUSE_BUDGET", "DEFAULT_RATE", "FAKE_PID_BASE",
    "SAMPLE_PERIOD", "AttachError", "FakeGpuSource", "HostSource", "Job", "JobIdentity", "NcclRasSource",
    "NvmlSource", "NvmlUnavailable", "ProcfsSource", "PrometheusError", "PySpySource", "Rank", "StackParser",
    "PYSPY_ENV", "attach_policy", "check_attachable", "is_native", "describe_environment", "environ_of", "find_pyspy", "find_ranks", "host_name",
    "identity_of", "job_cost_pct", "job_env", "native_dump", "prometheus_query", "prometheus_shown",
    "BadPrometheusUrl",
    "ptrace_facts", "read_identity",
]
