"""What one refresh of the job view (`gputop job`) costs at 1,024 ranks, on synthetic series.

A refresh is one instant query whose answer holds every rank series of the job (about 12 per
rank), then: JSON decoding, parsing the vector, building the job model, judging across ranks
(straggler, never-arrives, missing ranks) and laying out the lines. The network and Prometheus's
own evaluation are not in it (they depend on the server); the answer's size is reported so that
transfer can be estimated. Answers are made by tests/job_series.py in the API's documented
format: a job with a data straggler, and the same job with one rank that never arrives.

Then, where the `prometheus` binary and torch are present, the time to name each end to end: the
CPU setup of the across-hosts test (tests/two_hosts.py: two 4-rank torchrun gloo jobs, each split
over two "hosts" with their own `gputop export --attach all`, a real Prometheus scraping both at
1 s), polled every 0.5 s as `gputop job` reads it: seconds from the jobs' start, and from the
moment every rank is past its first all_reduce (when the straggler starts to lag and the hung rank
stops arriving), to the view naming each; and how long one `gputop job --once` took then.

    python bench/across_hosts.py --out bench/results     # writes across_hosts.json and .md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from gputop.fleet import build_job, judge, parse_vector  # noqa: E402
from gputop.present.job import job_lines  # noqa: E402
from job_series import job_payload  # noqa: E402

RUNS = 20
E2E_RUNS = 3
E2E_JOBS = {"bench-straggler": ("straggler", 3), "bench-hang": ("hang", 1)}
E2E_DEADLINE_S = 120


def e2e_once() -> dict:
    """One end-to-end run: seconds to name the straggler and the rank that never arrives."""
    from two_hosts import TwoHosts, verdict, view

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp, TwoHosts(Path(tmp), E2E_JOBS, stuck_after=3.0) as hosts:
        ready: dict[str, float] = {}
        while len(out) < 2 and time.monotonic() - hosts.t0 < E2E_DEADLINE_S:
            hosts.check_alive()
            now = time.monotonic() - hosts.t0
            for job in E2E_JOBS:
                if job not in ready and hosts.ready(job):
                    ready[job] = now
            got = verdict(hosts.api, "bench-straggler")
            if "straggler" not in out and got and got[1].straggler and got[1].straggler.waiting == 3:
                s = got[1].straggler.slow
                out["straggler"] = {"named": f"rank {s.rank} on {s.host}", "from_start_s": now,
                                    "from_ready_s": now - ready.get("bench-straggler", now),
                                    "once_s": view(hosts.api, "bench-straggler")[1]}
            got = verdict(hosts.api, "bench-hang")
            if "hang" not in out and got and got[1].never_arrives:
                r = got[1].never_arrives[0].rank
                out["hang"] = {"named": f"rank {r.rank} on {r.host}", "from_start_s": now,
                               "from_ready_s": now - ready.get("bench-hang", now),
                               "once_s": view(hosts.api, "bench-hang")[1]}
            time.sleep(0.5)
    return out


def e2e() -> dict:
    from two_hosts import PROMETHEUS

    if PROMETHEUS is None:
        return {"skipped": "no `prometheus` binary on PATH: the end-to-end timings need a machine with it"}
    try:
        import torch  # noqa: F401
    except ImportError:
        return {"skipped": "torch is not importable: the end-to-end timings need it (CPU build)"}
    import subprocess

    version = subprocess.run([PROMETHEUS, "--version"], capture_output=True, text=True).stdout.split("\n", 1)[0]
    runs = [e2e_once() for _ in range(E2E_RUNS)]
    return {"runs": runs, "prometheus": version}


def one(body: bytes) -> dict[str, float]:
    t = [time.perf_counter()]
    payload = json.loads(body)
    t.append(time.perf_counter())
    series = parse_vector(payload)
    t.append(time.perf_counter())
    job = build_job("exp-42", series)
    t.append(time.perf_counter())
    j = judge(job)
    t.append(time.perf_counter())
    job_lines(job, j, 77, "now", 5.0)
    t.append(time.perf_counter())
    names = ("json", "parse", "model", "judge", "lines")
    out = {n: (t[i + 1] - t[i]) * 1e3 for i, n in enumerate(names)}
    out["total"] = (t[-1] - t[0]) * 1e3
    out["_named"] = (j.straggler.slow.rank if j.straggler else None,
                     [n.rank.rank for n in j.never_arrives])
    return out


def measure(ranks: int, case: str) -> dict:
    kw = {"straggler": ranks - 3} if case == "straggler" else {"stuck": ranks // 2 + 1}
    body = json.dumps(job_payload(ranks, per_host=8, **kw)).encode()
    one(body)  # warm
    runs = [one(body) for _ in range(RUNS)]
    named = runs[0]["_named"]
    keys = ("json", "parse", "model", "judge", "lines", "total")
    return {"ranks": ranks, "case": case, "series": len(json.loads(body)["data"]["result"]),
            "answer_bytes": len(body), "named_straggler": named[0], "named_never_arrives": named[1],
            "ms_median": {k: round(statistics.median(r[k] for r in runs), 3) for k in keys},
            "ms_max": {k: round(max(r[k] for r in runs), 3) for k in keys}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for across_hosts.json and .md")
    ap.add_argument("--no-e2e", action="store_true", help="only the refresh part (no jobs, no Prometheus)")
    args = ap.parse_args()
    rows = [measure(n, c) for n in (64, 256, 1024) for c in ("straggler", "never-arrives")]
    end = {"skipped": "--no-e2e"} if args.no_e2e else e2e()
    meta = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "load_avg": [round(x, 2) for x in os.getloadavg()], "runs": RUNS,
            "note": "Measured on a shared 2-core development machine (other work running), no network"}
    md = ["# Job view refresh: parse and judge at up to 1,024 ranks", "",
          f"Generated by `python bench/across_hosts.py` on {meta['platform']}, {meta['cpus']} CPUs, Python "
          f"{meta['python']}; load average at the end {tuple(meta['load_avg'])}. {meta['note']}.", "",
          "One refresh = one instant query's answer (every rank series of the job) decoded, parsed, built into "
          "the job model, judged across ranks and laid out as lines. Synthetic answers in the API's format "
          "(tests/job_series.py), 8 ranks per host. The network and Prometheus's own query time are not "
          f"included. Milliseconds, median (max) of {RUNS} runs.", "",
          "| ranks | case | series | answer | named | JSON | parse | model | judge | lines | total |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, x = r["ms_median"], r["ms_max"]
        named = f"rank {r['named_straggler']}" if r["case"] == "straggler" else \
            ", ".join(f"rank {k}" for k in r["named_never_arrives"])
        md.append(f"| {r['ranks']:,} | {r['case']} | {r['series']:,} | {r['answer_bytes'] / 1e6:.2f} MB | {named} | "
                  + " | ".join(f"{m[k]:.1f} ({x[k]:.1f})" for k in ("json", "parse", "model", "judge", "lines", "total"))
                  + " |")
    md += ["", "## Time to name, end to end (CPU, two hosts, a real Prometheus)", ""]
    if "skipped" in end:
        md.append(f"Not measured: {end['skipped']}.")
    else:
        md += ["Two 4-rank torchrun gloo jobs side by side, each split over two \"hosts\" (2 ranks each, "
               "one `gputop export --attach all --interval 0.5 --stuck-after 3` per host on 127.0.0.2 and "
               "127.0.0.3), Prometheus 1 s scrapes, the view polled every 0.5 s. *Ready*: every rank of the job "
               "past its first all_reduce (when the straggler starts to lag, the hung rank stops arriving). "
               "The straggler counts as named once all three others are sampled. `--once`: one "
               "`gputop job --once` at that moment, the CLI's start included.", "",
               "| run | case | named | from the jobs' start | from ready | `--once` |", "|---|---|---|---|---|---|"]
        for i, run in enumerate(end["runs"], 1):
            for case in ("straggler", "hang"):
                r = run.get(case)
                md.append(f"| {i} | {case} | not named in {E2E_DEADLINE_S} s | | | |" if r is None else
                          f"| {i} | {case} | {r['named']} | {r['from_start_s']:.1f} s | {r['from_ready_s']:.1f} s | "
                          f"{r['once_s']:.1f} s |")
    text = "\n".join(md) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "across_hosts.json").write_text(json.dumps({"meta": meta, "rows": rows, "e2e": end},
                                                               indent=2) + "\n")
        (args.out / "across_hosts.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
