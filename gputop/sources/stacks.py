"""Python stacks of a running training process, by PID, through the py-spy binary: the sampler.

Its parts are modules of their own: ``pyspy_binary`` (finding and running py-spy, its failures),
``pyspy_parser`` (py-spy's JSON to samples), ``pyspy_permissions`` (why reading was refused);
their public names are importable from here too.

One ``py-spy dump --json`` per sample. py-spy has no streaming mode: ``record`` writes its
samples (raw, speedscope, chrometrace) only when it ends, so a long-lived ``record`` gives no
stack until its window closes, and it loses what the classifier and the stuck detector need:
py-spy's per-thread idle flag (waiting for data *is* idle), the kernel thread id and a time per
sample. So each sample is a short-lived py-spy process, and what it costs is managed instead:

- Routine dumps are ``--nonblocking``: py-spy reads the target's memory without stopping it,
  so the job loses no time to them (a blocking dump ptrace-stops every thread, which on a job
  with ~150 threads is what makes py-spy costly). Where ``--nonblocking`` loses a thread's
  kernel id (and with it the on-CPU flag), the id learnt from an earlier dump and
  ``/proc/PID/task/TID/stat`` (state R) give them back.
- Blocking dumps only where a consistent stack matters: the first look at the target, a thread
  not seen before, and a main stack that stopped moving (what the stuck detector will report).
  Each is charged to a pause budget at its whole wall time (an upper bound of the stop). None
  while the host's CPUs are saturated (``host_cpu``): py-spy would wait for a CPU with every
  thread of the job stopped (one such dump stopped a job for seconds, 6-14 % of a 30 s window).
- On a saturated host nonblocking dumps run at the lowest CPU priority
  (``pyspy_binary.NONBLOCKING_NICE``): they take the CPU the job leaves, and come less often;
  ``cost`` then says the sampling is held back, and why, beside the rate asked for.
- The sampler's own CPU (its thread and its py-spy processes) is metered and charged to a CPU
  budget: the rate falls below ``rate`` when py-spy is costly on this machine. Both budgets are
  token buckets with a burst, so attaching gives a quick first look.
- DataLoader workers (the target's children) are dumped one at a time, round robin, every
  ``worker_interval`` (every second over the first ``ATTACH_WORKERS_S`` after attaching).

``cost`` is the latest reading (gputop.model.SamplingCost), also said once as an Event.
bench/attach_cost.py measures the slowdown on real jobs against what is shown here.

Samples carry ``clock()`` (``time.time()``) taken when py-spy returns, the clock NVML's samples
use.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Callable

from ..model import Event, ProcSample, SamplingCost, TargetState, TargetStatus
from ..redact import perf_env, redact_cmdline
from ..units import fmt_clock
from .host_cpu import HostCpu, read_host_cpu

# The sampler's parts, each in its own module; their public names are re-exported here, the face
# callers import py-spy sampling from.
from .pyspy_binary import (
    DUMP_TIMEOUT_S,
    NATIVE_TIMEOUT_S,
    NONBLOCKING_NICE,
    PYSPY_ENV,
    AttachError,
    check_attachable,
    dump_json,
    exit_status,
    find_pyspy,
    native_dump,
    thread_on_cpu,
)
from .pyspy_parser import _CACHE_MAX, Classify, IsLibrary, SourceLines, StackParser, _unclassified
from .pyspy_permissions import (
    CAP_SYS_PTRACE_BIT, YAMA_SCOPE_FILE, PtraceFacts, attach_policy, permission_advice, ptrace_facts,
)

# The most main-thread stacks per second (``--sample-rate``); the CPU budget may lower it.
DEFAULT_RATE = 5.0
# For the first ATTACH_BURST_S after attaching, main-thread stacks come this often (within the
# CPU budget's burst): the rules need MIN_MAIN_SAMPLES of them (advisor.rules.base), so a steady
# problem is named in ~2-3 s instead of waiting on the steady rate. Nonblocking dumps do not stop
# the target; the burst's ~20 dumps cost ~0.3 s of gputop's own CPU, once. Judgement.
ATTACH_BURST_RATE = 10.0
ATTACH_BURST_S = 2.0
# Routine dumps do not stop the target (see the module's docstring).
DEFAULT_NONBLOCKING = True
# The sampler's own CPU, py-spy processes included, as a long-run average in cores. A py-spy
# dump costs ~8-15 ms of CPU (it maps the target and reads the interpreter's symbols each
# time), so on a busy host this, not DEFAULT_RATE, sets the steady rate: about 1-2 stacks/s.
DEFAULT_CPU_BUDGET = 0.015
# On a host with CPUs to spare (host_cpu.HostCpu.spare) the budget is this many times larger:
# nonblocking dumps stop no thread of the job and run on an idle CPU, so the job loses nothing
# (bench/attach_cost.py measures it), and the rate asked for (5/s) comes instead of 1-2/s. At
# 1-2 stacks/s a rank of a two-rank job got ~1 a second: a 15 % per-step sync was missed in a
# job's first 13 samples (a 12 % chance) and taken for launch overhead, and a hang's weighing
# waited on a handful of samples. Judgement: 0.075 of a core buys the default rate at 15 ms a
# dump, still a twentieth of the one CPU the host has free at least.
SPARE_BUDGET_FACTOR = 5.0
# CPU seconds the sampler may spend ahead of its budget: about 30 dumps at attach, so the first
# diagnosis does not wait on the steady rate.
CPU_BURST_S = 0.4
# The share of the target's wall time blocking dumps may stop it, as a long-run average.
DEFAULT_PAUSE_BUDGET = 0.001
PAUSE_BURST_S = 0.1  # a few blocking dumps at attach
# A main stack unchanged this long is confirmed with a blocking dump (a stuck job is reported
# with this stack), and again every CONFIRM_EVERY_S while it stays.
CONFIRM_AFTER_S = 2.0
CONFIRM_EVERY_S = 30.0
# Consecutive failed nonblocking dumps before a fault is reported: reading a running process
# can catch a frame list being rewritten, and the next dump is then fine.
NONBLOCKING_FAILS = 3
# The published cost is measured over this window, recomputed this often.
COST_WINDOW_S = 30.0
COST_EVERY_S = 2.0
COST_EVENT_AFTER_S = 10.0  # the one Event comes once this much has been measured
MAX_INTERVAL_S = 5.0  # however costly py-spy is, a stack at least this often
# Sampling is held back (``SamplingCost.held_back``) when fewer than this share of the stacks asked
# for came over the cost window. Judgement: the CPU budget alone keeps the default 5/s at ~1-2/s
# on most hosts (by design, said in the README); under a fifth of the ask, the advisor's first
# verdict waits noticeably longer, and the user should know why.
HELD_BACK_SHARE = 0.2
HOST_CPU_EVERY_S = 1.0  # how often the host's CPU contention is read again (two small /proc files)
# Worker stacks and process details (psutil) change slowly compared with the main thread; a
# worker's stacks feed the data-fetch breakdown, which a dump every few seconds keeps.
WORKER_INTERVAL_S = 3.0
# ... but over the first verdict's window after attaching, a worker every second: the findings
# that read the workers' stacks need two of them, and at one every 3 s a held-out job whose four
# workers fetched rows one by one was told "add workers" for 10 s before its second worker stack
# came. Each dump is charged to the CPU budget like any other (it waits when the budget is spent).
ATTACH_WORKER_INTERVAL_S = 1.0
ATTACH_WORKERS_S = 10.0
PROC_INTERVAL_S = 1.0
# After a py-spy failure that may pass (target busy forking, a timeout), try again this often.
RETRY_AFTER_S = 2.0
MAX_WORKERS = 64  # children followed at once (torch.compile can start dozens)
# A job this young (seconds since its process started) that py-spy cannot read yet is starting
# up, not failing: while Python imports torch and CUDA initialises, py-spy's "Failed to get stack
# traces" is routine and the next dumps succeed. Such a miss is not reported unless it lasts past
# this age (a recording of a job attached at its start led with "warning stacks: py-spy failed",
# followed by 10 s of good samples). Judgement: importing torch with CUDA takes 5-20 s.
STARTUP_GRACE_S = 30.0


# --------------------------------------------------------------------------- the source


class PySpySource:
    """Stacks of one training process and of its child processes (DataLoader workers), with
    the workers' process details (CPU, state).

    The target's own process details come from the host source in a live session (it also has
    the IO rates); ``target_details=True`` adds them here too, for use without one.
    ``classify`` and ``is_library`` come from the analysis layer (the session passes them): a
    source turns the world into samples and decides nothing about them. Whether the job is
    stuck is decided over the store (gputop.analysis.stuck), not here.

    Never raises from ``poll`` for routine faults: py-spy failing, the target exiting or being
    unreadable become Events (each once); once the target is gone sampling stops and what was
    collected stays in the store.
    """

    name = "stacks"

    def __init__(
        self,
        pid: int,
        clock: Callable[[], float] = time.time,
        rate: float = DEFAULT_RATE,
        nonblocking: bool = DEFAULT_NONBLOCKING,
        pyspy: str | None = None,
        worker_interval: float = WORKER_INTERVAL_S,
        target_details: bool = False,
        classify: Classify = _unclassified,
        is_library: IsLibrary = lambda filename: False,
        cpu_budget: float = DEFAULT_CPU_BUDGET,
        pause_budget: float = DEFAULT_PAUSE_BUDGET,
        burst_rate: float | None = None,
        host_cpu: Callable[[], HostCpu] | None = None,
    ) -> None:
        import psutil

        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.pid = pid
        self.clock = clock
        self.rate = rate
        self.interval = 1.0 / rate
        # The attach burst's rate (None: ATTACH_BURST_RATE when the rate is the default, else none:
        # a lower --sample-rate is a wish for less). One of n ranks' samplers gets 1/n of it.
        self.burst_rate = burst_rate if burst_rate is not None else (ATTACH_BURST_RATE if rate >= DEFAULT_RATE else rate)
        self.nonblocking = nonblocking
        self.worker_interval = worker_interval
        self.target_details = target_details
        self._pyspy = pyspy or find_pyspy()
        # Forked workers see the target's files and run the same code: one parser (and its
        # caches of source lines, frames and categories) serves them all.
        source = self._source = SourceLines(pid)
        self._parser = StackParser(source.line, classify, is_library, source.facts)
        self._proc: psutil.Process | None
        self._born: float | None = None  # when the target's process started (epoch seconds)
        try:
            self._proc = psutil.Process(pid)
            self._born = self._proc.create_time()
        except psutil.Error:
            self._proc = None
        self._env: tuple[tuple[str, str], ...] | None = None
        self._target_last: ProcSample | None = None
        self._procs: dict[int, psutil.Process] = {}  # kept, so cpu_percent has a baseline
        self._cpu_seen: dict[int, float] = {}  # the job's processes' CPU seconds at the last reading
        self._cpu_gone = 0.0  # what the job's ended processes had used
        self._workers: list[int] = []
        self._worker_next = 0
        self._no_stacks: set[int] = set()  # children that are not Python
        self._next_proc = 0.0
        self._next_worker = 0.0
        self._retry_at = 0.0
        self._fault: str | None = None  # the kind of the fault last reported
        self._stacks_off: str | None = None  # a permanent reason not to try again
        self._off_reason: str | None = None  # ... as the fault said it
        self.exited: float | None = None  # when the target was found gone
        self.exit_status: str | None = None  # "code N" / "signal NAME" when it could be read
        # What sampling costs: budgets on the monotonic clock (``clock`` may be a replayed one).
        t = time.monotonic()
        self._cpu_budget = cpu_budget
        self._cpu = _Bucket(cpu_budget, CPU_BURST_S, t)
        self._pause = _Bucket(pause_budget, PAUSE_BURST_S, t)
        self._totals = _Totals()
        self._totals.job_cpu = self._job_cpu()
        self._history: deque[tuple[float, _Totals]] = deque([(t, self._totals.copy())])
        self._started = t
        self._next_cost = t + COST_EVERY_S
        self._cost_said = False
        self.cost: SamplingCost | None = None  # the latest measured cost
        self._tids: dict[tuple[int, int], int] = {}  # (pid, Python thread id) -> kernel thread id
        self._unknown_thread = False  # a thread whose kernel id is not known: learn it blocking
        self._main_key: tuple | None = None  # the main thread's last stack ...
        self._main_since = 0.0  # ... unchanged since (monotonic)
        self._confirmed_at = float("-inf")  # the last blocking dump (monotonic)
        self._nb_fails = 0
        # The host's CPU contention, read now (``host_cpu.read_host_cpu``; tests give their own).
        self._read_host_cpu = host_cpu or read_host_cpu
        self._host_cpu: HostCpu | None = None
        self._host_cpu_at = float("-inf")

    # ----------------------------------------------------------------- Source protocol

    def poll(self) -> list[object]:
        if self.exited is not None:
            return []
        cpu0 = time.thread_time()
        out: list[object] = []
        now = self.clock()
        if not self._target_alive(now, out):
            return out
        if now >= self._next_proc:
            self._next_proc = now + PROC_INTERVAL_S
            out.extend(s for s in self._proc_samples(now) if self.target_details or s.role != "target")
        # A worker whose turn it is goes first: the main thread's polls are paced to spend the CPU
        # budget, so a worker dumped after one found the budget spent at every turn, and a job's
        # workers were sampled once at attach and never again (a worker that hung later was never
        # seen). Its turn passes only once it was dumped (or cannot be).
        if self._stacks_off is None and self._workers and self.clock() >= self._next_worker:
            wpid = self._workers[self._worker_next % len(self._workers)]
            got = self._sample_worker(wpid)
            if got is not None:
                out.extend(got)
                early = time.monotonic() - self._started < ATTACH_WORKERS_S  # _started is monotonic
                self._next_worker = self.clock() + (min(self.worker_interval, ATTACH_WORKER_INTERVAL_S) if early
                                                    else self.worker_interval)
                self._worker_next += 1
        out.extend(self._sample_target())
        # The poll's own CPU (parsing, classifying, psutil); py-spy's is metered per dump.
        spent = time.thread_time() - cpu0
        self._totals.cpu += spent
        self._cpu.charge(spent)
        self._pace(out)
        return out
    def close(self) -> None:
        self._procs.clear()

    @property
    def state(self) -> TargetState:
        """The target as this sampler knows it now, in one typed reading (see TargetState)."""
        if self.exited is not None:
            status = TargetStatus.EXITED
        elif self._stacks_off is not None:
            status = TargetStatus.UNTRACEABLE
        else:
            status = TargetStatus.ALIVE
        return TargetState(self.pid, status, exited_at=self.exited, exit_status=self.exit_status,
                           reason=self._off_reason, cost=self.cost)

    def snapshot(self) -> list[object]:
        """Everything at once, now: the target's and every worker's details and stacks
        (``gputop stacks``)."""
        out: list[object] = []
        now = self.clock()
        if not self._target_alive(now, out):
            return out
        self._proc_samples(now)  # finds the workers and primes cpu_percent
        # One look, not a series: blocking dumps (consistent stacks; a few ms of pause once).
        routine, self.nonblocking = self.nonblocking, False
        try:
            stacks = self._sample_target()
            for w in list(self._workers):
                stacks.extend(self._sample_worker(w) or ())
        finally:
            self.nonblocking = routine
        out.extend(self._proc_samples(self.clock()))
        out.extend(stacks)
        return out

    # ----------------------------------------------------------------- target liveness

    def _target_alive(self, now: float, out: list[object]) -> bool:
        import psutil

        if self._proc is None:
            self._mark_exited(now, out, f"no process with PID {self.pid}")
            return False
        try:
            running = self._proc.is_running() and self._proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            running = False
        except psutil.Error:
            running = True
        if not running:
            self.exit_status = exit_status(self.pid)
            how = f"with {self.exit_status}" if self.exit_status else "(exit code unknown: not our child)"
            self._mark_exited(now, out, f"target PID {self.pid} exited at {fmt_clock(now)} {how}")
        return running

    def _mark_exited(self, now: float, out: list[object], message: str) -> None:
        self.exited = now
        self.interval = PROC_INTERVAL_S  # nothing left to sample
        last = self._target_last
        out.append(ProcSample(ts=now, pid=self.pid, ppid=last.ppid if last else None, name=last.name if last else "",
                              cmdline=last.cmdline if last else "", status="exited", role="target"))
        out.append(Event(now, self.name, message, "warning"))

    # ----------------------------------------------------------------- sampling

    def _dump(self, pid: int, blocking: bool) -> list[dict]:
        """One metered dump; thread ids where ``--nonblocking`` lost them filled in."""
        def meter(wall: float, cpu: float) -> None:
            t = self._totals
            t.cpu += cpu
            t.dumps += 1
            self._cpu.charge(cpu)
            if blocking:
                # Every thread stays stopped at most for the dump's whole run: charged in full.
                t.pause += wall
                t.blocking += 1
                self._pause.charge(wall)

        # A nonblocking dump on a saturated host yields the CPU to the job (and comes later); not
        # during the attach burst, whose CPU (CPU_BURST_S at most, once) buys the first verdict.
        t = time.monotonic()
        idle = not blocking and t - self._started >= ATTACH_BURST_S and self.host_cpu(t).saturated
        nice = NONBLOCKING_NICE if idle else 0
        data = dump_json(pid, self._pyspy, not blocking, meter, nice=nice)
        self._fill_thread_ids(pid, data)
        return data

    def _fill_thread_ids(self, pid: int, data: list[dict]) -> None:
        if len(self._tids) > _CACHE_MAX:
            self._tids.clear()
        for th in data:
            key = (pid, int(th.get("thread_id") or 0))
            tid = th.get("os_thread_id")
            if tid is not None:
                self._tids[key] = int(tid)
                continue
            tid = self._tids.get(key)
            if tid is None:
                self._unknown_thread = True
                continue
            th["os_thread_id"] = tid
            on_cpu = thread_on_cpu(pid, tid)
            if on_cpu is not None:
                # py-spy's own idle heuristics (known waiting frames) still hold: idle wins.
                th["active"] = bool(th.get("active", True)) and on_cpu
            else:
                del self._tids[key]

    def host_cpu(self, t: float) -> HostCpu:
        """The host's CPU contention, read at most every HOST_CPU_EVERY_S."""
        if self._host_cpu is None or t - self._host_cpu_at >= HOST_CPU_EVERY_S:
            self._host_cpu, self._host_cpu_at = self._read_host_cpu(), t
        return self._host_cpu

    def _set_budget(self, t: float) -> None:
        """The CPU budget for the host as it is now: larger where CPUs are to spare."""
        self._cpu.set_rate(self._cpu_budget * (SPARE_BUDGET_FACTOR if self.host_cpu(t).spare else 1.0), t)

    def _want_blocking(self, t: float) -> bool:
        """A consistent stack matters now, the pause budget allows one, and the host has a CPU
        for py-spy as soon as it has stopped the job."""
        if not self.nonblocking:
            return True
        if not self._pause.allows(t):
            return False
        if self.host_cpu(t).saturated:
            self._totals.host_busy += 1
            return False
        if self._totals.dumps == 0 or self._unknown_thread:
            return True
        # The main stack stopped moving: the stuck detector may report it, so make sure it is
        # not a torn read; again now and then while it stays.
        held = self._main_key is not None and t - self._main_since >= CONFIRM_AFTER_S
        return held and (self._confirmed_at < self._main_since or t - self._confirmed_at >= CONFIRM_EVERY_S)

    def _sample_target(self) -> list[object]:
        now = self.clock()
        if self._stacks_off is not None or now < self._retry_at:
            return []
        t = time.monotonic()
        self._set_budget(t)
        if not self._cpu.allows(t):
            self._totals.over_budget += 1
            return []  # over the CPU budget, however often poll is called
        blocking = self._want_blocking(t)
        try:
            data = self._dump(self.pid, blocking)
        except AttachError as exc:
            if exc.kind == "pyspy-failed" and not blocking:
                self._nb_fails += 1
                if self._nb_fails < NONBLOCKING_FAILS:
                    return []  # a torn read: the next dump is fine
            return self._fault_event(exc)
        self._nb_fails = 0
        if blocking:
            self._confirmed_at = t
            self._unknown_thread = False
        ts = self.clock()
        samples = self._parser.samples(data, ts)
        main = next((x for x in samples if x.is_main), None)
        key = main.frames if main is not None else None
        if key != self._main_key:
            self._main_key, self._main_since = key, t
        self._totals.main += 1
        out: list[object] = []
        if self._fault is not None:
            out.append(Event(ts, self.name, f"stack sampling of PID {self.pid} resumed", "info"))
            self._fault = None
        while self._source.stale:
            name = self._source.stale.pop()
            out.append(Event(ts, self.name, f"{name} changed after PID {self.pid} started: its source lines are not "
                                            "shown (they would be the edited file's, not the running code's)", "info"))
        while self._source.unparsed:
            name = self._source.unparsed.pop()
            out.append(Event(ts, self.name, f"{name} does not parse as Python here: the loops around its lines are not "
                                            "read (a leak's line cannot be named from them)", "info"))
        out.extend(samples)
        return out

    def _sample_worker(self, wpid: int) -> list[object] | None:
        """The worker's samples ([] when it cannot be dumped); None: not now, the CPU budget is
        spent (its turn waits for the next poll)."""
        if wpid in self._no_stacks or self._stacks_off is not None:
            return []
        if not self._cpu.allows(time.monotonic()):
            return None
        try:
            data = self._dump(wpid, blocking=not self.nonblocking)
        except AttachError as exc:
            # A worker exiting between listing and dumping is routine; one that is not
            # Python (a shell, a compiler) is skipped from now on.
            if exc.kind in ("not-python", "permission"):
                self._no_stacks.add(wpid)
            return []
        return list(self._parser.samples(data, self.clock()))

    # ----------------------------------------------------------------- cost

    def _pace(self, out: list[object]) -> None:
        """The next poll's interval from the CPU budget, and the published cost."""
        t = time.monotonic()
        if self._stacks_off is None and self.exited is None:
            # Over budget: wait until the bucket is back to zero (the steady rate is then
            # budget / CPU per poll), never longer than MAX_INTERVAL_S.
            rate = self.rate
            if t - self._started < ATTACH_BURST_S:
                rate = max(rate, self.burst_rate)
            self.interval = min(MAX_INTERVAL_S, max(1.0 / rate, self._cpu.wait(t)))
        if t >= self._next_cost:
            self._next_cost = t + COST_EVERY_S
            self._measure(t, out)

    def _measure(self, t: float, out: list[object]) -> None:
        hist = self._history
        self._totals.job_cpu = self._job_cpu()
        hist.append((t, self._totals.copy()))
        while len(hist) > 1 and t - hist[1][0] >= COST_WINDOW_S:
            hist.popleft()
        if len(hist) < 2:
            return
        (t0, a), (t1, b) = hist[0], hist[-1]
        span = t1 - t0
        cpu_pct = 100.0 * (b.cpu - a.cpu) / span
        pause_pct = 100.0 * (b.pause - a.pause) / span
        rate = (b.main - a.main) / span
        job = 100.0 * (b.job_cpu - a.job_cpu) / span if a.job_cpu is not None and b.job_cpu is not None else None
        host = self.host_cpu(t)
        self.cost = SamplingCost(
            ts=self.clock(), pid=self.pid, window_s=round(span, 1), stacks_per_s=rate,
            sampler_cpu_pct=cpu_pct, pause_pct=pause_pct, job_cost_pct=job_cost_pct(cpu_pct, pause_pct),
            blocking=b.blocking - a.blocking, dumps=b.dumps - a.dumps, asked_per_s=self.rate,
            held_back=self._held_back(rate, host, a, b), load1=host.load1, cpus=host.cpus,
            cpu_pressure_pct=host.pressure_pct, job_cpu_pct=job,
        )
        if not self._cost_said and t - self._started >= COST_EVENT_AFTER_S:
            self._cost_said = True
            c = self.cost
            out.append(Event(c.ts, self.name, f"sampling PID {self.pid} costs the job about {c.job_cost_pct:.2g} % "
                             f"({c.stacks_per_s:.1f} stacks/s; sampler {c.sampler_cpu_pct:.1f} % of a core, "
                             f"target stopped {c.pause_pct:.2f} % of the time)", "info"))

    def _job_cpu(self) -> float | None:
        """The job's CPU seconds so far: the target and the processes under it the process
        sampler follows (a launcher's ranks, DataLoader workers), what the sampler is weighed
        against. A launcher's own CPU alone made the sampler look like half of a torchrun job's.
        Monotonic: a process that ends keeps what it used (folded into ``_cpu_gone``)."""
        if self._proc is None:
            return None
        procs = dict(self._procs)
        procs[self.pid] = self._proc
        # Gone: no longer one of the family the process sampler follows (a read that fails once
        # keeps the process's last figure, so it is not counted twice when it reads again).
        for pid in set(self._cpu_seen) - set(procs):
            self._cpu_gone += self._cpu_seen.pop(pid)
        target_read = False
        for pid, proc in procs.items():
            try:
                t = proc.cpu_times()
            except Exception:
                continue
            target_read |= pid == self.pid
            self._cpu_seen[pid] = max(t.user + t.system, self._cpu_seen.get(pid, 0.0))
        return self._cpu_gone + sum(self._cpu_seen.values()) if target_read else None

    def _held_back(self, rate: float, host: HostCpu, a: _Totals, b: _Totals) -> str | None:
        """Why far fewer stacks came than asked over the window (None: they came, or nothing is
        sampled any more)."""
        if rate >= HELD_BACK_SHARE * self.rate or self._stacks_off is not None or self.exited is not None:
            return None
        if host.saturated or b.host_busy > a.host_busy:
            return "host-busy"
        if b.over_budget > a.over_budget:
            return "cpu-budget"
        return "faults"

    def _fault_event(self, exc: AttachError) -> list[object]:
        now = self.clock()
        if exc.kind == "gone":
            out: list[object] = []
            if not self._target_alive(now, out):
                return out
        if exc.kind == "not-python" and self._totals.main:
            # Its stacks were read before: a Python process that stops reading as one is ending
            # (its interpreter torn down while it exits), not "not a Python process" (advise said
            # that beside 12-15 stacks and "the target exited", and put it in attach_errors).
            # Tried again; its exit is said when it comes.
            self._retry_at = now + RETRY_AFTER_S
            return []
        if exc.kind in ("not-python", "permission", "pyspy-missing"):
            self._stacks_off = exc.kind  # retrying cannot help; process details go on
            self._off_reason = str(exc)
            self.interval = PROC_INTERVAL_S
        else:
            self._retry_at = now + RETRY_AFTER_S
        if exc.kind == "pyspy-failed" and self._starting_up(now):
            return []  # tried again in RETRY_AFTER_S; said if it is still failing once the job is older
        if self._fault == exc.kind:
            return []
        self._fault = exc.kind
        return [Event(now, self.name, str(exc), "error" if self._stacks_off else "warning")]

    def _starting_up(self, now: float) -> bool:
        """The target is in its first STARTUP_GRACE_S and no stack has been read from it yet."""
        return self._totals.main == 0 and self._born is not None and now - self._born < STARTUP_GRACE_S

    # ----------------------------------------------------------------- process details

    def _proc_samples(self, now: float) -> list[ProcSample]:
        import psutil

        assert self._proc is not None
        out: list[ProcSample] = []
        try:
            children = self._proc.children(recursive=True)[:MAX_WORKERS]
        except psutil.Error:
            children = []
        self._workers = [c.pid for c in children]
        by_pid = {c.pid: c for c in children}
        by_pid[self.pid] = self._proc
        for gone in set(self._procs) - set(by_pid):
            del self._procs[gone]
        self._no_stacks &= set(by_pid)
        for pid, proc in by_pid.items():
            first = pid not in self._procs
            if first:
                self._procs[pid] = proc
            s = self._proc_sample(self._procs[pid], "target" if pid == self.pid else "worker", now, first)
            if s is not None:
                out.append(s)
                if pid == self.pid:
                    self._target_last = s
        return out

    def _proc_sample(self, proc, role: str, now: float, first: bool) -> ProcSample | None:
        import psutil

        try:
            with proc.oneshot():
                cpu = proc.cpu_percent(None)
                info: dict = dict(
                    ppid=proc.ppid(),
                    name=proc.name(),
                    status=proc.status(),
                    num_threads=proc.num_threads(),
                    create_time=proc.create_time(),
                )
                try:
                    info["rss"] = proc.memory_info().rss
                except psutil.AccessDenied:
                    pass
                try:
                    info["user"] = proc.username()
                except (psutil.AccessDenied, KeyError):
                    pass
            try:
                info["cmdline"] = redact_cmdline(proc.cmdline())
            except psutil.AccessDenied:
                pass
            if role == "target":
                if self._env is None:
                    try:
                        self._env = perf_env(proc.environ())
                    except psutil.Error:
                        self._env = ()
                info["env"] = self._env
        except psutil.NoSuchProcess:
            return None
        except psutil.Error:
            return ProcSample(ts=now, pid=proc.pid, role=role)
        # The first cpu_percent reading has no baseline: say unknown, not 0 %.
        return ProcSample(ts=now, pid=proc.pid, role=role, cpu_percent=None if first else cpu, **info)


def job_cost_pct(sampler_cpu_pct: float, pause_pct: float, cpus: int | None = None) -> float:
    """What the job is estimated to lose, in %: the time it is stopped, plus the sampler's share
    of the machine's cores (a job that keeps every core busy gives that up; one that leaves
    cores idle loses less). bench/attach_cost.py checks the estimate against step rates."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    return pause_pct + sampler_cpu_pct / max(1, cpus)


class _Bucket:
    """A token bucket: ``rate`` units per second, at most ``burst`` ahead."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.level, self.t = rate, burst, burst, now

    def _refill(self, now: float) -> None:
        self.level = min(self.burst, self.level + (now - self.t) * self.rate)
        self.t = now

    def charge(self, amount: float) -> None:
        self.level -= amount

    def set_rate(self, rate: float, now: float) -> None:
        """A new refill rate from now on (what came in so far at the old one)."""
        if rate != self.rate:
            self._refill(now)
            self.rate = rate

    def allows(self, now: float) -> bool:
        self._refill(now)
        return self.level >= 0

    def wait(self, now: float) -> float:
        """Seconds until the level is back to zero."""
        self._refill(now)
        if self.level >= 0:
            return 0.0
        return -self.level / self.rate if self.rate > 0 else MAX_INTERVAL_S


class _Totals:
    """Running totals of what sampling spent: CPU s, pause s, dumps, blocking dumps, main stacks;
    the times a stack was not taken: over the CPU budget, a blocking dump forgone on a busy host;
    and the target's own CPU s, to weigh the sampler's against."""

    __slots__ = ("cpu", "pause", "dumps", "blocking", "main", "over_budget", "host_busy", "job_cpu")

    def __init__(self) -> None:
        self.cpu = self.pause = 0.0
        self.dumps = self.blocking = self.main = self.over_budget = self.host_busy = 0
        self.job_cpu: float | None = None  # the target's CPU seconds when last measured

    def copy(self) -> _Totals:
        c = _Totals()
        for name in self.__slots__:
            setattr(c, name, getattr(self, name))
        return c


__all__ = [
    "ATTACH_BURST_RATE", "ATTACH_BURST_S", "CAP_SYS_PTRACE_BIT", "CONFIRM_AFTER_S", "CONFIRM_EVERY_S",
    "COST_EVENT_AFTER_S", "COST_EVERY_S", "COST_WINDOW_S", "CPU_BURST_S", "DEFAULT_CPU_BUDGET", "HELD_BACK_SHARE",
    "DEFAULT_NONBLOCKING", "DEFAULT_PAUSE_BUDGET", "DEFAULT_RATE", "DUMP_TIMEOUT_S", "MAX_INTERVAL_S",
    "MAX_WORKERS", "NATIVE_TIMEOUT_S", "NONBLOCKING_FAILS", "PAUSE_BURST_S", "PROC_INTERVAL_S", "PYSPY_ENV",
    "RETRY_AFTER_S", "STARTUP_GRACE_S", "WORKER_INTERVAL_S", "ATTACH_WORKER_INTERVAL_S", "YAMA_SCOPE_FILE", "AttachError", "Classify", "IsLibrary",
    "PtraceFacts", "PySpySource", "SourceLines", "StackParser", "attach_policy", "check_attachable", "dump_json",
    "exit_status",
    "find_pyspy", "job_cost_pct", "native_dump", "permission_advice", "ptrace_facts", "thread_on_cpu",
]
