"""The host as psutil sees it: CPU per core, memory, disk, network, and the processes that matter.

Rates (disk, network, process IO) are differences between two polls, so the first poll
reports them as ``None`` rather than inventing a number.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable

import psutil

from ..model import CoreTimes, Event, HostSample, ProcSample
from ..redact import perf_env, redact_cmdline, redact_value

PidsProvider = Callable[[], Iterable[int]]

# A distributed job's shape, read beside the performance keys: whether it spans nodes (WORLD_SIZE
# above LOCAL_WORLD_SIZE) decides which NCCL settings slow it. Numbers and a host name, passed
# through the same redaction as every value.
DIST_ENV_KEYS = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "RANK", "LOCAL_RANK",
                 "NNODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")


def job_env(environ: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The environment keys gputop keeps of a process: the performance ones and the job's shape,
    every value through the same redaction (``redact``): never a secret on screen or in a file."""
    shape = {(k, redact_value(k, environ[k])) for k in DIST_ENV_KEYS if k in environ}
    return tuple(sorted(set(perf_env(environ)) | shape))


# How long a process's name, user and command line are reused before being read again.
IDENTITY_TTL_S = 10.0


class HostSource:
    name = "host"

    def __init__(
        self,
        interval: float = 1.0,
        pids: PidsProvider | None = None,
        clock: Callable[[], float] = time.time,
        target_pid: int | None = None,
        top_cpu: int = 0,
        env_pids: PidsProvider | None = None,
    ) -> None:
        self.interval = interval
        # Without GPU processes to list (no NVML), the busiest CPU processes stand in.
        self._top_cpu = top_cpu
        self._pids = pids or (lambda: ())
        self._clock = clock
        self.target_pid = target_pid
        # Besides the target's, whose environments are read: a multi-rank job's ranks (their NCCL
        # settings can differ, and the advisor reads them per rank).
        self._env_pids = env_pids or (lambda: ())
        self._prev_cpu = psutil.cpu_times(percpu=True)
        self._prev_disk = _disk_counters()
        self._prev_net = _net_counters()
        self._prev_t = time.monotonic()
        self._procs: dict[int, psutil.Process] = {}
        self._prev_io: dict[int, tuple[float, int, int]] = {}
        self._gone: set[int] = set()
        self._identity_cache: dict[int, tuple[float, float, tuple[str, str | None, str]]] = {}
        self._env_pid_set: set[int] = set()

    def poll(self) -> list[object]:
        ts = self._clock()
        now = time.monotonic()
        dt = max(1e-3, now - self._prev_t)
        self._prev_t = now
        out: list[object] = [self._host_sample(ts, dt)]
        out.extend(self._proc_samples(ts))
        return out

    def close(self) -> None:
        self._procs.clear()

    # ----------------------------------------------------------------- host

    def _host_sample(self, ts: float, dt: float) -> HostSample:
        cur = psutil.cpu_times(percpu=True)
        cores = tuple(_core_pct(a, b) for a, b in zip(self._prev_cpu, cur))
        self._prev_cpu = cur
        n = max(1, len(cores))
        busy = sum(c.busy for c in cores) / n
        iowait = sum(c.iowait for c in cores) / n
        steal = sum(c.steal for c in cores) / n
        try:
            load = os.getloadavg()
        except OSError:
            load = (None, None, None)
        vm = psutil.virtual_memory()
        sw = psutil.swap_memory()
        disk = _disk_counters()
        net = _net_counters()
        d_r = d_w = n_rx = n_tx = None
        if disk and self._prev_disk:
            d_r = max(0, disk[0] - self._prev_disk[0]) / dt
            d_w = max(0, disk[1] - self._prev_disk[1]) / dt
        if net and self._prev_net:
            n_rx = max(0, net[0] - self._prev_net[0]) / dt
            n_tx = max(0, net[1] - self._prev_net[1]) / dt
        self._prev_disk, self._prev_net = disk, net
        shm_total = shm_used = None
        try:
            shm = psutil.disk_usage("/dev/shm")
            shm_total, shm_used = shm.total, shm.used
        except OSError:
            pass
        return HostSample(
            ts=ts,
            cpu_percent=busy,
            cores=cores,
            iowait_percent=iowait,
            steal_percent=steal,
            load1=load[0],
            load5=load[1],
            load15=load[2],
            mem_total=vm.total,
            mem_used=vm.total - vm.available,
            mem_available=vm.available,
            swap_total=sw.total,
            swap_used=sw.used,
            disk_read_bps=d_r,
            disk_write_bps=d_w,
            net_rx_bps=n_rx,
            net_tx_bps=n_tx,
            shm_total=shm_total,
            shm_used=shm_used,
        )

    # ----------------------------------------------------------------- processes

    def _proc_samples(self, ts: float) -> list[object]:
        out: list[object] = []
        self._env_pid_set = set(self._env_pids())
        wanted = set(self._pids())
        if self.target_pid is not None:
            wanted.add(self.target_pid)
        if self._top_cpu:
            wanted |= self._busiest(self._top_cpu)
        for pid in list(self._procs):
            if pid not in wanted:
                self._procs.pop(pid, None)
                self._prev_io.pop(pid, None)
                self._identity_cache.pop(pid, None)
        for pid in sorted(wanted):
            s = self._proc_sample(ts, pid)
            if s is not None:
                out.append(s)
            elif pid not in self._gone:
                self._gone.add(pid)
                if pid == self.target_pid:
                    out.append(Event(ts, "host", f"process {pid} has exited", "warning"))
        return out

    def _proc_sample(self, ts: float, pid: int) -> ProcSample | None:
        proc = self._procs.get(pid)
        now_mono = time.monotonic()
        try:
            if proc is None:
                proc = psutil.Process(pid)
                proc.cpu_percent(None)  # primes the counter; the first reading is 0 by design
                self._procs[pid] = proc
            with proc.oneshot():
                cpu = proc.cpu_percent(None)
                mem = proc.memory_info()
                ppid = proc.ppid()
                status = proc.status()
                threads = proc.num_threads()
                io = _try(proc.io_counters)
                created = proc.create_time()
                name, user, cmdline = self._identity(pid, proc, created, now_mono)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._procs.pop(pid, None)
            self._identity_cache.pop(pid, None)
            return None
        except psutil.AccessDenied:
            return ProcSample(ts=ts, pid=pid, name="?", status="access denied", role=self._role(pid))
        self._gone.discard(pid)
        r_bps = w_bps = None
        if io is not None:
            prev = self._prev_io.get(pid)
            now = now_mono
            if prev is not None:
                dt = max(1e-3, now - prev[0])
                r_bps = max(0, io.read_bytes - prev[1]) / dt
                w_bps = max(0, io.write_bytes - prev[2]) / dt
            self._prev_io[pid] = (now, io.read_bytes, io.write_bytes)
        env: tuple[tuple[str, str], ...] = ()
        if pid == self.target_pid or pid in self._env_pid_set:
            environ = _try(proc.environ)
            if environ:
                env = job_env(environ)
        return ProcSample(
            ts=ts,
            pid=pid,
            ppid=ppid,
            name=name,
            user=user,
            cmdline=cmdline,
            cpu_percent=cpu,
            rss=mem.rss,
            num_threads=threads,
            status=status,
            create_time=created,
            io_read_bps=r_bps,
            io_write_bps=w_bps,
            role=self._role(pid),
            env=env,
        )

    def _identity(self, pid: int, proc: psutil.Process, created: float, now: float) -> tuple[str, str | None, str]:
        """Name, user and redacted command line, read again only every IDENTITY_TTL_S.

        They rarely change in a process's life, and reading them (three /proc files, a passwd
        lookup, the redaction) was most of a poll's cost per process. The start time is read on
        every poll, so a reused PID never inherits the old process's identity.
        """
        cached = self._identity_cache.get(pid)
        if cached is not None and now < cached[0] and cached[1] == created:
            return cached[2]
        name = proc.name()
        user = _try(proc.username)
        cmd = _try(proc.cmdline) or []
        ident = (name, user, redact_cmdline(cmd) if cmd else name)
        self._identity_cache[pid] = (now + IDENTITY_TTL_S, created, ident)
        return ident

    def _role(self, pid: int) -> str:
        if pid == self.target_pid:
            return "target"
        return "cpu" if self._top_cpu else "gpu"

    def _busiest(self, n: int) -> set[int]:
        # process_iter keeps its Process objects between calls, so cpu_percent is a real rate.
        usage = []
        for p in psutil.process_iter(["cpu_percent"]):
            cpu = p.info.get("cpu_percent")
            if cpu:
                usage.append((cpu, p.pid))
        usage.sort(reverse=True)
        return {pid for _, pid in usage[:n]}


def _core_pct(a, b) -> CoreTimes:
    fields = a._fields
    total = sum(getattr(b, f) - getattr(a, f) for f in fields)
    if total <= 0:
        return CoreTimes(0.0, 0.0)

    def pct(*names: str) -> float:
        return 100.0 * sum(getattr(b, n) - getattr(a, n) for n in names if n in fields) / total

    return CoreTimes(
        user=pct("user", "nice"),
        system=pct("system", "irq", "softirq"),
        iowait=pct("iowait"),
        steal=pct("steal"),
    )


def _disk_counters() -> tuple[int, int] | None:
    try:
        d = psutil.disk_io_counters()
    except (OSError, RuntimeError):
        return None
    return (d.read_bytes, d.write_bytes) if d else None


def _net_counters() -> tuple[int, int] | None:
    try:
        n = psutil.net_io_counters()
    except (OSError, RuntimeError):
        return None
    return (n.bytes_recv, n.bytes_sent) if n else None


def _try(fn):
    try:
        return fn()
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
        return None
