"""Multi-rank jobs: the ranks found from the launcher's PID, the straggler named with its
function, the rank that never reaches the collective named, a healthy job silent. The slow tests
start real 2-rank gloo jobs with torch.distributed.run and attach ``gputop advise`` to the launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gputop.advisor.context import WARMUP_AGE_S
from gputop.analysis.ranks import rank_map, rank_view, ranks_message, straggler
from gputop.model import Category, Event, Frame, StackSample
from proc_helpers import kill_tree

JOB = Path(__file__).with_name("rank_job.py")
DIST = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"


def _main(pid, i, frames, cat, active=False):
    return StackSample(ts=float(i), pid=pid, thread_id=pid, frames=frames, active=active, is_main=True, category=cat)


def test_rank_map_reads_back_the_session_event():
    msg = ranks_message({101: 0, 102: 1}, 100)
    assert rank_map([Event(0.0, "ranks", msg)]) == {101: 0, 102: 1}


def test_straggler_is_the_rank_that_does_not_wait():
    coll = (Frame("all_reduce", DIST, 10), Frame("main", "/p/train.py", 50))
    load = (Frame("load_batch", "/p/train.py", 40), Frame("main", "/p/train.py", 48))
    r0 = rank_view(0, 101, [_main(101, i, coll, Category.COLLECTIVE) for i in range(20)])
    r1 = rank_view(1, 102, [_main(102, i, load if i % 5 else coll, Category.OTHER if i % 5 else Category.COLLECTIVE)
                            for i in range(20)])
    found = straggler([r0, r1], 0.3, 0.25, min_samples=10)
    assert found is not None and found.slow.rank == 1 and found.slow.hot.startswith("load_batch (") and found.slow.hot.endswith("train.py:40)")
    assert r0.collective_fn == "all_reduce"
    assert straggler([r0, r0], 0.3, 0.25) is None


def test_a_ranks_hot_place_is_its_own_work_before_the_models_loop_line():
    """FSDP on H200s: rank 1 tokenizes in Python (35 % of its samples, over a few functions) and
    waits in backward on the loop's line (40 %). Its hot place is the tokenizer, the work the
    other rank does not do, not `loss.backward()`."""
    step = (Frame("backward", "/usr/lib/python3/site-packages/torch/_tensor.py", 520), Frame("main", "/p/train.py", 506))
    tok = [(Frame("tokenize_slowly", "/p/train.py", 430 + k), Frame("load_batch", "/p/train.py", 460),
            Frame("main", "/p/train.py", 502)) for k in range(3)]
    win = (Frame("window", "/p/train.py", 452), Frame("load_batch", "/p/train.py", 461), Frame("main", "/p/train.py", 502))
    samples = []
    for i in range(40):
        if i % 20 < 8:
            samples.append(_main(102, i, step, Category.BACKWARD))
        elif i % 20 < 15:
            samples.append(_main(102, i, tok[i % 3], Category.OTHER, active=True))
        elif i % 20 < 16:
            samples.append(_main(102, i, win, Category.OTHER, active=True))
        else:
            samples.append(_main(102, i, (Frame("all_reduce", DIST, 10),) + step[1:], Category.COLLECTIVE))
    r = rank_view(1, 102, samples)
    assert r.hot is not None and r.hot.startswith("tokenize_slowly ("), r.hot
    # A rank whose work is the model's step alone keeps the loop's line.
    r = rank_view(1, 102, [_main(102, i, step, Category.BACKWARD) for i in range(20)])
    assert r.hot is not None and r.hot.startswith("main ("), r.hot


# Each mode's job and how long `advise` watches it. The straggler is watched past its warm-up
# (throughput findings, the straggler among them, wait out a job's first seconds).
DURATION_S = {"straggler": 10, "hang": 10, "healthy": 8, "accum": 8}
PAST_WARMUP = {"straggler", "accum"}


def _start_job(mode: str, tmp: Path, go: Path | None = None) -> tuple[subprocess.Popen, Path, float]:
    """``go``: the ranks warm up, say ready, then wait for this file before their loop starts
    (rank_job.py, ``RANK_JOB_GO``)."""
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               OMP_NUM_THREADS="1")
    if go is not None:
        env["RANK_JOB_GO"] = str(go)
    log = tmp / f"{mode}.log"
    with open(log, "w") as out:
        job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                                str(JOB), mode], stdout=out, stderr=subprocess.STDOUT, env=env)
    return job, log, time.monotonic()


def _wait_ready(job: subprocess.Popen, log: Path, t0: float) -> None:
    while log.read_text().count("ready") < 2:  # both ranks past their first all_reduce
        assert job.poll() is None and time.monotonic() - t0 < 60, log.read_text()[-2000:]
        time.sleep(0.1)


def _advise(job: subprocess.Popen, duration: int, record: Path | None = None) -> tuple[dict, float]:
    """``record``: also record the watch there, so a failed verdict can be replayed."""
    t1 = time.monotonic()
    extra = ["--record", str(record)] if record is not None else []
    res = subprocess.run([sys.executable, "-m", "gputop", "advise", "--pid", str(job.pid), "--duration",
                          str(duration), "--json", *extra], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout), time.monotonic() - t1


@pytest.fixture(scope="module")
def advised(tmp_path_factory):
    """``advise`` attached to the launcher of each 2-rank job: mode -> (report, seconds it took).

    The hung job and the straggler start together (starting torch is most of a job's cost) and
    are watched side by side: the hung job is idle. The healthy job is started and watched next,
    alone, once the straggler (which keeps a core busy) is gone, and as young as before: its
    watch starts when it is ready. The accumulation job is watched last, alone too (its
    all-reduces' share is what it is judged on), but started with the first two: it warms up and
    then waits, idle, for its go file, so by its watch it is past its warm-up age with no wait
    left, and its loop starts as its watch does. A mode whose job or watch failed gives its
    exception, raised by the test that reads it."""
    tmp = tmp_path_factory.mktemp("ranks")
    jobs: dict[str, tuple[subprocess.Popen, Path, float]] = {}
    results: dict[str, object] = {}
    go = tmp / "accum.go"

    def watch(mode: str) -> None:
        job, log, t0 = jobs[mode]
        try:
            _wait_ready(job, log, t0)
            if mode == "accum":
                go.touch()  # its ranks leave their wait and start the loop
            if mode in PAST_WARMUP:
                time.sleep(max(0.0, t0 + WARMUP_AGE_S + 0.5 - time.monotonic()))
            results[mode] = _advise(job, DURATION_S[mode], record=tmp / f"{mode}.gputop")
            if mode == "accum":  # the one-shot dump of the same launcher, while its ranks still run
                res = subprocess.run([sys.executable, "-m", "gputop", "stacks", "--pid", str(job.pid), "--json"],
                                     capture_output=True, text=True, timeout=60)
                results["accum-stacks"] = json.loads(res.stdout) if res.returncode == 0 else AssertionError(res.stderr)
        except BaseException as exc:  # noqa: BLE001 (handed to the mode's test)
            results[mode] = exc
        finally:
            kill_tree(job)

    try:
        for mode in ("hang", "straggler"):
            jobs[mode] = _start_job(mode, tmp)
        # Started now, its start-up over before the straggler's watch begins; idle until its own.
        jobs["accum"] = _start_job("accum", tmp, go=go)
        with ThreadPoolExecutor(max_workers=2) as pool:
            for f in [pool.submit(watch, "hang"), pool.submit(watch, "straggler")]:
                f.result()
        jobs["healthy"] = _start_job("healthy", tmp)
        watch("healthy")
        watch("accum")  # alone too: its all-reduces' share is what it is judged on
        yield results
    finally:
        for job, _, _ in jobs.values():
            kill_tree(job)


def _report(advised: dict, mode: str) -> tuple[dict, float]:
    got = advised[mode]
    if isinstance(got, BaseException):
        raise got
    return got


@pytest.mark.slow
def test_straggler_rank_is_named_with_its_function(advised):
    report, took = _report(advised, "straggler")
    stuck = [f for f in report["findings"] if f["id"] == "stuck"]
    # The title and evidence first: CI cuts a long message, and these say which path called it.
    assert not stuck, (stuck[0]["title"], stuck[0]["evidence"])
    f = next(f for f in report["findings"] if f["id"] == "rank-straggler")
    assert f["title"].startswith("rank 1 is the straggler")
    assert "load_batch (tests/rank_job.py:" in f["evidence"][0] and "all_reduce" in f["evidence"][0], f["evidence"]
    print(f"straggler named in a {took:.1f} s advise run")


@pytest.mark.slow
def test_rank_that_never_arrives_is_named_by_the_stuck_finding(advised):
    report, took = _report(advised, "hang")
    f = next(f for f in report["findings"] if f["id"] == "stuck")
    assert "waits in all_reduce for rank 1 (pid" in f["title"] and "never arrives: it is at" in f["title"], f["title"]
    assert "never_arrives, sleeps instead" in f["title"], f["title"]
    assert any("rank 1 (pid" in e and "is elsewhere" in e for e in f["evidence"]), f["evidence"]
    print(f"hang named in a {took:.1f} s advise run")


@pytest.mark.slow
def test_healthy_two_rank_job_is_silent(advised):
    report, took = _report(advised, "healthy")
    # The job pauses 20 ms a step on both ranks on purpose (balanced on a busy machine): once past
    # its warm-up (a loaded machine starts it late), that pause is rightly a blocking-in-loop
    # finding about the job. Nothing about its ranks is: no straggler, no stuck, no wait.
    loud = [f for f in report["findings"] if f["severity"] in ("warning", "critical")
            and not (f["id"] == "blocking-in-loop" and "time.sleep(0.02)" in f["title"])]
    assert not loud, loud


@pytest.mark.slow
def test_accumulation_that_all_reduces_every_micro_batch_is_named_with_no_sync(advised):
    report, took = _report(advised, "accum")
    f = next((f for f in report["findings"] if f["id"] == "accumulation-sync"), None)
    assert f is not None, [(f["id"], f["title"]) for f in report["findings"]]
    assert "`accumulate`" in f["title"] and "no_sync()" in f["action"]
    assert "(line 55: every 8 micro-batches)" in f["evidence"][0], f["evidence"]
    loud = [g["id"] for g in report["findings"] if g["severity"] in ("warning", "critical") and g is not f]
    assert not loud, loud  # the collectives' cost is said once, as this
    print(f"accumulation named in a {took:.1f} s advise run")


@pytest.mark.slow
def test_stacks_names_the_launchers_ranks_as_ranks(advised):
    """`gputop stacks --pid LAUNCHER` listed a DDP job's ranks as "worker PID" (a DataLoader
    worker's word). (A rank off the CPU in backward is now judged as advise judges it, a
    collective wait: analysis.ranks.as_ranks, tested with it.)"""
    dump = advised.get("accum-stacks")
    if isinstance(dump, BaseException):
        raise dump
    assert dump is not None, "no dump was taken"
    ranks = sorted(w["rank"] for w in dump["workers"])
    assert ranks == [0, 1], dump["workers"]


def test_a_rank_that_only_waits_shows_where_in_its_own_code_it_waits():
    """The Ranks tab's HOT column was blank on a 2-rank gloo job: a rank waiting in all_reduce
    (its newest frame in torch) or sleeping has no place outside waits. The column then shows the
    user's frame under the wait."""
    from gputop.present.ranks import rank_line

    coll = (Frame("all_reduce", DIST, 10), Frame("main", "/p/train.py", 50))
    sleep = (Frame("never_arrives", "/p/train.py", 35), Frame("main", "/p/train.py", 48))
    r0 = rank_view(0, 101, [_main(101, i, coll, Category.COLLECTIVE) for i in range(20)])
    r1 = rank_view(1, 102, [_main(102, i, sleep, Category.IDLE) for i in range(20)])
    assert r0.hot is None and r0.top == "main (/p/train.py:50)" and r0.top_share == 1.0
    assert r1.hot is None and r1.top == "never_arrives (/p/train.py:35)"
    text = "".join(t for t, _ in rank_line(r0, 20, 40))
    assert text.rstrip().endswith("main (/p/train.py:50) 100%")
    # A rank with work outside waits keeps that work as its hot place.
    load = (Frame("load_batch", "/p/train.py", 40), Frame("main", "/p/train.py", 48))
    r2 = rank_view(1, 103, [_main(103, i, load if i % 4 else coll, Category.OTHER if i % 4 else Category.COLLECTIVE)
                            for i in range(20)])
    assert r2.hot == "load_batch (/p/train.py:40)" and "load_batch (/p/train.py:40) 75%" in "".join(t for t, _ in rank_line(r2, 20, 40))
