"""Recording benchmark: a synthetic 24 h session of one GPU at default rates.

Measures what the recording targets are stated in:
- size of the file for 24 h (target <= 50 MB), and bytes per GPU-hour;
- open-to-first-frame on that file (target < 1 s): open, read the first frame into a store and
  the overview the timeline draws, in a fresh process; plus the Textual app's first render;
- seek anywhere (target < 100 ms): the store reset and refilled with the state at a random time;
- the recorder's CPU: seconds of CPU per hour of default-rate data, and an A/B of a running
  pipeline with and without the recorder attached.

Runs on CPU only:  python bench/record_bench.py --out DIR  (writes DIR/record_bench.json/.md)
Default rates: 1 s GPU polls, 5 utilisation points/s, 1 host sample/s, 4 processes/s, stack
samples at 5 Hz for 4 threads (see tests/synth_recording.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the scripted recording lives with the tests' other scripts

from gputop.pipeline import Pipeline  # noqa: E402
from gputop.record.reader import Reader  # noqa: E402
from synth_recording import Rates, SyntheticSession  # noqa: E402
from gputop.record.recorder import FLUSH_INTERVAL_S, Recorder  # noqa: E402
from gputop.record.writer import RecordWriter, SessionMeta  # noqa: E402
from gputop.record.replay import ReplaySource  # noqa: E402
from gputop.store import Store  # noqa: E402

SIZE_TARGET_MB = 50.0
OPEN_TARGET_S = 1.0
SEEK_TARGET_MS = 100.0


def write_session(path: Path, seconds: int, flush_s: float, log) -> dict:
    """Write ``seconds`` of synthetic session through the real writer, ``flush_s`` per flush."""
    ss = SyntheticSession()
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="fake", target_pid=4_194_300, target_cmdline="python train.py", interval=1.0))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    gen = 0.0
    parts = max(1, round(1.0 / flush_s))
    for k in range(seconds):
        g0 = time.process_time()
        batch = ss.second(k)
        gen += time.process_time() - g0
        if parts == 1:
            w.flush(batch)
        else:
            t = ss.t0 + k
            for j in range(parts):
                lo, hi = t + j / parts, t + (j + 1) / parts
                w.flush([s for s in batch if lo < s.ts <= hi or (j == 0 and s.ts <= lo)])
        if k and k % 7200 == 0:
            log(f"  {k / 3600:.0f} h written, {path.stat().st_size / 1e6:.1f} MB")
    w.finish()
    cpu = time.process_time() - cpu0 - gen
    return {
        "seconds": seconds,
        "samples": w.samples,
        "flush_s": flush_s,
        "writer_cpu_s": round(cpu, 2),
        "writer_cpu_s_per_hour": round(cpu / (seconds / 3600), 2),
        "writer_core_percent": round(100 * cpu / seconds, 3),
        "wall_s": round(time.perf_counter() - wall0, 1),
    }


def table_sizes(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC").fetchall()
    except sqlite3.Error:
        rows = []
    conn.close()
    return {n: int(s) for n, s in rows}


_FIRST_FRAME = r"""
import sys, time, json
t0 = time.perf_counter()
from gputop.record.reader import Reader
from gputop.record.navigate import Navigator
from gputop.record.replay import ReplaySource
from gputop.store import Store
from gputop.pipeline import Pipeline
t_import = time.perf_counter()
r = Reader(sys.argv[1])
store = Store()
src = ReplaySource(r, Navigator(r), paused=True)
pipe = Pipeline(store, [src]); src.attach(pipe.publish)
pipe.poll_once()
t_frame = time.perf_counter()
ok = bool(store.gpu_indices()) and store.latest_gpu(0) is not None
r.overview(); src.idle_periods(); src.finding_marks()
t_timeline = time.perf_counter()
print(json.dumps({"import_s": t_import - t0, "first_frame_s": t_frame - t_import,
                  "with_timeline_s": t_timeline - t_import, "ok": ok}))
"""

_APP_FRAME = r"""
import asyncio, sys, time, json
t0 = time.perf_counter()
from gputop.session import open_replay
from gputop.ui.app import GputopApp
async def main():
    s = open_replay(sys.argv[1], paused=True, advisor=False)
    app = GputopApp(s, interval=1.0)
    s.pipeline.start()
    try:
        async with app.run_test(size=(140, 45)) as pilot:
            while not list(app.screen.query(".gpu-panel")):
                await pilot.pause(0.01)
            t = time.perf_counter() - t0
    finally:
        s.pipeline.stop()
    return t
print(json.dumps({"app_first_frame_s": asyncio.run(main())}))
"""


def first_frame(path: Path, runs: int, code: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = []
    for _ in range(runs):
        res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
                             timeout=120)
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-2000:])
        out.append(json.loads(res.stdout.strip().splitlines()[-1]))
    return out


def seeks(path: Path, n: int, seed: int = 7) -> dict:
    r = Reader(path)
    store = Store()
    src = ReplaySource(r, paused=True)
    pipe = Pipeline(store, [src])
    src.attach(pipe.publish)
    pipe.poll_once()
    rnd = random.Random(seed)
    cold, warm = [], []
    for _ in range(n):
        ts = rnd.uniform(src.start_ts, src.end_ts)
        r._cache.clear()  # every block decoded from the file: a jump to a part not seen yet
        t = time.perf_counter()
        src.seek(ts)
        cold.append(1000 * (time.perf_counter() - t))
        assert store.now <= ts and store.latest_gpu(0) is not None
        t = time.perf_counter()
        src.seek(ts + rnd.uniform(-30, 30))  # a nearby jump: blocks mostly cached
        warm.append(1000 * (time.perf_counter() - t))
    r.close()

    def stats(v: list[float]) -> dict:
        v = sorted(v)
        return {"median_ms": round(statistics.median(v), 1), "p95_ms": round(v[int(0.95 * (len(v) - 1))], 1),
                "max_ms": round(v[-1], 1)}

    return {"n": n, "cold": stats(cold), "nearby": stats(warm)}


class _SyntheticStacks:
    """py-spy's volume without py-spy: 4 threads' stacks every 200 ms (the synthetic job's)."""

    name = "stacks"
    interval = 0.2

    def __init__(self) -> None:
        self.ss = SyntheticSession(t0=time.time())

    def poll(self) -> list[object]:
        t = time.time()
        return [s for s in self.ss._stacks(t, False) if s.ts >= t - 0.2]

    def close(self) -> None:
        pass


def ab_overhead(seconds: float, tmp: Path, rounds: int) -> dict:
    """CPU of gputop's own collection (the real host source, a GPU source, and stack samples at
    py-spy's rate) for ``seconds``, without and with the recorder attached, interleaved."""
    from gputop.session import Config, open_live

    def run(record: bool, i: int) -> float:
        try:
            session = open_live(Config(interval=1.0, advisor=False))
            if session.gpu is None:
                raise RuntimeError("no GPU")
        except Exception:
            session = open_live(Config(interval=1.0, fake=1, advisor=False))
        session.pipeline.add_source(_SyntheticStacks())
        rec = Recorder.attach(session, tmp / f"ab{i}.gputop", interval=1.0) if record else None
        c0 = time.process_time()
        session.pipeline.start()
        time.sleep(seconds)
        session.pipeline.stop()
        if rec is not None:
            rec.close()
        return time.process_time() - c0

    off, on = [], []
    for i in range(rounds):  # interleaved, to share the machine's noise
        off.append(run(False, i))
        on.append(run(True, i))
    base, rec = statistics.median(off), statistics.median(on)
    return {
        "seconds_per_run": seconds,
        "rounds": rounds,
        "cpu_s_without": [round(x, 3) for x in off],
        "cpu_s_with": [round(x, 3) for x in on],
        "recorder_core_percent": round(100 * (rec - base) / seconds, 2),
        "pipeline_core_percent_without": round(100 * base / seconds, 2),
        "recorder_share_of_pipeline_percent": round(100 * (rec - base) / base, 1) if base > 0 else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for record_bench.json and record_bench.md")
    ap.add_argument("--hours", type=float, default=24.0, help="length of the synthetic session (default 24)")
    ap.add_argument("--flush", type=float, default=1.0,
                    help="simulated seconds per writer flush (default 1; the recorder flushes every "
                    f"{FLUSH_INTERVAL_S} s, which gives the same file once minutes are compacted)")
    ap.add_argument("--seeks", type=int, default=100)
    ap.add_argument("--opens", type=int, default=5)
    ap.add_argument("--ab-seconds", type=float, default=20.0)
    ap.add_argument("--ab-rounds", type=int, default=3)
    ap.add_argument("--keep", metavar="FILE", help="keep the synthetic recording at FILE")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="gputop-bench-") as tmpd:
        tmp = Path(tmpd)
        path = Path(args.keep) if args.keep else tmp / "synthetic-24h.gputop"
        if path.exists():
            path.unlink()
        seconds = int(args.hours * 3600)
        log(f"writing {args.hours:g} h of synthetic session to {path} ...")
        written = write_session(path, seconds, args.flush, log)
        size = path.stat().st_size
        gpus = Rates().gpus
        log(f"size {size / 1e6:.1f} MB; measuring first frame ...")
        frames = first_frame(path, args.opens, _FIRST_FRAME)
        try:
            app_frames = first_frame(path, max(1, args.opens // 2), _APP_FRAME)
        except Exception as exc:  # the app is optional here: no Textual, no number
            log(f"app first frame not measured: {exc}")
            app_frames = []
        log("seeking ...")
        seek = seeks(path, args.seeks)
        log("A/B of the recorder on a running pipeline ...")
        ab = ab_overhead(args.ab_seconds, tmp, args.ab_rounds)
        with Reader(path) as r:
            info = r.describe()
        result = {
            "machine": {"python": platform.python_version(), "platform": platform.platform(),
                        "cpus": os.cpu_count(), "sqlite": sqlite3.sqlite_version,
                        "load_avg_at_end": os.getloadavg() if hasattr(os, "getloadavg") else None},
            "session": {"hours": args.hours, "gpus": gpus, "rates": Rates().__dict__, **written},
            "size": {
                "bytes": size,
                "mb": round(size / 1e6, 2),
                "mb_per_24h": round(size / 1e6 * 24 / args.hours, 2),
                "bytes_per_gpu_hour": round(size / (args.hours * gpus)),
                "target_mb_24h": SIZE_TARGET_MB,
                "by_table": table_sizes(path),
                "counts": info["counts"],
            },
            "first_frame": {
                "runs": frames,
                "median_s": round(statistics.median(f["first_frame_s"] for f in frames), 3),
                "max_s": round(max(f["first_frame_s"] for f in frames), 3),
                "with_timeline_median_s": round(statistics.median(f["with_timeline_s"] for f in frames), 3),
                "import_median_s": round(statistics.median(f["import_s"] for f in frames), 3),
                "app_first_frame_s": [round(a["app_first_frame_s"], 3) for a in app_frames],
                "target_s": OPEN_TARGET_S,
            },
            "seek": {**seek, "target_ms": SEEK_TARGET_MS},
            "recorder_cpu": ab,
        }
        result["verdict"] = {
            "size": result["size"]["mb_per_24h"] <= SIZE_TARGET_MB,
            "first_frame": result["first_frame"]["with_timeline_median_s"] < OPEN_TARGET_S,
            "seek": seek["cold"]["median_ms"] < SEEK_TARGET_MS,
        }
    (out / "record_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "record_bench.md").write_text(markdown(result))
    log((out / "record_bench.md").read_text())
    return 0


def markdown(r: dict) -> str:
    s, f, k, c, w = r["size"], r["first_frame"], r["seek"], r["recorder_cpu"], r["session"]
    ok = {True: "meets", False: "MISSES"}
    lines = [
        "# Recording benchmark (synthetic session)",
        "",
        f"Generated by `python bench/record_bench.py --out DIR` on {r['machine']['platform']}, "
        f"{r['machine']['cpus']} CPUs, Python {r['machine']['python']}, SQLite {r['machine']['sqlite']}; "
        f"load average at the end {r['machine']['load_avg_at_end']}.",
        "",
        f"Session: {w['hours']:g} h, {w['gpus']} GPU, default rates (1 s polls, 5 utilisation points/s, "
        f"host 1/s, 4 processes/s, stack samples 5 Hz × 4 threads): {w['samples']:,} samples.",
        "",
        "| measure | result | target | |",
        "|---|---|---|---|",
        f"| file size for 24 h | {s['mb_per_24h']} MB ({s['bytes_per_gpu_hour'] / 1e6:.2f} MB per GPU-hour) "
        f"| ≤ {s['target_mb_24h']:g} MB | {ok[r['verdict']['size']]} |",
        f"| open to first frame (fresh process, store filled) | median {f['median_s']} s, max {f['max_s']} s "
        f"| < {f['target_s']:g} s | |",
        f"| … plus the timeline's overview and marks | median {f['with_timeline_median_s']} s "
        f"| < {f['target_s']:g} s | {ok[r['verdict']['first_frame']]} |",
        f"| Python imports before that | median {f['import_median_s']} s | | |",
        f"| full app (Textual) to first GPU panel, from process start | "
        f"{', '.join(str(x) for x in f['app_first_frame_s']) or 'not measured'} s | | |",
        f"| seek anywhere, blocks not cached ({k['n']} random) | median {k['cold']['median_ms']} ms, "
        f"p95 {k['cold']['p95_ms']} ms, max {k['cold']['max_ms']} ms | < {k['target_ms']:g} ms "
        f"| {ok[r['verdict']['seek']]} |",
        f"| seek nearby (±30 s, cached) | median {k['nearby']['median_ms']} ms, p95 {k['nearby']['p95_ms']} ms | | |",
        f"| writer CPU (encode, SQLite, compaction) | {w['writer_cpu_s_per_hour']} CPU-s per hour of data = "
        f"{w['writer_core_percent']} % of one core | | |",
        f"| recorder on gputop's own collection (A/B, {c['rounds']}× {c['seconds_per_run']:g} s; host source, "
        f"a GPU source, stacks at 5 Hz × 4) | +{c['recorder_core_percent']} % of a core; collection alone "
        f"{c['pipeline_core_percent_without']} % (recorder = {c['recorder_share_of_pipeline_percent']} % of it) "
        f"| a few % of gputop's CPU | |",
        "",
        "Size by table (bytes):",
        "",
        "| table | bytes |",
        "|---|---|",
    ]
    for name, b in list(s["by_table"].items())[:12]:
        lines.append(f"| {name} | {b:,} |")
    lines += [
        "",
        "Notes: the first-frame time is measured in a fresh Python process per run (the OS file cache "
        "is warm after the first). Seek times include resetting the store and refilling it with the "
        "history the panels show (GPU and utilisation 5 min, host and processes 1 min, stacks 90 s). The "
        "synthetic values carry the noise of real readings (power, GPM, per-core CPU), which is what "
        "does not compress.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
