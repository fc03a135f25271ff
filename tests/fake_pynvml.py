"""A scriptable stand-in for the part of ``pynvml`` that gputop's NVML source uses.

``FakeNvml(gpus=[FakeGpu(...)], clock=FakeClock())`` behaves like the module: same function
names, the same error classes and codes (``NVMLError(3)`` is an ``NVMLError_NotSupported``),
the same constants. Per GPU one can script metric values, functions that are not supported or
fail with a code, the 200 ms utilisation buffer and per-process utilisation (generated from the
shared clock), GPM support and values, and a GPU that is lost after N polls (a poll is counted
each time the GPU's utilisation rates are read, the first thing a poll asks).

Every call is counted in ``fake.calls`` (function name -> count) so tests can check pacing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

# ----------------------------------------------------------------------------- constants (pynvml values)

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999

_ERROR_NAMES = {
    NVML_ERROR_UNINITIALIZED: ("Uninitialized", "Uninitialized"),
    NVML_ERROR_INVALID_ARGUMENT: ("InvalidArgument", "Invalid Argument"),
    NVML_ERROR_NOT_SUPPORTED: ("NotSupported", "Not Supported"),
    NVML_ERROR_NO_PERMISSION: ("NoPermission", "Insufficient Permissions"),
    NVML_ERROR_NOT_FOUND: ("NotFound", "Not Found"),
    NVML_ERROR_DRIVER_NOT_LOADED: ("DriverNotLoaded", "Driver Not Loaded"),
    NVML_ERROR_TIMEOUT: ("Timeout", "Timeout"),
    NVML_ERROR_LIBRARY_NOT_FOUND: ("LibraryNotFound", "NVML Shared Library Not Found"),
    NVML_ERROR_FUNCTION_NOT_FOUND: ("FunctionNotFound", "Function Not Found"),
    NVML_ERROR_GPU_IS_LOST: ("GpuIsLost", "GPU is lost"),
    NVML_ERROR_RESET_REQUIRED: ("ResetRequired", "GPU requires restart"),
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: ("LibRmVersionMismatch", "RM has detected an NVML/RM version mismatch."),
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: ("ArgumentVersionMismatch", "Argument Version Mismatch"),
    NVML_ERROR_GPU_NOT_FOUND: ("GpuNotFound", "GPU not found"),
    NVML_ERROR_UNKNOWN: ("Unknown", "Unknown Error"),
}

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
nvmlMemory_v2 = 0x02000028

NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DFMA_TENSOR_UTIL = 6
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_FP64_UTIL = 11
NVML_GPM_METRIC_FP32_UTIL = 12
NVML_GPM_METRIC_FP16_UTIL = 13
NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21
NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60
NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1

NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_SYSTEM = 50
NVML_P2P_CAPS_INDEX_READ = (0,)  # pynvml spells it as a 1-tuple
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_NVLINK_MAX_LINKS = 18
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_ALL_LINKS = 0xFFFFFFFF  # nvmlFieldValue_t.scopeId for the sum over all links (UINT_MAX)


# ----------------------------------------------------------------------------- errors (as pynvml builds them)


class NVMLError(Exception):
    _by_code: dict[int, type] = {}

    def __new__(cls, value: int | None = None):
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value if value is not None else getattr(cls, "_code", None)
        return obj

    def __init__(self, *args) -> None:
        Exception.__init__(self, self.value)

    def __str__(self) -> str:
        return _ERROR_NAMES.get(self.value, ("", f"NVML Error with code {self.value}"))[1]


_ERROR_CLASSES: dict[str, type] = {}
for _code, (_name, _text) in _ERROR_NAMES.items():
    _cls = type("NVMLError_" + _name, (NVMLError,), {"_code": _code})
    NVMLError._by_code[_code] = _cls
    _ERROR_CLASSES["NVMLError_" + _name] = _cls
    globals()["NVMLError_" + _name] = _cls
del _code, _name, _text, _cls


# ----------------------------------------------------------------------------- scripted world


class FakeClock:
    """Seconds since the epoch, moved by the test."""

    def __init__(self, t: float = 1_763_800_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@dataclass
class FakeProcess:
    pid: int
    used_memory: int | None = 1 << 30  # None: NVML says "not available"
    kind: str = "C"  # C, G or C+G
    sm_util: float | None = 50.0  # None: no per-process utilisation samples
    mem_util: float = 10.0


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-1111-2222-3333-444444444444"
    memory_total: int = 80 * 2**30
    memory_used: int = 20 * 2**30
    memory_reserved: int = 512 * 2**20  # v1 "used" includes this, v2 does not
    util_gpu: int = 97
    util_mem: int = 40
    temperature: int = 65
    power_mw: int = 650_000
    power_limit_mw: int = 700_000
    fan: int = 30
    sm_clock: int = 1980
    mem_clock: int = 2619
    sm_clock_max: int = 1980
    clocks_reasons: int = 0x4
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_max_gen: int = 5
    pcie_max_width: int = 16
    pcie_rx_kbs: int = 4000  # KB/s, as nvmlDeviceGetPcieThroughput reports
    pcie_tx_kbs: int = 2000
    ecc_corrected: int = 3
    ecc_uncorrected: int = 0
    compute_capability: tuple[int, int] = (9, 0)
    cuda_cores: int = 16896  # 132 SMs x 128
    persistence: int = NVML_FEATURE_ENABLED
    cpu_affinity: tuple[int, ...] = (0xFFFF,)  # CPUs 0-15
    # GPM: metric id -> value; None = the GPU does not support GPM
    gpm: dict[int, float] | None = field(
        default_factory=lambda: {
            NVML_GPM_METRIC_SM_UTIL: 96.9,
            NVML_GPM_METRIC_SM_OCCUPANCY: 12.1,
            NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.0,
            NVML_GPM_METRIC_DRAM_BW_UTIL: 6.5,
            NVML_GPM_METRIC_FP32_UTIL: 77.4,
            NVML_GPM_METRIC_FP16_UTIL: 1.5,
            NVML_GPM_METRIC_DFMA_TENSOR_UTIL: 0.0,
            NVML_GPM_METRIC_FP64_UTIL: 0.25,
            NVML_GPM_METRIC_PCIE_RX_PER_SEC: 4.75,
            NVML_GPM_METRIC_PCIE_TX_PER_SEC: 2.5,
        }
    )
    # the 200 ms buffer: value at time t (s); default is util_gpu
    util_at: Callable[[float], float] | None = None
    sample_period_us: int = 200_000
    buffer_s: float = 14.0
    proc_sample_period_us: int = 500_000
    processes: list[FakeProcess] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)  # function names -> NotSupported
    errors: dict[str, int] = field(default_factory=dict)  # function name -> error code
    lost_after_polls: int | None = None
    lost: bool = False
    lost_code: int = NVML_ERROR_GPU_IS_LOST
    polls: int = 0
    nvlinks: int = 0  # NVLinks up; 0: no NVLink (NotSupported)
    nvlink_kib_per_s: tuple[int, int] = (0, 0)  # (tx, rx) the counters grow by per second of the clock
    # Which scopes the NVLink throughput fields answer: "all" (every link, UINT_MAX for their
    # sum), "links" (per link only: UINT_MAX is an invalid argument, as an older driver may
    # say), "none" (NotSupported).
    nvlink_scopes: str = "all"
    nvlink_reset_at: float | None = None  # the counters start again from 0 at this clock time
    gpm_refuse_ids: set[int] = field(default_factory=set)  # GPM metric ids that fail the whole request


class _Handle:
    def __init__(self, gpu: FakeGpu, index: int) -> None:
        self.gpu = gpu
        self.index = index


class _GpmSample:
    def __init__(self) -> None:
        self.gpu: FakeGpu | None = None
        self.ts: float | None = None
        self.freed = False


class _GpmMetric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = NVML_SUCCESS
        self.value = 0.0


class c_nvmlGpmMetricsGet_t:  # noqa: N801 - pynvml's name
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: _GpmSample | None = None
        self.sample2: _GpmSample | None = None
        self.metrics = [_GpmMetric() for _ in range(32)]


class FakeNvml:
    """Module-like object: pass it as ``nvml=`` to the source."""

    NVMLError = NVMLError
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        clock: Callable[[], float] | None = None,
        init_error: int | None = None,
        driver: str = "580.159.04",
        cuda: int = 13000,
        nvml_version: str = "13.580.159.04",
        refuse_handles: dict[int, int] | None = None,
        links: dict[tuple[int, int], tuple[int, int, int]] | None = None,
    ) -> None:
        """``links``: (i, j) -> (common-ancestor level, P2P read status, P2P NVLink status); None:
        the topology calls are not supported."""
        self.gpus = list(gpus) if gpus is not None else [FakeGpu()]
        self.clock = clock or FakeClock()
        self.init_error = init_error
        self.driver = driver
        self.cuda = cuda
        self.nvml_version = nvml_version
        self.refuse_handles = refuse_handles or {}
        self.links = links
        self.calls: Counter[str] = Counter()
        self.initialized = 0
        self.shutdowns = 0
        self.gpm_samples: list[_GpmSample] = []
        self.gpm_pairs: list[tuple[float, float]] = []
        self.samples_args: list[tuple[int, int]] = []  # (gpu index, lastSeen µs) per GetSamples
        self.proc_util_args: list[tuple[int, int]] = []
        self.field_args: list[tuple[int, list]] = []  # (gpu index, field ids) per GetFieldValues

    def __getattr__(self, name: str):
        # Module constants and error classes, as ``pynvml.X``.
        g = globals()
        if name.startswith(("NVML_", "NVMLError_", "nvmlMemory_")) and name in g:
            return g[name]
        raise AttributeError(name)

    # ----------------------------------------------------------------- plumbing

    def _dev(self, fn: str, h: _Handle) -> FakeGpu:
        self.calls[fn] += 1
        gpu = h.gpu
        if fn == "nvmlDeviceGetUtilizationRates":
            gpu.polls += 1
            if gpu.lost_after_polls is not None and gpu.polls > gpu.lost_after_polls:
                gpu.lost = True
        if gpu.lost:
            raise NVMLError(gpu.lost_code)
        if fn in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if fn in gpu.errors:
            raise NVMLError(gpu.errors[fn])
        return gpu

    def _now_us(self) -> int:
        return int(round(self.clock() * 1e6))

    # ----------------------------------------------------------------- library / system

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.cuda

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlSystemGetNVMLVersion(self) -> str:
        return self.nvml_version

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> _Handle:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        if i in self.refuse_handles:
            raise NVMLError(self.refuse_handles[i])
        if not 0 <= i < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[i].lost:
            raise NVMLError(self.gpus[i].lost_code)
        return _Handle(self.gpus[i], i)

    # ----------------------------------------------------------------- static-ish device info

    def nvmlDeviceGetName(self, h):
        return self._dev("nvmlDeviceGetName", h).name

    def nvmlDeviceGetUUID(self, h):
        return self._dev("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return self._dev("nvmlDeviceGetCudaComputeCapability", h).compute_capability

    def nvmlDeviceGetNumGpuCores(self, h):
        return self._dev("nvmlDeviceGetNumGpuCores", h).cuda_cores

    def nvmlDeviceGetPersistenceMode(self, h):
        return self._dev("nvmlDeviceGetPersistenceMode", h).persistence

    def nvmlDeviceGetCpuAffinity(self, h, cpu_set_size):
        words = list(self._dev("nvmlDeviceGetCpuAffinity", h).cpu_affinity)
        return (words + [0] * cpu_set_size)[:cpu_set_size]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._dev("nvmlDeviceGetMaxPcieLinkGeneration", h).pcie_max_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._dev("nvmlDeviceGetMaxPcieLinkWidth", h).pcie_max_width

    def nvmlDeviceGetMaxClockInfo(self, h, clock_type):
        gpu = self._dev("nvmlDeviceGetMaxClockInfo", h)
        return gpu.sm_clock_max if clock_type == NVML_CLOCK_SM else gpu.mem_clock

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._dev("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw

    # ----------------------------------------------------------------- per-poll metrics

    def nvmlDeviceGetUtilizationRates(self, h):
        gpu = self._dev("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=gpu.util_gpu, memory=gpu.util_mem)

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        gpu = self._dev("nvmlDeviceGetMemoryInfo", h)
        free = gpu.memory_total - gpu.memory_used - gpu.memory_reserved
        if version is None:
            return SimpleNamespace(total=gpu.memory_total, free=free, used=gpu.memory_total - free)
        if version != nvmlMemory_v2:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return SimpleNamespace(
            version=version, total=gpu.memory_total, reserved=gpu.memory_reserved, free=free, used=gpu.memory_used
        )

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._dev("nvmlDeviceGetTemperature", h).temperature

    def nvmlDeviceGetPowerUsage(self, h):
        return self._dev("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetFanSpeed(self, h):
        return self._dev("nvmlDeviceGetFanSpeed", h).fan

    def nvmlDeviceGetClockInfo(self, h, clock_type):
        gpu = self._dev("nvmlDeviceGetClockInfo", h)
        return gpu.sm_clock if clock_type == NVML_CLOCK_SM else gpu.mem_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._dev("nvmlDeviceGetCurrentClocksEventReasons", h).clocks_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._dev("nvmlDeviceGetCurrentClocksThrottleReasons", h).clocks_reasons

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._dev("nvmlDeviceGetCurrPcieLinkGeneration", h).pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._dev("nvmlDeviceGetCurrPcieLinkWidth", h).pcie_width

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        gpu = self._dev("nvmlDeviceGetPcieThroughput", h)
        return gpu.pcie_rx_kbs if counter == NVML_PCIE_UTIL_RX_BYTES else gpu.pcie_tx_kbs

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        gpu = self._dev("nvmlDeviceGetTotalEccErrors", h)
        if counter_type != NVML_VOLATILE_ECC:
            return 10_000  # aggregate: a value the source must not report
        return gpu.ecc_corrected if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED else gpu.ecc_uncorrected

    # ----------------------------------------------------------------- sample buffers

    def nvmlDeviceGetSamples(self, h, sampling_type, last_seen_us):
        gpu = self._dev("nvmlDeviceGetSamples", h)
        self.samples_args.append((h.index, int(last_seen_us)))
        if sampling_type != NVML_GPU_UTILIZATION_SAMPLES:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        now = self._now_us()
        period = gpu.sample_period_us
        oldest = now - int(gpu.buffer_s * 1e6)
        first = max(oldest, int(last_seen_us)) // period + 1
        out = []
        for k in range(first, now // period + 1):
            t_us = k * period
            value = gpu.util_at(t_us / 1e6) if gpu.util_at else gpu.util_gpu
            out.append(SimpleNamespace(timeStamp=t_us, sampleValue=SimpleNamespace(uiVal=int(value), dVal=0.0)))
        if not out:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return (NVML_VALUE_TYPE_UNSIGNED_INT, out)

    def nvmlDeviceGetProcessUtilization(self, h, last_seen_us):
        gpu = self._dev("nvmlDeviceGetProcessUtilization", h)
        self.proc_util_args.append((h.index, int(last_seen_us)))
        now = self._now_us()
        period = gpu.proc_sample_period_us
        oldest = now - int(gpu.buffer_s * 1e6)
        first = max(oldest, int(last_seen_us)) // period + 1
        out = []
        for k in range(first, now // period + 1):
            for p in gpu.processes:
                if p.sm_util is not None:
                    out.append(
                        SimpleNamespace(
                            pid=p.pid, timeStamp=k * period, smUtil=int(p.sm_util), memUtil=int(p.mem_util), encUtil=0, decUtil=0
                        )
                    )
        if not out:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return out

    # ----------------------------------------------------------------- processes

    def _procs(self, h, fn: str, kinds: tuple[str, ...]):
        gpu = self._dev(fn, h)
        return [
            SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_memory, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            for p in gpu.processes
            if p.kind in kinds
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self._procs(h, "nvmlDeviceGetComputeRunningProcesses", ("C", "C+G"))

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return self._procs(h, "nvmlDeviceGetGraphicsRunningProcesses", ("G", "C+G"))

    # ----------------------------------------------------------------- links

    def _link(self, fn: str, a, b) -> tuple[int, int, int]:
        self._dev(fn, a)
        key = (min(a.index, b.index), max(a.index, b.index))
        if self.links is None or key not in self.links:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return self.links[key]

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self._link("nvmlDeviceGetTopologyCommonAncestor", a, b)[0]

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        link = self._link("nvmlDeviceGetP2PStatus", a, b)
        return link[2] if index == NVML_P2P_CAPS_INDEX_NVLINK else link[1]

    def nvmlDeviceGetNvLinkState(self, h, link):
        gpu = self._dev("nvmlDeviceGetNvLinkState", h)
        if not gpu.nvlinks or link >= NVML_NVLINK_MAX_LINKS:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return NVML_FEATURE_ENABLED if link < gpu.nvlinks else NVML_FEATURE_DISABLED

    def nvmlDeviceGetFieldValues(self, h, ids):
        """``ids``: field ids, or (field id, scope id) pairs as pynvml takes them; a bare id is
        scope 0 (link 0 for the NVLink throughput counters)."""
        gpu = self._dev("nvmlDeviceGetFieldValues", h)
        self.field_args.append((h.index, list(ids)))
        t = self.clock()
        if gpu.nvlink_reset_at is not None and t >= gpu.nvlink_reset_at:
            t -= gpu.nvlink_reset_at
        per_s = {NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: gpu.nvlink_kib_per_s[0],
                 NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: gpu.nvlink_kib_per_s[1]}
        out = []
        for item in ids:
            fid, scope = item if isinstance(item, tuple) else (item, 0)
            code, value = NVML_SUCCESS, 0
            if fid not in per_s or gpu.nvlink_scopes == "none" or not gpu.nvlinks:
                code = NVML_ERROR_NOT_SUPPORTED
            elif scope == NVML_ALL_LINKS:
                if gpu.nvlink_scopes == "links":
                    code = NVML_ERROR_INVALID_ARGUMENT
                else:
                    value = int(per_s[fid] * t)
            elif scope < gpu.nvlinks:
                value = int(per_s[fid] * t / gpu.nvlinks)  # the traffic spread evenly over the links
            else:
                code = NVML_ERROR_INVALID_ARGUMENT
            out.append(SimpleNamespace(fieldId=fid, scopeId=scope, nvmlReturn=code, value=SimpleNamespace(ullVal=value)))
        return out

    # ----------------------------------------------------------------- GPM

    def nvmlGpmQueryDeviceSupport(self, h):
        gpu = self._dev("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(gpu.gpm is not None))

    def nvmlGpmSampleAlloc(self):
        self.calls["nvmlGpmSampleAlloc"] += 1
        s = _GpmSample()
        self.gpm_samples.append(s)
        return s

    def nvmlGpmSampleFree(self, s):
        self.calls["nvmlGpmSampleFree"] += 1
        s.freed = True

    def nvmlGpmSampleGet(self, h, s):
        gpu = self._dev("nvmlGpmSampleGet", h)
        if gpu.gpm is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if s.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        s.gpu, s.ts = gpu, self.clock()
        return s

    def nvmlGpmMetricsGet(self, req):
        self.calls["nvmlGpmMetricsGet"] += 1
        s1, s2 = req.sample1, req.sample2
        if req.version != NVML_GPM_METRICS_GET_VERSION:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if s1 is None or s2 is None or s1.ts is None or s2.ts is None or s1.gpu is not s2.gpu:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not s1.ts < s2.ts:  # NVML needs the older sample first
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if any(m.metricId in s2.gpu.gpm_refuse_ids for m in req.metrics[: req.numMetrics]):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self.gpm_pairs.append((s1.ts, s2.ts))
        values = s2.gpu.gpm or {}
        for m in req.metrics[: req.numMetrics]:
            if m.metricId in values:
                m.nvmlReturn, m.value = NVML_SUCCESS, values[m.metricId]
            else:
                m.nvmlReturn, m.value = NVML_ERROR_NOT_SUPPORTED, 0.0
        return req


# Function names the fake implements: the source must not call anything else.
FAKE_FUNCTIONS = sorted(n for n in vars(FakeNvml) if n.startswith("nvml"))
