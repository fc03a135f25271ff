"""A synthetic training session, second by second: what the recorder sees at default rates.

Used by the size/seek benchmark (a 24 h file without waiting 24 h) and by tests that need a
realistic recording; ``synth.py`` beside it scripts the analysis tests' timelines, and the
product's own scripted source (``gputop --fake``) is ``gputop/sources/fake.py``. Values have the precision real sources give (floats where psutil and
NVML give floats), stacks have realistic depth and variety, so the file sizes it produces are
representative. Seeded, so runs are comparable. Clearly synthetic: SystemInfo.source is "fake".

Script: one training job per GPU (busy ~85 %, short data stalls every few seconds), a 60 s
checkpoint every 30 min with the GPU idle, a target process plus three loader workers, and
py-spy-like stack samples at 5 Hz for four threads of the target.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Iterator

from gputop.model import (
    Category,
    CoreTimes,
    Event,
    Finding,
    Frame,
    GpuInfo,
    GpuProcess,
    GpuSample,
    HostSample,
    ProcSample,
    TaskSample,
    ThreadState,
    Severity,
    StackSample,
    SystemInfo,
    UtilPoint,
)

GiB = 1024**3
TARGET_PID = 4_194_300  # above Linux's pid_max: never a real process
CHECKPOINT_EVERY_S = 1800.0
CHECKPOINT_LEN_S = 60.0


@dataclass(frozen=True)
class Rates:
    """The default rates the size target is stated for."""

    gpus: int = 1
    util_per_s: int = 5  # NVML's buffer: one point per 200 ms
    workers: int = 3  # loader processes besides the target
    stack_hz: int = 5
    threads: int = 4
    cores: int = 16
    procfs: bool = True  # each process's /proc reading every second (the target and its workers)


def _frames(depth_base: list[Frame], tail: list[Frame]) -> tuple[Frame, ...]:
    return tuple(reversed(depth_base + tail))  # newest first


def _build_stacks(rng: random.Random) -> dict[str, list[tuple[tuple[Frame, ...], Category, bool]]]:
    site = "/usr/lib/python3.12/site-packages/torch"
    base = [
        Frame("<module>", "train.py", 212, "__main__"),
        Frame("main", "train.py", 198, "__main__"),
        Frame("train", "train.py", 141, "__main__"),
        Frame("train_one_epoch", "train.py", 88, "__main__"),
    ]
    main: list[tuple[tuple[Frame, ...], Category, bool]] = []
    # Forward through 24 blocks, backward, optimizer: many distinct stacks, as a real model has.
    for layer in range(24):
        for op, line in (("attention", 57), ("mlp", 73), ("layernorm", 41)):
            tail = [
                Frame("forward", "model.py", 301, "model"),
                Frame("_call_impl", f"{site}/nn/modules/module.py", 1562, "torch.nn.modules.module"),
                Frame("forward", "model.py", 120 + layer, "model"),
                Frame(op, "model.py", line, "model"),
                Frame("linear", f"{site}/nn/functional.py", 2183 + layer % 3, "torch.nn.functional"),
            ]
            main.append((_frames(base, tail), Category.FORWARD, True))
    for i in range(12):
        tail = [
            Frame("backward", f"{site}/_tensor.py", 521, "torch._tensor"),
            Frame("backward", f"{site}/autograd/__init__.py", 289, "torch.autograd"),
            Frame("_engine_run_backward", f"{site}/autograd/graph.py", 768 + i, "torch.autograd.graph"),
        ]
        main.append((_frames(base, tail), Category.BACKWARD, True))
    for i in range(4):
        tail = [
            Frame("step", f"{site}/optim/adamw.py", 204 + i, "torch.optim.adamw"),
            Frame("_multi_tensor_adamw", f"{site}/optim/adamw.py", 590 + i, "torch.optim.adamw"),
        ]
        main.append((_frames(base, tail), Category.OPTIMIZER, True))
    data_wait = [
        (
            _frames(
                base,
                [
                    Frame("__next__", f"{site}/utils/data/dataloader.py", 630, "torch.utils.data.dataloader"),
                    Frame("_next_data", f"{site}/utils/data/dataloader.py", 1327, "torch.utils.data.dataloader"),
                    Frame("_get_data", f"{site}/utils/data/dataloader.py", 1293, "torch.utils.data.dataloader"),
                    Frame("get", "/usr/lib/python3.12/queue.py", 180, "queue"),
                    Frame("wait", "/usr/lib/python3.12/threading.py", 359, "threading"),
                ],
            ),
            Category.DATA_WAIT,
            False,
        )
    ]
    sync = [
        (
            _frames(base, [Frame("item", "train.py", 97, "__main__")]),
            Category.HOST_SYNC,
            True,
        )
    ]
    ckpt = [
        (
            _frames(
                base,
                [
                    Frame("save_checkpoint", "train.py", 160, "__main__"),
                    Frame("save", f"{site}/serialization.py", 651, "torch.serialization"),
                    Frame("_save", f"{site}/serialization.py", 883 + i, "torch.serialization"),
                ],
            ),
            Category.CHECKPOINT_IO,
            i % 2 == 0,
        )
        for i in range(3)
    ]
    thread_base = [Frame("_bootstrap", "/usr/lib/python3.12/threading.py", 1032, "threading"),
                   Frame("_bootstrap_inner", "/usr/lib/python3.12/threading.py", 1075, "threading"),
                   Frame("run", "/usr/lib/python3.12/threading.py", 1012, "threading")]
    pin = [
        (
            _frames(
                thread_base,
                [
                    Frame("_pin_memory_loop", f"{site}/utils/data/_utils/pin_memory.py", 59, None),
                    Frame("do_one_step", f"{site}/utils/data/_utils/pin_memory.py", 35 + i, None),
                    Frame("get", "/usr/lib/python3.12/multiprocessing/queues.py", 113, None),
                ],
            ),
            Category.IDLE,
            False,
        )
        for i in range(2)
    ]
    logger = [(_frames(thread_base, [Frame("_worker", "wandb/sdk/internal.py", 98, None),
                                      Frame("wait", "/usr/lib/python3.12/threading.py", 359, "threading")]),
               Category.IDLE, False)]
    watchdog = [(_frames(thread_base, [Frame("_monitor", "train.py", 30, "__main__"),
                                        Frame("sleep", "<built-in>", 0, None)]), Category.IDLE, False)]
    rng.shuffle(main)
    return {"main": main, "data_wait": data_wait, "sync": sync, "ckpt": ckpt, "pin": pin,
            "logger": logger, "watchdog": watchdog}


class SyntheticSession:
    """Yields one batch per simulated second: ``for batch in SyntheticSession(t0).seconds(n)``."""

    def __init__(
        self,
        t0: float = 1_767_225_600.0,
        rates: Rates = Rates(),
        seed: int = 1,
        checkpoint_every_s: float = CHECKPOINT_EVERY_S,
        checkpoint_len_s: float = CHECKPOINT_LEN_S,
        worker_uss: Callable[[float, int], float] | None = None,
        target_rss: Callable[[float], float] | None = None,
    ) -> None:
        """``worker_uss``: each worker's private memory, bytes, at (seconds since t0, worker
        index), read as the host source reads it (every 12 s, the workers' reads spread over
        them); None: not read (a recording from before schema version 2). ``target_rss``: the main
        process's RSS (None: about 9.2 GiB, noisy)."""
        self.worker_uss = worker_uss
        self.target_rss = target_rss
        self.t0 = t0
        self.checkpoint_every_s = checkpoint_every_s
        self.checkpoint_len_s = checkpoint_len_s
        self.rates = rates
        self.rng = random.Random(seed)
        self.stacks = _build_stacks(self.rng)
        self._main_i = 0
        self._stall_until = -1.0
        self.env = (
            ("CUDA_VISIBLE_DEVICES", "0"),
            ("NCCL_DEBUG", "WARN"),
            ("OMP_NUM_THREADS", "8"),
            ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        )

    def util_at(self, t: float) -> float:
        if self.in_checkpoint(t):
            return 0.0
        if t < self._stall_until:
            return float(self.rng.choice((0, 0, 3, 12)))
        return float(self.rng.choice((96, 97, 98, 99, 100, 100, 93, 88)))

    def in_checkpoint(self, t: float) -> bool:
        return (t - self.t0) % self.checkpoint_every_s >= self.checkpoint_every_s - self.checkpoint_len_s

    def static(self) -> list[object]:
        r = self.rates
        out: list[object] = [
            SystemInfo(ts=self.t0, hostname="synthetic-host", driver_version="580.159.04", cuda_driver_version="13.0",
                       nvml_version="13.580.159.04", gpu_count=r.gpus, cpu_count=r.cores, source="fake")
        ]
        for g in range(r.gpus):
            out.append(GpuInfo(ts=self.t0, index=g, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-synthetic-{g:04d}",
                               memory_total=80 * GiB, power_limit_w=700.0, pcie_max_gen=5, pcie_max_width=16,
                               compute_capability=(9, 0), sm_count=132, gpm_supported=True, persistence_mode=True,
                               numa_cpus="0-15"))
        return out

    def seconds(self, n: int, start: int = 0) -> Iterator[list[object]]:
        for k in range(start, start + n):
            yield self.second(k)

    def second(self, k: int) -> list[object]:
        rng = self.rng
        r = self.rates
        t = self.t0 + k + 1
        out: list[object] = self.static() if k == 0 else []
        # A data stall of 0.2-0.6 s every ~5 s on average.
        if rng.random() < 0.2:
            self._stall_until = t - 1 + rng.uniform(0.2, 0.6)
        ckpt = self.in_checkpoint(t)
        for g in range(r.gpus):
            utils = []
            for j in range(r.util_per_s):
                ts = t - 1 + (j + 1) / r.util_per_s
                u = self.util_at(ts)
                utils.append(u)
                out.append(UtilPoint(ts=ts, index=g, util=u))
            busy = sum(utils) / len(utils) / 100.0
            noise = rng.gauss(0, 1.0)
            out.append(
                GpuSample(
                    ts=t, index=g, util_gpu=float(round(100 * busy)), util_mem=float(round(38 * busy)),
                    mem_used=int(61.3 * GiB) + rng.randrange(0, 64) * 2**20, mem_total=80 * GiB,
                    temperature_c=float(round(40 + 38 * busy + noise)), power_w=round(90 + 560 * busy + 8 * noise, 3),
                    power_limit_w=700.0, fan_pct=None, sm_clock_mhz=1980 if busy > 0.1 else 345, mem_clock_mhz=2619,
                    sm_clock_max_mhz=1980, throttle_reasons=0x4 if busy > 0.5 else 0x1,
                    pcie_gen=5 if busy > 0.1 else 1, pcie_width=16, pcie_max_gen=5, pcie_max_width=16,
                    pcie_rx_bps=float(rng.randrange(1_500_000_000, 2_500_000_000)) * busy,
                    pcie_tx_bps=float(rng.randrange(10_000_000, 20_000_000)) * busy,
                    ecc_corrected=0, ecc_uncorrected=0,
                    sm_active=max(0.0, 91 * busy + noise), sm_occupancy=max(0.0, 36 * busy + noise / 2),
                    tensor_active=max(0.0, 41 * busy + noise), dram_active=max(0.0, 52 * busy + noise),
                    fp32_active=max(0.0, 7.5 * busy + noise / 4), fp16_active=max(0.0, 29 * busy + noise / 3),
                )
            )
            out.append(GpuProcess(ts=t, gpu_index=g, pid=TARGET_PID, used_memory=int(60.8 * GiB),
                                  sm_util=float(round(100 * busy)), mem_util=float(round(30 * busy))))
        cores = []
        for c in range(r.cores):
            busy_c = min(100.0, max(0.0, (65 if c < 5 else 8) + rng.gauss(0, 6)))
            cores.append(CoreTimes(user=busy_c * 0.85, system=busy_c * 0.15, iowait=rng.choice((0.0, 0.0, 0.0, 1.0)),
                                   steal=0.0))
        cpu = sum(c.busy for c in cores) / len(cores)
        out.append(
            HostSample(
                ts=t, cpu_percent=cpu, cores=tuple(cores), iowait_percent=sum(c.iowait for c in cores) / len(cores),
                steal_percent=0.0, load1=5.2 + rng.random(), load5=5.1 + rng.random() / 4, load15=5.0,
                mem_total=128 * GiB, mem_used=int(48 * GiB) + rng.randrange(0, 2**28),
                mem_available=int(80 * GiB) - rng.randrange(0, 2**28), swap_total=0, swap_used=0,
                disk_read_bps=float(rng.randrange(0, 300_000_000)) if not ckpt else 0.0,
                disk_write_bps=float(rng.randrange(0, 1_000_000)) if not ckpt else 1.8e9,
                net_rx_bps=float(rng.randrange(1000, 90_000)), net_tx_bps=float(rng.randrange(1000, 60_000)),
                shm_total=64 * GiB, shm_used=int(3.1 * GiB),
            )
        )
        out.append(
            ProcSample(ts=t, pid=TARGET_PID, ppid=1, name="python", user="researcher",
                       cmdline="python train.py --config configs/vit_b16.yaml --batch-size 256 --workers 3",
                       cpu_percent=round(100 + rng.gauss(0, 8), 1),
                       rss=(int(9.2 * GiB) + rng.randrange(0, 2**24)) if self.target_rss is None
                       else int(self.target_rss(k + 1)),
                       num_threads=41, status=rng.choice(("running", "running", "sleeping")),
                       create_time=self.t0 - 120.0, io_read_bps=0.0, io_write_bps=0.0 if not ckpt else 1.8e9,
                       role="target", env=self.env)
        )
        for w in range(r.workers):
            out.append(
                ProcSample(ts=t, pid=TARGET_PID + 1 + w, ppid=TARGET_PID, name="pt_data_worker", user="researcher",
                           cmdline="python train.py --config configs/vit_b16.yaml --batch-size 256 --workers 3",
                           cpu_percent=round(max(0.0, 92 + rng.gauss(0, 10)), 1),
                           rss=int(2.1 * GiB) + rng.randrange(0, 2**22), num_threads=3,
                           status=rng.choice(("running", "running", "disk-sleep", "sleeping")),
                           create_time=self.t0 - 110.0, io_read_bps=float(rng.randrange(10_000_000, 90_000_000)),
                           io_write_bps=0.0, role="worker",
                           uss=int(self.worker_uss(k + 1, w)) if self.worker_uss is not None and (k - 4 * w) % 12 == 0
                           else None)
            )
        if r.procfs:
            out.extend(self._tasks(t, k, ckpt))
        out.extend(self._stacks(t, ckpt))
        if k % 10 == 9:
            out.extend(self._findings(t, k))
        if self.in_checkpoint(t) and not self.in_checkpoint(t - 1):
            out.append(Event(ts=t, source="host", message="checkpoint started: runs/ckpt_%05d.pt" % k, level="info"))
        return out

    def _tasks(self, t: float, k: int, ckpt: bool) -> list[TaskSample]:
        """The /proc readings the procfs source takes each second: the target's main thread mostly
        launching (R) or in a futex, the workers reading files; CPU time and switches counting up."""
        rng = self.rng
        out = []
        for w in range(-1, self.rates.workers):
            pid = TARGET_PID + 1 + w if w >= 0 else TARGET_PID
            busy = w < 0 and not ckpt
            state = rng.choice(("R", "R", "S")) if busy else rng.choice(("S", "S", "R", "D"))
            main = ThreadState(tid=pid, name="python" if w < 0 else "pt_data_worker", state=state,
                               cpu_ns=int((k + 1) * (0.95e9 if w < 0 else 0.9e9)) + rng.randrange(0, 10**7),
                               runs=(k + 1) * 400 + rng.randrange(0, 50), wakes=(k + 1) * 380 + rng.randrange(0, 40),
                               wchan=None if state == "R" else ("futex_wait_queue" if w < 0 else "folio_wait_bit"),
                               syscall=None if state == "R" else ("futex" if w < 0 else "read"),
                               fd_path=None if w < 0 or state == "R" else f"/data/shards/train-{k % 64:05d}.tar",
                               fs=None if w < 0 or state == "R" else "ext4 on /data")
            out.append(TaskSample(ts=t, pid=pid, ppid=1 if w < 0 else TARGET_PID, threads=(main,),
                                  rchar=(k + 1) * 80_000_000, wchar=(k + 1) * 10_000))
        return out

    def _stacks(self, t: float, ckpt: bool) -> list[StackSample]:
        rng = self.rng
        r = self.rates
        out: list[StackSample] = []
        names = ("MainThread", "Thread-1 (_pin_memory_loop)", "Thread-2 (_worker)", "Thread-3 (_monitor)")
        pools = ("main", "pin", "logger", "watchdog")
        for j in range(r.stack_hz):
            ts = t - 1 + (j + 1) / r.stack_hz
            for th in range(r.threads):
                pool = pools[th % len(pools)]
                if th == 0:
                    if ckpt:
                        frames, cat, active = rng.choice(self.stacks["ckpt"])
                    elif ts < self._stall_until:
                        frames, cat, active = self.stacks["data_wait"][0]
                    elif rng.random() < 0.05:
                        frames, cat, active = self.stacks["sync"][0]
                    else:
                        self._main_i = (self._main_i + rng.randrange(1, 4)) % len(self.stacks["main"])
                        frames, cat, active = self.stacks["main"][self._main_i]
                else:
                    frames, cat, active = rng.choice(self.stacks[pool])
                out.append(
                    StackSample(ts=ts, pid=TARGET_PID, thread_id=140_000_000_000_000 + th * 4096, thread_name=names[th % 4],
                                frames=frames, active=active, owns_gil=active and th == 0, is_main=th == 0,
                                category=cat, os_thread_id=TARGET_PID + 100 + th)
                )
        return out

    def _findings(self, t: float, k: int) -> list[Finding]:
        out = [
            Finding(id="data-stall", title="GPU waits for the input pipeline ~12% of the time",
                    severity=Severity.WARNING, confidence=0.8,
                    evidence=("main thread in DataLoader.__next__ during 71% of idle samples",
                              "3 loader workers at 92% CPU each"),
                    action="DataLoader(num_workers=8, pin_memory=True, persistent_workers=True)",
                    expected_gain="up to 12% more steps/s", cost_s=0.12 * 60, gpu_index=0, ts=t, first_seen=self.t0 + 60)
        ]
        if self.in_checkpoint(t):
            out.append(Finding(id="checkpoint-stall",
                               title=f"Checkpoint saving stalls the GPU for {self.checkpoint_len_s:.0f} s every "
                                     f"{self.checkpoint_every_s / 60:.0f} min",
                               severity=Severity.WARNING, confidence=0.9,
                               evidence=(f"GPU idle {self.checkpoint_len_s:.0f} s while the main thread is in "
                                         "torch.save",),
                               action="save asynchronously (torch.distributed.checkpoint.async_save)",
                               expected_gain=f"{100 * self.checkpoint_len_s / self.checkpoint_every_s:.0f}% of wall time",
                               cost_s=self.checkpoint_len_s, gpu_index=0, ts=t, first_seen=t))
        return out
