"""What the job view (`gputop job`) costs at up to 1,024 ranks, on synthetic series, and how soon
and how steadily it names a straggler and a hang end to end.

The view judges a window, not an instant (fleet.memory): `--once` and the live view's first
refresh read the last minute evaluated every 5 s (one subquery: 13 steps), a later refresh the
last 3 steps. Each is one answer holding every rank series of the job at each step (about 12
per rank), then: JSON decoding, parsing the matrix, building the job at each step, judging each
step and applying the hold rule, and laying out the lines. The network and Prometheus's own
evaluation are not in it (they depend on the server); the answer's size is reported so that
transfer can be estimated. Answers are made by tests/job_series.py in the API's documented
format: a job with a data straggler, and the same job with one rank that never arrives.

Then, where the `prometheus` binary and torch are present, the time to name each end to end: the
CPU setup of the across-hosts test (tests/two_hosts.py: two 4-rank torchrun gloo jobs, each split
over two "hosts" with their own `gputop export --attach all`, a real Prometheus scraping both at
1 s), polled every 0.5 s as `gputop job --once` reads it (the last minute through the hold rule):
seconds from the jobs' start, and from the moment every rank is past its first all_reduce (when
the straggler starts to lag and the hung rank stops arriving), to the view naming each; when one
evaluation alone (the newest step, no hold rule: what the view did before) first named it; how
long one `gputop job --once` took then; and, over the next 20 s, how often each changed its
verdict (the flicker the hold rule is for).

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

from gputop.fleet import LOOK_BACK_S, Memory, build_jobs, judge, parse_matrix  # noqa: E402
from gputop.present.job import job_lines  # noqa: E402
from job_series import TS, job_matrix, job_payload  # noqa: E402

RUNS = 10
STEP_S = 5.0
ONCE_STEPS = int(LOOK_BACK_S / STEP_S) + 1  # 13: what --once and the first refresh read
REFRESH_STEPS = 3  # what a later live refresh reads (the last three steps)
E2E_RUNS = 3
E2E_JOBS = {"bench-straggler": ("straggler", 3), "bench-hang": ("hang", 1)}
E2E_DEADLINE_S = 120
WATCH_AFTER_S = 20.0  # how long the verdicts are watched for changes once both are named


def _said(j, case: str):
    """What a judgement says of the case: the rank named, or None."""
    if case == "straggler":
        return (j.straggler.slow.rank, j.straggler.slow.host) if j.straggler and j.straggler.waiting == 3 else None
    return tuple((n.rank.rank, n.rank.host) for n in j.never_arrives) or None


def e2e_once() -> dict:
    """One end-to-end run: seconds to name the straggler and the rank that never arrives, and
    how often the verdicts changed afterwards."""
    from two_hosts import TwoHosts, verdict, view

    out: dict = {}
    cases = {"straggler": "bench-straggler", "hang": "bench-hang"}
    with tempfile.TemporaryDirectory() as tmp, TwoHosts(Path(tmp), E2E_JOBS, stuck_after=3.0) as hosts:
        ready: dict[str, float] = {}
        raw_first: dict[str, float] = {}
        last = {c: {"held": None, "raw": None} for c in cases}
        flips = {c: {"held": 0, "raw": 0} for c in cases}
        done_at: float | None = None
        while time.monotonic() - hosts.t0 < E2E_DEADLINE_S:
            hosts.check_alive()
            now = time.monotonic() - hosts.t0
            if done_at is not None and now - done_at >= WATCH_AFTER_S:
                break
            for case, job in cases.items():
                if job not in ready and hosts.ready(job):
                    ready[job] = now
                got = verdict(hosts.api, job)
                if got is None:
                    continue
                held, raw = _said(got[1], case), _said(judge(got[0]), case)
                if raw is not None and case not in raw_first:
                    raw_first[case] = now
                if case in out:  # named: count the changes from here on
                    for kind, said in (("held", held), ("raw", raw)):
                        flips[case][kind] += said != last[case][kind]
                elif held is not None:
                    r = got[1].straggler.slow if case == "straggler" else got[1].never_arrives[0].rank
                    out[case] = {"named": f"rank {r.rank} on {r.host}", "from_start_s": now,
                                 "from_ready_s": now - ready.get(job, now),
                                 "one_evaluation_s": raw_first.get(case, now) - ready.get(job, now),
                                 "once_s": view(hosts.api, job)[1]}
                last[case] = {"held": held, "raw": raw}
            if done_at is None and len(out) == len(cases):
                done_at = time.monotonic() - hosts.t0
            time.sleep(0.5)
        for case in out:
            out[case]["changes_after"] = flips[case]
            out[case]["replay_1s"] = replay(hosts.api, cases[case], case)
    return out


def replay(api: str, job: str, case: str) -> dict:
    """The run's whole history at 1 s steps (what Prometheus kept), judged step by step alone and
    through the hold rule: how often each changed its verdict once it had first named the case."""
    from gputop.commands.job import fetch_steps

    steps = fetch_steps(api, job, E2E_DEADLINE_S, 1.0)
    mem = Memory(step_s=1.0)
    said: dict[str, list] = {"raw": [], "held": []}
    for ts, j in steps:
        mem.feed(ts, j)
        said["raw"].append(_said(judge(j), case))
        said["held"].append(_said(mem.judgement(), case))

    def changes(xs: list) -> int:
        first = next((i for i, x in enumerate(xs) if x is not None), len(xs))
        return sum(a != b for a, b in zip(xs[first:], xs[first + 1:]))

    return {"steps": len(steps), "raw": changes(said["raw"]), "held": changes(said["held"])}


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
    series = parse_matrix(payload)
    t.append(time.perf_counter())
    steps = build_jobs("exp-42", series)
    t.append(time.perf_counter())
    mem = Memory(step_s=STEP_S)
    mem.feed_all(steps)
    j = mem.judgement()
    t.append(time.perf_counter())
    job_lines(mem.job, j, 77, "now", STEP_S)
    t.append(time.perf_counter())
    names = ("json", "parse", "model", "judge", "lines")
    out = {n: (t[i + 1] - t[i]) * 1e3 for i, n in enumerate(names)}
    out["total"] = (t[-1] - t[0]) * 1e3
    out["_named"] = (j.straggler.slow.rank if j.straggler else None,
                     [n.rank.rank for n in j.never_arrives])
    return out


def measure(ranks: int, case: str, steps: int) -> dict:
    kw = {"straggler": ranks - 3} if case == "straggler" else {"stuck": ranks // 2 + 1}
    payload = job_payload(ranks, per_host=8, **kw)
    body = json.dumps(job_matrix([(TS + STEP_S * k, payload) for k in range(steps)])).encode()
    one(body)  # warm
    runs = [one(body) for _ in range(RUNS)]
    named = runs[0]["_named"]
    keys = ("json", "parse", "model", "judge", "lines")
    return {"ranks": ranks, "case": case, "steps": steps, "series": len(payload["data"]["result"]),
            "answer_bytes": len(body), "named_straggler": named[0], "named_never_arrives": named[1],
            "ms_median": {k: round(statistics.median(r[k] for r in runs), 3) for k in (*keys, "total")},
            "ms_max": {k: round(max(r[k] for r in runs), 3) for k in (*keys, "total")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for across_hosts.json and .md")
    ap.add_argument("--no-e2e", action="store_true", help="only the refresh part (no jobs, no Prometheus)")
    args = ap.parse_args()
    rows = [measure(n, c, k) for k in (ONCE_STEPS, REFRESH_STEPS) for n in (64, 256, 1024)
            for c in ("straggler", "never-arrives")]
    end = {"skipped": "--no-e2e"} if args.no_e2e else e2e()
    meta = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "load_avg": [round(x, 2) for x in os.getloadavg()], "runs": RUNS,
            "note": "Measured on a shared 2-core development machine (other work running), no network"}
    md = ["# Job view: what a refresh costs at up to 1,024 ranks, and how soon it names", "",
          f"Generated by `python bench/across_hosts.py` on {meta['platform']}, {meta['cpus']} CPUs, Python "
          f"{meta['python']}; load average at the end {tuple(meta['load_avg'])}. {meta['note']}.", "",
          f"`--once` and the live view's first refresh read the last minute evaluated every {STEP_S:g} s "
          f"({ONCE_STEPS} steps, one subquery); a later live refresh reads the last {REFRESH_STEPS}. Each: the "
          "answer (every rank series of the job at each step) decoded, parsed, built into the job at each step, "
          "each step judged across ranks and the hold rule applied, and the view laid out as lines. Synthetic "
          "answers in the API's format (tests/job_series.py), 8 ranks per host, the job the same at every step. "
          f"The network and Prometheus's own query time are not included. Milliseconds, median (max) of {RUNS} runs.",
          "",
          "| steps | ranks | case | series | answer | named | JSON | parse | model | judge | lines | total |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, x = r["ms_median"], r["ms_max"]
        named = f"rank {r['named_straggler']}" if r["case"] == "straggler" else \
            ", ".join(f"rank {k}" for k in r["named_never_arrives"]) or "none (weighing)"
        if r["case"] == "straggler" and r["named_straggler"] is None:
            named = "none (weighing)"
        md.append(f"| {r['steps']} | {r['ranks']:,} | {r['case']} | {r['series']:,} | {r['answer_bytes'] / 1e6:.2f} MB "
                  f"| {named} | "
                  + " | ".join(f"{m[k]:.1f} ({x[k]:.1f})"
                               for k in ("json", "parse", "model", "judge", "lines", "total"))
                  + " |")
    md += ["", "## Time to name, end to end (CPU, two hosts, a real Prometheus)", ""]
    if "skipped" in end:
        md.append(f"Not measured: {end['skipped']}.")
    else:
        md += ["Two 4-rank torchrun gloo jobs side by side, each split over two \"hosts\" (2 ranks each, "
               "one `gputop export --attach all --interval 0.5 --stuck-after 3` per host on 127.0.0.2 and "
               "127.0.0.3), Prometheus 1 s scrapes, the view polled every 0.5 s as `gputop job --once` reads it "
               f"(the last minute at {STEP_S:g} s steps through the hold rule: named once held 10 s). *Ready*: every "
               "rank of the job past its first all_reduce (when the straggler starts to lag, the hung rank stops "
               "arriving). The straggler counts as named once all three others are sampled. *One evaluation*: when "
               "the newest step alone first named it (what the view said before the hold rule), from ready. "
               "`--once`: one `gputop job --once` at that moment, the CLI's start included. *Changes*: over the "
               f"next {WATCH_AFTER_S:g} s of polls, how often the held verdict and the newest step alone changed "
               "what they said of the case. *Replayed at 1 s*: the run's whole history as Prometheus kept it, "
               "evaluated every second, judged one evaluation at a time and through the hold rule: the changes "
               "once each had first named the case, of that many evaluations.", "",
               "| run | case | named | from the jobs' start | from ready | one evaluation, from ready | `--once` "
               "| changes: held / one evaluation | replayed at 1 s: held / one evaluation |",
               "|---|---|---|---|---|---|---|---|---|"]
        for i, run in enumerate(end["runs"], 1):
            for case in ("straggler", "hang"):
                r = run.get(case)
                rp = r.get("replay_1s", {}) if r else {}
                md.append(f"| {i} | {case} | not named in {E2E_DEADLINE_S} s | | | | | | |" if r is None else
                          f"| {i} | {case} | {r['named']} | {r['from_start_s']:.1f} s | {r['from_ready_s']:.1f} s | "
                          f"{r['one_evaluation_s']:.1f} s | {r['once_s']:.1f} s | "
                          f"{r['changes_after']['held']} / {r['changes_after']['raw']} | "
                          f"{rp.get('held', '-')} / {rp.get('raw', '-')} of {rp.get('steps', '-')} |")
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
