"""``--attach all``: sample the stacks of every Python process that holds a GPU, and on a host
without a GPU, of every Python process whose environment names it a rank (gloo on CPU).

Each attached process costs one py-spy sampler at 5 Hz: about 5 % of a core on the exporter's
side and +0.35 % lost time in the job (bench/results/pyspy_overhead.md). That is what turns a
GPU's idle seconds into causes; it is also why the number attached is capped (``max_attach``,
default one per GPU of a full node) and why the exporter attaches to nothing unless asked.
A process that cannot be sampled (not Python, no ptrace permission) is tried once and left.
CPU ranks come in only where there is no GPU: on a GPU host the budget is one sampler per GPU,
and a rank there shows up in NVML's list once it opens its CUDA context. ``under`` narrows every
candidate to one process tree (a launcher, a Slurm step, a container's init).
"""

from __future__ import annotations

import os
import re
import threading
from typing import TYPE_CHECKING, Callable, Iterable

from ..model import Event
from .config import DEFAULT_MAX_ATTACH

if TYPE_CHECKING:
    from ..sources import PySpySource

# New GPU processes are looked for this often: a job is attached within a few seconds of
# opening its CUDA context, and the check costs one NVML process list already in the store.
ATTACH_EVERY_S = 5.0
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")


def is_python(pid: int) -> bool:
    """The process runs a Python interpreter (by its executable; torch renames the main thread,
    so the process name says ``pt_main_thread``)."""
    try:
        if _PYTHON.match(os.path.basename(os.readlink(f"/proc/{pid}/exe"))):
            return True
    except OSError:  # another user's process without ptrace rights: argv[0] still tells
        pass
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return False
    return bool(_PYTHON.match(os.path.basename(argv0)))


class Attacher:
    """A pipeline stage that attaches a stack sampler to each new Python GPU process (or CPU rank).

    ``ranks``: the PIDs of the host's CPU ranks (``cpu_ranks.RankScanner``), asked only while the
    store knows no GPU; ``under``: whether a PID may be attached at all (``--attach-under``)."""

    name = "attach"

    def __init__(
        self,
        session,
        sampler: Callable[[int], PySpySource],
        max_attach: int = DEFAULT_MAX_ATTACH,
        interval: float = ATTACH_EVERY_S,
        python: Callable[[int], bool] = is_python,
        check: Callable[[int], object] | None = None,
        ranks: Callable[[], Iterable[int]] | None = None,
        under: Callable[[int], bool] | None = None,
    ) -> None:
        self.session = session
        self.sampler = sampler
        self.max_attach = max_attach
        self.interval = interval
        self._python = python
        self._check = check
        self._ranks = ranks
        self._under = under
        self._lock = threading.Lock()
        self._attached: dict[int, PySpySource] = {}
        self._tried: set[int] = set()

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(self._attached)

    def poll(self) -> list[object]:
        store = self.session.store
        out: list[object] = []
        with self._lock:
            for pid, src in list(self._attached.items()):
                if src.exited is not None:  # the job ended: free its slot
                    self.session.pipeline.remove_source(src)
                    del self._attached[pid]
            for pid in self._candidates(store):
                if pid in self._attached or pid in self._tried or pid == self.session.target_pid:
                    continue
                if self._under is not None and not self._under(pid):
                    self._tried.add(pid)  # a process never moves into a tree it was not born in
                    continue
                if len(self._attached) >= self.max_attach:
                    out.append(Event(store.now, self.name, f"not attaching to PID {pid}: "
                                     f"{self.max_attach} processes attached already (--max-attach)", "warning"))
                    self._tried.add(pid)
                    continue
                self._tried.add(pid)
                if not self._python(pid):
                    continue
                try:
                    self._checker()(pid)
                except Exception as exc:  # AttachError: not Python after all, permission, py-spy
                    out.append(Event(store.now, self.name, f"cannot sample stacks of PID {pid}: {exc}", "warning"))
                    continue
                src = self.sampler(pid)
                self._attached[pid] = src
                self.session.pipeline.add_source(src)
                out.append(Event(store.now, self.name, f"attached to PID {pid}", "info"))
        return out

    def _candidates(self, store) -> list[int]:
        pids = {p.pid for p in store.gpu_processes()}
        if self._ranks is not None and not store.gpu_indices():
            pids.update(self._ranks())
        return sorted(pids)

    def _checker(self) -> Callable[[int], object]:
        if self._check is None:
            from ..sources import check_attachable

            self._check = check_attachable
        return self._check

    def close(self) -> None:
        pass


class RankNamer:
    """With ``--attach all``: names the attached ranks of a distributed job to the session, in the
    ranks event a ``--pid`` session publishes as it attaches (``analysis.ranks_message``).

    Without it the advisor, which reads the ranks from that event, saw separate processes: a
    rank waiting in all_reduce for its straggler was judged stuck, while the rank series (which
    know the ranks from their environments) showed the straggler, so the exporter disagreed with
    the UI and ``advise`` on the same job. One advisor judges one job: where several are attached,
    the one with the most ranks here (then the lowest job id), the same each poll while it lasts.
    ``identities``: the attached ranks' identities (``JobCollector.identities``); ``judge``: told
    the pid of the job's lowest rank, the process the advisor then judges, as a ``--pid`` session
    given the launcher judges its rank 0 (so both reach one verdict on the same job)."""

    name = "attach-ranks"

    def __init__(self, store, identities: Callable[[], dict], interval: float = ATTACH_EVERY_S,
                 judge: Callable[[int], None] = lambda pid: None) -> None:
        self.store = store
        self.judge = judge
        self.interval = interval  # as often as new processes are attached
        self.identities = identities
        self._named: dict[int, int] = {}
        self.job: str | None = None  # the job named (its job_id), None: none yet

    def poll(self) -> list[object]:
        from ..analysis import RANKS_SOURCE, ranks_message

        by_job: dict[str, dict[int, int]] = {}
        for pid, ident in self.identities().items():
            by_job.setdefault(ident.job, {})[pid] = ident.rank
        jobs = [j for j, ranks in by_job.items() if len(ranks) >= 2]
        if not jobs:
            return []
        # The job named before stays named while it has ranks here: the advisor's hold counts
        # evaluations of one job, and switching would start it over.
        job = self.job if self.job in jobs else min(jobs, key=lambda j: (-len(by_job[j]), j))
        if job == self.job and by_job[job] == self._named:
            return []
        self.job, self._named = job, by_job[job]
        self.judge(min(self._named, key=self._named.__getitem__))
        return [Event(self.store.now, RANKS_SOURCE, ranks_message(self._named, None), "info")]

    def close(self) -> None:
        pass
