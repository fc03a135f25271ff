"""The NVML source: every GPU's samples, polled through ``nvml_binding`` (which loads NVML).

Every metric is optional. A metric the GPU does not support reads ``None`` and is named once in
an info ``Event``; it is not asked for again. A GPU that stops answering becomes a
``GpuSample(error=...)`` plus one warning, is retried with a growing delay, and the others keep
being polled. ``poll()`` does not raise for NVML errors.

Call costs measured on an H100 (see the project's facts file): most getters ~1 µs, the 200 ms
utilisation buffer ~1.9 ms, per-process utilisation ~1.8 ms, PCIe throughput ~20 ms per counter
(it measures over a window). The slow ones are paced or skipped when there is nothing to read.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..model import Event, GpuInfo, GpuProcess, GpuSample, SystemInfo, UtilPoint
from .nvml_binding import ALL_LINKS, SUCCESS, Binding, NvmlUnavailable, open_nvml

SOURCE = "nvml"

# nvmlDeviceGetPcieThroughput blocks ~20 ms per counter (facts file): read it this often and
# reuse the value in between. GPUs with GPM get PCIe rates from GPM at no extra cost instead.
PCIE_INTERVAL_S = 5.0
# A GPU that stopped answering is tried again after this delay, doubled on each failure.
LOST_RETRY_FIRST_S = 2.0
LOST_RETRY_MAX_S = 60.0
# GPM rates over a shorter window than this are noise (and NVML may refuse them): a poll that
# comes sooner than this after the previous GPM sample reuses the previous values.
GPM_MIN_WINDOW_S = 0.1
# How often the slowly changing GpuInfo fields (persistence mode, ...) are read again.
INFO_REFRESH_S = 30.0
# Per-process utilisation: how far back the first read (or one after a long gap) looks. Older
# buffer entries describe another moment than the one this poll shows.
PROC_UTIL_LOOKBACK_S = 2.0
# Per-process utilisation is read at most this often. It is the costliest NVML call (2.4 ms of CPU
# per read on an H100, as much as all other metrics together); between reads the table shows
# the last reading.
PROC_UTIL_EVERY_S = 4.0

# The topology event's source name (analysis.ranks.topology reads it back).
TOPOLOGY_SOURCE = "topology"
# nvmlDeviceGetTopologyCommonAncestor's levels (nvml.h NVML_TOPOLOGY_*), in words: the path P2P
# traffic takes between two GPUs without NVLink.
_LEVELS = {0: "same board", 10: "one PCIe switch", 20: "several PCIe switches", 30: "PCIe host bridge",
           40: "across host bridges in one NUMA node", 50: "across CPU sockets"}
# nvmlDeviceGetP2PStatus's answers (nvml.h NVML_P2P_STATUS_*), in words.
_P2P_STATUS = {1: "not supported by the chipset", 2: "not supported by the GPU", 3: "not supported by the IOH topology",
               4: "disabled by a registry key", 5: "not supported", 6: "unknown"}

_MIB = 1024 * 1024
# GPM's NVLink rates (metrics 60/61) count in units of 1000 KiB, not the MiB nvml.h names: on
# 2 x H200 they read 1.024x the bytes a NCCL all_reduce must move, where the link counters read
# 1.000x (bench/results/probe_nvlink.json).
_GPM_NVLINK_UNIT = 1000 * 1024
_KIB = 1024  # nvmlDeviceGetPcieThroughput reports KB/s; the NVLink throughput counters count KiB

# The key under which the NVLink link counters' trouble is noted (once) and skipped.
_NVLINK_COUNTERS = "NVLink throughput"

# NVML gives CUDA cores, not SMs; cores per SM is fixed per architecture (CUDA C Programming
# Guide, "Arithmetic Instructions" throughput table: FP32 lanes per SM).
_CORES_PER_SM = {
    (7, 0): 64,
    (7, 5): 64,
    (8, 0): 64,
    (8, 6): 128,
    (8, 7): 128,
    (8, 9): 128,
    (9, 0): 128,
    (10, 0): 128,
    (12, 0): 128,
}

# nvmlSample_t value union member per nvmlValueType_t.
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_NOT_AVAILABLE_U64 = 2**64 - 1


class _GpuLost(Exception):
    pass


@dataclass(slots=True)
class _Gpm:
    samples: list[Any]
    get: Any  # the reusable nvmlGpmMetricsGet_t request
    cur: int = 0
    have_prev: bool = False
    prev_ts: float = 0.0
    last: dict[str, float] = field(default_factory=dict)
    pcie_ok: bool = True  # GPM gives PCIe rates on this GPU (else the slow legacy counter)
    ids: list[tuple[str, int]] = field(default_factory=list)  # (field, metric id) the request asks
    nvlink_ok: bool = False  # GPM gives NVLink rates on this GPU (else the link counters)


@dataclass(slots=True)
class _Gpu:
    """What the source remembers about one GPU between polls."""

    index: int
    handle: Any
    pos: int  # position among the polled GPUs (staggers the slow PCIe reads)
    info: GpuInfo | None = None
    info_next: float = 0.0
    sm_clock_max: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    skip: set[str] = field(default_factory=set)  # not supported: never asked again
    missing: dict[str, str] = field(default_factory=dict)  # this poll's unavailable fields
    reported: set[str] = field(default_factory=set)  # already told the user
    util_last_us: int = 0
    proc_util_last_us: int = 0
    proc_util: dict[int, tuple[float, float]] = field(default_factory=dict)
    proc_util_next: float = 0.0
    proc_util_pids: set[int] = field(default_factory=set)  # the processes the last read covered
    pcie_next: float | None = None
    pcie_rx: float | None = None
    pcie_tx: float | None = None
    gpm: _Gpm | None = None
    gpm_checked: bool = False
    nvlink_prev: tuple[float, int, int] | None = None  # (ts, tx KiB, rx KiB): the counters' last read
    nvlink_per_link: bool = False  # the counters answer per link only, not for all links at once
    lost: str | None = None
    retry_at: float = 0.0
    backoff: float = LOST_RETRY_FIRST_S


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    return str(v)


def _cuda_version(v: int | None) -> str | None:
    """NVML encodes CUDA 13.0 as 13000."""
    if not v:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


def _cpu_ranges(words: Any) -> str | None:
    """A cpuset bitmask (64-bit words, lowest CPUs first) as text like ``"0-15,32-47"``."""
    cpus = [w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]
    if not cpus:
        return None
    parts: list[str] = []
    start = prev = cpus[0]
    for c in cpus[1:] + [None]:  # type: ignore[list-item]
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(parts)


class NvmlSource:
    """Polls every GPU NVML sees. Build it with :meth:`open`."""

    name = SOURCE

    # The first polls come at most this far apart: the GPM readings (tensor cores, fp32 pipes, SM
    # activity) exist only per poll, and the rules want MIN_BUSY_POLLS of them (advisor.rules.base),
    # so at a 2 s interval a precision or launch finding could not come before ~6 s after start.
    # Four polls at 0.5 s cost a few milliseconds of NVML calls, once. Judgement.
    START_POLLS = 4
    START_INTERVAL_S = 0.5

    @property
    def interval(self) -> float:
        if self._polls < self.START_POLLS:
            return min(self._interval, self.START_INTERVAL_S)
        return self._interval

    @interval.setter
    def interval(self, value: float) -> None:
        self._interval = value

    def __init__(
        self,
        nvml: Any,
        handles: list[tuple[int, Any]],
        interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        pcie_interval: float = PCIE_INTERVAL_S,
    ) -> None:
        self.interval = interval
        self._polls = 0
        self._nv = nvml
        self._clock = clock
        self._pcie_interval = pcie_interval
        self._gpus = [_Gpu(index=i, handle=h, pos=p) for p, (i, h) in enumerate(handles)]
        self._started = False
        self._closed = False
        self._refused: list[str] = []  # GPUs NVML lists but would not give a handle for
        self._lock = threading.Lock()
        self._b = Binding(nvml)  # error codes, constants, the entry points this driver has
        self._nvlinks: dict[int, int] = {}  # GPU index -> NVLinks up (read once, at the first poll)
        self._nvlink_ids: dict[int, list[int]] = {}  # GPU index -> the links that are up

    # ----------------------------------------------------------------- construction

    @classmethod
    def open(
        cls,
        interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        nvml: Any = None,
        pcie_interval: float = PCIE_INTERVAL_S,
    ) -> "NvmlSource":
        """Initialise NVML and find the GPUs; :class:`NvmlUnavailable` if there is nothing to poll."""
        nvml, handles, refused = open_nvml(nvml)
        src = cls(nvml, handles, interval=interval, clock=clock, pcie_interval=pcie_interval)
        src._refused = refused
        return src

    # ----------------------------------------------------------------- Source protocol

    def poll(self) -> list[object]:
        with self._lock:
            if self._closed:
                return []
            self._polls += 1
            ts = self._clock()
            out: list[object] = []
            if not self._started:
                self._started = True
                out.append(self._system_info(ts))
                for why in self._refused:
                    out.append(Event(ts, SOURCE, f"{why}; not monitored", "warning"))
                topo = self._topology_event(ts)
                if topo is not None:
                    out.append(topo)
            for g in self._gpus:
                try:
                    self._poll_gpu(g, ts, out)
                except Exception as exc:  # a bug or an odd binding: one GPU's poll, not the source
                    msg = f"read failed: {type(exc).__name__}: {exc}"
                    out.append(GpuSample(ts, g.index, error=msg))
                    if msg not in g.reported:
                        g.reported.add(msg)
                        out.append(Event(ts, SOURCE, f"GPU {g.index}: {msg}", "error"))
            return out

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for g in self._gpus:
                self._drop_gpm(g)
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass

    # ----------------------------------------------------------------- per GPU

    def _poll_gpu(self, g: _Gpu, ts: float, out: list[object]) -> None:
        if g.lost is not None:
            if ts < g.retry_at:
                out.append(GpuSample(ts, g.index, error=g.lost))
                return
            try:  # the old handle may be stale after a reset
                g.handle = self._nv.nvmlDeviceGetHandleByIndex(g.index)
            except Exception as exc:
                self._mark_lost(g, ts, str(exc), out)
                return
        g.missing.clear()
        try:
            items = self._read_gpu(g, ts)
        except _GpuLost as exc:
            self._mark_lost(g, ts, str(exc), out)
            return
        if g.lost is not None:
            out.append(Event(ts, SOURCE, f"GPU {g.index} answers again", "info"))
            g.lost = None
            g.backoff = LOST_RETRY_FIRST_S
        out.extend(items)
        self._report_missing(g, ts, out)

    def _mark_lost(self, g: _Gpu, ts: float, why: str, out: list[object]) -> None:
        first = g.lost is None
        g.lost = f"GPU lost: {why}"
        g.retry_at = ts + g.backoff
        g.backoff = min(g.backoff * 2, LOST_RETRY_MAX_S)
        if g.gpm is not None:
            g.gpm.have_prev = False  # the counters restart with the device
        g.nvlink_prev = None
        g.info_next = 0.0  # read the description again when it comes back
        out.append(GpuSample(ts, g.index, error=g.lost))
        if first:
            out.append(
                Event(ts, SOURCE, f"GPU {g.index}: {why}; other GPUs still monitored, retrying", "warning")
            )

    def _read_gpu(self, g: _Gpu, ts: float) -> list[object]:
        h, k = g.handle, self._b.k
        util = self._get(g, "utilization", "nvmlDeviceGetUtilizationRates", h, probe=True)
        self._setup_gpm(g)
        mem = self._get(g, "memory", self._b.memory, h)
        mem_total = int(mem.total) if mem is not None else None
        power_mw = self._get(g, "power", "nvmlDeviceGetPowerUsage", h)
        limit_mw = self._get(g, "power limit", "nvmlDeviceGetEnforcedPowerLimit", h)
        limit_w = limit_mw / 1000.0 if limit_mw is not None else None

        items: list[object] = []
        info = self._maybe_info(g, ts, mem_total, limit_w)
        if info is not None:
            items.append(info)

        temp = self._get(g, "temperature", self._b.temperature, h)
        fan = self._get(g, "fan", "nvmlDeviceGetFanSpeed", h)
        sm_clock = self._get(g, "SM clock", "nvmlDeviceGetClockInfo", h, k["clock_sm"])
        mem_clock = self._get(g, "memory clock", "nvmlDeviceGetClockInfo", h, k["clock_mem"])
        reasons = self._get(g, "clocks event reasons", self._b.reasons, h)
        gen = self._get(g, "PCIe link gen", "nvmlDeviceGetCurrPcieLinkGeneration", h)
        width = self._get(g, "PCIe link width", "nvmlDeviceGetCurrPcieLinkWidth", h)
        ecc_c = self._get(
            g, "ECC", "nvmlDeviceGetTotalEccErrors", h, k["ecc_corr"], k["ecc_volatile"]
        )
        ecc_u = self._get(
            g, "ECC", "nvmlDeviceGetTotalEccErrors", h, k["ecc_uncorr"], k["ecc_volatile"]
        )
        try:
            gpm = self._read_gpm(g, ts)
        except _GpuLost:
            raise
        except Exception as exc:
            g.missing.setdefault("GPM metrics", f"{type(exc).__name__}: {exc}")
            gpm = {}
        rx, tx = self._pcie(g, ts, gpm)
        nvl_tx, nvl_rx = self._nvlink(g, ts, gpm)

        items.append(
            GpuSample(
                ts,
                g.index,
                util_gpu=float(util.gpu) if util is not None else None,
                util_mem=float(util.memory) if util is not None else None,
                mem_used=int(mem.used) if mem is not None else None,
                mem_total=mem_total,
                temperature_c=float(temp) if temp is not None else None,
                power_w=power_mw / 1000.0 if power_mw is not None else None,
                power_limit_w=limit_w,
                fan_pct=float(fan) if fan is not None else None,
                sm_clock_mhz=int(sm_clock) if sm_clock is not None else None,
                mem_clock_mhz=int(mem_clock) if mem_clock is not None else None,
                sm_clock_max_mhz=g.sm_clock_max,
                throttle_reasons=int(reasons) if reasons is not None else None,
                pcie_gen=int(gen) if gen is not None else None,
                pcie_width=int(width) if width is not None else None,
                pcie_max_gen=g.pcie_max_gen,
                pcie_max_width=g.pcie_max_width,
                pcie_rx_bps=rx,
                pcie_tx_bps=tx,
                ecc_corrected=int(ecc_c) if ecc_c is not None else None,
                ecc_uncorrected=int(ecc_u) if ecc_u is not None else None,
                sm_active=gpm.get("sm_active"),
                sm_occupancy=gpm.get("sm_occupancy"),
                tensor_active=gpm.get("tensor_active"),
                dram_active=gpm.get("dram_active"),
                fp32_active=gpm.get("fp32_active"),
                fp16_active=gpm.get("fp16_active"),
                dfma_active=gpm.get("dfma_active"),
                fp64_active=gpm.get("fp64_active"),
                nvlink_tx_bps=nvl_tx,
                nvlink_rx_bps=nvl_rx,
            )
        )
        for key, part in (("utilization samples", self._util_points), ("processes", self._processes)):
            try:
                items.extend(part(g, ts))
            except _GpuLost:
                raise
            except Exception as exc:  # an odd answer: that part is missing, the sample stands
                g.missing.setdefault(key, f"{type(exc).__name__}: {exc}")
        return items

    # ----------------------------------------------------------------- one call, guarded

    def _get(self, g: _Gpu, key: str, fn: Callable[..., Any] | str, *args: Any, probe: bool = False) -> Any:
        """``fn(*args)``, or ``None`` with the reason noted; raises only ``_GpuLost``."""
        if key in g.skip:
            return None
        if isinstance(fn, str):  # by name: an older pynvml may not have it
            name = fn
            fn = getattr(self._nv, name, None)
            if fn is None:
                g.skip.add(key)
                g.missing.setdefault(key, f"not in this pynvml ({name})")
                return None
        try:
            return fn(*args)
        except self._b.err_cls as exc:  # type: ignore[misc]
            code = getattr(exc, "value", None)
            if code in (self._b.probe_lost if probe else self._b.hard_lost):
                raise _GpuLost(str(exc)) from None
            if code in self._b.never:
                g.skip.add(key)
                g.missing.setdefault(key, "not supported")
            elif code == self._b.code["NOT_FOUND"] and key in _EMPTY_OK:
                pass  # nothing new since the last read
            else:
                g.missing.setdefault(key, str(exc) or f"NVML error {code}")
            return None
        except Exception as exc:
            g.missing.setdefault(key, f"{type(exc).__name__}: {exc}")
            return None

    def _report_missing(self, g: _Gpu, ts: float, out: list[object]) -> None:
        new = [k for k in g.missing if k not in g.reported]
        if not new:
            return
        g.reported.update(new)
        by_reason: dict[str, list[str]] = {}
        for k in new:
            by_reason.setdefault(g.missing[k], []).append(k)
        text = "; ".join(f"{', '.join(keys)} ({why})" for why, keys in by_reason.items())
        # A metric this GPU model does not have (a fan on a datacenter GPU) is a fact of the model,
        # not news: kept (recordings, doctor) but not a line for the status bar. A failure is news.
        level = "debug" if set(by_reason) == {"not supported"} else "info"
        out.append(Event(ts, SOURCE, f"GPU {g.index}: not available: {text}", level))

    # ----------------------------------------------------------------- links between GPUs

    def _topology_event(self, ts: float) -> Event | None:
        """How each pair of GPUs is connected (NVML's common ancestor), whether P2P works between
        them (read, and over NVLink), and the NVLinks each GPU has up: one event
        (``analysis.ranks.topology`` reads it back), None when NVML says nothing of it."""
        pairs = []
        read_idx = self._b.const("NVML_P2P_CAPS_INDEX_READ", 0)
        nvlink_idx = self._b.const("NVML_P2P_CAPS_INDEX_NVLINK", 2)
        ok = self._b.const("NVML_P2P_STATUS_OK", 0)
        for i, a in enumerate(self._gpus):
            for b in self._gpus[i + 1:]:
                level = self._b.call("nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
                read = self._b.call("nvmlDeviceGetP2PStatus", a.handle, b.handle, read_idx)
                over_nvlink = self._b.call("nvmlDeviceGetP2PStatus", a.handle, b.handle, nvlink_idx)
                if level is None and read is None:
                    continue
                link = "NVLink" if over_nvlink == ok else _LEVELS.get(level, "unknown link") if level is not None else "unknown link"
                p2p = "unknown" if read is None else "ok" if read == ok else _P2P_STATUS.get(read, f"status {read}")
                pairs.append(f"{a.index}-{b.index} {link}, P2P {p2p}")
        max_links = self._b.const("NVML_NVLINK_MAX_LINKS", 18)
        enabled = self._b.k["enabled"]
        for g in self._gpus:
            up: list[int] = []
            for link in range(max_links):
                state = self._b.call("nvmlDeviceGetNvLinkState", g.handle, link)
                if state is None:
                    break  # no NVLink (NotSupported), or no more links
                if state == enabled:
                    up.append(link)
            if up:
                self._nvlinks[g.index] = len(up)
                self._nvlink_ids[g.index] = up
        if not pairs and not self._nvlinks:
            return None
        parts = [f"GPU pairs: {'; '.join(pairs)}"] if pairs else []
        if self._nvlinks:
            parts.append("NVLinks up: " + ", ".join(f"GPU {i} {n}" for i, n in sorted(self._nvlinks.items())))
        return Event(ts, TOPOLOGY_SOURCE, " | ".join(parts), "info")

    def _nvlink(self, g: _Gpu, ts: float, gpm: dict[str, float]) -> tuple[float | None, float | None]:
        """(tx, rx) NVLink data bytes/s of a GPU with links up since the previous poll: GPM's rates
        where GPM gives them, else the link counters' difference; (None, None) when unknown."""
        if g.index not in self._nvlinks:
            return None, None
        st = g.gpm
        if st is not None and st.nvlink_ok:
            # GPM's own window (the previous poll's sample to this one's); none yet on the first.
            tx, rx = gpm.get("nvlink_tx_mib"), gpm.get("nvlink_rx_mib")
            if tx is not None and rx is not None:
                return tx * _GPM_NVLINK_UNIT, rx * _GPM_NVLINK_UNIT
            return None, None
        return self._nvlink_counters(g, ts)

    def _nvlink_counters(self, g: _Gpu, ts: float) -> tuple[float | None, float | None]:
        """Rates from NVML's NVLink data counters (KiB since the driver loaded, payload only).

        Asked for all links at once (scope UINT_MAX); a driver that answers only per link is asked
        for each link up and the sum taken. A counter that went back (a reset, the driver
        reloaded) gives no rate for that poll rather than a negative or a false zero."""
        got = self._nvlink_read(g)
        if got is None:
            g.nvlink_prev = None
            return None, None
        tx, rx = got
        prev, g.nvlink_prev = g.nvlink_prev, (ts, tx, rx)
        if prev is None or ts <= prev[0] or tx < prev[1] or rx < prev[2]:
            return None, None
        dt = ts - prev[0]
        return (tx - prev[1]) * _KIB / dt, (rx - prev[2]) * _KIB / dt

    def _nvlink_read(self, g: _Gpu) -> tuple[int, int] | None:
        """(tx, rx) KiB summed over the GPU's links, or None with the reason noted once."""
        tx_id = self._b.const("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138)
        rx_id = self._b.const("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139)
        links = [ALL_LINKS] if not g.nvlink_per_link else self._nvlink_ids.get(g.index, [])
        code = self._nvlink_fields(g, tx_id, rx_id, links)
        if isinstance(code, int) and not g.nvlink_per_link and self._nvlink_ids.get(g.index):
            # An older driver may not know the all-links scope: try each link up.
            per_link = self._nvlink_fields(g, tx_id, rx_id, self._nvlink_ids[g.index])
            if not isinstance(per_link, int) and per_link is not None:
                g.nvlink_per_link = True
            code = per_link
        if code is None or isinstance(code, tuple):
            return code
        if code in self._b.never:
            g.skip.add(_NVLINK_COUNTERS)
            g.missing.setdefault(_NVLINK_COUNTERS, "not supported")
        else:
            g.missing.setdefault(_NVLINK_COUNTERS, f"NVML error {code}")
        return None

    def _nvlink_fields(self, g: _Gpu, tx_id: int, rx_id: int, links: list[int]) -> tuple[int, int] | int | None:
        """The counters' sums over ``links``; an int: the NVML error one of them gave; None: the
        call itself failed (noted by ``_get``)."""
        ids = [(tx_id, link) for link in links] + [(rx_id, link) for link in links]
        vals = self._get(g, _NVLINK_COUNTERS, "nvmlDeviceGetFieldValues", g.handle, ids)
        if vals is None:
            return None
        try:
            got = list(vals)
            if len(got) != len(ids):
                return self._b.code["UNKNOWN"]
            bad = [int(v.nvmlReturn) for v in got if v.nvmlReturn != SUCCESS]
            if bad:
                return bad[0]
            n = len(links)
            return (sum(int(v.value.ullVal) for v in got[:n]), sum(int(v.value.ullVal) for v in got[n:]))
        except (TypeError, ValueError, AttributeError) as exc:
            g.missing.setdefault(_NVLINK_COUNTERS, f"{type(exc).__name__}: {exc}")
            return None

    # ----------------------------------------------------------------- static description

    def _system_info(self, ts: float) -> SystemInfo:
        nv = self._nv

        def safe(fn_name: str) -> Any:
            fn = getattr(nv, fn_name, None)
            if fn is None:
                return None
            try:
                return fn()
            except Exception:
                return None

        cuda = safe("nvmlSystemGetCudaDriverVersion_v2") or safe("nvmlSystemGetCudaDriverVersion")
        return SystemInfo(
            ts=ts,
            hostname=socket.gethostname(),
            driver_version=_text(safe("nvmlSystemGetDriverVersion")),
            cuda_driver_version=_cuda_version(cuda),
            nvml_version=_text(safe("nvmlSystemGetNVMLVersion")),
            gpu_count=len(self._gpus),
            cpu_count=os.cpu_count(),
            source="live",
        )

    def _maybe_info(self, g: _Gpu, ts: float, mem_total: int | None, limit_w: float | None) -> GpuInfo | None:
        """The GpuInfo to emit this poll, if it is new or changed."""
        if g.info is not None and ts < g.info_next:
            if limit_w is not None and limit_w != g.info.power_limit_w:
                g.info = replace(g.info, ts=ts, power_limit_w=limit_w)
                return g.info
            return None
        g.info_next = ts + INFO_REFRESH_S
        h = g.handle
        name = _text(self._get(g, "name", "nvmlDeviceGetName", h)) or f"GPU {g.index}"
        uuid = _text(self._get(g, "UUID", "nvmlDeviceGetUUID", h)) or ""
        cc_raw = self._get(g, "compute capability", "nvmlDeviceGetCudaComputeCapability", h)
        cc = (int(cc_raw[0]), int(cc_raw[1])) if cc_raw is not None else None
        g.pcie_max_gen = _int(self._get(g, "PCIe max gen", "nvmlDeviceGetMaxPcieLinkGeneration", h))
        g.pcie_max_width = _int(self._get(g, "PCIe max width", "nvmlDeviceGetMaxPcieLinkWidth", h))
        g.sm_clock_max = _int(self._get(g, "max SM clock", "nvmlDeviceGetMaxClockInfo", h, self._b.k["clock_sm"]))
        pm = self._get(g, "persistence mode", "nvmlDeviceGetPersistenceMode", h)
        info = GpuInfo(
            ts=ts,
            index=g.index,
            name=name,
            uuid=uuid,
            memory_total=mem_total,
            power_limit_w=limit_w,
            pcie_max_gen=g.pcie_max_gen,
            pcie_max_width=g.pcie_max_width,
            compute_capability=cc,
            sm_count=self._sm_count(g, cc),
            gpm_supported=g.gpm is not None,
            persistence_mode=(pm == self._b.k["enabled"]) if pm is not None else None,
            numa_cpus=self._numa_cpus(g),
        )
        if g.info is not None and replace(g.info, ts=ts) == info:
            return None
        g.info = info
        return info

    def _sm_count(self, g: _Gpu, cc: tuple[int, int] | None) -> int | None:
        per_sm = _CORES_PER_SM.get(cc) if cc else None
        if per_sm is None or "SM count" in g.skip:
            return None
        cores = self._get(g, "SM count", "nvmlDeviceGetNumGpuCores", g.handle)
        if not cores or cores % per_sm:
            return None
        return int(cores) // per_sm

    def _numa_cpus(self, g: _Gpu) -> str | None:
        words = max(1, ((os.cpu_count() or 1) + 63) // 64)
        mask = self._get(g, "CPU affinity", "nvmlDeviceGetCpuAffinity", g.handle, words)
        return _cpu_ranges(mask) if mask is not None else None

    # ----------------------------------------------------------------- GPM

    def _setup_gpm(self, g: _Gpu) -> None:
        if g.gpm_checked:
            return
        g.gpm_checked = True
        nv = self._nv
        support = self._get(g, "GPM", "nvmlGpmQueryDeviceSupport", g.handle)
        if support is None:
            return
        if not getattr(support, "isSupportedDevice", 0):
            g.missing["GPM metrics"] = "not supported on this GPU"
            return
        samples: list[Any] = []
        # NVLink rates only of a GPU with links up: on others they could only read 0 or fail.
        nvlink = g.index in self._nvlinks
        ids = self._b.gpm_ids + (self._b.gpm_nvlink_ids if nvlink else [])
        try:
            for _ in range(2):
                samples.append(nv.nvmlGpmSampleAlloc())
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version = nv.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(ids)
            for i, (_, mid) in enumerate(ids):
                req.metrics[i].metricId = mid
        except Exception as exc:
            for s in samples:
                try:
                    nv.nvmlGpmSampleFree(s)
                except Exception:
                    pass
            g.missing["GPM metrics"] = f"setup failed: {exc}"
            return
        g.gpm = _Gpm(samples=samples, get=req, ids=ids, nvlink_ok=nvlink)

    def _read_gpm(self, g: _Gpu, ts: float) -> dict[str, float]:
        """GPM metrics between the previous poll's sample and this one's ({} on the first)."""
        st = g.gpm
        if st is None:
            return {}
        if st.have_prev and ts - st.prev_ts < GPM_MIN_WINDOW_S:
            return st.last
        cur = st.samples[st.cur]
        if self._get(g, "GPM sample", "nvmlGpmSampleGet", g.handle, cur) is None:
            st.have_prev = False
            if "GPM sample" in g.skip:
                self._drop_gpm(g)
            return {}
        prev = st.samples[st.cur ^ 1]
        st.cur ^= 1
        st.prev_ts = ts
        if not st.have_prev:
            st.have_prev = True
            st.last = {}
            return {}
        req = st.get
        req.sample1 = prev
        req.sample2 = cur
        st.last = {}
        got = self._get(g, "GPM metrics", "nvmlGpmMetricsGet", req)
        if got is None and len(st.ids) > len(self._b.gpm_ids):
            # A driver refusing the whole request over the NVLink ids (appended last) would take
            # GPM's other metrics with it: ask again without them; the link counters take over.
            why = g.missing.pop("GPM metrics", None)
            g.skip.discard("GPM metrics")
            del st.ids[len(self._b.gpm_ids):]
            req.numMetrics = len(st.ids)
            st.nvlink_ok = False
            g.missing.setdefault("GPM NVLink rates", f"{why or 'refused'}; reading the link counters")
            got = self._get(g, "GPM metrics", "nvmlGpmMetricsGet", req)
        if got is None:
            return {}
        values: dict[str, float] = {}
        for i, (fld, _) in enumerate(st.ids):
            m = req.metrics[i]
            if m.nvmlReturn == SUCCESS:
                values[fld] = float(m.value)
            elif fld.startswith("pcie"):
                st.pcie_ok = False  # fall back to the paced legacy counter
            elif fld.startswith("nvlink"):
                if st.nvlink_ok:  # fall back to the link counters, and say so once
                    st.nvlink_ok = False
                    g.missing.setdefault("GPM NVLink rates", f"NVML error {m.nvmlReturn}; reading the link counters")
            else:
                g.missing.setdefault(f"GPM {fld}", f"NVML error {m.nvmlReturn}")
        st.last = values
        return values

    def _drop_gpm(self, g: _Gpu) -> None:
        if g.gpm is None:
            return
        for s in g.gpm.samples:
            try:
                self._nv.nvmlGpmSampleFree(s)
            except Exception:
                pass
        g.gpm = None

    # ----------------------------------------------------------------- PCIe throughput

    def _pcie(self, g: _Gpu, ts: float, gpm: dict[str, float]) -> tuple[float | None, float | None]:
        if g.gpm is not None and g.gpm.pcie_ok:
            rx, tx = gpm.get("pcie_rx_mib"), gpm.get("pcie_tx_mib")
            return (rx * _MIB if rx is not None else None, tx * _MIB if tx is not None else None)
        if g.pcie_next is None:
            # Stagger the ~40 ms reads so that several GPUs don't all pay in one poll.
            g.pcie_next = ts + g.pos * self._pcie_interval / max(1, len(self._gpus))
        if ts >= g.pcie_next:
            g.pcie_next = ts + self._pcie_interval
            k = self._b.k
            rx = self._get(g, "PCIe throughput", "nvmlDeviceGetPcieThroughput", g.handle, k["pcie_rx"])
            tx = self._get(g, "PCIe throughput", "nvmlDeviceGetPcieThroughput", g.handle, k["pcie_tx"])
            g.pcie_rx = rx * _KIB if rx is not None else None
            g.pcie_tx = tx * _KIB if tx is not None else None
        return g.pcie_rx, g.pcie_tx

    # ----------------------------------------------------------------- 200 ms utilisation buffer

    def _util_points(self, g: _Gpu, ts: float) -> list[UtilPoint]:
        got = self._get(
            g, "utilization samples", "nvmlDeviceGetSamples", g.handle, self._b.k["util_samples"], g.util_last_us
        )
        if not got:
            return []
        vtype, samples = got
        fld = _VALUE_FIELDS[vtype] if 0 <= vtype < len(_VALUE_FIELDS) else "uiVal"
        last = g.util_last_us
        raw = []
        for s in samples:
            t = int(s.timeStamp)
            if t > last:  # the first call returns ~14 s of history; later ones only what is new
                raw.append((t, getattr(s.sampleValue, fld)))
        if not raw:
            return []
        raw.sort()
        g.util_last_us = raw[-1][0]
        return [UtilPoint(t / 1e6, g.index, float(v)) for t, v in raw]

    # ----------------------------------------------------------------- processes

    def _processes(self, g: _Gpu, ts: float) -> list[GpuProcess]:
        procs: dict[int, list[Any]] = {}  # pid -> [used_memory, kind]
        for kind, fn, key in (
            ("C", self._b.compute_procs, "compute processes"),
            ("G", self._b.graphics_procs, "graphics processes"),
        ):
            for p in self._get(g, key, fn, g.handle) or ():
                mem = getattr(p, "usedGpuMemory", None)
                if mem == _NOT_AVAILABLE_U64:
                    mem = None
                pid = int(p.pid)
                have = procs.get(pid)
                if have is None:
                    procs[pid] = [mem, kind]
                else:
                    if have[1] != kind:
                        have[1] = "C+G"
                    if mem is not None and (have[0] is None or mem > have[0]):
                        have[0] = mem
        if not procs:
            return []
        if ts >= g.proc_util_next or not g.proc_util_pids.issuperset(procs):
            # A new process is read at once: its row should not wait for the next read.
            g.proc_util = self._process_util(g, ts)
            g.proc_util_pids = set(procs)
            # Slack of a twentieth of the interval, so a poll that lands a hair early still reads.
            g.proc_util_next = ts + PROC_UTIL_EVERY_S - 0.05 * self.interval
        util = g.proc_util
        out = []
        for pid, (mem, kind) in procs.items():
            u = util.get(pid)
            out.append(
                GpuProcess(
                    ts,
                    g.index,
                    pid,
                    used_memory=int(mem) if mem is not None else None,
                    sm_util=u[0] if u else None,
                    mem_util=u[1] if u else None,
                    kind=kind,
                )
            )
        return out

    def _process_util(self, g: _Gpu, ts: float) -> dict[int, tuple[float, float]]:
        since = max(g.proc_util_last_us, int((ts - max(PROC_UTIL_LOOKBACK_S, 2 * self.interval)) * 1e6))
        samples = self._get(g, "process utilization", "nvmlDeviceGetProcessUtilization", g.handle, since)
        if not samples:
            return {}
        latest: dict[int, Any] = {}
        for s in samples:
            t = int(s.timeStamp)
            if t <= since:
                continue
            prev = latest.get(int(s.pid))
            if prev is None or t > int(prev.timeStamp):
                latest[int(s.pid)] = s
            if t > g.proc_util_last_us:
                g.proc_util_last_us = t
        return {pid: (float(s.smUtil), float(s.memUtil)) for pid, s in latest.items()}


# Calls whose NOT_FOUND means "no new entries", not a missing metric.
_EMPTY_OK = frozenset({"utilization samples", "process utilization"})


def _int(v: Any) -> int | None:
    return int(v) if v is not None else None


# --------------------------------------------------------------------------- doctor


def describe_environment(nvml: Any = None) -> list[tuple[str, bool, str]]:
    """Checks for ``gputop doctor``: (what, ok, one-line detail). Never raises for NVML trouble."""
    try:
        src = NvmlSource.open(interval=1.0, nvml=nvml)
    except NvmlUnavailable as exc:
        return [(exc.check, False, str(exc))]
    try:
        batch = src.poll()
    finally:
        src.close()
    checks: list[tuple[str, bool, str]] = []
    system = next((s for s in batch if isinstance(s, SystemInfo)), None)
    infos = {s.index: s for s in batch if isinstance(s, GpuInfo)}
    samples = {s.index: s for s in batch if isinstance(s, GpuSample)}
    if system is not None:
        cuda = f" (CUDA {system.cuda_driver_version})" if system.cuda_driver_version else ""
        checks.append(("NVIDIA driver", True, f"{system.driver_version or 'version unknown'}{cuda}"))
        checks.append(("NVML", system.nvml_version is not None, f"version {system.nvml_version or 'unknown'}"))
        checks.append(("GPUs", system.gpu_count > 0, f"{system.gpu_count} visible to NVML"))
    for ev in batch:
        if isinstance(ev, Event) and ev.level == "debug":
            # Metrics this GPU model does not have: noted here once, not a problem.
            checks.append(("metrics", True, ev.message))
        elif isinstance(ev, Event) and ev.level != "info":
            checks.append(("NVML", False, ev.message))
    for i in sorted(set(infos) | set(samples)):
        info, s = infos.get(i), samples.get(i)
        if s is not None and s.error:
            checks.append((f"GPU {i}", False, s.error))
            continue
        if info is None:
            continue
        parts = [info.name]
        if info.memory_total:
            parts.append(f"{info.memory_total / 2**30:.0f} GiB")
        if info.compute_capability:
            parts.append("compute {}.{}".format(*info.compute_capability))
        if info.sm_count:
            parts.append(f"{info.sm_count} SMs")
        if info.numa_cpus:
            parts.append(f"CPUs {info.numa_cpus}")
        checks.append((f"GPU {i}", True, ", ".join(parts)))
        if info.persistence_mode is None:
            checks.append((f"GPU {i} persistence mode", True, "not reported (normal on some platforms)"))
        elif info.persistence_mode:
            checks.append((f"GPU {i} persistence mode", True, "on"))
        else:
            checks.append(
                (
                    f"GPU {i} persistence mode",
                    False,
                    "off: the driver may unload between jobs and the first CUDA call waits; "
                    "sudo nvidia-smi -pm 1",
                )
            )
        if info.gpm_supported:
            checks.append((f"GPU {i} GPM", True, "supported: SM, tensor-core and DRAM activity available"))
        else:
            checks.append(
                (f"GPU {i} GPM", False, "not supported (Hopper or newer): tensor-core activity not measurable")
            )
        if s is not None and s.pcie_gen is not None and info.pcie_max_gen is not None:
            cur = f"gen {s.pcie_gen} x{s.pcie_width if s.pcie_width is not None else '?'}"
            best = f"gen {info.pcie_max_gen} x{info.pcie_max_width if info.pcie_max_width is not None else '?'}"
            full = s.pcie_gen >= info.pcie_max_gen and (
                s.pcie_width is None or info.pcie_max_width is None or s.pcie_width >= info.pcie_max_width
            )
            detail = f"{cur} (max {best})"
            if not full:
                detail += "; an idle GPU may train its link down: check again under load"
            checks.append((f"GPU {i} PCIe link", full, detail))
    return checks


__all__ = ["NvmlSource", "NvmlUnavailable", "describe_environment", "PCIE_INTERVAL_S"]
