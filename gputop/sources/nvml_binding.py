"""The NVML binding: loading ``pynvml`` (the ``nvidia-ml-py`` package) and starting NVML, its
error codes and constants, and the compatibility probes that find which entry point this driver
and binding pair has. The only module that imports ``pynvml``; ``sources.nvml`` turns what it
answers into samples.

Everything is read from the module handed in (``pynvml``, or a stand-in with its names), with
nvml.h's values as defaults: an older ``pynvml`` that lacks a constant or a function still works,
the function then reads as not supported.
"""

from __future__ import annotations

from typing import Any, Callable

# NVML return codes (nvml.h; pynvml uses the same numbers). Read from the module when present.
SUCCESS = 0
_ERR = {
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "LIB_RM_VERSION_MISMATCH": 18,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "GPU_NOT_FOUND": 28,
    "UNKNOWN": 999,
}

# GPM metric ids (nvml.h NVML_GPM_METRIC_*) → GpuSample field. PCIe rates come in MiB/s.
_GPM_METRICS: tuple[tuple[str, str, int], ...] = (
    ("sm_active", "NVML_GPM_METRIC_SM_UTIL", 2),
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY", 3),
    ("tensor_active", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5),
    ("dram_active", "NVML_GPM_METRIC_DRAM_BW_UTIL", 10),
    ("fp32_active", "NVML_GPM_METRIC_FP32_UTIL", 12),
    ("fp16_active", "NVML_GPM_METRIC_FP16_UTIL", 13),
    ("dfma_active", "NVML_GPM_METRIC_DFMA_TENSOR_UTIL", 6),
    ("fp64_active", "NVML_GPM_METRIC_FP64_UTIL", 11),
    ("pcie_tx_mib", "NVML_GPM_METRIC_PCIE_TX_PER_SEC", 20),
    ("pcie_rx_mib", "NVML_GPM_METRIC_PCIE_RX_PER_SEC", 21),
)
# GPM's NVLink data rates over all links, MiB/s (DCGM's nvlink_tx_bytes / nvlink_rx_bytes, DCP
# fields 1011/1012, are these on GPUs with GPM). Asked only of GPUs with NVLinks up.
_GPM_NVLINK: tuple[tuple[str, str, int], ...] = (
    ("nvlink_tx_mib", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", 61),
    ("nvlink_rx_mib", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", 60),
)
# nvmlFieldValue_t.scopeId asking NVLink throughput counters for the sum over all links (UINT_MAX,
# nvml.h); scope 0, pynvml's default for a bare field id, is link 0 alone.
ALL_LINKS = 0xFFFFFFFF


class NvmlUnavailable(Exception):
    """NVML cannot be used at all; ``str()`` is one line saying why.

    ``check`` names what failed (for a doctor-style listing).
    """

    def __init__(self, message: str, check: str = "NVIDIA driver") -> None:
        super().__init__(message)
        self.check = check


def open_nvml(nvml: Any = None) -> tuple[Any, list[tuple[int, Any]], list[str]]:
    """Initialise NVML and find the GPUs: (the module, (index, handle) per GPU, the GPUs NVML
    lists but would not give a handle for). :class:`NvmlUnavailable` if there is nothing to poll."""
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError:
            raise NvmlUnavailable(
                "nvidia-ml-py is not installed (pip install nvidia-ml-py)", check="nvidia-ml-py"
            ) from None
    err_cls = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except err_cls as exc:
        raise NvmlUnavailable(_init_reason(nvml, exc)) from None
    except Exception as exc:  # ctypes/OS trouble loading the library
        raise NvmlUnavailable(f"NVML init failed: {type(exc).__name__}: {exc}") from None

    def fail(message: str, check: str) -> NvmlUnavailable:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
        return NvmlUnavailable(message, check=check)

    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:
        raise fail(f"cannot count NVIDIA GPUs: {exc}", "GPUs") from None
    if count <= 0:
        raise fail("no NVIDIA GPU found", "GPUs")
    handles: list[tuple[int, Any]] = []
    refused: list[str] = []
    for i in range(count):
        try:
            handles.append((i, nvml.nvmlDeviceGetHandleByIndex(i)))
        except Exception as exc:
            refused.append(f"GPU {i}: {exc}")
    if not handles:
        raise fail("no accessible NVIDIA GPU (" + "; ".join(refused) + ")", "GPUs")
    return nvml, handles, refused


def _init_reason(nvml: Any, exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    c = {k: getattr(nvml, "NVML_ERROR_" + k, v) for k, v in _ERR.items()}
    if code == c["LIBRARY_NOT_FOUND"]:
        return "NVIDIA driver not loaded (libnvidia-ml.so.1 not found)"
    if code == c["DRIVER_NOT_LOADED"]:
        return "NVIDIA driver not loaded (the kernel module is not running)"
    if code == c["NO_PERMISSION"]:
        return "no permission to use the NVIDIA driver (check access to /dev/nvidia*)"
    if code == c["LIB_RM_VERSION_MISMATCH"]:
        return "NVIDIA driver and library versions differ (reload the driver or reboot)"
    return f"NVML init failed: {exc}"


class Binding:
    """One NVML module and what the source needs to know of it: its error class and codes (which
    mean "never ask again", "the GPU is gone", "try an older entry point"), its constants, and
    the entry points chosen for calls that drivers and bindings spell differently."""

    def __init__(self, nvml: Any) -> None:
        self.nv = nvml
        self.err_cls: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self.code = {k: getattr(nvml, "NVML_ERROR_" + k, v) for k, v in _ERR.items()}
        c = self.code
        self.never = {c["NOT_SUPPORTED"], c["FUNCTION_NOT_FOUND"]}
        self.hard_lost = {c["GPU_IS_LOST"], c["RESET_REQUIRED"], c["GPU_NOT_FOUND"]}
        # On the first call of a poll, these mean the whole device is not answering.
        self.probe_lost = self.hard_lost | {c["UNKNOWN"], c["TIMEOUT"]}
        self.newer_missing = {c["FUNCTION_NOT_FOUND"], c["ARGUMENT_VERSION_MISMATCH"]}
        self.k = {
            "temp_gpu": getattr(nvml, "NVML_TEMPERATURE_GPU", 0),
            "clock_sm": getattr(nvml, "NVML_CLOCK_SM", 1),
            "clock_mem": getattr(nvml, "NVML_CLOCK_MEM", 2),
            "ecc_corr": getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0),
            "ecc_uncorr": getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            "ecc_volatile": getattr(nvml, "NVML_VOLATILE_ECC", 0),
            "util_samples": getattr(nvml, "NVML_GPU_UTILIZATION_SAMPLES", 1),
            "pcie_tx": getattr(nvml, "NVML_PCIE_UTIL_TX_BYTES", 0),
            "pcie_rx": getattr(nvml, "NVML_PCIE_UTIL_RX_BYTES", 1),
            "enabled": getattr(nvml, "NVML_FEATURE_ENABLED", 1),
        }
        nv = nvml
        self.temperature = self.newest(
            [
                lambda h: nv.nvmlDeviceGetTemperature(h, self.k["temp_gpu"]),
                lambda h: nv.nvmlDeviceGetTemperatureV(h, self.k["temp_gpu"]),
            ]
        )
        mem_calls: list[Callable[[Any], Any]] = []
        if hasattr(nv, "nvmlMemory_v2"):
            # v2 leaves out the driver's reserved memory, as nvidia-smi does.
            mem_calls.append(lambda h: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2))
        mem_calls.append(lambda h: nv.nvmlDeviceGetMemoryInfo(h))
        self.memory = self.newest(mem_calls)
        self.reasons = self.newest_named(
            "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        self.compute_procs = self.newest_named(
            "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"
        )
        self.graphics_procs = self.newest_named(
            "nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses_v2"
        )
        self.gpm_ids = [(f, getattr(nv, name, default)) for f, name, default in _GPM_METRICS]
        self.gpm_nvlink_ids = [(f, getattr(nv, name, default)) for f, name, default in _GPM_NVLINK]

    def newest(self, calls: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
        """A call trying NVML entry points in order until the driver has one; remembers it."""
        order = list(calls)
        missing = self.newer_missing

        def call(h: Any) -> Any:
            while True:
                fn = order[0]
                try:
                    return fn(h)
                except AttributeError:
                    if len(order) == 1:
                        raise self.nv.NVMLError(self.code["NOT_SUPPORTED"]) from None
                    order.pop(0)
                except self.err_cls as exc:  # type: ignore[misc]
                    if getattr(exc, "value", None) not in missing or len(order) == 1:
                        raise
                    order.pop(0)
                except Exception as exc:
                    # pynvml wraps a missing versioned entry point in NVMLLibraryMismatchError
                    if type(exc).__name__ != "NVMLLibraryMismatchError" or len(order) == 1:
                        raise
                    order.pop(0)

        return call

    def newest_named(self, *names: str) -> Callable[[Any], Any]:
        nv = self.nv
        return self.newest([lambda h, n=n: getattr(nv, n)(h) for n in names])

    def call(self, name: str, *args: Any) -> Any:
        """An optional NVML call: None when this pynvml lacks it, the GPU does not support it
        (NotSupported) or it fails at all; link facts are never worth an error."""
        fn = getattr(self.nv, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception:
            return None

    def const(self, name: str, default: int) -> int:
        v = getattr(self.nv, name, default)
        return v[0] if isinstance(v, tuple) else v  # pynvml spells a few of these as 1-tuples


__all__ = ["ALL_LINKS", "SUCCESS", "Binding", "NvmlUnavailable", "open_nvml"]
