"""A scripted GPU source: the same samples NVML would give, from a known script.

It drives the real pipeline, store and UI in tests and lets anyone try gputop on a laptop.
Everything it reports says "fake" on screen (SystemInfo.source), so it is never mistaken
for a measurement.

The script, per GPU index (mod 4):
  0  a training job with data stalls: busy 1.6 s, idle 0.4 s (sub-second gaps for the 200 ms
     buffer), bf16 tensor cores in use while busy
  1  fp32 matmuls: 98 % busy, tensor cores idle (the classic "busy but inefficient")
  2  idle GPU, no processes
  3  a memory-heavy job near its memory limit, thermally throttled
"""

from __future__ import annotations

import math
import os
import random
import socket
import time
from typing import Callable

from ..model import PID_MAX_LIMIT, GpuInfo, GpuProcess, GpuSample, ProcSample, SystemInfo, UtilPoint

GiB = 1024**3
SAMPLE_PERIOD = 0.2  # NVML's utilisation buffer period on Hopper (facts: 200 ms)
FAKE_PID_BASE = PID_MAX_LIMIT + 96  # above Linux's largest pid_max: never a real process (4,194,400)

# Throttle bits as NVML defines them (sw power cap 0x4, sw thermal 0x20).
_SW_POWER_CAP = 0x4
_SW_THERMAL = 0x20


class FakeGpuSource:
    name = "fake"

    def __init__(
        self,
        gpus: int = 2,
        interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        seed: int = 0,
        name: str = "Fake H100 80GB HBM3 (scripted)",
        hostname: str | None = None,
    ) -> None:
        self.interval = interval
        self.gpus = max(0, gpus)
        self._clock = clock
        self._rng = random.Random(seed)
        self._gpu_name = name
        self._hostname = hostname  # None: this machine's name
        self._started = False
        self._last_point: dict[int, float] = {}
        self._t0 = clock()

    # The script: utilisation of GPU ``i`` at time ``t``.
    def util_at(self, i: int, t: float) -> float:
        kind = i % 4
        phase = (t - self._t0) % 2.0
        if kind == 0:
            return 97.0 if phase < 1.6 else 0.0
        if kind == 1:
            return 98.0
        if kind == 2:
            return 0.0
        return 88.0 + 8.0 * math.sin(t / 7.0)

    def poll(self) -> list[object]:
        ts = self._clock()
        out: list[object] = []
        if not self._started:
            self._started = True
            out.append(
                SystemInfo(
                    ts=ts,
                    hostname=self._hostname or socket.gethostname(),
                    driver_version="fake",
                    cuda_driver_version="fake",
                    nvml_version="fake",
                    gpu_count=self.gpus,
                    cpu_count=os.cpu_count(),
                    source="fake",
                )
            )
            for i in range(self.gpus):
                out.append(
                    GpuInfo(
                        ts=ts,
                        index=i,
                        name=self._gpu_name,
                        uuid=f"GPU-fake-{i:04d}",
                        memory_total=80 * GiB,
                        power_limit_w=700.0,
                        pcie_max_gen=5,
                        pcie_max_width=16,
                        compute_capability=(9, 0),
                        sm_count=132,
                        gpm_supported=True,
                        persistence_mode=True,
                    )
                )
        for i in range(self.gpus):
            out.extend(self._points(i, ts))
            out.append(self._sample(i, ts))
            out.extend(self._processes(i, ts))
        return out

    def close(self) -> None:
        pass

    # ----------------------------------------------------------------- pieces

    def _points(self, i: int, ts: float) -> list[UtilPoint]:
        # On the first poll, like NVML, the buffer already holds some history (~14 s).
        last = self._last_point.get(i, ts - 14.0)
        k = math.floor(last / SAMPLE_PERIOD) + 1
        pts = []
        while k * SAMPLE_PERIOD <= ts:
            t = k * SAMPLE_PERIOD
            pts.append(UtilPoint(ts=t, index=i, util=self.util_at(i, t)))
            k += 1
        if pts:
            self._last_point[i] = pts[-1].ts
        return pts

    def _sample(self, i: int, ts: float) -> GpuSample:
        kind = i % 4
        # The poll's utilisation is the mean over the last second, as NVML reports it.
        util = sum(self.util_at(i, ts - j * SAMPLE_PERIOD) for j in range(5)) / 5
        noise = self._rng.uniform(-1.5, 1.5)
        busy = util / 100.0
        mem_used = {0: 61 * GiB, 1: 34 * GiB, 2: 0.5 * GiB, 3: 78.5 * GiB}[kind]
        tensor = {0: 41.0 * busy, 1: 0.0, 2: 0.0, 3: 22.0 * busy}[kind]
        throttle = _SW_POWER_CAP if kind == 1 else (_SW_THERMAL if kind == 3 else 0)
        return GpuSample(
            ts=ts,
            index=i,
            util_gpu=round(util),
            util_mem=round(max(0.0, 35 * busy + noise)),
            mem_used=int(mem_used),
            mem_total=80 * GiB,
            temperature_c=round(34 + 45 * busy + (6 if kind == 3 else 0) + noise),
            power_w=round(70 + 600 * busy + 10 * noise, 1),
            power_limit_w=700.0,
            fan_pct=None,  # SXM boards have no fan: exercises the "not available" path
            sm_clock_mhz=int(1980 if busy > 0.1 else 345) - (200 if kind == 3 else 0),
            mem_clock_mhz=2619,
            sm_clock_max_mhz=1980,
            throttle_reasons=throttle if busy > 0.1 else 0x1,
            pcie_gen=5 if busy > 0.1 else 1,  # links downshift when idle, as real ones do
            pcie_width=16,
            pcie_max_gen=5,
            pcie_max_width=16,
            pcie_rx_bps=(2.1e9 if kind == 0 else 5e6) * busy,
            pcie_tx_bps=1.5e7 * busy,
            ecc_corrected=0,
            ecc_uncorrected=0,
            sm_active=max(0.0, 0.93 * util + noise),
            sm_occupancy=max(0.0, (38 if kind == 0 else 12) * busy + noise),
            tensor_active=max(0.0, tensor + (noise if tensor else 0.0)),
            dram_active=max(0.0, (52 if kind == 0 else 6.5) * busy + noise),
            fp32_active=max(0.0, (8 if kind == 0 else 77) * busy),
            fp16_active=max(0.0, (30 if kind == 0 else 0) * busy),
            dfma_active=0.0,
            fp64_active=0.0,
        )

    def _processes(self, i: int, ts: float) -> list[object]:
        kind = i % 4
        if kind == 2:
            return []
        pid = FAKE_PID_BASE + i
        util = self.util_at(i, ts)
        mem = {0: 60 * GiB, 1: 33 * GiB, 3: 78 * GiB}[kind]
        script = {0: "train.py --config vit_b16.yaml", 1: "bench_matmul.py --dtype fp32", 3: "train_llm.py --bs 64"}[kind]
        return [
            GpuProcess(ts=ts, gpu_index=i, pid=pid, used_memory=int(mem), sm_util=util, mem_util=util / 3),
            ProcSample(
                ts=ts,
                pid=pid,
                ppid=1,
                name="python",
                user="fake",
                cmdline=f"python {script}  [fake]",
                cpu_percent=100.0 + 20 * (kind == 0),
                rss=int(6.5 * GiB),
                num_threads=24,
                status="running",
                create_time=self._t0 - 3600 * (i + 1),
                role="gpu",
            ),
        ]
