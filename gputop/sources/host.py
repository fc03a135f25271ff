"""The host as psutil sees it: CPU per core, memory, disk, network, and the processes that matter.

Rates (disk, network, process IO) are differences between two polls, so the first poll
reports them as ``None`` rather than inventing a number.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable

import psutil

from .cgroup_memory import job_cgroup_memory
from ..model import SET_IN_SCRIPT, CoreTimes, Event, HostSample, ProcSample
from ..redact import PERF_ENV_PREFIXES, perf_env, redact_cmdline, redact_value
from .script_env import MAX_SOURCE_BYTES, env_set_by_script, script_argv

PidsProvider = Callable[[], Iterable[int]]

# A distributed job's shape, read beside the performance keys: whether it spans nodes (WORLD_SIZE
# above LOCAL_WORLD_SIZE) decides which NCCL settings slow it. Numbers and a host name, passed
# through the same redaction as every value.
DIST_ENV_KEYS = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "RANK", "LOCAL_RANK",
                 "NNODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")


def job_env(environ: dict[str, str], script: tuple[tuple[str, str, str], ...] = ()) -> tuple[tuple[str, str], ...]:
    """The environment keys gputop keeps of a process: the performance ones and the job's shape,
    every value through the same redaction (``redact``): never a secret on screen or in a file.
    ``script``: the performance settings its script makes for itself, (key, value, where): they
    override the starting value and say where (KEY + SET_IN_SCRIPT)."""
    merged = dict(environ)
    marks = set()
    for key, value, where in script:
        if key.startswith(PERF_ENV_PREFIXES):
            merged[key] = value
            marks.add((key + SET_IN_SCRIPT, redact_value(key, where)))
    shape = {(k, redact_value(k, merged[k])) for k in DIST_ENV_KEYS if k in merged}
    return tuple(sorted(set(perf_env(merged)) | shape | marks))


def read_script_settings(cmdline: list[str], cwd: str | None, environ: dict[str, str]) -> tuple[tuple[str, str, str], ...]:
    """The environment settings the script a process runs makes for itself, (key, value,
    "file.py:line"); () when it runs no script file that can be read. One read of one file."""
    found = script_argv(cmdline)
    if found is None:
        return ()
    path, argv = found
    if not os.path.isabs(path):
        if cwd is None:
            return ()
        path = os.path.join(cwd, path)
    try:
        if os.path.getsize(path) > MAX_SOURCE_BYTES:
            return ()
        with open(path, encoding="utf-8", errors="replace") as f:
            source = f.read()
    except OSError:
        return ()
    name = os.path.basename(path)
    return tuple((k, v, f"{name}:{line}") for k, v, line in env_set_by_script(source, argv, environ))


# How long a process's name, user and command line are reused before being read again.
IDENTITY_TTL_S = 10.0

# --- The workers' private memory (USS, PSS)
# Copy-on-read (a Dataset of Python objects whose refcounts, touched in a forked worker, copy
# every page they sit on) shows in a worker's private memory, not in its RSS: the RSS of a forked
# child counts the parent's pages it shares from the start. The kernel gives the private figure
# in /proc/PID/smaps_rollup, which it builds by walking every page table of the process under
# its mmap lock (read side): while the walk runs, the process's own mmap/munmap/brk may wait for
# it (kernels since late 2020 let a waiting writer in between areas, not within one). Its cost
# grows with what the process maps: 12-17 ms for a torch job's DataLoader worker (390 MB RSS),
# 19 ms for that job's main process, 48 ms for a torch process holding 2.2 GB (median of 40 reads,
# a 2-core VM, Linux 6.18). So it is read only where the job can afford it:
# - never the job's main process, a rank or a process holding a GPU (what trains: their page
#   tables are the largest and their allocator maps memory all the time); only the target's
#   other descendants (its DataLoader workers);
# - each at most every USS_PERIOD_S, the workers' reads spread over that period, at most
#   USS_READS_PER_POLL a poll (many workers lengthen the period rather than bunch the reads);
# - each read timed: the worker's next read waits at least the read's cost / USS_LOCK_SHARE, so
#   its lock is held by gputop at most that share of its time, however large it grows (a read of
#   up to 60 ms keeps the period, a 100 ms one comes every 20 s), and a read slower than
#   USS_SLOW_READ_S is said once. Half a percent: a worker stalled that long at worst (only if it
#   maps memory during a read, and a worker prefetches ahead of the step) loses less than any step
#   time shows. It was a thousandth: a new user's 900 MB workers on a loaded 2-core host took
#   40-60 ms a read (wall time, twice the walk's CPU time under load) and were read every 40-120 s,
#   3-4 readings in 3 minutes, so the copy-on-read finding the readings exist for never came;
# - /proc/PID/smaps_rollup only (Linux 4.14+), read directly: psutil's memory_full_info falls
#   back to /proc/PID/smaps when the rollup is missing, which walks the same tables and formats
#   every area besides; without the rollup, or without permission, workers are not read (said once).
# A worker's USS grows by a few MB a minute or more when copy-on-read matters; a reading every
# 12 s puts 50 points in the 10 minutes the memory forecast looks back over.
USS_PERIOD_S = 12.0
USS_READS_PER_POLL = 2
USS_LOCK_SHARE = 0.005
USS_SLOW_READ_S = 0.05
# The target's descendants are listed again this often (psutil reads every process's stat for it).
USS_CHILDREN_TTL_S = 5.0
USS_MAX_WORKERS = 64


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
        private: PrivateMemory | None = None,
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
        self._script_cache: dict[int, tuple[float, tuple[tuple[str, str, str], ...]]] = {}
        self._env_pid_set: set[int] = set()
        # The workers' USS/PSS reader (its pace: USS_*); a test passes one with a shorter period.
        self._private = private or PrivateMemory(self._clock)

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
        cg = job_cgroup_memory(self.target_pid) if self.target_pid is not None else None
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
            # Only a limit below the host's binds before the host runs out.
            cgroup_limit=cg.limit if cg is not None and cg.limit < vm.total else None,
            cgroup_used=cg.used if cg is not None and cg.limit < vm.total else None,
        )

    # ----------------------------------------------------------------- processes

    def _proc_samples(self, ts: float) -> list[object]:
        out: list[object] = []
        self._env_pid_set = set(self._env_pids())
        wanted = set(self._pids())
        if self.target_pid is not None:
            wanted.add(self.target_pid)
        # What trains (the target, its ranks, whatever holds a GPU); not the busiest processes
        # added below for a host without NVML, which are often the workers themselves.
        trains = set(wanted)
        if self._top_cpu:
            wanted |= self._busiest(self._top_cpu)
        for pid in list(self._procs):
            if pid not in wanted:
                self._procs.pop(pid, None)
                self._prev_io.pop(pid, None)
                self._identity_cache.pop(pid, None)
                self._script_cache.pop(pid, None)
        for pid in sorted(wanted):
            s = self._proc_sample(ts, pid)
            if s is not None:
                out.append(s)
            elif pid not in self._gone:
                self._gone.add(pid)
                if pid == self.target_pid:
                    out.append(Event(ts, "host", f"process {pid} has exited", "warning"))
        if self.target_pid is not None:
            out.extend(self._private.poll(ts, self.target_pid, trains, self._identity))
        return out

    def _proc_sample(self, ts: float, pid: int) -> ProcSample | None:
        proc = self._procs.get(pid)
        now_mono = time.monotonic()
        first = proc is None
        try:
            if proc is None:
                proc = psutil.Process(pid)
                proc.cpu_percent(None)  # primes the counter; the first reading is 0 by design
                self._procs[pid] = proc
            with proc.oneshot():
                # Read at once after priming, the rate covers no time: not read, not 0 % (a rank
                # seen first at 0 % read as standing still to the stuck verdict across ranks).
                cpu = None if first else proc.cpu_percent(None)
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
            self._script_cache.pop(pid, None)
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
                env = job_env(environ, self._script_settings(pid, proc, created, environ))
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

    def _script_settings(self, pid: int, proc: psutil.Process, created: float,
                         environ: dict[str, str]) -> tuple[tuple[str, str, str], ...]:
        """What the process's script sets in its own environment, read once per process (a
        script's text is fixed once it runs; a reused PID has another start time)."""
        cached = self._script_cache.get(pid)
        if cached is not None and cached[0] == created:
            return cached[1]
        settings = read_script_settings(_try(proc.cmdline) or [], _try(proc.cwd), environ)
        self._script_cache[pid] = (created, settings)
        return settings

    def _role(self, pid: int) -> str:
        if pid == self.target_pid:
            return "target"
        return "cpu" if self._top_cpu else "gpu"

    def _busiest(self, n: int) -> set[int]:
        # process_iter keeps its Process objects between calls, so cpu_percent is a real rate.
        usage = []
        for p in psutil.process_iter(["cpu_percent", "ppid"]):
            cpu = p.info.get("cpu_percent")
            # Linux kernel threads (kthreadd, pid 2, and its children: rcu_preempt, kworker/...)
            # have no memory or command line to show: rows of "n/a" and 0 B that crowded the
            # table on an idle host (a new user's report).
            if cpu and p.pid != KTHREADD_PID and p.info.get("ppid") != KTHREADD_PID:
                usage.append((cpu, p.pid))
        usage.sort(reverse=True)
        return {pid for _, pid in usage[:n]}


KTHREADD_PID = 2  # Linux: the parent of every kernel thread


class PrivateMemory:
    """The target's workers' private memory, read by the rules above (USS_*): a ProcSample per
    worker read this poll, with ``uss``/``pss`` and the worker's other details; none for a
    worker not due. ``cost`` keeps each worker's last read's seconds (for the numbers docs/advisor.md
    gives and the tests)."""

    def __init__(self, clock: Callable[[], float] = time.time, proc_root: str = "/proc",
                 period_s: float = USS_PERIOD_S, lock_share: float = USS_LOCK_SHARE,
                 monotonic: Callable[[], float] = time.monotonic, timer: Callable[[], float] = time.perf_counter,
                 read: Callable[[str], dict[str, int]] | None = None) -> None:
        self._clock = clock
        self._root = proc_root
        self.period_s = period_s
        self.lock_share = lock_share
        self._mono = monotonic
        self._timer = timer
        self._read_file = read or _smaps_rollup
        self._due: dict[int, float] = {}  # pid -> monotonic time of its next read
        self._procs: dict[int, psutil.Process] = {}
        self._children_at = -1e18
        self._children: list[psutil.Process] = []
        self._said: set[str] = set()
        self._primed: set[int] = set()
        self.cost: dict[int, float] = {}
        self.reads = 0

    def poll(self, ts: float, target: int, not_workers: set[int], identity) -> list[object]:
        now = self._mono()
        if "unreadable" in self._said:
            return []
        if now - self._children_at >= USS_CHILDREN_TTL_S:
            self._children_at = now
            try:
                self._children = psutil.Process(target).children(recursive=True)[:USS_MAX_WORKERS]
            except psutil.Error:
                self._children = []
        workers = {c.pid: c for c in self._children if c.pid not in not_workers and c.pid != target}
        for pid in list(self._due):
            if pid not in workers:
                self._due.pop(pid, None)
                self._procs.pop(pid, None)
                self.cost.pop(pid, None)
                self._primed.discard(pid)
        new = sorted(p for p in workers if p not in self._due)
        # New workers (a DataLoader starts them together) are spread over one period, not read at once.
        for k, pid in enumerate(new):
            self._due[pid] = now + k * self.period_s / len(new)
            self._procs[pid] = workers[pid]
        out: list[object] = []
        due = sorted((p for p, t in self._due.items() if t <= now), key=self._due.__getitem__)
        for pid in due[:USS_READS_PER_POLL]:  # the longest waiting first; the rest on the next polls
            out.extend(self._read(ts, pid, identity))
        return out

    def _read(self, ts: float, pid: int, identity) -> list[object]:
        proc = self._procs[pid]
        # Whatever happens, not again before the period is over (a failing read is not retried each poll).
        self._due[pid] = self._mono() + self.period_s
        t0 = self._timer()
        try:
            rollup = self._read_file(f"{self._root}/{pid}/smaps_rollup")
        except FileNotFoundError:
            # The kernel has no rollup (before 4.14: no process has it, and /proc lists none), the
            # worker has just exited, or the kernel refused this one (psutil has seen ENOENT for live
            # processes): only the first is for good, and tells the user something.
            if os.path.isdir(f"{self._root}/{pid}") and not os.path.exists(f"{self._root}/{pid}/smaps_rollup"):
                return self._off(ts, "unreadable", "workers' private memory (USS/PSS) is not read: this kernel has "
                                 "no /proc/PID/smaps_rollup (Linux 4.14+), and reading the full smaps instead costs "
                                 "the job too much")
            return []
        except PermissionError:
            return self._off(ts, "denied", f"workers' private memory (USS/PSS) is not read: permission denied for "
                             f"PID {pid} (another user's process, or ptrace restricted)")
        except (OSError, ValueError):
            return []  # gone (ESRCH) or a line this parser does not know: the next period tries again
        cost = self._timer() - t0
        self.cost[pid] = cost
        self.reads += 1
        # The lock is held for about the read's time: keep that under USS_LOCK_SHARE of the worker's.
        wait = max(self.period_s, cost / self.lock_share)
        self._due[pid] = self._mono() + wait
        out: list[object] = []
        if cost > USS_SLOW_READ_S and "slow" not in self._said:
            self._said.add("slow")
            out.append(Event(ts, "host", f"reading worker {pid}'s private memory took {cost * 1e3:.0f} ms: it is "
                             f"read every {wait:.0f} s instead of {self.period_s:.0f} s", "info"))
        try:
            with proc.oneshot():
                # The first CPU reading of a Process has no baseline (psutil says 0): unknown, not 0 %.
                first = pid not in self._primed
                self._primed.add(pid)
                cpu = proc.cpu_percent(None)
                created = proc.create_time()
                name, user, cmdline = identity(pid, proc, created, self._mono())
                sample = ProcSample(
                    # Stamped when read, not when the poll began: the stacks source writes the same
                    # worker's details each second, and the store keeps a process's samples in time order.
                    ts=self._clock(), pid=pid, ppid=proc.ppid(), name=name, user=user, cmdline=cmdline,
                    cpu_percent=None if first else cpu, rss=rollup.get("rss"), num_threads=proc.num_threads(),
                    status=proc.status(), create_time=created, role="worker", uss=rollup["uss"],
                    pss=rollup["pss"])
        except psutil.Error:
            return out
        out.append(sample)
        return out

    def _off(self, ts: float, kind: str, message: str) -> list[object]:
        if kind in self._said:
            return []
        self._said.add(kind)
        return [Event(ts, "host", message, "info")]


def _smaps_rollup(path: str) -> dict[str, int]:
    """USS (the Private_* lines summed), PSS and RSS from one smaps_rollup, in bytes: the sums
    psutil's memory_full_info makes of the same file."""
    out = {"uss": 0}
    with open(path, "rb") as f:
        data = f.read()
    for line in data.splitlines():
        if line.startswith(b"Private_"):
            out["uss"] += int(line.split()[1]) * 1024
        elif line.startswith(b"Pss:"):
            out["pss"] = int(line.split()[1]) * 1024
        elif line.startswith(b"Rss:"):
            out["rss"] = int(line.split()[1]) * 1024
    if "pss" not in out:
        raise ValueError("no Pss line")
    return out


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
