"""The exporter's series, read from the store when Prometheus scrapes.

Conventions: base units (bytes, watts, hertz, seconds, ratios 0..1 rather than percent),
``_total`` for counters, one ``*_info`` series carrying text labels at 1. Every GPU series has
the labels ``gpu`` (NVML index), ``uuid`` and ``model``; a metric the device cannot give is left
out, never sent as 0. When a GPU stops answering (or NVML goes) its series are left out, so
Prometheus marks them stale at the next scrape, and ``gputop_gpu_up`` / ``gputop_nvml_up`` say
so, with the reason in ``gputop_nvml_error_info``.

Labels are chosen for a fleet: ``container_id`` and ``pod_uid`` rather than ``container`` and
``pod``, which Kubernetes service discovery puts on every target (the exporter's own pod) and
which would otherwise be renamed ``exported_*``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .. import __version__
from ..advisor import STATE_IDS, WARMUP_ID
from ..analysis import CPU_DEVICE, Bucket
from ..model import GpuInfo, GpuSample, ProcSample
from ..analysis import MEMORY_WINDOW_S, REASONS, MemoryView, jobs_private, memory_view
from .account import TimeAccount
from .jobs import Placement, read_placement, script_of

GPU_LABELS = ("gpu", "uuid", "model")
JOB_LABELS = ("pid", "comm", "script", "user", "container_id", "pod_uid")
_LABELS_SEEN_MAX = 4096  # jobs whose labels are remembered after their process is gone
# Reason label values: NVML's clocks-event reasons in snake case (power_cap, sw_thermal, ...).
THROTTLE_REASONS = tuple((r.bit, r.word.replace(" ", "_").replace("-", "_")) for r in REASONS)
# A GPU whose newest sample is older than this many sampling intervals (and at least
# STALE_MIN_S) is reported down: its source has stopped, whatever the reason.
STALE_POLLS = 3
STALE_MIN_S = 10.0

# (metric suffix, help, sample field, scale to base units)
_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("utilization_ratio", "Share of the last sample period a kernel was running (NVML utilization.gpu)", "util_gpu", 0.01),
    ("memory_utilization_ratio", "Share of the last sample period device memory was read or written", "util_mem", 0.01),
    ("memory_used_bytes", "Device memory in use", "mem_used", 1.0),
    ("memory_total_bytes", "Device memory in all", "mem_total", 1.0),
    ("power_watts", "Power draw", "power_w", 1.0),
    ("power_limit_watts", "Enforced power limit", "power_limit_w", 1.0),
    ("temperature_celsius", "GPU core temperature", "temperature_c", 1.0),
    ("fan_ratio", "Fan speed as a share of its maximum (boards with fans)", "fan_pct", 0.01),
    ("sm_clock_hertz", "SM clock", "sm_clock_mhz", 1e6),
    ("sm_clock_max_hertz", "Highest SM clock the board allows", "sm_clock_max_mhz", 1e6),
    ("memory_clock_hertz", "Memory clock", "mem_clock_mhz", 1e6),
    ("pcie_link_generation", "Current PCIe link generation (links downshift when idle)", "pcie_gen", 1.0),
    ("pcie_link_width", "Current PCIe link width in lanes", "pcie_width", 1.0),
    ("pcie_receive_bytes_per_second", "PCIe traffic into the GPU (NVML's throughput counter, a rate)", "pcie_rx_bps", 1.0),
    ("pcie_transmit_bytes_per_second", "PCIe traffic out of the GPU (NVML's throughput counter, a rate)", "pcie_tx_bps", 1.0),
    # GPUs with NVLinks up only: payload bytes over all links, GPM's rate else NVML's link counters.
    ("nvlink_receive_bytes_per_second", "NVLink data into the GPU over all its links since the previous sample (payload, not protocol overhead)", "nvlink_rx_bps", 1.0),
    ("nvlink_transmit_bytes_per_second", "NVLink data out of the GPU over all its links since the previous sample (payload, not protocol overhead)", "nvlink_tx_bps", 1.0),
    # GPM (Hopper and newer): absent on GPUs without it.
    ("sm_active_ratio", "Share of time SMs had a warp resident, averaged over SMs (GPM)", "sm_active", 0.01),
    ("sm_occupancy_ratio", "Resident warps as a share of the SMs' maximum (GPM)", "sm_occupancy", 0.01),
    ("tensor_active_ratio", "Share of time the tensor cores were busy (GPM)", "tensor_active", 0.01),
    ("dram_active_ratio", "Share of time device memory was busy (GPM)", "dram_active", 0.01),
)


class GputopCollector:
    """A prometheus_client custom collector over one store.

    ``attached``: the PIDs whose stacks are sampled (their GPUs' idle time gets causes);
    ``interval``: the session's sampling interval (how old a sample may be before its GPU is
    called down); ``clock``: the store's clock (``time.time`` live).
    """

    def __init__(
        self,
        store,
        interval: float = 2.0,
        window: float = 60.0,
        attached: Callable[[], Iterable[int]] = lambda: (),
        mode: str = "live",
        clock: Callable[[], float] = time.time,
        account: TimeAccount | None = None,
        placement: Callable[[int], Placement] = read_placement,
        judged: Callable[[], tuple[str, str]] = lambda: ("", ""),
        alive: Callable[[int], bool] = lambda pid: True,
        judged_memory: Callable[[], "MemoryView | None"] = lambda: None,
    ) -> None:
        self.store = store
        # (pid, job_id) of the process the advisor's findings speak of, '' where none: the
        # findings say which attached job they belong to.
        self.judged = judged
        # Whether a process still runs: the findings of a judged process that has gone are not
        # exported (they spoke of a job that no longer runs, and their cost kept growing).
        self.alive = alive
        # The memory view of the advisor's last evaluation (its evidence window: the judged job's
        # GPU memory, its host forecast bounded by its workers' shared pages), None where it has
        # none: the growth and time-to-limit series then say what the findings say.
        self.judged_memory = judged_memory
        self.interval = interval
        self.window = window
        self.attached = attached
        self.mode = mode
        self.clock = clock
        self.account = account or TimeAccount(start=clock())
        self._placement = placement
        self._placements: dict[tuple[int, float | None], Placement] = {}
        # Each job's label values as last read from a process sample: a job whose process has gone
        # (its findings still in the advisor's window) keeps the same series, not a new one with
        # empty labels (a new user's exporter changed `user` from "root" to "" at the target's exit).
        self._labels_seen: dict[int, list[str]] = {}
        self.last_duration = 0.0

    def describe(self) -> list[Metric]:
        # Registering must not run a collection (the store may still be empty).
        return []

    def collect(self) -> Iterator[Metric]:
        t = time.perf_counter()
        out = list(self._collect())
        self.last_duration = time.perf_counter() - t
        g = GaugeMetricFamily("gputop_exporter_collect_seconds", "Time the last collection took")
        g.add_metric([], self.last_duration)
        out.append(g)
        yield from out

    # ----------------------------------------------------------------- the families

    def _collect(self) -> Iterator[Metric]:
        store = self.store
        now = self.clock()
        info = GaugeMetricFamily("gputop_exporter_info", "The exporter: version and GPU source (live or fake)",
                                 labels=["version", "source"])
        info.add_metric([__version__, self.mode], 1)
        yield info

        gpu_info = dict(store.gpu_info)
        indices = store.gpu_indices()
        labels = {i: _gpu_labels(i, gpu_info.get(i)) for i in indices}
        stale_after = max(STALE_POLLS * self.interval, STALE_MIN_S)
        latest: dict[int, GpuSample] = {}
        reasons: list[str] = []
        up = GaugeMetricFamily("gputop_gpu_up", "1 while the GPU answers; 0 when it stopped (its series go stale)",
                               labels=list(GPU_LABELS))
        for i in indices:
            s = store.latest_gpu(i)
            if s is None:
                continue  # known from its info only: not polled yet
            why = s.error or (f"no sample for {now - s.ts:.0f} s" if now - s.ts > stale_after else None)
            up.add_metric(labels[i], 0 if why else 1)
            if why:
                reasons.append(why if why.startswith(f"GPU {i}:") else f"GPU {i}: {why}")
            else:
                latest[i] = s
        yield up

        system = store.system
        nvml_error = system.nvml_error if system is not None else None
        if nvml_error:
            reasons.insert(0, f"NVML unavailable: {nvml_error}")
        elif not indices:
            reasons.append("no GPU sample yet" if system is None else "no GPU found")
        nvml_up = GaugeMetricFamily("gputop_nvml_up", "1 while NVML answers for at least one GPU")
        nvml_up.add_metric([], 1 if latest and not nvml_error else 0)
        yield nvml_up
        err = GaugeMetricFamily("gputop_nvml_error_info", "Why a GPU or NVML is down (a series only then)",
                                labels=["reason"])
        for r in dict.fromkeys(reasons):
            err.add_metric([r[:200]], 1)
        yield err

        ginfo = GaugeMetricFamily("gputop_gpu_info", "The GPU and its driver", labels=[*GPU_LABELS, "driver_version"])
        driver = (system.driver_version if system is not None else None) or ""
        for i in indices:
            ginfo.add_metric([*labels[i], driver], 1)
        yield ginfo

        for suffix, help_text, attr, scale in _GAUGES:
            fam = GaugeMetricFamily(f"gputop_gpu_{suffix}", help_text, labels=list(GPU_LABELS))
            for i, s in latest.items():
                v = getattr(s, attr)
                if v is not None:
                    fam.add_metric(labels[i], float(v) * scale)
            yield fam

        thr = GaugeMetricFamily("gputop_gpu_throttle_reason",
                                "1 while NVML reports this clocks-event (throttle) reason, else 0",
                                labels=[*GPU_LABELS, "reason"])
        ecc = CounterMetricFamily("gputop_gpu_ecc_errors", "Volatile ECC errors since the driver loaded",
                                  labels=[*GPU_LABELS, "type"])
        for i, s in latest.items():
            if s.throttle_reasons is not None:
                for bit, name in THROTTLE_REASONS:
                    thr.add_metric([*labels[i], name], 1 if s.throttle_reasons & bit else 0)
            for kind, v in (("corrected", s.ecc_corrected), ("uncorrected", s.ecc_uncorrected)):
                if v is not None:
                    ecc.add_metric([*labels[i], kind], v)
        yield thr
        yield ecc

        yield from self._processes_and_time(labels, latest)
        yield from self._memory(labels, latest, now)
        yield from self._workers_private(now)
        yield from self._findings(labels)

    def _processes_and_time(self, labels: dict[int, list[str]], latest: dict[int, GpuSample]) -> Iterator[Metric]:
        store = self.store
        attached = set(self.attached())
        procs = store.procs_latest()
        gpu_procs = store.gpu_processes()
        create_times = {p.pid: (procs[p.pid].create_time if p.pid in procs else None) for p in gpu_procs}
        self.account.advance(store, attached, create_times)
        gpu_totals, jobs = self.account.snapshot()

        job_labels = {pid: self._job_labels(pid, procs.get(pid)) for pid in {p.pid for p in gpu_procs} | attached}

        mem = GaugeMetricFamily("gputop_process_gpu_memory_used_bytes", "Device memory a process holds",
                                labels=[*GPU_LABELS, *JOB_LABELS])
        for p in gpu_procs:
            if p.used_memory is not None and p.gpu_index in latest:
                mem.add_metric([*labels.get(p.gpu_index, _gpu_labels(p.gpu_index, None)), *job_labels[p.pid]],
                               p.used_memory)
        yield mem

        jinfo = GaugeMetricFamily("gputop_job_info",
                                  "A process on a GPU (or attached); attached=1 when its stacks are sampled",
                                  labels=[*JOB_LABELS, "attached"])
        for pid, lab in sorted(job_labels.items()):
            jinfo.add_metric([*lab, "1" if pid in attached else "0"], 1)
        yield jinfo

        gt = CounterMetricFamily(
            "gputop_gpu_time_seconds",
            "GPU time since the exporter started, by where it went: busy, or idle for a cause "
            "(causes need an attached job; otherwise idle is 'unknown')",
            labels=[*GPU_LABELS, "bucket"],
        )
        for i, totals in sorted(gpu_totals.items()):
            lab = labels.get(i) or _gpu_labels(i, None)
            for b in Bucket:  # every bucket from the start: rate() sees a cause's first seconds
                gt.add_metric([*lab, b.value], totals.get(b, 0.0))
        yield gt

        jt = CounterMetricFamily(
            "gputop_job_gpu_time_seconds",
            "GPU time of the GPUs a process is on, while it was listed there, by bucket",
            labels=[*JOB_LABELS, "bucket"],
        )
        listed = {p.pid for p in gpu_procs}
        for pid, job in sorted(jobs.items()):
            if pid not in listed or pid not in job_labels:
                continue  # ended (or not seen this poll): its series go stale
            for b in Bucket:
                jt.add_metric([*job_labels[pid], b.value], job.seconds.get(b, 0.0))
        yield jt

    def _memory(self, labels: dict[int, list[str]], latest: dict[int, GpuSample], now: float) -> Iterator[Metric]:
        """Memory growth and the time to the limit at that rate (analysis.memory_growth), per GPU
        and for the host: the attached jobs' own NVML memory, else the whole card's. Labels are
        the GPU's only (no PID): one series per GPU however many jobs come and go."""
        store = self.store
        t0 = now - MEMORY_WINDOW_S
        attached = set(self.attached())
        host = store.host_window(t0, now)
        view = memory_view(list(latest), {i: store.gpu_window(i, t0, now) for i in latest},
                           store.gpu_process_window(attached, t0, now) if attached else [], host, {}, attached,
                           gpu_info=dict(store.gpu_info))
        # Where the advisor judged a job, its own view stands for that job's GPUs and the host: the
        # same evidence, the same forecast as its finding (this one knows no workers, so its host
        # forecast was a straight line where the finding's was bounded by their shared pages).
        judged = self.judged_memory()
        if judged is not None:
            mine = {gm.index for gm in judged.gpus}
            view = replace(view, gpus=tuple(sorted([*judged.gpus, *(gm for gm in view.gpus if gm.index not in mine)],
                                                   key=lambda gm: gm.index)),
                           host=judged.host if judged.host is not None else view.host)
        rate = GaugeMetricFamily(
            "gputop_gpu_memory_growth_bytes_per_second",
            "Steady growth of the attached jobs' device memory (the whole card's without one) over the last "
            "minutes; 0 when flat, warming up or a saw-tooth; absent until there are minutes of history",
            labels=list(GPU_LABELS))
        eta = GaugeMetricFamily(
            "gputop_gpu_memory_time_to_limit_seconds",
            "At the growth rate, seconds until the card's memory is full; only while memory grows",
            labels=list(GPU_LABELS))
        for gm in view.gpus:
            if gm.growth.kind == "too short" or gm.index not in labels:
                continue
            rate.add_metric(labels[gm.index], gm.growth.rate if gm.growth.growing else 0.0)
            if gm.growth.growing and gm.growth.eta_s is not None:
                eta.add_metric(labels[gm.index], gm.growth.eta_s)
        yield rate
        yield eta
        hrate = GaugeMetricFamily("gputop_host_memory_growth_bytes_per_second",
                                  "Steady growth of the host's used memory; 0 when flat")
        heta = GaugeMetricFamily("gputop_host_memory_time_to_limit_seconds",
                                 "At the growth rate, seconds until the host's memory is full (the OOM killer)")
        hg = view.host
        if hg is not None and hg.kind != "too short":
            hrate.add_metric([], hg.rate if hg.growing else 0.0)
            if hg.growing and hg.eta_s is not None:
                heta.add_metric([], hg.eta_s)
        yield hrate
        yield heta

    def _workers_private(self, now: float) -> Iterator[Metric]:
        """Each attached job's DataLoader workers' private memory (USS), as the memory view
        judges it (analysis.memory_window): one series per job, with the job's labels, never one
        per worker (workers come and go: a series each would grow without bound)."""
        store = self.store
        t0 = now - MEMORY_WINDOW_S
        procs = store.procs_latest()
        per_job = jobs_private(self.attached(), procs, lambda pid: store.proc_window(pid, t0, now), now)
        total = GaugeMetricFamily(
            "gputop_workers_private_memory_bytes",
            "The attached job's DataLoader workers' private memory (USS, each worker's latest reading) summed; "
            "copy-on-read grows it, never their RSS. Only where the workers' USS is read",
            labels=list(JOB_LABELS))
        rate = GaugeMetricFamily(
            "gputop_workers_private_memory_growth_bytes_per_second",
            "The median growth of a DataLoader worker's private memory (USS) while the workers' is judged growing "
            "(at least half of them, steadily, over the last minutes); 0 otherwise; absent until there are minutes "
            "of history",
            labels=list(JOB_LABELS))
        for pid, p in sorted(per_job.items()):
            lab = self._job_labels(pid, procs.get(pid))
            total.add_metric(lab, p.total)
            if p.judged:
                rate.add_metric(lab, p.median_rate if p.grows else 0.0)
        yield total
        yield rate

    def _job_labels(self, pid: int, ps: ProcSample | None) -> list[str]:
        """A job's label values (JOB_LABELS), the same for every per-job series."""
        if ps is None and pid in self._labels_seen:
            return self._labels_seen[pid]
        place = self._placement_of(pid, ps.create_time if ps else None)
        labels = [
            str(pid),
            ps.name if ps else "",
            script_of(ps.cmdline) if ps else "",
            (ps.user or "") if ps else "",
            place.container_id,
            place.pod_uid,
        ]
        if ps is not None:
            if len(self._labels_seen) >= _LABELS_SEEN_MAX:
                self._labels_seen.clear()  # bounded however many jobs come and go
            self._labels_seen[pid] = labels
        return labels

    def _findings(self, labels: dict[int, list[str]]) -> Iterator[Metric]:
        window = GaugeMetricFamily("gputop_advisor_window_seconds", "The span the advisor's findings speak of")
        window.add_metric([], self.window)
        yield window
        fam = GaugeMetricFamily(
            "gputop_finding",
            "An active advisor finding; the value is the GPU time (seconds) its cause cost over the "
            "advisor's window, what fixing it would give back",
            labels=["id", "severity", "gpu", "pid", "job_id"],
        )
        conf = GaugeMetricFamily("gputop_finding_confidence", "The advisor's confidence in an active finding, 0..1",
                                 labels=["id", "severity", "gpu", "pid", "job_id"])
        # Warming up is the job's phase, not a finding: a gauge of its own, so a dashboard or an
        # alert counting gputop_finding series does not count it.
        warm = GaugeMetricFamily("gputop_job_warming_up",
                                 "1 while the advisor says the attached job is warming up (its speed not judged yet)")
        rows: dict[tuple[str, ...], tuple[float, float]] = {}
        warming = False
        # The advisor judges one process (and its job) at a time, so these add one label value
        # each, not one per attached process.
        pid, job = self.judged()
        # A job that has ended has no cause left to fix: its findings went on in the window (a new
        # user's exporter kept `workers-blocked` for a killed target, its value growing) while its
        # gputop_job_info was gone.
        findings = self.store.findings() if not pid or self.alive(int(pid)) else []
        for f in findings:
            if f.id in STATE_IDS:  # a state of the job, not a finding
                warming = warming or f.id == WARMUP_ID
                continue
            # A job with no GPU (its training thread stands in for the device, CPU_DEVICE) has no
            # GPU to label: "", as for a finding about no GPU, not "-1".
            gpu = "" if f.gpu_index is None or f.gpu_index == CPU_DEVICE else str(f.gpu_index)
            key = (f.id, f.severity.value, gpu, pid, job)
            rows.setdefault(key, (float(f.cost_s), float(f.confidence)))  # one series per label set
        for key, (cost, confidence) in rows.items():
            fam.add_metric(list(key), cost)
            conf.add_metric(list(key), confidence)
        warm.add_metric([], 1 if warming else 0)
        yield fam
        yield conf
        yield warm

    def _placement_of(self, pid: int, create_time: float | None) -> Placement:
        key = (pid, create_time)
        place = self._placements.get(key)
        if place is None:
            if len(self._placements) > 1024:
                self._placements.clear()  # bounded; re-read on the next scrape
            place = self._placements[key] = self._placement(pid)
        return place


def _gpu_labels(index: int, info: GpuInfo | None) -> list[str]:
    return [str(index), info.uuid if info else "", info.name if info else ""]
