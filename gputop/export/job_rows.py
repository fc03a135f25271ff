"""What the exporter says for each attached rank of a distributed job: its identity, where its
steps' time goes, its hot line, whether it is stuck, and its top findings. Read from the store at
scrape time with the same analysis the Ranks tab uses (``analysis.rank_views``); no Prometheus
here, so it is tested with plain data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..analysis import CPU_DEVICE, GROUPS, RankView, across_ranks, as_ranks, family_tasks, group_shares, hot_line, judge, rank_views
from ..model import Finding, StackSample
from ..redact import redact_code, redact_text
from ..sources import JobIdentity
from .rank_start import starting, steady_since

# A rank's findings exported: its costliest few. The rule set is finite, so the id label is
# bounded anyway; the cap keeps a rank's series few when many rules speak at once.
MAX_FINDINGS_PER_RANK = 3
# The hot line's source text as a label value is cut here (the place, function and file:line,
# says where; the text is for a human reading the dashboard).
MAX_CODE_CHARS = 120
PHASES = tuple(name for name, _ in GROUPS)


@dataclass(frozen=True)
class RankRow:
    identity: JobIdentity
    pid: int
    gpu: int | None
    samples: int  # main-thread stack samples in the window: what the shares rest on
    phases: tuple[tuple[str, float], ...]  # GROUPS' names -> share of its samples
    wait: float  # share of the window it waited for its peers (host stacks or its GPU spinning)
    collective: str  # the collective it waits in ("all_reduce"), '' when none seen
    hot: str  # where its own code spends the time outside waits: "decode (data.py:88)", '' unknown
    hot_code: str  # that line's source text, redacted, '' unknown
    hot_share: float
    stuck: bool
    stuck_s: float  # how long its main thread has stood in one place (0 when it moves)
    stuck_where: str  # where it stands when stuck
    findings: tuple[Finding, ...]  # its GPU's findings, costliest first
    # '' once it runs its steps; else what it still does (rank_start: "importing", "joining the
    # process group", "first steps", ...): its shares then say nothing of its steps yet
    starting: str = ""
    # Why its GPU's clocks were held down (power, heat, a hardware slowdown: NVML's limiting
    # reasons) in at least a third of its busy polls over the window; () when they were not
    throttled: tuple[str, ...] = ()


def _code_of(main: Sequence[StackSample], place: str) -> str:
    """The source text of the line ``place`` ("fn (file.py:40)") names, from the newest sample
    that carries it, redacted as code."""
    if not place:
        return ""
    for s in reversed(main):
        for f in s.frames:
            if f.code and place.startswith(f"{f.name} (") and place.endswith(f":{f.line})"):
                return redact_code(f.code.strip())[:MAX_CODE_CHARS]
    return ""


def rank_rows(store, identities: Mapping[int, JobIdentity], now: float, window_s: float,
              stuck_after: float, judged_job: str = "") -> list[RankRow]:
    """One row per pid in ``identities`` (the attached ranks whose environment names their job).
    ``judged_job``: the job the advisor's findings speak of ('' none): its findings that are on no
    GPU (a job on the CPU) are its ranks' findings."""
    if not identities:
        return []
    t0 = now - window_s
    pid_rank = {p: i.rank for p, i in identities.items()}
    gpu_processes = store.gpu_processes()
    # Ranks of different jobs may share a rank number: each job's ranks are viewed apart.
    by_job: dict[str, dict[int, int]] = {}
    for p, i in identities.items():
        by_job.setdefault(i.job, {})[p] = i.rank
    stacks_all = store.stack_window(t0, now)
    main_by_pid: dict[int, list[StackSample]] = {}
    for s in stacks_all:
        if s.is_main and s.pid in pid_rank:
            main_by_pid.setdefault(s.pid, []).append(s)
    for main in main_by_pid.values():
        main.sort(key=lambda s: s.ts)
    start = {p: starting(main_by_pid.get(p, ()), now) for p in identities}
    # A rank past its start-up is read from its samples after it: its imports and rendezvous are
    # no share of its steps. One still starting keeps its window (what it does is shown, not judged).
    since = {p: steady_since(main_by_pid[p]) for p in identities if not start[p] and p in main_by_pid}
    stacks_all = [s for s in stacks_all if since.get(s.pid) is None or s.ts > since[s.pid]]
    gpus = bool(store.gpu_indices())
    gpu_samples = {i: store.gpu_window(i, t0, now) for i in store.gpu_indices()}
    views: list[RankView] = []
    job_stacks: dict[str, list[StackSample]] = {}
    for job, ranks in by_job.items():
        stacks = job_stacks[job] = as_ranks(stacks_all, ranks, gpu_processes, gpus)
        procs = {p: store.proc_window(p, t0, now) for p in ranks}
        views.extend(rank_views(ranks, stacks, t0, gpu_processes, procs, gpu_samples=gpu_samples, t1=now))
    findings = sorted(store.findings(), key=lambda f: -f.cost_s)
    # The OS's view, as the advisor's verdict has it: an unchanged stack is no hang while the rank
    # or its DataLoader workers burn CPU. A starved sampler (py-spy on a saturated host) takes a
    # sample every few seconds, which can land on one line for a whole threshold while the rank
    # works: the stacks then say samples are missing, not that the rank stands still.
    every_proc = {p: store.proc_window(p, t0, now) for p in store.procs_latest()}
    tasks = store.task_windows(t0, now)
    rows = []
    for v in views:
        main = main_by_pid.get(v.pid, [])
        job = identities[v.pid].job
        verdict = judge(main, now, stuck_after, procs=every_proc, tasks=family_tasks(tasks, v.pid))
        # Seen across its job's ranks, as the advisor's verdict is: a rank waiting in a collective
        # while another rank moves waits for a straggler; it is not stuck.
        verdict = across_ranks(verdict, by_job[job], job_stacks[job], v.pid, tasks=tasks, procs=every_proc, now=now)
        # The place the Ranks pane and the straggler finding name (one choice, analysis.hot_line).
        hot, share, _ = hot_line(v)
        hot = hot or ""
        mine = tuple(f for f in findings if (f.gpu_index is not None and f.gpu_index == v.gpu)
                     or (v.gpu is None and f.gpu_index in (None, CPU_DEVICE) and job == judged_job))
        rows.append(RankRow(
            identity=identities[v.pid], pid=v.pid, gpu=v.gpu, samples=v.samples,
            phases=group_shares(v.shares), wait=v.wait, collective=v.collective_fn or "",
            hot=redact_text(hot), hot_code=_code_of(main, hot), hot_share=share,
            stuck=verdict.stuck, stuck_s=verdict.held_s if verdict.stuck else 0.0,
            stuck_where=redact_text(verdict.where) if verdict.stuck else "",
            findings=mine[:MAX_FINDINGS_PER_RANK], starting=start.get(v.pid, ""), throttled=v.gpu_throttled,
        ))
    return sorted(rows, key=lambda r: (r.identity.job, r.identity.rank))
