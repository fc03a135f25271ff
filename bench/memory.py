#!/usr/bin/env python3
"""Does gputop name a job's memory growth before it dies, and how well does it forecast the death?

Six plain user scripts (bench/jobs/memory/): a graph kept by `total_loss += loss`, outputs kept
in a list, a slow leak (a few MB a step), a healthy job whose allocator warms up then plateaus, a
saw-tooth (a periodic eval at a larger batch), and DataLoader workers whose Dataset of Python
objects is copied page by page (copy-on-read). Each runs under a memory cap so the leaks really
die: a ballast process holds all of the card (or the host) but a few GiB (each job's
``room_gib``, or ``--room``), so the limit the job meets is the one NVML (or the host) reports,
the one the forecast is made against. The card's ballast starts before the job; the host's once
the job runs (its baseline is then known) and before gputop attaches, so its own filling is not
read as the job's growth; the job's OOM score is raised, so the kernel takes it, not the ballast. (A cap
inside the job, ``torch.cuda.set_per_process_memory_fraction``, is invisible to NVML: the
forecast would be late by design.)

gputop attaches to each job through its own session (the same advisor as ``advise``) and the
bench notes, per job: ``truth``, ``named`` (memory-growth shown, on the right device, with the
leak's line where the stacks hold it), ``t_named_s`` (from the job's "growth starts" line),
``eta_predicted_s`` (the forecast when first named) against ``eta_actual_s`` (from then to the
job's death), and ``false_alarm`` (memory-growth shown on a job that does not leak).

Targets (issue 27): every leak named within 30 s of its growth becoming visible, the forecast
within 25 % of the actual time once named, no false alarm on the healthy and saw-tooth jobs.

Usage, on the GPU machine:
    python bench/memory.py --out bench/results            # writes memory.json and memory.md
    python bench/memory.py --only workers_cow.py --out DIR --shot DIR   # one job; a screenshot
Smoke test on a CPU (host-memory job, small; prints the rows, writes nothing):
    python bench/memory.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gputop.session import Config, open_live  # noqa: E402

JOBS = ROOT / "bench" / "jobs" / "memory"


@dataclass(frozen=True)
class Job:
    script: str
    truth: str  # "gpu-leak", "host-leak", "healthy"
    line: str | None = None  # the leaking line's text, where the stacks can hold it
    cpu: bool = False  # meaningful on a CPU (host memory)
    host: bool = False  # its memory is the host's: the ballast holds the host's, started once it runs
    room_gib: float = 8.0  # what the ballast leaves free (GPU: before the job starts; host: beside it)
    limit_s: float = 150.0  # the longest it is watched


SUITE = (
    Job("total_loss.py", "gpu-leak", "total_loss += loss"),
    Job("outputs_list.py", "gpu-leak", "all_outputs.append(outputs)"),
    Job("slow_leak.py", "gpu-leak", "cache[step] = x.detach().clone()"),
    Job("healthy.py", "healthy", cpu=True, limit_s=60.0),
    Job("sawtooth.py", "healthy", limit_s=60.0),
    Job("workers_cow.py", "host-leak", cpu=True, host=True, room_gib=2.0, limit_s=240.0),
)


@dataclass
class Row:
    job: str
    truth: str
    named: bool = False
    line_named: bool | None = None
    t_named_s: float | None = None
    eta_predicted_s: float | None = None
    eta_actual_s: float | None = None
    eta_error: float | None = None  # (predicted - actual) / actual
    false_alarm: bool = False
    exit_cause: str | None = None
    exit_code: int | None = None
    job_said: str = ""  # the job's last line on stderr (its error, when it died)
    early: bool = False  # named on less than a minute of history (memory_growth.EARLY_SPAN_S)
    # The forecast's ceiling when named, MiB: what the growing workers still shared (copy-on-read
    # is bounded by it); None: forecast as a line.
    ceiling_mib: float | None = None
    # The host's: from the naming to its available memory under 1 % (what the forecast is made
    # for; the OOM killer comes later, once the kernel has no page cache left to evict).
    full_actual_s: float | None = None
    host_avail_mib: list = field(default_factory=list)  # the host's available memory: after the ballast, every 10 s
    cap: str = ""  # how the job's memory was capped where it was not the ballast (--cgroup)
    title: str = ""
    note: str = ""


def ballast(device: str, room_gib: float) -> subprocess.Popen | None:
    """A process that holds all of the card's (or the host's) memory but ``room_gib``. On the host
    its pages are populated (MAP_POPULATE) and written, and it asks the OOM killer to spare it (it
    may not be allowed to: the job's own score is raised too, see run_job)."""
    if device == "cpu":
        code = ("import mmap, os, time\n"
                "try:\n    open('/proc/self/oom_score_adj', 'w').write('-1000')\nexcept OSError:\n    pass\n"
                "avail = int(next(l for l in open('/proc/meminfo') if l.startswith('MemAvailable')).split()[1]) * 1024\n"
                f"n = max(4096, avail - int({room_gib} * 2**30))\n"
                "flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, 'MAP_POPULATE', 0)\n"
                "m = mmap.mmap(-1, n, flags=flags)\n"
                # Written through as well: a kernel may take MAP_POPULATE as a hint (one VM's
                # did: the host's memory stayed free), and a written page is held for good.
                "chunk = b'\\1' * (64 << 20)\n"
                "for i in range(0, n, len(chunk)):\n"
                "    m[i:i + min(len(chunk), n - i)] = chunk[:min(len(chunk), n - i)]\n"
                "print('ready', flush=True)\n"
                "time.sleep(1e9)\n")
    else:
        code = ("import torch, time\n"
                "free, total = torch.cuda.mem_get_info()\n"
                f"x = torch.empty(max(0, free - int({room_gib} * 2**30)), dtype=torch.uint8, device='cuda')\n"
                "print('ready', flush=True)\n"
                "time.sleep(1e9)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    if p.stdout.readline().strip() != "ready":
        raise SystemExit("the ballast did not start")
    return p


class Cgroup:
    """A memory cgroup of the bench's own (v2 where the unified hierarchy delegates the memory
    controller, else v1), for a host job to die in at a limit set once its baseline is known:
    the container case, where the OOM killer acts at the group's limit while the host has room."""

    def __init__(self) -> None:
        name = f"gputop-bench-{os.getpid()}"
        v2 = Path("/sys/fs/cgroup")
        if (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.subtree_control").read_text():
            self.dir, self.limit_file, self.usage_file = v2 / name, "memory.max", "memory.current"
        else:
            self.dir = Path("/sys/fs/cgroup/memory") / name
            self.limit_file, self.usage_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
        try:
            self.dir.mkdir()
        except OSError as exc:
            raise SystemExit(f"--cgroup: cannot make a memory cgroup ({exc}): run as root on a host with cgroups")

    def wrap(self, args: list[str]) -> list[str]:
        """The job's command, started inside the group (its workers, forked later, inherit it)."""
        code = ("import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
                "os.execv(sys.executable, [sys.executable] + sys.argv[2:])")
        return [sys.executable, "-c", code, str(self.dir / "cgroup.procs"), *args[1:]]

    def used(self) -> int:
        return int((self.dir / self.usage_file).read_text())

    def limit(self, n: int) -> None:
        (self.dir / self.limit_file).write_text(str(n))

    def close(self) -> None:
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def run_job(job: Job, device: str, tiny: bool, limit_s: float, room: bool = True,
            shot: Path | None = None, cgroup: bool = False) -> Row:
    """One job watched by gputop's own session until it dies or ``limit_s``. ``room``: hold the
    memory but the job's room with a ballast; ``shot``: also take a screenshot of the live UI
    attached to it (a folder), 40 s after its growth starts."""
    # Relative to the project (run from it): the command line the screen shows names the project's file.
    args = [sys.executable, str((JOBS / job.script).relative_to(ROOT)), "--device", device] + (["--tiny"] if tiny else [])
    if job.truth == "healthy":
        args += ["--seconds", str(limit_s)]
    hold = ballast(device, job.room_gib) if room and not job.host else None
    group = Cgroup() if cgroup and job.host else None
    if group is not None:
        args = group.wrap(args)
    # A session of its own, so the workers die with it; its OOM score raised so that the kernel
    # takes it, not the ballast, when the host is full.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=ROOT)
    try:
        with open(f"/proc/{proc.pid}/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    row = Row(job.script, job.truth)
    growth_start = None
    named_at = None
    session = None
    camera = None
    try:
        if job.host and (room or group is not None):
            # The host's ballast (or the group's limit) once the job runs (its baseline is then
            # known), before gputop attaches: the ballast's own filling must not read as the job's growth.
            t_wait = time.time() + 180
            while growth_start is None and time.time() < t_wait and proc.poll() is None:
                time.sleep(0.5)
                growth_start = _growth_start(proc)
            if group is not None:
                base = group.used()
                group.limit(base + int(job.room_gib * 2**30))
                row.cap = f"cgroup: {base / 2**20:.0f} MiB at the growth's start + {job.room_gib:g} GiB"
            else:
                hold = ballast(device, job.room_gib)
            row.host_avail_mib.append(_host_available_mib())
        session = open_live(Config(pid=proc.pid, interval=1.0))
        session.start()
        attached = time.time()
        t_end = time.time() + limit_s
        while time.time() < t_end and proc.poll() is None:
            time.sleep(1.0)
            if job.host and int(time.time() - attached) % 10 == 0:
                row.host_avail_mib.append(_host_available_mib())
            if job.host and named_at is not None and row.full_actual_s is None and _host_full():
                row.full_actual_s = round(time.time() - named_at, 1)
            if growth_start is None:
                growth_start = _growth_start(proc)
            if shot is not None and camera is None and growth_start is not None and time.time() > growth_start + 1:
                camera = subprocess.Popen(
                    [sys.executable, str(ROOT / "scripts" / "screenshot.py"), "--out", str(shot), "--name",
                     "live-memory-leak", "--size", "160x48", "--seconds", "38", "--pid", str(proc.pid)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if named_at is not None:
                continue
            f = next((f for f in session.store.findings() if f.id == "memory-growth"), None)
            if f is None:
                continue
            named_at = time.time()
            ctx = session.advisor.advisor.last_context
            mem = ctx.memory if ctx is not None else None
            row.named = (f.gpu_index is not None) == (job.truth == "gpu-leak") and job.truth != "healthy"
            row.false_alarm = job.truth == "healthy"
            row.title = f.title
            if job.line is not None:
                row.line_named = job.line in f.action
            # Growth is visible to gputop from when it grows and gputop watches, whichever is later.
            visible = max(attached, growth_start) if growth_start is not None else attached
            row.t_named_s = round(named_at - visible, 1)
            if mem is not None:
                gr = mem.gpu(f.gpu_index).growth if f.gpu_index is not None and mem.gpu(f.gpu_index) else mem.host
                row.eta_predicted_s = None if gr is None or gr.eta_s is None else round(gr.eta_s, 1)
                row.early = bool(gr is not None and gr.early)
                row.ceiling_mib = None if gr is None or gr.ceiling is None else round(gr.ceiling / 2**20)
        died = proc.poll() is not None
        died_at = time.time()
        time.sleep(3.0)  # the exit's last polls
        ctx = session.advisor.advisor.last_context
        if ctx is not None and ctx.memory is not None:
            row.exit_cause = ctx.memory.exit_cause
        if died:
            row.exit_code = proc.returncode
            err = (proc.stderr.read() or "").strip().splitlines()
            row.job_said = err[-1][:200] if err else ""
        if died and named_at is not None:
            row.eta_actual_s = round(died_at - named_at, 1)
            # Named in the second it died (a fast leak in a small room): no time to compare a forecast with.
            if row.eta_predicted_s and row.eta_actual_s > 0:
                row.eta_error = round((row.eta_predicted_s - row.eta_actual_s) / row.eta_actual_s, 3)
        if not died:
            row.note = f"alive after {limit_s:.0f} s"
    finally:
        if session is not None:
            session.stop()
        if camera is not None:
            try:
                camera.wait(timeout=60)
            except subprocess.TimeoutExpired:
                camera.kill()
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, 9)
            except OSError:
                proc.kill()
        proc.wait()
        if hold is not None:
            hold.kill()
            hold.wait()
        if group is not None:
            group.close()
    return row


def _host_available_mib() -> int:
    try:
        return int(next(ln for ln in open("/proc/meminfo") if ln.startswith("MemAvailable")).split()[1]) // 1024
    except (OSError, StopIteration, ValueError):
        return -1


def _host_full() -> bool:
    try:
        info = {ln.split(":")[0]: int(ln.split()[1]) for ln in open("/proc/meminfo") if ln.split()[1:]}
    except (OSError, ValueError):
        return False
    return info.get("MemAvailable", 1) < 0.01 * info.get("MemTotal", 1)


def _growth_start(proc: subprocess.Popen) -> float | None:
    """The job's own "growth starts <epoch>" line, if it has printed it (non-blocking)."""
    os.set_blocking(proc.stdout.fileno(), False)
    text = proc.stdout.readline() or ""
    return float(text.split()[-1]) if text.startswith("growth starts") else None


def summary(rows: list[Row]) -> dict:
    """The issue's targets, met or not, over what ran."""
    leaks = [r for r in rows if r.truth != "healthy"]
    healthy = [r for r in rows if r.truth == "healthy"]
    timed = [r for r in leaks if r.eta_error is not None]
    lines = [r for r in leaks if r.line_named is not None]
    return {
        "leaks": len(leaks),
        "named": sum(r.named for r in leaks),
        "named_within_30s": sum(bool(r.named and r.t_named_s is not None and r.t_named_s <= 30) for r in leaks),
        "forecasts_timed": len(timed),
        "forecasts_within_25pct": sum(abs(r.eta_error) <= 0.25 for r in timed),
        "lines_expected": len(lines),
        "lines_named": sum(bool(r.line_named) for r in lines),
        "healthy": len(healthy),
        "false_alarms": sum(r.false_alarm for r in rows),
        "host_fills_within_25pct": sum(abs(r.eta_predicted_s - r.full_actual_s) <= 0.25 * r.full_actual_s
                                       for r in leaks if r.full_actual_s and r.eta_predicted_s),
    }


def markdown(rows: list[Row], machine: str = "") -> str:
    s = summary(rows)
    out = [f"# Memory: leaks named before they kill{f' ({machine})' if machine else ''}", "",
           ("bench/memory.py --cgroup: each host job in a memory cgroup of its own whose limit is set at the "
            "growth's start (its baseline) plus its room (the container case: the host keeps room), "
            if any(r.cap for r in rows) else
            "bench/memory.py: each job under a ballast that leaves it a few GiB (the card's, or the host's), ") +
           "watched by gputop's own live session (the advisor `advise` runs). `t_named_s` counts from when "
           "the growth is visible (the job's \"growth starts\" line, or gputop's attach if later); "
           "`eta_actual_s` from the naming to the job's death.", "",
           f"- leaks named: {s['named']} of {s['leaks']}, within 30 s: {s['named_within_30s']} (target: all)",
           f"- forecasts within 25 % of the actual time to death: {s['forecasts_within_25pct']} of "
           f"{s['forecasts_timed']} timed (target: all)",
           f"- the leaking line named: {s['lines_named']} of {s['lines_expected']}",
           f"- false alarms on the {s['healthy']} healthy jobs: {s['false_alarms']} (target: 0)", "",
           "| job | truth | named | early | line | t_named_s | eta_predicted_s | eta_actual_s | error | false alarm "
           "| exit | the job said |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    out += [f"| {r.job} | {r.truth} | {r.named} | {r.early} | {r.line_named} | {r.t_named_s} | {r.eta_predicted_s} | "
            f"{r.eta_actual_s}{'' if r.full_actual_s is None else f' (host full at {r.full_actual_s})'} | {r.eta_error} | {r.false_alarm} | {r.exit_cause or r.exit_code or r.note} | "
            f"{r.job_said.replace('|', '/')} |" for r in rows]
    capped = [f"- {r.job}: {r.cap}" for r in rows if r.cap]
    if capped:
        out += ["", "Caps:", *capped]
    return "\n".join(out) + "\n"


def machine(device: str) -> str:
    if device != "cuda":
        return "CPU"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i",
                              os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return f"1 x {out}" if out else "GPU"
    except (OSError, subprocess.SubprocessError):
        return "GPU"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="small jobs, a short watch, no ballast: a smoke test")
    p.add_argument("--room", type=float, default=None, help="GiB every ballast leaves free (default: each job's own)")
    p.add_argument("--limit", type=float, default=None, help="seconds to watch each job (default: each job's own; "
                   "90 with --tiny)")
    p.add_argument("--only", nargs="*", help="job scripts to run")
    p.add_argument("--shot", type=Path, default=None, help="also screenshot the live UI on the first leak, into DIR")
    p.add_argument("--out", type=Path, default=None, help="folder for memory.json and memory.md (none: print only)")
    p.add_argument("--cgroup", action="store_true", help="cap host jobs with a memory cgroup of their own (the "
                   "container case: the group's limit binds while the host has room) instead of a ballast; root")
    args = p.parse_args()
    jobs = [j for j in SUITE if (not args.only or j.script in args.only) and (args.device == "cuda" or j.cpu)]
    name = machine(args.device)
    rows = []
    shot = args.shot
    for job in jobs:
        if args.room is not None:
            job = replace(job, room_gib=args.room)
        limit = args.limit or (90.0 if args.tiny else job.limit_s)
        rows.append(run_job(job, args.device, args.tiny, limit, room=not args.tiny,
                            shot=shot if job.truth == "gpu-leak" else None, cgroup=args.cgroup))
        if job.truth == "gpu-leak":
            shot = None
        print(json.dumps(asdict(rows[-1])), flush=True)
        if args.out is not None:  # after every job: a watch cut short keeps what ran
            args.out.mkdir(parents=True, exist_ok=True)
            doc = {"machine": name, "summary": summary(rows), "jobs": [asdict(r) for r in rows]}
            (args.out / "memory.json").write_text(json.dumps(doc, indent=2) + "\n")
            (args.out / "memory.md").write_text(markdown(rows, name))
    print(markdown(rows, name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
