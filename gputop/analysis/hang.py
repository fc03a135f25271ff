"""Why a stuck job is stuck, and where every party waits. Pure: stacks and /proc readings in.

A hang has parties: the main thread, the job's other threads, its DataLoader workers (or the
ranks a launcher spawned). Each waits on something, told from its Python stack (the line, the
function it is in) and, where the procfs source read it, from the kernel (state S or D, the
syscall, what that syscall's file descriptor is, ``wchan``):

- a lock (``with lock:``, ``.acquire()``), an event, condition or barrier (threading.py);
- a queue (the DataLoader's worker queue, multiprocessing pipes);
- a socket (recv, accept, connect), a file or FIFO, the disk or a network filesystem (state D);
- a child process (``Popen.wait``, ``Process.join``, wait4/waitid);
- a collective (torch.distributed), or the GPU (``synchronize`` while the GPU is busy).

From the parties, ``diagnose`` names the kind of hang, each with its own evidence and next step.
``progress`` says from /proc readings whether the job's processes moved at all (CPU time, bytes
through read/write) over a span: the evidence that calls a job stuck within seconds of attaching.
"""

from __future__ import annotations

import functools

import re
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from ..model import Category, Frame, StackSample, TaskSample, ThreadState
from .classify import own_frames, project_frame, short_path, where
from .threshold import IntThreshold, JUDGEMENT

# Kinds of hang, most specific first where parties disagree.
GPU_KERNEL = "gpu-kernel"
COLLECTIVE = "collective"
WORKER = "dataloader-worker"
DEADLOCK = "deadlock"
IO = "io"
SOCKET = "socket"
CHILD = "child-process"
LOCK = "lock"
UNKNOWN = "unknown"

# At most this many parties are named (a job with a hundred idle pool threads would bury the
# ones that matter). Judgement: the main thread, a few helpers and eight workers fit.
MAX_PARTIES = IntThreshold(
    16, "parties", JUDGEMENT,
    "At most this many parties of a hang are named: the main thread, a few helpers and eight workers fit; a "
    "hundred idle pool threads would bury them.")

_SOCKET_CODE = re.compile(r"\.(recv|recv_into|recvfrom|recvmsg|accept|connect|sendall|send)\(|urlopen\(|requests\.")
_SOCKET_SYSCALLS = {"recvfrom", "recvmsg", "accept", "accept4", "connect", "sendto", "sendmsg"}
# A thread blocked on the line that takes a lock, whatever the lock is called: ``X.acquire(``, or a
# ``with`` over plain names (``with a:``, ``with self.state, locks[i] as held:``). A ``with`` that
# calls (``with open(p):``, ``with torch.no_grad():``) is not one; nor is a context manager whose
# ``__enter__`` is Python, since a thread blocked in it shows that frame, not the ``with`` line.
_ACQUIRE_CODE = re.compile(r"\.acquire\(")
_WITH_ITEM = r"[A-Za-z_][\w.]*(?:\[[^\]()]*\])*(?:\s+as\s+[A-Za-z_]\w*)?"
_WITH_CODE = re.compile(rf"^\s*(?:async\s+)?with\s+{_WITH_ITEM}(?:\s*,\s*{_WITH_ITEM})*\s*:\s*(?:#.*)?$")
# Native frames of a thread blocked taking a lock (CPython's lock, glibc's mutex and semaphore),
# where the stacks have them (py-spy --native).
_NATIVE_LOCK = re.compile(r"^(PyThread_acquire_lock(_timed)?|lock_PyThread_acquire_lock|acquire_timed|_?PyMutex_Lock\w*"
                          r"|_PySemaphore_Wait|pthread_mutex_(timed)?lock|__pthread_mutex_\w*lock\w*|__lll_lock_wait\w*"
                          r"|sem_(timed|clock)?wait|do_futex_wait\S*|__new_sem_wait\S*)$")
# The kernel's view of a lock wait: a futex (CPython's locks, pthread mutexes and semaphores).
_FUTEX_WCHAN = re.compile(r"futex")
_SLEEP_CODE = re.compile(r"\bsleep\(")
_CHILD_FUNCS = re.compile(r"(Popen\.(wait|_wait|communicate|_try_wait)|BaseProcess\.join|ProcessContext\.join|Process\.join)$")
_THREADING_WAITS = {
    "Condition.wait": "a condition", "Event.wait": "an event", "Barrier.wait": "a barrier",
    "Semaphore.acquire": "a semaphore", "BoundedSemaphore.acquire": "a semaphore", "Thread.join": "a thread",
    "Thread._wait_for_tstate_lock": "a thread",
}
_QUEUE_FILES = ("queues.py", "queue.py", "connection.py", "selectors.py")
# The calls of the standard library's queue.Queue that wait in threading's Condition.wait, and what
# each waits for.
_QUEUE_CALLS = {"get": "that nothing puts into", "put": "that nothing takes from",
                "join": "for task_done() calls that never come"}


@dataclass(frozen=True)
class Party:
    """One thread that takes part in a hang."""

    pid: int
    tid: int | None
    label: str  # "main thread", "thread metrics-writer", "worker 1234"
    where: str  # 'file:line in function' (newest project frame)
    code: str | None  # the source line there
    waits: str  # lock | event | queue | socket | file | disk | child | collective | gpu | sleep | running | blocked
    what: str  # the wait in words: "waits on a lock", "blocked in recvfrom on socket:[123]"
    state: ThreadState | None = None
    category: Category | None = None
    worker: bool = False
    main: bool = False
    collective: str | None = None  # the torch.distributed function it waits in ("all_reduce")

    def line(self) -> str:
        code = f"  `{self.code}`" if self.code else ""
        return f"{self.label}: {self.where}{code} - {self.what}"


@dataclass(frozen=True)
class Diagnosis:
    kind: str
    summary: str  # one phrase: "DataLoader worker 1234 hung at data.py:40 in __getitem__"
    parties: tuple[Party, ...]
    evidence: tuple[str, ...]  # why this kind, beyond the parties' lines
    action: str
    native: bool = False  # native frames would tell more (C extension, GPU, NCCL)


@dataclass(frozen=True)
class Progress:
    """What /proc says the job's processes did over a span."""

    span_s: float  # between the first and last reading of the target used
    cores: float  # CPU the processes used on average, in cores
    io_bps: float  # bytes through read/write syscalls per second, all processes
    threads: int  # threads seen
    ran: int  # threads scheduled at least once in the span (schedstat), or whose CPU time grew
    main_cores: float | None = None  # CPU the target's main thread itself used, in cores
    main_state: str | None = None  # its state at the last reading (R: running or runnable)
    # Times the main thread was put on a CPU over its span (schedstat): with ``main_cores``, how much
    # it runs each time it wakes. None: unknown (no schedstat, or no main thread read).
    main_runs: int | None = None
    # Times the main thread blocked and woke over its span (voluntary switches): on a busy host its
    # runs count preemptions too, which split one wake's work into many runs. None: not read.
    main_wakes: int | None = None


def progress(tasks: Mapping[int, Sequence[TaskSample]], t0: float, t1: float,
             main_tid: int | None = None) -> Progress | None:
    """The job's movement between the first and last /proc reading in [t0, t1] (``tasks``: the
    target's and its children's readings, time order; ``main_tid``: the target's main thread).
    None: fewer than two readings."""
    span = 0.0
    cpu_ns = 0
    io = 0
    threads = ran = 0
    main_ns: int | None = None
    main_span = 0.0
    main_state: str | None = None
    main_runs: int | None = None
    main_wakes: int | None = None
    for samples in tasks.values():
        xs = [s for s in samples if t0 <= s.ts <= t1]
        if len(xs) < 2:
            continue
        a, b = xs[0], xs[-1]
        span = max(span, b.ts - a.ts)
        before = {t.tid: t for t in a.threads}
        for t in b.threads:
            threads += 1
            old = before.get(t.tid)
            if old is None:
                ran += 1  # a new thread: something is going on
                continue
            d = (t.cpu_ns or 0) - (old.cpu_ns or 0)
            cpu_ns += max(0, d)
            if t.tid == main_tid:
                main_ns, main_span, main_state = max(0, d), b.ts - a.ts, t.state
                if t.runs is not None and old.runs is not None:
                    main_runs = max(0, t.runs - old.runs)
                if t.wakes is not None and old.wakes is not None:
                    main_wakes = max(0, t.wakes - old.wakes)
            if (t.runs is not None and old.runs is not None and t.runs != old.runs) or d > 0:
                ran += 1
        for x, y in ((a.rchar, b.rchar), (a.wchar, b.wchar)):
            if x is not None and y is not None:
                io += max(0, y - x)
    if span <= 0:
        return None
    main_cores = main_ns / 1e9 / main_span if main_ns is not None and main_span > 0 else None
    return Progress(span, cpu_ns / 1e9 / span, io / span, threads, ran, main_cores, main_state, main_runs,
                    main_wakes)


# --------------------------------------------------------------------------- one party


def _state_of(s: StackSample, tasks: Mapping[int, TaskSample]) -> ThreadState | None:
    t = tasks.get(s.pid)
    tid = s.os_thread_id if s.os_thread_id is not None else (s.pid if s.is_main else None)
    if t is None or tid is None:
        return None
    return next((x for x in t.threads if x.tid == tid), None)


def _kernel_words(st: ThreadState | None) -> str:
    if st is None:
        return ""
    bits = [f"state {st.state}"]
    if st.syscall:
        bits.append(f"in {st.syscall}" + (f" on {st.fd_path}" if st.fd_path else ""))
    if st.wchan:
        bits.append(f"wchan {st.wchan}")
    if st.fs:
        bits.append(st.fs)
    return " (" + ", ".join(bits) + ")"


def waits_on(s: StackSample, st: ThreadState | None = None) -> tuple[str, str]:
    """(what the thread waits on, the wait in words), from its stack and the kernel's view."""
    own = own_frames(s.frames)
    py = [f for f in own if not _native(f)]  # the Python frames, where py-spy --native gave C ones too
    leaf = py[0] if py else (own[0] if own else None)
    code = (leaf.code or "") if leaf else ""
    fname = leaf.filename.replace("\\", "/").rsplit("/", 1)[-1] if leaf else ""
    names = [f.name for f in own]
    fd = (st.fd_path or "") if st else ""
    sysc = (st.syscall or "") if st else ""
    if s.category is Category.COLLECTIVE:
        # Before "running": a thread in a collective waits for its peers whatever the kernel or
        # py-spy caught it doing (gloo waking for a chunk, runnable on a loaded host, NCCL
        # spin-waiting on its stream); whether that wait ends is told across the ranks.
        fn = next((f.name for f in own if "/torch/distributed/" in f.filename.replace("\\", "/")), None)
        fn = fn or collective_fn(s) or (leaf.name if leaf else "?")
        return "collective", f"waits in a collective ({fn})"
    if st is not None and st.state == "R" or (st is None and s.active and s.category is not Category.IDLE):
        return "running", "running on a CPU"
    if s.category is Category.HOST_SYNC:
        return "gpu", "waits for the GPU (a synchronising call)"
    if st is not None and st.state == "D":
        target = f" on {fd}" if fd else ""
        return "disk", f"in uninterruptible IO{target}"
    if fd.startswith("socket:") or sysc in _SOCKET_SYSCALLS or _SOCKET_CODE.search(code) or fname in ("socket.py", "ssl.py"):
        return "socket", "waits on a socket that never answers"
    if sysc in ("wait4", "waitid") or any(_CHILD_FUNCS.search(n) for n in names) or "waitpid(" in code:
        return "child", "waits for a child process"
    if fd.startswith("/") and sysc in ("read", "readv", "pread64", "write", "writev", "pwrite64"):
        return "file", f"blocked in {sysc} on {fd}"
    if fname == "threading.py" and leaf is not None:
        # A queue's get or put waits in threading's Condition.wait: the user's call is the queue's.
        caller = next((f for f in py if not f.filename.endswith("threading.py")), None)
        if caller is not None and caller.filename.replace("\\", "/").rsplit("/", 1)[-1] == "queue.py":
            fn = caller.name.rsplit(".", 1)[-1]
            if fn in _QUEUE_CALLS:
                call = caller.name if "." in caller.name else f"Queue.{fn}"
                return "event", f"waits on a queue's {fn} (queue.{call}) {_QUEUE_CALLS[fn]}"
        # The outermost threading frame says what the caller waits on (Event.wait calls Condition.wait).
        for n in reversed([f.name for f in py[:3] if f.filename.endswith("threading.py")]):
            fn = next((k for k in _THREADING_WAITS if n.endswith(k)), None)
            if fn is not None:
                return "event", f"waits on {_THREADING_WAITS[fn]} (threading.{fn}) that nothing sets"
    if fname not in _QUEUE_FILES and _lock_wait(own, st):
        return "lock", "waits on a lock"
    if s.category is Category.DATA_WAIT or fname in _QUEUE_FILES or fd.startswith("pipe:"):
        return "queue", "waits on a queue" + (" (the DataLoader's workers)" if s.category is Category.DATA_WAIT else "")
    if _SLEEP_CODE.search(code):
        return "sleep", "sleeps"
    return "blocked", "blocked"


def _lock_wait(own: Sequence[Frame], st: ThreadState | None) -> bool:
    """Whether a blocked thread waits to take a lock, from what it does (not what the lock is
    called): the kernel has it in a futex (or cannot say), and its native frames are in a lock
    acquire, its newest threading.py frame is a lock's ``acquire``, or its line takes a lock."""
    if st is not None and (st.syscall or st.wchan):
        futex = (st.syscall or "").startswith("futex") or bool(_FUTEX_WCHAN.search(st.wchan or ""))
        if not futex:
            return False  # the kernel has it in a read, a poll, a sleep: not a lock
    py = [f for f in own if not _native(f)]
    leaf = py[0] if py else None
    if any(_NATIVE_LOCK.match(f.name) for f in own if _native(f)) and not (
            leaf is not None and leaf.filename.endswith("threading.py") and not leaf.name.endswith(".acquire")):
        return True  # a Condition/Event wait acquires its waiter lock too: threading.py says which
    if leaf is None:
        return False
    if leaf.filename.endswith("threading.py") and leaf.name.endswith(".acquire"):
        return True  # threading's Python locks (_RLock.acquire under the pure-Python RLock)
    code = leaf.code or ""
    return bool(_ACQUIRE_CODE.search(code) or _WITH_CODE.match(code))


def _native(f: Frame) -> bool:
    """A native (C/C++) frame of py-spy --native: no Python source file."""
    return not f.filename.endswith((".py", ".pyx", ">")) and not f.filename.endswith(".pyi")


def party(s: StackSample, target: int, tasks: Mapping[int, TaskSample], ranks: Mapping[int, int] | None = None) -> Party:
    st = _state_of(s, tasks)
    waits, what = waits_on(s, st)
    worker = s.pid != target
    if not worker and ranks and s.pid in ranks:
        # The target is a rank too: "main thread" would not say which one to a multi-rank user.
        label = f"rank {ranks[s.pid]} (pid {s.pid})" + ("" if s.is_main else f" thread {s.thread_name or s.thread_id}")
    elif not worker:
        label = "main thread" if s.is_main else f"thread {s.thread_name or s.os_thread_id or s.thread_id}"
    else:
        # Another rank of a multi-rank job is named by its rank: that is what the user launched.
        who = f"rank {ranks[s.pid]} (pid {s.pid})" if ranks and s.pid in ranks else f"worker {s.pid}"
        label = who + ("" if s.is_main else f" thread {s.thread_name or s.thread_id}")
    f = project_frame(s.frames) or (own_frames(s.frames)[0] if s.frames else None)
    return Party(pid=s.pid, tid=st.tid if st else s.os_thread_id, label=label, where=where(s.frames),
                 code=f.code if f is not None else None, waits=waits, what=what + _kernel_words(st), state=st,
                 category=s.category, worker=worker, main=s.is_main and not worker,
                 collective=collective_fn(s) if waits == "collective" else None)


def collective_fn(s: StackSample) -> str | None:
    """The torch.distributed function a stack is in ("all_reduce"): its newest such frame (the
    outer ones are decorators such as c10d_logger's ``wrapper``). A collective wait with no such
    frame is DDP's: in backward (autograd's engine, or the reducer's native frames) the gradient
    all-reduce, in DDP's forward prologue a broadcast of buffers or parameters. None for a stack
    outside collectives."""
    own = own_frames(s.frames)
    fn = next((f.name for f in own if "/torch/distributed/" in f.filename.replace("\\", "/")), None)
    if fn:
        return fn.rsplit(".", 1)[-1]
    if s.category is not Category.COLLECTIVE:
        return None
    for f in own:
        path = f.filename.replace("\\", "/")
        if path.endswith("/torch/nn/parallel/distributed.py"):
            return "broadcast"
        if path.endswith(("/torch/autograd/graph.py", "/torch/autograd/__init__.py")) or "Reducer::" in f.name:
            return "all_reduce"
    return None


# The collective a rank whose GPU spins waits in, where its Python frames name none: NCCL's kernel
# on its stream (DDP's gradient all-reduce is launched from autograd's hooks, not from a call of
# the user's).
GPU_COLLECTIVE = "a NCCL collective on its GPU"


def _boring(p: Party) -> bool:
    """A pool or helper thread parked in its idle loop: listed only when there is room."""
    return not p.main and not p.worker and p.waits in ("queue", "event", "blocked", "sleep") and p.category is Category.IDLE


def parties(main: StackSample, others: Sequence[StackSample], target: int,
            tasks: Mapping[int, TaskSample], ranks: Mapping[int, int] | None = None) -> tuple[Party, ...]:
    """The main thread, the target's other threads and each worker's threads (main first)."""
    ps = [party(main, target, tasks, ranks)] + [party(s, target, tasks, ranks) for s in others]
    keep = [p for p in ps if not _boring(p)]
    rest = [p for p in ps if _boring(p)]
    return tuple((keep + rest)[:MAX_PARTIES])


# --------------------------------------------------------------------------- the kind


def _at(p: Party) -> str:
    return f"{p.label} at {p.where}"


def _hung_workers_line(hung: int, sampled: int, running: int | None) -> str:
    """How many workers are blocked, out of those whose stacks were read; and, when the OS shows
    more workers than were sampled, that only some were (the others' stacks are not in yet)."""
    if running is None or running <= sampled:
        return f"{hung} of {sampled} DataLoader workers blocked inside the dataset"
    head = f"{sampled} of {running} DataLoader workers sampled"
    if hung == sampled:
        return f"{head}: {'all ' if sampled > 1 else ''}blocked inside the dataset"
    return f"{head}: {hung} blocked inside the dataset"


@dataclass(frozen=True)
class Scene:
    """What every kind's test reads: the parties of a hang and what they share."""

    parties: tuple[Party, ...]
    target: int
    gpu: str
    ranks: Mapping[int, int]
    workers_running: int | None

    @property
    def main(self) -> Party:
        return self.parties[0]

    @functools.cached_property
    def worker_mains(self) -> list[Party]:
        return [p for p in self.parties if p.worker and p.main is False and " thread " not in p.label]

    @functools.cached_property
    def target_threads(self) -> list[Party]:
        return [p for p in self.parties if not p.worker]

    def waiting(self, on: str) -> list[Party]:
        return [p for p in self.parties if p.waits == on]

    @property
    def native(self) -> str:
        return f"gputop stacks --pid {self.target} --native"


_DUMP = ("import faulthandler, signal; faulthandler.register(signal.SIGUSR1, all_threads=True) at start-up "
         "(or faulthandler.dump_traceback_later(600, repeat=True)) prints every thread when it hangs")
_DIST_TIMEOUT = ("dist.init_process_group(..., timeout=datetime.timedelta(minutes=10)) with "
                 "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and TORCH_NCCL_DUMP_ON_TIMEOUT=1, so a hang raises and dumps")
# No GPU of the job's seen: gloo on the CPU, where the NCCL settings do nothing; its collectives
# raise once the process group's timeout passes.
_GLOO_TIMEOUT = ("dist.init_process_group(..., timeout=datetime.timedelta(minutes=10)), so a hang raises "
                 "(gloo: the TORCH_NCCL_* settings do nothing here)")


def _gpu_spins(sc: Scene) -> Diagnosis | None:
    if sc.gpu != "spin" or sc.ranks:
        return None
    return Diagnosis(
        GPU_KERNEL, f"GPU never finishes: {_at(sc.main)} waits on a GPU that spins 'busy' doing nothing", sc.parties,
        ("the GPU reads 100 % busy with few SMs active, no tensor-core work and power near idle while the "
         "host waits: a kernel that does not end (one spinning on a flag, or a collective waiting for a peer)",),
        f"see the kernel: {sc.native}; rerun with CUDA_LAUNCH_BLOCKING=1 to name it, or under compute-sanitizer; "
        f"a collective (NCCL) waiting for a process that never calls it hangs like this: {_DIST_TIMEOUT}",
        native=True)


def _gpu_busy(sc: Scene) -> Diagnosis | None:
    if sc.gpu != "busy" or sc.main.waits != "gpu":
        return None
    return Diagnosis(
        GPU_KERNEL, f"GPU never finishes: {_at(sc.main)} waits for it while it is 100 % busy", sc.parties,
        ("the GPU stays busy while the host waits in a synchronising call: a kernel that does not end",),
        f"see the kernel: {sc.native}; rerun with CUDA_LAUNCH_BLOCKING=1 to name it, or under "
        "compute-sanitizer; a kernel that spins on a flag (custom kernels, NCCL) waits for a peer",
        native=True)


def _in_collective(sc: Scene) -> Diagnosis | None:
    coll = sc.waiting("collective")
    timeout = _GLOO_TIMEOUT if sc.gpu == "unknown" else _DIST_TIMEOUT
    return _collective(sc.parties, coll, sc.worker_mains, sc.ranks, sc.gpu, timeout) if coll else None


def _disk(sc: Scene) -> Diagnosis | None:
    disk = sc.waiting("disk")
    if not disk:
        return None
    d = disk[0]
    st = d.state
    fs = st.fs if st is not None else None
    net = fs is not None and bool(re.match(r"(nfs|fuse|cifs|smb|ceph|lustre|9p|gcsfuse|s3)", fs))
    kind_fs = f" on a network/user-space filesystem ({fs})" if net else (f" ({fs})" if fs else "")
    target_txt = st.fd_path if st is not None and st.fd_path else "a file"
    return Diagnosis(
        IO, f"IO hang: {_at(d)} is in uninterruptible IO on {target_txt}{kind_fs}", sc.parties,
        tuple(f"{_at(p)} in state D{_kernel_words(p.state)}" for p in disk),
        ("check the mount: `mount | grep` the path, `dmesg | tail` for 'server not responding' or hung-task "
         "messages" + (", `nfsstat -m`" if fs and fs.startswith("nfs") else "")
         + "; a process in state D cannot be killed until the IO returns; read from local storage instead"),
        native=True)


def _worker_hung(sc: Scene) -> Diagnosis | None:
    m = sc.main
    if not (m.waits == "queue" and m.category is Category.DATA_WAIT or (m.waits == "queue" and sc.worker_mains)):
        return None
    hung = [p for p in sc.worker_mains if p.category is Category.DATA_FETCH and p.waits != "running"]
    if not hung:
        return None
    w = hung[0]
    ev = [_hung_workers_line(len(hung), len(sc.worker_mains), sc.workers_running)
          + f" ({', '.join(sorted({p.waits for p in hung}))}); the main thread waits for its batch"]
    on = {"socket": " on a socket", "event": " on an event", "lock": " on a lock", "file": " on a file",
          "child": " on a child process"}.get(w.waits, "")
    return Diagnosis(
        WORKER, f"DataLoader worker {w.pid} hung{on} at {w.where}", sc.parties, tuple(ev),
        "make a hung worker fail instead of waiting forever: DataLoader(..., timeout=120); "
        + ("give the network call a timeout (socket.settimeout, requests.get(..., timeout=30)); "
           if w.waits == "socket" else "")
        + f"then fix the line above ({w.where}); {_DUMP}")


def _workers_silent(sc: Scene) -> Diagnosis | None:
    if sc.main.category is not Category.DATA_WAIT:
        return None
    # The workers' stacks are not in (yet): the main thread's wait is all there is to go on.
    return Diagnosis(
        WORKER, f"{_at(sc.main)} waits for DataLoader workers that deliver nothing", sc.parties,
        (f"{len(sc.worker_mains)} worker stacks seen",),
        f"see where the workers wait: gputop stacks --pid {sc.target}; make a hung worker fail instead of "
        f"waiting forever: DataLoader(..., timeout=120); {_DUMP}")


def _locks(sc: Scene) -> list[Party]:
    return [p for p in sc.target_threads if p.waits == "lock"]


def _deadlock(sc: Scene) -> Diagnosis | None:
    locks = _locks(sc)
    if len(locks) < 2:
        return None
    a, b = locks[0], locks[1]
    return Diagnosis(
        DEADLOCK, f"deadlock: {_at(a)} and {_at(b)} wait on locks", sc.parties,
        (f"{len(locks)} threads blocked on locks and nothing else moves: each holds a lock another wants "
         "(their lines below take them in opposite order)",),
        f"take the locks in one order everywhere (or one lock); to see which locks: "
        f"py-spy dump --pid {sc.target} --locals, {sc.native}; {_DUMP}", native=True)


def _socket(sc: Scene) -> Diagnosis | None:
    sock = sc.waiting("socket")
    if not sock:
        return None
    return Diagnosis(
        SOCKET, f"waits on a socket: {_at(sock[0])}", sc.parties,
        (f"{len(sock)} thread(s) blocked on a socket, nothing else moves",),
        "give every network call a timeout (socket.settimeout(30), requests.get(..., timeout=30), "
        f"urlopen(..., timeout=30)); check that the peer is up; {_DUMP}")


def _file(sc: Scene) -> Diagnosis | None:
    files = sc.waiting("file")
    if not files:
        return None
    f = files[0]
    return Diagnosis(
        IO, f"IO hang: {_at(f)} {f.what}", sc.parties, (f"{len(files)} thread(s) blocked reading or writing a file",),
        "a read that never returns: a FIFO or pipe whose writer stopped, or a device; check who should write "
        f"{f.state.fd_path if f.state and f.state.fd_path else 'it'}; {_DUMP}")


def _child(sc: Scene) -> Diagnosis | None:
    kids = sc.waiting("child")
    if not kids:
        return None
    k = kids[0]
    child_lines = tuple(f"{_at(p)}: {p.what}" for p in sc.worker_mains if p.waits != "child")
    return Diagnosis(
        CHILD, f"waits for a child process: {_at(k)}", sc.parties,
        (f"{_at(k)}: {k.what}",) + child_lines,
        f"see what the child does: gputop stacks --pid {sc.target} (children are listed as workers); give the "
        f"wait a timeout (Popen.wait(timeout=...), Process.join(timeout=...)); {_DUMP}")


def _lock(sc: Scene) -> Diagnosis | None:
    locks = _locks(sc)
    if not locks:
        return None
    lk = locks[0]
    return Diagnosis(
        LOCK, f"waits on a lock that is never released: {_at(lk)}", sc.parties, (f"{_at(lk)}: `{lk.code or '?'}`",),
        f"find the holder: py-spy dump --pid {sc.target} --locals, {sc.native}; {_DUMP}", native=True)


def _unknown(sc: Scene) -> Diagnosis:
    m = sc.main
    # No evidence of its own: every party's line (the main thread's first) already says its wait.
    return Diagnosis(
        UNKNOWN, f"{_at(m)} {m.what}", sc.parties, (),
        f"see every thread: py-spy dump --pid {sc.target} --locals; native frames: {sc.native}; {_DUMP}", native=True)


# The kinds of hang, most specific first: the first whose test holds names the hang. A new kind is
# a function from the Scene to a Diagnosis (or None) and a row here, in the place its evidence
# outranks the rows below it (a GPU that never finishes explains every thread that waits on it; a
# collective explains a rank's idle workers; two threads on locks are a deadlock before one is a
# lock never released).
KINDS: tuple[tuple[str, Callable[[Scene], "Diagnosis | None"]], ...] = (
    (GPU_KERNEL, _gpu_spins),
    (GPU_KERNEL, _gpu_busy),
    (COLLECTIVE, _in_collective),
    (IO, _disk),
    (WORKER, _worker_hung),
    (WORKER, _workers_silent),
    (DEADLOCK, _deadlock),
    (SOCKET, _socket),
    (IO, _file),
    (CHILD, _child),
    (LOCK, _lock),
)


def diagnose(main: StackSample, others: Sequence[StackSample], target: int, gpu: str = "unknown",
             tasks: Mapping[int, TaskSample] | None = None, ranks: Mapping[int, int] | None = None,
             workers_running: int | None = None, spin_pids: frozenset[int] = frozenset()) -> Diagnosis:
    """The kind of hang from every party's wait (the first row of KINDS that holds). ``tasks``:
    the newest /proc reading per pid; ``ranks``: pid -> rank of a multi-rank job's processes (the
    others are named by rank); ``workers_running``: the target's DataLoader workers the OS shows
    (``worker_stats``), of which ``others`` may hold only some (a worker is sampled every few
    seconds)."""
    tasks = tasks or {}
    ps = parties(main, others, target, tasks, ranks)
    if spin_pids and ranks:
        # NCCL waits on the GPU: a rank whose GPU spins waits in a collective whatever its host
        # thread was caught doing (launching the next step's kernels into a full queue, a sync).
        # Its Python frames may name no collective (DDP's all-reduce runs from autograd's hooks): it
        # is then the GPU's, which a rank waiting in a host-side one (a gloo barrier) is not in.
        ps = tuple(replace(p, waits="collective", what="waits in a NCCL collective on its GPU (the kernel spins)",
                           collective=p.collective or GPU_COLLECTIVE)
                   if p.pid in spin_pids and p.pid in ranks and (p.main or p.worker) and " thread " not in p.label
                   else p for p in ps)
    sc = Scene(tuple(ps), target, gpu, ranks or {}, workers_running)
    for _kind, test in KINDS:
        found = test(sc)
        if found is not None:
            return found
    return _unknown(sc)


def _collective(ps: Sequence[Party], coll: Sequence[Party], worker_mains: Sequence[Party], ranks: Mapping[int, int],
                gpu: str, dist_timeout: str) -> Diagnosis:
    """Parties wait in a collective. With the ranks known, each rank's main thread is compared
    with the collective the most of them wait in: a rank elsewhere never arrives (named with
    what it does instead), a rank in another collective is a desync (the ranks called
    different collectives, or the same in another order)."""
    rank_mains = [p for p in ps if p.pid in ranks and " thread " not in p.label and (p.main or p.worker)]
    fns = {p.pid: p.collective for p in rank_mains if p.collective}
    # The collective most ranks wait in; at a tie, the one on the GPUs: NCCL ranks wait there in the
    # step's own collective (DDP's gradient all-reduce every step), and a rank waiting on its host in
    # another (a barrier under `if rank == 0:`) is the one that left the step's path.
    common = max(set(fns.values()),
                 key=lambda f: (list(fns.values()).count(f), f == GPU_COLLECTIVE, f)) if fns else None
    if rank_mains:
        elsewhere = [p for p in rank_mains if p.waits != "collective"]
        other_coll = [p for p in rank_mains if p.waits == "collective" and common and p.collective != common]
        waiting = [p for p in rank_mains if p.waits == "collective" and p not in other_coll]
    else:
        elsewhere, other_coll, waiting = [p for p in worker_mains if p.waits != "collective"], [], list(coll)
    waiting = waiting or list(coll)
    in_fn = f" in {common}" if common else ""
    ev = [f"{_at(p)} waits in a collective" + (f" ({p.collective})" if p.collective else "") for p in coll]
    ev += [f"{_at(p)} is elsewhere ({p.what}): the rank the others wait for" for p in elsewhere]
    ev += [f"{_at(p)} waits in {p.collective} instead of {common}: a desync" for p in other_coll]
    names = ", ".join(p.label for p in waiting[:3]) + (" …" if len(waiting) > 3 else "")
    absent = [p for p in elsewhere if p.pid in ranks]
    if absent:
        a = absent[0]
        summary = (f"collective wait: {names} wait{'s' if len(waiting) == 1 else ''}{in_fn} for {a.label}, which "
                   f"never arrives: it is at {a.where}, {_doing(a)} instead")
    elif other_coll and common == GPU_COLLECTIVE:
        o = other_coll[0]
        summary = (f"collective desync: {names} wait{'s' if len(waiting) == 1 else ''} in {common} for {o.label}, "
                   f"which never arrives: it waits in {o.collective} at {o.where} instead, a collective "
                   f"{'they do' if len(waiting) > 1 else 'it does'} not call")
    elif other_coll:
        o = other_coll[0]
        summary = (f"collective desync: {names} wait{'s' if len(waiting) == 1 else ''} in {common} while "
                   f"{o.label} waits in {o.collective} (at {o.where})")
    else:
        summary = f"collective wait: {_at(coll[0])} waits for a rank that never arrives"
    action = f"find the rank that is elsewhere: gputop stacks --pid PID on every rank; {dist_timeout}"
    if absent:
        action = (f"see why {absent[0].label} stops before the collective: gputop stacks --pid {absent[0].pid}; "
                  f"every rank must reach the same collectives in the same order; {dist_timeout}")
    elif other_coll:
        action = ("make every rank call the same collectives in the same order (a collective under a rank-dependent "
                  f"`if`, or a different number of steps per rank, desyncs them); TORCH_DISTRIBUTED_DEBUG=DETAIL "
                  f"names the mismatched call (debugging only); {dist_timeout}")
    return Diagnosis(COLLECTIVE, summary, tuple(ps), tuple(ev), action, native=gpu == "busy")


def _doing(p: Party) -> str:
    """What a party does, in a few words: 'computing (forward)', 'sleeps'."""
    if p.waits == "running":
        return f"running ({p.category.value})" if p.category is not None else "running"
    return p.what.split(" (", 1)[0]


def short(p: Party) -> str:
    """'file:line' of a party, shortest form."""
    return p.where.split(" in ", 1)[0] if p.where else short_path("")
