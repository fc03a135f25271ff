#!/usr/bin/env python3
"""Multi-rank jobs on a 2-GPU machine: does ``gputop advise`` on the launcher's PID give the right
verdict, and how soon after attaching?

Three 2-rank DDP jobs started with ``torchrun --standalone --nproc-per-node 2`` (NCCL on CUDA,
gloo with ``--device cpu``): ``healthy`` (both ranks do the same work), ``straggler`` (rank 1
builds each batch in slow pure Python in its main process while rank 0 waits in the gradient
all-reduce), ``hang`` (rank 1 stops before the all-reduce, rank 0 waits in it forever). Each job
runs past its warm-up, then ``python -m gputop advise --pid LAUNCHER --duration D --json`` attaches.
The right verdict: healthy, no warning or critical finding; straggler, ``rank-straggler`` naming
rank 1 and its slow function (``load_batch``); hang, ``stuck`` naming rank 1 as the rank that never
arrives. With DDP the gradient all-reduce runs inside ``loss.backward()``: rank 0 waits there with
no torch.distributed frame of its own (on the CPU, off the CPU in backward). The time to it is the
advisor's own ``first_seen_s`` (seconds after attaching).

Every job gets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1:
NVLink multicast stays off on the machines this runs on.

    python bench/multi_rank.py --device cuda                 # writes bench/results/multi_rank.{json,md}
    python bench/multi_rank.py --device cpu --out /tmp/mr    # the same on CPU (gloo): never as GPU results

The script is also the job itself (``--job MODE``, run by torchrun).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("healthy", "straggler", "hang", "compute")
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# Throughput findings wait out a job's first 10 s (gputop.advisor.context.WARMUP_AGE_S): attach
# after that, as a user past a job's first seconds would.
ATTACH_AFTER_S = 12.0


# --------------------------------------------------------------------------- the job (one rank)


def load_batch(n: int):
    """The slow Python data path of the straggler: per-element work in the interpreter."""
    total = 0.0
    for i in range(n):
        total += ((i * 7) % 13) ** 0.5
    return total / max(1, n)


def never_arrives() -> None:
    while True:
        time.sleep(0.05)


def _exit_with_the_launcher() -> None:
    # A benchmark killed mid-run may leave no one to stop the ranks: they would spin on.
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def run_job(mode: str, device: str) -> None:
    import threading

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    threading.Thread(target=_exit_with_the_launcher, daemon=True).start()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(local)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    width = 4096 if cuda else 256
    model = DDP(torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(4))).to(dev),
                device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(64 if cuda else 16, width, device=dev)
    slow_n = 2_000_000 if cuda else 300_000  # rank 1's extra Python per step: a large share of a step
    for step in range(10**9):
        if mode == "straggler" and rank == 1:
            x.mul_(1.0 + 1e-9 * load_batch(slow_n))
        if mode == "compute" and rank == 1:
            # A compute straggler: rank 1 runs its model on two more batches each step (an
            # uneven shard), its host never waits; rank 0 waits in the all-reduce on its GPU.
            with torch.no_grad():
                for _ in range(2):
                    model.module(x)
        if mode == "hang" and rank == 1 and step == 20:
            print(f"rank {rank} stops before the all-reduce", flush=True)
            never_arrives()
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # the gradient all-reduce
        opt.step()
        if step == 3:
            if cuda:
                torch.cuda.synchronize()
            print(f"rank {rank} ready", flush=True)


# --------------------------------------------------------------------------- the benchmark


# --------------------------------------------------------------------------- held-out jobs

# Written at different times, each by someone who had not read the rules; a mode's script is the
# one whose TRUTHS holds it.
FRESH_SCRIPTS = tuple(sorted((ROOT / "bench" / "jobs").glob("multi_rank_fresh*.py")))


def _truths_of(script: Path) -> dict:
    import ast

    if not script.exists():
        return {}
    tree = ast.parse(script.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TRUTHS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def fresh_truths() -> dict:
    """The held-out jobs' truths (each bench/jobs/multi_rank_fresh*.py's TRUTHS), read without
    importing torch: the files' TRUTHS literals, each with the script it came from."""
    out = {}
    for script in FRESH_SCRIPTS:
        for mode, truth in _truths_of(script).items():
            out[mode] = {**truth, "script": script.name}
    return out


def fresh_script(mode: str) -> Path:
    return next(s for s in FRESH_SCRIPTS if mode in _truths_of(s))


def wanted_finding(truth: dict) -> str | None:
    """The finding id a held-out truth accepts (None: no finding id of its own: healthy, or an
    inefficiency judged by what the warnings say)."""
    return {"straggler": "rank-straggler", "stuck": "stuck", "desync": "stuck"}.get(truth["verdict"])


def _mentions(text: str, name: str) -> bool:
    """A name said in any of its spellings: NCCL says AllReduce where Python says all_reduce."""
    def norm(s: str) -> str:
        return s.lower().replace("_", "")
    return norm(name) in norm(text)


def fresh_right(truth: dict, report: dict) -> tuple[bool, float | None, str]:
    """A held-out job's verdict against its truth: the finding its verdict wants, naming its rank,
    and its functions (or, for a compute straggler, its GPU's work) somewhere in what it says. A
    healthy job is right when no warning is standing; an inefficiency when a standing warning
    names its fix."""
    findings = report.get("findings", [])
    seen = {s["id"]: s["first_seen_s"] for s in report.get("seen", [])}
    names = truth.get("names") or []
    loud = [f for f in findings if f["severity"] in ("warning", "critical")]
    if truth["verdict"] == "healthy":
        return (not loud, None, loud[0]["title"] if loud else "(no warning)")
    if truth["verdict"] not in ("straggler", "stuck", "desync"):
        # The cause must be stated in what the finding says is wrong (its title and evidence), not
        # only among the changes its action lists: launch-bound's action names `AdamW(fused=True)`
        # as one option, which matched a held-out truth's "AdamW" while the cause it named (the
        # CPU launching kernels) was not the job's (FSDP2's CPU offload, 20x). From the twelfth set on.
        hit = next((f for f in loud if any(_mentions(" ".join([f["title"], *f.get("evidence", [])]), n)
                                           for n in names)), None)
        if hit is None:
            return False, None, findings[0]["title"] if findings else "(nothing)"
        return True, seen.get(hit["id"]), hit["title"]
    want = wanted_finding(truth)
    f = next((f for f in findings if f["id"] == want), None)
    if f is None:
        return False, None, findings[0]["title"] if findings else "(nothing)"
    text = " ".join([f["title"], *f.get("evidence", []), f.get("action", "")])
    rank = truth["rank"]
    if truth["verdict"] == "straggler":
        named = f"rank {rank} is the straggler" in f["title"]
        if truth.get("phase") == "compute":
            named = named and "computes on GPU" in text
    elif truth["verdict"] == "desync":
        named = "desync" in text
    else:
        # A truth with no rank (a lock whichever rank takes first) takes any rank named as absent.
        named = (rank is None or f"rank {rank} (pid" in text) and "never arrives" in text
    if names:
        named = named and any(_mentions(text, n) for n in names)
    return named, seen.get(want), f["title"]


HEALTHY_BELOW = 1.10  # a measured fix gaining less leaves a healthy job: no warning is right (as bench/real_jobs.py)


def measured_grade(row: dict) -> dict:
    """Truth is measured: where a held-out job's fix was measured and gains under HEALTHY_BELOW, the
    job is healthy whatever its author expected, so it is right only with no warning standing at the
    end, and every warning shown is false. Applied to a result row after its fix is measured."""
    fix = row.get("fix") or {}
    if fix.get("speedup") is None or fix["speedup"] >= HEALTHY_BELOW or "top_timeline" not in row:
        return row
    loud = [t for t in row["top_timeline"] if t.get("severity") in ("warning", "critical")]
    wrong = list(dict.fromkeys(t["top"] for t in loud))
    standing = bool(row["top_timeline"]) and row["top_timeline"][-1].get("severity") in ("warning", "critical")
    return {**row, "written_ok": row["ok"], "measured_truth": "healthy", "ok": not standing,
            "correct": not standing, "first_seen_s": None, "t_correct_s": None,
            "false_warnings": len(wrong), "false_warning_ids": wrong}


def false_warnings(report: dict, want: str | None) -> list[str]:
    """Every warning-level top finding the watch showed that is not the job's truth (``want``:
    the finding id the truth accepts, None for a healthy job)."""
    out = []
    for row in report.get("top_timeline", []):
        if row.get("severity") in ("warning", "critical") and row.get("top") != want and row.get("top") not in out:
            out.append(row["top"])
    return out


def right(mode: str, report: dict) -> tuple[bool, float | None, str]:
    """(right verdict, seconds after attaching it was first shown, the finding's title)."""
    findings = report.get("findings", [])
    seen = {s["id"]: s["first_seen_s"] for s in report.get("seen", [])}
    if mode == "healthy":
        loud = [f for f in findings if f["severity"] in ("warning", "critical")]
        return (not loud, None, loud[0]["title"] if loud else "(no warning)")
    want = "rank-straggler" if mode in ("straggler", "compute") else "stuck"
    f = next((f for f in findings if f["id"] == want), None)
    if f is None:
        top = findings[0]["title"] if findings else "(nothing)"
        return False, None, top
    if mode == "straggler":
        # Named with what it does instead: its slow function, from its own stacks.
        named = "rank 1 is the straggler" in f["title"] and "load_batch" in " ".join(f.get("evidence", []))
    elif mode == "compute":
        named = "rank 1 is the straggler" in f["title"] and "computes on GPU" in " ".join(f.get("evidence", []))
    else:
        named = "rank 1 (pid" in f["title"] and "never arrives" in f["title"]
    return named, seen.get(want), f["title"]


def start_job(mode: str, device: str, log: Path, fresh: bool, fixed: bool = False) -> subprocess.Popen:
    env = dict(os.environ, **NVLS_OFF, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT / "bench" / "jobs") + os.pathsep + env.get("PYTHONPATH", "")
    script = fresh_script(mode) if fresh else Path(__file__).resolve()
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                                 str(script), "--job", mode, "--device", device, *(["--fixed"] if fixed else [])],
                                stdout=out, stderr=subprocess.STDOUT, env=env)


def rate_of(log: Path, t0: float, t1: float) -> float | None:
    """Rank 0's samples/s between two times, from its rate lines."""
    pts = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if parts[:2] == ["gputop-workload", "rate"]:
            kv = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
            t = float(kv["t"])
            if t0 <= t <= t1:
                pts.append((t, int(kv["samples"])))
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


MEASURE_S = 6.0  # each variant's throughput window, for a straggler's measured fix


def measure_fix(mode: str, device: str, tmp: Path) -> dict:
    """A held-out straggler's truth measured: the job as written and with its fix (``--fixed``),
    each past its warm-up for MEASURE_S; the speed-up of rank 0's samples/s."""
    rates = {}
    for fixed in (False, True):
        log = tmp / f"{mode}-{'fixed' if fixed else 'as-is'}-rate.log"
        job = start_job(mode, device, log, fresh=True, fixed=fixed)
        try:
            t0 = time.monotonic()
            while log.read_text().count("ready") < 2 and job.poll() is None and time.monotonic() - t0 < 180:
                time.sleep(0.2)
            time.sleep(2.0)
            start = time.time()
            time.sleep(MEASURE_S)
            rates["fixed" if fixed else "as_is"] = rate_of(log, start, time.time())
        finally:
            kill_job(job)
    a, b = rates.get("as_is"), rates.get("fixed")
    return {"rate_as_is": a, "rate_fixed": b, "speedup": round(b / a, 2) if a and b else None}


def run_one(mode: str, device: str, duration: float, tmp: Path, fresh: bool = False,
            record_dir: Path | None = None) -> dict:
    log = tmp / f"{mode}.log"
    job = start_job(mode, device, log, fresh)
    try:
        t0 = time.monotonic()
        while log.read_text().count("ready") < 2:
            if job.poll() is not None or time.monotonic() - t0 > 180:
                return {"mode": mode, "ok": False, "error": "job did not start: " + log.read_text()[-500:]}
            time.sleep(0.2)
        time.sleep(max(0.0, t0 + ATTACH_AFTER_S - time.monotonic()))
        started = time.monotonic()
        # The session kept (--record-dir): a miss is then replayed through the advisor, not guessed at.
        rec = [] if record_dir is None else ["--record", str(record_dir / f"{mode}.gputop")]
        res = subprocess.run([sys.executable, "-m", "gputop", "advise", "--pid", str(job.pid), "--duration",
                              str(duration), "--json", *rec], capture_output=True, text=True, timeout=duration + 120,
                             cwd=ROOT)
        wall = time.monotonic() - started
        if res.returncode != 0:
            return {"mode": mode, "ok": False, "error": res.stderr.strip()[-500:]}
        report = json.loads(res.stdout)
        if fresh:
            truth = fresh_truths()[mode]
            ok, first, title = fresh_right(truth, report)
            # An inefficiency has no finding id of its own: the one that named its fix is the truth.
            want = wanted_finding(truth) or next((f["id"] for f in report.get("findings", [])
                                                  if ok and f["title"] == title), None)
        else:
            ok, first, title = right(mode, report)
            want = {"healthy": None, "straggler": "rank-straggler", "compute": "rank-straggler"}.get(mode, "stuck")
        top = next((f for f in report.get("findings", []) if f["title"] == title), None)
        wrong = false_warnings(report, want)
        return {"mode": mode, "fresh": fresh, "ok": ok, "correct": ok, "first_seen_s": first,
                "t_correct_s": first if ok else None, "false_warnings": len(wrong), "false_warning_ids": wrong,
                "title": title, "advise_wall_s": round(wall, 1),
                "evidence": (top or {}).get("evidence", [])[:3],
                "findings": [f["id"] for f in report.get("findings", [])],
                "top_timeline": report.get("top_timeline", []),
                # What each evaluation saw: a miss is explained from this, not guessed at.
                "evaluation_log": report.get("evaluation_log", [])[:30],
                "attach_errors": report.get("attach_errors", [])}
    finally:
        kill_job(job)


def kill_job(job: subprocess.Popen) -> None:
    """The launcher and its ranks (torchrun starts each rank in a process group of its own)."""
    import psutil

    try:
        procs = psutil.Process(job.pid).children(recursive=True)
    except psutil.Error:
        procs = []
    for p in [*procs, job]:
        try:
            p.kill()
        except (psutil.Error, ProcessLookupError):
            pass
    job.wait(timeout=30)
    psutil.wait_procs(procs, timeout=10)


def machine(device: str) -> str:
    host = socket.gethostname()
    if device != "cuda":
        return f"{host}, CPU only ({os.cpu_count()} cores), gloo"
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=20).stdout.split("\n")
        gpus = [n.strip() for n in names if n.strip()]
    except (OSError, subprocess.SubprocessError):
        gpus = []
    return f"{host}, {len(gpus)} x {gpus[0] if gpus else 'GPU'}, NCCL, {os.cpu_count()} cores"


def markdown(doc: dict) -> str:
    lines = [f"# Multi-rank jobs: the right verdict after attaching to the launcher", "",
             f"Machine: {doc['machine']}. `python -m gputop advise --pid LAUNCHER --duration {doc['duration_s']:g} --json`, "
             f"attached {ATTACH_AFTER_S:g} s after the job started; time = the finding's `first_seen_s`.", "",
             "| job | right | time to the verdict | false warnings | what gputop said |", "| --- | --- | --- | --- | --- |"]
    for fresh in (False, True):
        rows = [r for r in doc["results"] if bool(r.get("fresh")) == fresh]
        if not rows:
            continue
        if fresh:
            lines += ["", "Held out: written apart from the rules, before any rule change for them, never tuned on "
                          "(bench/jobs/multi_rank_fresh*.py).", "",
                      "| job | right | time to the verdict | false warnings | measured fix | what gputop said |",
                      "| --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            when = "-" if r.get("first_seen_s") is None else f"{r['first_seen_s']:.1f} s"
            said = (r.get("title") or r.get("error", "")) + "".join(f" ({e})" for e in r.get("evidence", [])[:1]
                                                                   if r.get("ok") and "straggler" in (r.get("title") or ""))
            said = said.replace("|", "\\|")
            fw = str(r.get("false_warnings", "-")) + (f" ({', '.join(r['false_warning_ids'])})" if r.get("false_warning_ids") else "")
            fix = r.get("fix") or {}
            fix_txt = f"{fix['speedup']:.2f}x" if fix.get("speedup") else "-"
            if r.get("measured_truth"):  # graded by the measured fix, not by what its author expected
                fix_txt += f" (< {HEALTHY_BELOW:.2f}x: healthy)"
            lines.append(f"| {r['mode']} | {'yes' if r['ok'] else 'NO'} | {when} | {fw} |"
                         + (f" {fix_txt} |" if fresh else "") + f" {said} |")
        right_n = sum(r["ok"] for r in rows)
        times = sorted(r["first_seen_s"] for r in rows if r.get("ok") and r.get("first_seen_s") is not None)
        med = f", median {times[len(times) // 2] if len(times) % 2 else (times[len(times) // 2 - 1] + times[len(times) // 2]) / 2:.1f} s" if times else ""
        lines += ["", f"{'Held out' if fresh else 'In-sample'}: {right_n} of {len(rows)} right{med}, "
                      f"{sum(r.get('false_warnings', 0) for r in rows)} false warnings."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds each advise run watches")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for multi_rank.{json,md} (default bench/results on CUDA; required on CPU)")
    ap.add_argument("--fresh", default="all",
                    help="held-out jobs of bench/jobs/multi_rank_fresh*.py to run too (comma list, 'all' or '')")
    ap.add_argument("--measure-fixes", action="store_true", help="also measure each held-out straggler's fix")
    ap.add_argument("--fixes-only", action="store_true",
                    help="only measure the held-out stragglers' fixes (no advise), into fixes.json")
    ap.add_argument("--record-dir", type=Path, default=None,
                    help="keep each advise session as DIR/MODE.gputop (for replaying a miss)")
    ap.add_argument("--job", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.record_dir is not None:
        args.record_dir.mkdir(parents=True, exist_ok=True)
    if args.job:
        run_job(args.job, args.device)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        print(f"--modes: choose from {', '.join(MODES)}", file=sys.stderr)
        return 2
    truths = fresh_truths()
    fresh = list(truths) if args.fresh == "all" else [m for m in args.fresh.split(",") if m]
    if any(m not in truths for m in fresh):
        print(f"--fresh: choose from {', '.join(truths)}", file=sys.stderr)
        return 2
    out = args.out
    if out is None:
        if args.device != "cuda":
            print("--device cpu needs --out: CPU results are not the GPU results in bench/results", file=sys.stderr)
            return 2
        out = ROOT / "bench" / "results"
    if args.device == "cuda" and out.resolve() == (ROOT / "bench" / "results").resolve():
        try:
            import torch

            if torch.cuda.device_count() < 2:
                print("needs 2 GPUs (torch sees fewer)", file=sys.stderr)
                return 2
        except ImportError:
            print("needs torch", file=sys.stderr)
            return 2
    if args.fixes_only:
        fixes = {}
        with tempfile.TemporaryDirectory() as tmp:
            for m in fresh:
                if truths[m]["verdict"] not in ("stuck", "desync", "healthy"):
                    fixes[m] = measure_fix(m, args.device, Path(tmp))
                    print(json.dumps({m: fixes[m]}), flush=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "fixes.json").write_text(json.dumps({"machine": machine(args.device), "measure_s": MEASURE_S,
                                                    "fixes": fixes}, indent=2) + "\n")
        return 0
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in modes:
            r = run_one(m, args.device, args.duration, Path(tmp), record_dir=args.record_dir)
            print(json.dumps(r), flush=True)
            results.append(r)
        for m in fresh:
            r = run_one(m, args.device, args.duration, Path(tmp), fresh=True, record_dir=args.record_dir)
            r["truth"] = truths[m]
            if args.measure_fixes and truths[m]["verdict"] not in ("stuck", "desync", "healthy"):
                r["fix"] = measure_fix(m, args.device, Path(tmp))
                r = measured_grade(r)
            print(json.dumps(r), flush=True)
            results.append(r)
    doc = {"machine": machine(args.device), "device": args.device, "platform": platform.platform(),
           "duration_s": args.duration, "attach_after_s": ATTACH_AFTER_S, "nvls_off": NVLS_OFF, "results": results}
    out.mkdir(parents=True, exist_ok=True)
    (out / "multi_rank.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "multi_rank.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
