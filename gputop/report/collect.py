"""Read a recording into a ``Summary``, an hour at a time."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from ..advisor import STATE_IDS, WARMUP_ID, holds_no_gpu
from ..analysis import stack_slices
from ..analysis import descends_from, is_worker, parents_of
from ..analysis import poll_slices, util_slices
from ..analysis import as_ranks, rank_map
from ..model import GpuProcess, GpuSample, ProcSample, StackSample, UtilPoint
from ..record import Reader, session_spans
from .ranks import collect_ranks
from .rejudge import needs_rejudging, rejudge
from .summary import HELD_NO_GPU, RunAccumulator, SessionSummary, Summary, finding_ends, summarise_findings

# Work in chunks so a day-long recording never sits in memory at once.
CHUNK_S = 3600.0
# Events worth listing in a report.
EVENT_LEVELS = ("warning", "error")
MAX_EVENTS = 50


def collect(reader: Reader, chunk_s: float = CHUNK_S) -> Summary:
    start, end = reader.start_ts, reader.end_ts
    last = reader.sessions[-1] if reader.sessions else {}
    acc = RunAccumulator(start, max(end, start + 1.0))
    # The first util point's period reaches back before the chunk: read a little earlier.
    t = start - 1e-6
    carry: dict[int, UtilPoint] = {}
    latest_proc: dict[int, ProcSample] = {}
    latest_gpu_proc: dict[int, GpuProcess] = {}
    listed: dict[int, set[int]] = {}  # GPU -> every PID NVML listed on it so far
    ranks = rank_map(reader.events(float("-inf"), float("inf")))
    has_gpus = bool(reader.gpu_indices())
    # Each recording session is read for its own target (an appended session may follow another
    # process): its main thread's stacks, its family, its CPU time line. What the last session
    # with main-thread samples judged says whether the job held a GPU (``cpu_why`` below).
    sessions = _sessions(reader, acc.end)
    held: tuple[int | None, set[int], StackSample] | None = None
    for k, sess in enumerate(sessions):
        acc.begin_session(sess)
        # The session's chunks run to where the next session starts (the last: to the end); the
        # reader's ranges hold their end, so the next session's first sample (at its start) is its own.
        until = sessions[k + 1].start - 1e-6 if k + 1 < len(sessions) else end
        target = sess.target_pid
        # The CPU device (advise's "CPU (no GPU)"): the job's main thread as its own time line.
        job_pid = target
        main_carry: StackSample | None = None
        first_main: StackSample | None = None
        family: set[int] = set()
        while t < until:
            e = min(until, t + chunk_s)
            pts: dict[int, list[UtilPoint]] = {}
            for p in reader.util_points(t, e):
                pts.setdefault(p.index, []).append(p)
            polls: dict[int, list[GpuSample]] = {}
            for s in reader.gpu_samples(t, e):
                polls.setdefault(s.index, []).append(s)
            slices = {}
            for g in set(pts) | set(polls):
                if g in pts:
                    seq = ([carry[g]] if g in carry else []) + pts[g]
                    slices[g] = util_slices(seq, t, e)
                    carry[g] = pts[g][-1]
                else:
                    slices[g] = poll_slices(polls[g], t, e)
            stacks = reader.stack_samples(t, e, main_only=True, pid=target)
            if not stacks and target is not None:
                stacks = reader.stack_samples(t, e, main_only=True)
            gprocs = reader.gpu_processes(t, e)
            # Judged as advise judges a multi-rank job's stacks (analysis.ranks.as_ranks): a CPU
            # rank off the CPU in backward waits in DDP's all-reduce. Read as they were recorded,
            # a rank's 69 % all-reduce wait was "busy 100 %" in the report beside advise's verdict.
            stacks = as_ranks(stacks, ranks, gprocs, has_gpus)
            host, procs = reader.host_samples(t, e), reader.proc_samples(t, e)

            if job_pid is None and stacks:
                # No target named: the process sampled most is the one watched (as in advise).
                job_pid = Counter(x.pid for x in stacks).most_common(1)[0][0]
            main = [x for x in stacks if x.pid == job_pid]
            acc.add_main_samples(main)
            for p in procs:
                latest_proc[p.pid] = p
            for gp in gprocs:
                latest_gpu_proc[gp.pid] = gp
                listed.setdefault(gp.gpu_index, set()).add(gp.pid)
            parents = parents_of(latest_proc.values())
            family = ({job_pid} | {pid for pid, p in latest_proc.items() if is_worker(p, job_pid, parents=parents)}
                      if job_pid else set())
            # A job that demonstrably holds none of the GPUs does not explain their idle time (the live
            # window's rule, analysis.window.holds_no_gpu): another job's idle GPU read as this one's
            # CPU work in a report whose own CPU line said the job held no GPU.
            first = first_main or (main[0] if main else None)
            theirs = first is not None and holds_no_gpu(
                job_pid, family, ranks, list(latest_gpu_proc.values()),
                {pid: [p] for pid, p in latest_proc.items()}, [first])
            # A launcher's ranks are its children; a rank started apart is known by its rank alone.
            own = family | set(ranks) | {pid for pid, p in latest_proc.items() if job_pid and p.ppid == job_pid}
            mine = frozenset() if theirs else job_gpus(listed, own) if job_pid else None
            acc.add_chunk(slices, polls, () if theirs else stacks, host, procs, job_gpus=mine)
            if family:
                acc.add_job_memory(gprocs, family)
            if job_pid:
                # The workers' private memory: the host source reads it for the target's DataLoader
                # workers alone; a reading counts for the job it runs under.
                read = {p.pid for p in procs if p.uss is not None and descends_from(p, job_pid, parents)}
                acc.add_worker_memory(procs, read, job_pid)
            if main:
                first_main = first_main or main[0]
                cpu_sl = stack_slices(([main_carry] if main_carry else []) + main, t, e)
                acc.add_cpu_chunk(cpu_sl, main, host, [p for p in procs if p.pid in family])
                main_carry = main[-1]
            t = e
        if first_main is not None:
            held = (job_pid, family, first_main)
    all_events = reader.events(float("-inf"), float("inf"))
    events = [ev for ev in all_events if ev.level in EVENT_LEVELS][-MAX_EVENTS:]
    cpu_why = None
    if held is not None and holds_no_gpu(
        held[0], held[1], rank_map(all_events), list(latest_gpu_proc.values()),
        {pid: [p] for pid, p in latest_proc.items()}, [held[2]],
    ):
        cpu_why = HELD_NO_GPU
    sysinfo = reader.system_info()
    # The file's findings when this advisor showed them; else the samples judged again, as a
    # replay judges them, so a report and a replay of one file reach one verdict.
    judged = rejudge(reader) if needs_rejudging(reader) else None
    findings = summarise_findings(judged.rows if judged else reader.finding_rows())
    finding_ends(findings, judged.clears if judged else all_events, session_spans(reader.sessions, start, acc.end))
    # The advisor's "warming up" is the job's phase, recorded as a finding row so a replay's
    # advisor pane shows it: the report says it as the phase and counts it as no finding.
    phases = [fs for fs in findings if fs.finding.id == WARMUP_ID]
    findings = [fs for fs in findings if fs.finding.id not in STATE_IDS]
    return acc.summary(
        path=str(reader.path),
        host=(sysinfo.hostname if sysinfo else None) or last.get("host") or "?",
        system=sysinfo,
        target_pid=last.get("target_pid"),
        target_cmdline=last.get("target_cmdline"),
        source=(sysinfo.source if sysinfo else None) or last.get("mode") or "live",
        findings=findings,
        phases=phases,
        events=events,
        damage=reader.damage,
        lost_tables=tuple(reader.lost_tables),
        size_bytes=reader.size_bytes(),
        gpu_infos={g.index: g for g in reader.gpu_infos()},
        cpu_why=cpu_why,
        backfill_s=reader.span.backfill_s,
        ranks=collect_ranks(reader, chunk_s),
        gain_predicted_recorded=True if judged else _has_column(reader, "findings", "gain_predicted"),
        judged_step_s=judged.step_s if judged else None,
        recorded_ids=judged.recorded if judged else (),
        sample_interval=max((x["interval"] or 0.0 for x in reader.sessions), default=0.0) or None,
    )


def job_gpus(listed: Mapping[int, Iterable[int]], own: Iterable[int]) -> frozenset[int] | None:
    """Which GPUs are the job's, from the PIDs NVML listed on each (``listed``) and the job's own
    (``own``: its target, workers, ranks): those it was listed on, as the live window takes the
    target's; failing that (another PID namespace, or the job not on a GPU yet) those with any
    process listed; None where nothing was listed (nothing tells: every GPU is taken for the job's).
    A GPU the job never touched beside the one it trained on was charged with its CPU work."""
    own = set(own)
    mine = frozenset(g for g, pids in listed.items() if own & set(pids))
    return mine or frozenset(g for g, pids in listed.items() if pids) or None


def _sessions(reader: Reader, end: float) -> list[SessionSummary]:
    """The recording's sessions, each with its span and target; the last ends at ``end`` (the
    report's); a file without session rows is one session without a target."""
    listed = reader.session_list()
    if not listed:
        return [SessionSummary(1, reader.start_ts, end, None, None)]
    out = [SessionSummary(x["session"], x["start"], x["end"], x["target_pid"], x["target_cmdline"]) for x in listed]
    out[-1].end = max(out[-1].end, end)
    return out


def _has_column(reader: Reader, table: str, column: str) -> bool:
    try:
        return any(r[1] == column for r in reader.conn.execute(f"PRAGMA table_info({table})"))
    except Exception:  # noqa: BLE001 - a damaged file: the reader has said so already
        return False
