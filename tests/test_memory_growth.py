"""Memory growth: the fit and its verdict on synthetic series, the leak lines, the exit cause,
and the rules (memory-growth, oom-exit, memory-headroom held back) through the advisor."""

import random
from dataclasses import replace

import pytest

from gputop.analysis import GROWING, growth, leak_line, leak_lines, theil_sen, exit_cause, exit_status_of
from gputop.analysis.memory_growth import PLATEAU, SAWTOOTH, SHORT, eta_text, rate_text
from gputop.model import Category as C
from gputop.model import Event, Frame, GpuSample, HostSample, ProcSample, Severity, StackSample

from synth import GiB, T0, TARGET, Job, rule_findings

MiB = 2**20
LIMIT = 80 * GiB


def line(rate, start=10 * GiB, seconds=600, every=1.0, noise=0.0, seed=1):
    rnd = random.Random(seed)
    n = int(seconds / every)
    return [(T0 + k * every, start + rate * k * every + rnd.gauss(0, noise)) for k in range(n + 1)]


# --------------------------------------------------------------------------- the fit


def test_noiseless_leak_forecast_within_10_percent():
    rate = 5 * MiB  # per second: 300 MiB/min
    pts = line(rate)
    g = growth(pts, LIMIT)
    truth = (LIMIT - pts[-1][1]) / rate
    assert g.kind == GROWING
    assert g.rate == pytest.approx(rate, rel=1e-6)
    assert g.eta_s == pytest.approx(truth, rel=0.10)
    assert g.eta_low_s <= truth <= g.eta_high_s
    assert rate_text(g.rate) == "300 MB/min"


def test_noisy_leak_interval_contains_the_truth():
    rate = 2 * MiB
    for seed in range(5):
        pts = line(rate, noise=200 * MiB, seed=seed)
        g = growth(pts, LIMIT)
        assert g.kind == GROWING, seed
        assert g.rate_low <= rate <= g.rate_high, seed
        truth = (LIMIT - g.used) / rate
        assert g.eta_low_s <= truth <= g.eta_high_s, seed
        assert g.rate_high - g.rate_low > 0  # noise widens it


def test_allocator_warm_up_that_plateaus_is_not_growth():
    # 6 GiB in the first 30 s (the caching allocator's first steps), then flat with its 2 MiB steps
    pts = [(T0 + t, min(6 * GiB, t * 0.2 * GiB) + (2 * MiB if t % 97 < 3 else 0)) for t in range(0, 600)]
    g = growth(pts, LIMIT)
    assert g.kind == PLATEAU
    assert not g.growing and g.eta_s is None


def test_growth_that_levels_off_is_not_steady():
    # a cache filling towards its size: fast at first, slower and slower
    pts = [(T0 + t, 10 * GiB + 4 * GiB * (1 - 0.99 ** t)) for t in range(0, 600)]
    assert growth(pts, LIMIT).kind == PLATEAU


def test_saw_tooth_eval_is_not_a_leak():
    # every 60 s an eval phase takes 3 GiB more for 15 s, then gives it back
    pts = [(T0 + t, 20 * GiB + (3 * GiB * ((t % 60) - 45) / 15 if t % 60 >= 45 else 0)) for t in range(0, 600)]
    g = growth(pts, LIMIT)
    assert g.kind == SAWTOOTH
    assert not g.growing
    assert g.used == pytest.approx(20 * GiB + 3 * GiB * 14 / 15, rel=0.01)  # the peak sets the headroom


def test_saw_tooth_over_a_leak_is_growth_judged_on_its_troughs():
    leak = 3 * MiB
    pts = [(T0 + t, 20 * GiB + leak * t + (3 * GiB * ((t % 60) - 45) / 15 if t % 60 >= 45 else 0)) for t in range(0, 600)]
    g = growth(pts, LIMIT)
    assert g.kind == GROWING and g.sawtooth
    assert g.rate == pytest.approx(leak, rel=0.05)


def test_too_little_history_says_nothing():
    assert growth(line(5 * MiB, seconds=30), LIMIT).kind == SHORT
    assert growth([], LIMIT).kind == SHORT


def test_a_leak_that_kills_soon_is_judged_early_in_the_training_loop():
    # 25 s of steady growth at 200 MiB/s with 10 GiB left: dead in ~50 s, so it cannot wait a minute
    pts = line(200 * MiB, start=LIMIT - 15 * GiB, seconds=25)
    g = growth(pts, LIMIT, early=True)
    assert g.kind == GROWING and g.early
    assert g.eta_s == pytest.approx((LIMIT - pts[-1][1]) / (200 * MiB), rel=0.05)
    # the same series outside the training loop (loading, compiling) waits for the minute
    assert growth(pts, LIMIT).kind == SHORT
    # under EARLY_SPAN_S nothing is judged, however fast
    assert growth(line(200 * MiB, start=LIMIT - 15 * GiB, seconds=15), LIMIT, early=True).kind == SHORT


def test_early_history_judges_only_urgent_steady_growth():
    # a slow leak (hours away) waits for the minute: 25 s of it says too little
    assert growth(line(5 * MiB, seconds=25), LIMIT, early=True).kind == SHORT
    # a fast warm-up that levels off inside the 25 s is not growth
    warm = [(T0 + t, 10 * GiB + min(t, 15) * 500 * MiB) for t in range(26)]
    assert not growth(warm, LIMIT, early=True).growing
    # with no limit known there is no urgency to judge by
    assert growth(line(200 * MiB, seconds=25), None, early=True).kind == SHORT


def test_theil_sen_shrugs_off_an_outlier():
    pts = [(float(t), 2.0 * t) for t in range(30)]
    pts[10] = (10.0, 1e6)
    fit = theil_sen(pts)
    assert fit.rate == pytest.approx(2.0)
    assert fit.low <= 2.0 <= fit.high


def test_eta_text_reads_in_minutes_with_its_interval():
    g = growth(line(5 * MiB, start=LIMIT - 70 * 5 * MiB * 60 - 600 * 5 * MiB), LIMIT)
    assert eta_text(g) == "~70 min"  # noiseless: no interval to speak of
    g = growth(line(5 * MiB, start=LIMIT - 70 * 5 * MiB * 60 - 600 * 5 * MiB, noise=300 * MiB), LIMIT)
    assert eta_text(g).startswith("~7") and "(" in eta_text(g)


# --------------------------------------------------------------------------- the line


@pytest.mark.parametrize("code,kept", [
    ("total_loss += loss", "loss"),
    ("    running = running + outputs.loss", "outputs.loss"),
    ("losses.append(loss)", "loss"),
    ("all_outputs.append(outputs)", "outputs"),
])
def test_leak_lines_are_named(code, kept):
    hit = leak_line(code)
    assert hit is not None and hit[0] == kept


@pytest.mark.parametrize("code", [
    "total_loss += loss.item()",
    "losses.append(loss.detach())",
    "history.append(float(loss))",
    "step += 1",
    "x = x + 1",
    "paths.append(path)",
])
def test_lines_that_keep_nothing_are_not_named(code):
    assert leak_line(code) is None


def test_leak_lines_from_stacks_skip_libraries():
    user = Frame("train", "/home/u/train.py", 57, code="total_loss += loss")
    lib = Frame("f", "/usr/lib/python3.11/site-packages/torch/x.py", 3, code="acc += loss")
    s = StackSample(ts=T0, pid=TARGET, thread_id=1, frames=(lib, user), is_main=True)
    found = leak_lines([s, s])
    assert [x.where for x in found] == ["u/train.py:57"]
    assert "loss.item()" in found[0].fix


# --------------------------------------------------------------------------- after the fact


def _gpu(ts, used):
    return GpuSample(ts=ts, index=0, mem_used=int(used), mem_total=LIMIT)


def test_exit_at_the_cards_limit_is_likely_cuda_oom():
    samples = {0: [_gpu(T0 + k, 79.5 * GiB) for k in range(5)]}
    why = exit_cause(T0 + 5, None, samples, [])
    assert why.startswith("likely CUDA out of memory") and "99 %" in why
    assert exit_cause(T0 + 5, None, {0: [_gpu(T0 + k, 60 * GiB) for k in range(5)]}, []) is None
    assert exit_cause(T0 + 5, "code 0", samples, []) is None  # it finished


def test_sigkill_with_the_host_full_is_likely_the_oom_killer():
    host = [HostSample(ts=T0 + k, cpu_percent=0, mem_total=64 * GiB, mem_available=200 * MiB) for k in range(5)]
    why = exit_cause(T0 + 5, "signal SIGKILL", {}, host)
    assert why.startswith("likely the OOM killer") and "killed by SIGKILL" in why
    assert "journalctl" in exit_cause(T0 + 5, None, {}, host)  # status unknown: says how to be sure
    assert exit_cause(T0 + 5, "signal SIGTERM", {}, host) is None
    roomy = [HostSample(ts=T0 + k, cpu_percent=0, mem_total=64 * GiB, mem_available=30 * GiB) for k in range(5)]
    assert exit_cause(T0 + 5, "signal SIGKILL", {}, roomy) is None


def test_exit_status_is_read_from_the_samplers_message():
    assert exit_status_of("target PID 7 exited at 12:00:01 with signal SIGKILL") == "signal SIGKILL"
    assert exit_status_of("target PID 7 exited at 12:00:01 (exit code unknown: not our child)") is None


# --------------------------------------------------------------------------- the rules


GPM = {"sm_active": 30.0, "sm_occupancy": 10.0, "tensor_active": 20.0, "fp32_active": 5.0}


def leaking_job(rate=50 * MiB, frames=None, **kw):
    mem = lambda t: 4 * GiB + rate * t  # noqa: E731
    return Job(seconds=150, gpu={**GPM, "mem_used": mem}, proc_mem=mem, main_frames=frames, **kw)


def test_memory_growth_names_the_line_and_the_forecast():
    frames = lambda t: (Frame("train", "/home/u/train.py", 57, code="total_loss += loss"),)  # noqa: E731
    found, ctx = rule_findings(leaking_job(frames=frames))
    f = found["memory-growth"]
    assert f.severity is Severity.WARNING  # (80 - 11.3) GiB at 3 GiB/min: ~23 min
    assert f.gpu_index == 0
    assert "GPU 0 memory grows 2.9 GB/min: out of memory in ~23 min" in f.title
    assert any("at this rate it runs out in ~23 min" in e for e in f.evidence)
    assert "u/train.py:57: total_loss += loss  →  loss.item()" in f.action
    assert ctx.memory.gpu(0).source == "process"


def test_memory_growth_without_a_line_says_what_is_known():
    f = rule_findings(leaking_job())[0]["memory-growth"]
    assert "_record_memory_history" in f.action
    assert any("hold no line" in e for e in f.evidence)


def test_slow_growth_is_info_and_flat_memory_is_silent():
    f = rule_findings(leaking_job(rate=6 * MiB))[0]["memory-growth"]  # 76 GiB at 360 MiB/min: ~3.6 h
    assert f.severity is Severity.INFO
    assert "memory-growth" not in rule_findings(leaking_job(rate=0))[0]


def test_no_larger_batch_for_a_job_whose_memory_grows():
    # the same job, its memory flat: memory-headroom offers a larger batch ...
    flat = rule_findings(leaking_job(rate=0))[0]
    assert "memory-headroom" in flat
    # ... growing (still far below the headroom bar): never
    found = rule_findings(leaking_job(rate=20 * MiB))[0]
    assert "memory-growth" in found
    assert "memory-headroom" not in found
    assert all("batch fits" not in f.action for f in found.values())


def test_host_growth_of_dataloader_workers():
    job = Job(seconds=150, workers=4, host_mem_total=64 * GiB, host_available=lambda t: 40 * GiB - 100 * MiB * t,
              worker_rss=lambda t: 2 * GiB)
    f = rule_findings(job)[0]["memory-growth"]
    assert f.title.startswith("host memory grows 5.9 GB/min")
    # No USS read: said honestly, and copy-on-read stays the likelier cause
    assert any("RSS is flat" in e and "private memory (USS) is not read" in e for e in f.evidence)
    assert "numpy array or an Arrow table" in f.action
    # Read, but too few times to judge (a worker's read is paced by its cost): said as such, not as
    # "no history" beside a report that shows the readings (a new user's 3 minutes had 3-4 a worker).
    job = Job(seconds=70, workers=2, host_mem_total=64 * GiB, host_available=lambda t: 40 * GiB - 100 * MiB * t,
              worker_rss=lambda t: 2 * GiB, worker_uss=lambda t: 300 * MiB + 2 * MiB * t)
    f = rule_findings(job)[0]["memory-growth"]
    assert any("is being read but has too few readings to judge yet (a minute and 10 readings a worker)" in e
               for e in f.evidence), f.evidence
    job = Job(seconds=150, workers=4, host_mem_total=64 * GiB, host_available=lambda t: 40 * GiB - 100 * MiB * t,
              worker_rss=lambda t: 1 * GiB + 25 * MiB * t)
    f = rule_findings(job)[0]["memory-growth"]
    assert any("4 of 4 DataLoader workers' RSS grows 1.5 GB/min each" in e for e in f.evidence)


def _exited(job: Job, status_text: str, last_mem):
    st = job.store()
    ts = T0 + job.seconds + 0.5
    st.add([GpuSample(ts=ts - 0.4, index=0, mem_used=int(last_mem), mem_total=80 * GiB),
            ProcSample(ts=ts, pid=TARGET, name="python", status="exited", role="target"),
            Event(ts, "stacks", f"target PID {TARGET} exited at 12:00:00 {status_text}", "warning")])
    from gputop.advisor.context import build_context
    from gputop.advisor.engine import Advisor
    return {f.id: f for f in Advisor().run_rules(build_context(st))}


def test_oom_exit_after_the_fact():
    found = _exited(leaking_job(), "(exit code unknown: not our child)", 79.2 * GiB)
    f = found["oom-exit"]
    assert f.title == "Job ended: likely CUDA out of memory" and f.severity is Severity.CRITICAL
    assert "99 %" in f.evidence[0]
    assert "oom-exit" not in _exited(leaking_job(), "with code 0", 79.2 * GiB)
    assert "oom-exit" not in _exited(leaking_job(), "(exit code unknown: not our child)", 20 * GiB)


def _loop_frames(t):
    """A training loop's main thread: the loop's frame calling forward, backward or the step in turn."""
    callee = (Frame("forward", "/home/u/model.py", 30), Frame("backward", "/usr/lib/python3/site-packages/torch/_tensor.py", 500),
              Frame("step", "/usr/lib/python3/site-packages/torch/optim/adamw.py", 200))[int(t * 7) % 3]
    return (callee, Frame("train", "/home/u/train.py", 40 + int(t * 7) % 3, code="x"), Frame("<module>", "/home/u/train.py", 90))


def test_a_fast_leak_is_named_within_half_a_minute_only_in_the_training_loop():
    # 400 MiB/s from 40 GiB: ~100 s to the card's limit; 30 s of history
    job = lambda frames: Job(seconds=30, gpu={**GPM, "mem_used": lambda t: 40 * GiB + 400 * MiB * t},  # noqa: E731
                             proc_mem=lambda t: 40 * GiB + 400 * MiB * t, main_frames=frames)
    found, ctx = rule_findings(job(_loop_frames))
    assert ctx.step.stepping
    f = found["memory-growth"]
    assert f.severity is Severity.CRITICAL and "out of memory in" in f.title  # ~72 s: nothing else first
    # the same growth while the main thread sits in one line (weights loading): not judged yet
    loading = lambda t: (Frame("load_state_dict", "/usr/lib/python3/site-packages/torch/nn/modules/module.py", 2000),  # noqa: E731
                         Frame("<module>", "/home/u/train.py", 12, code="model.load_state_dict(sd)"))
    found, ctx = rule_findings(job(loading))
    assert not ctx.step.stepping
    assert "memory-growth" not in found


def test_memory_grown_while_loading_weights_is_not_judged_early_once_training_starts():
    # 20 s of loading shards in a loop of the user's own (memory +300 MiB/s), then training, flat
    def mem(t):
        return 40 * GiB + 300 * MiB * min(t, 20.0)

    def frames(t):
        if t < 20:
            line = 12 if int(t * 5) % 2 else 13  # shards.append(load(f)); time.sleep(...)
            return (Frame("load", "/home/u/train.py", 5), Frame("<module>", "/home/u/train.py", line))
        return _loop_frames(t)

    def category(t):
        return C.OTHER if t < 20 else (C.FORWARD, C.BACKWARD, C.OPTIMIZER)[int(t * 7) % 3]

    for seconds in (28, 35, 45):
        found, ctx = rule_findings(Job(seconds=seconds, main=category, gpu={**GPM, "mem_used": mem}, proc_mem=mem,
                                       main_frames=frames))
        assert ctx.step.stepping, seconds
        assert "memory-growth" not in found, seconds
    # the same job leaking once it trains is named within half a minute of training
    leak = lambda t: mem(t) + 400 * MiB * max(0.0, t - 20.0)  # noqa: E731
    found, _ = rule_findings(Job(seconds=45, main=category, gpu={**GPM, "mem_used": leak}, proc_mem=leak,
                                 main_frames=frames))
    assert "memory-growth" in found


def test_the_host_forecast_is_the_jobs_own_growth_not_its_neighbours():
    # A steady leak in the main process (5 MiB/s) beside a neighbour taking and freeing 1.5 GiB
    neighbour = lambda t: 1.5 * GiB if int(t) % 20 < 12 else 0.0  # noqa: E731
    rss = lambda t: 330 * MiB + 5 * MiB * t  # noqa: E731
    job = Job(seconds=120, workers=0, host_mem_total=23 * GiB,
              host_available=lambda t: 20 * GiB - 5 * MiB * t - neighbour(t), target_rss=rss)
    f = rule_findings(job)[0]["memory-growth"]
    assert f.title.startswith("host memory grows 300 MB/min")
    # A test suite beside a job that grows slowly: the host's 4 GB/min is not the job's
    burst = Job(seconds=120, workers=0, host_mem_total=23 * GiB,
                host_available=lambda t: 20 * GiB - 66 * MiB * t, target_rss=lambda t: 330 * MiB + 4 * MiB * t)
    f = rule_findings(burst)[0]["memory-growth"]
    assert "240 MB/min" in f.title and f.severity is not Severity.CRITICAL
    # the host grows, the job's own memory does not: not the job's leak
    others = Job(seconds=120, workers=0, host_mem_total=23 * GiB,
                 host_available=lambda t: 20 * GiB - 66 * MiB * t, target_rss=lambda t: 330 * MiB)
    assert "memory-growth" not in rule_findings(others)[0]


def test_growth_under_a_minute_and_far_from_the_limit_is_weighed_not_judged():
    # A new user's advise --duration 60 watched 1.7 GB of growth and said nothing of memory.
    g = growth(line(5 * MiB, seconds=40), LIMIT, early=True)
    assert g.kind == SHORT and g.rising == pytest.approx(5 * MiB, rel=0.05)
    # outside the training loop, flat, or with too little history: nothing weighed
    assert growth(line(5 * MiB, seconds=40), LIMIT).rising == 0
    assert growth(line(0, seconds=40), LIMIT, early=True).rising == 0
    assert growth(line(5 * MiB, seconds=15), LIMIT, early=True).rising == 0
    # in the advisor: said as a weighing, never a forecast or a warning; gone once judged
    job = lambda secs: Job(seconds=secs, gpu={**GPM, "mem_used": lambda t: 20 * GiB + 20 * MiB * t},  # noqa: E731
                           proc_mem=lambda t: 20 * GiB + 20 * MiB * t, main_frames=_loop_frames)
    found, _ = rule_findings(job(40))
    f = found["memory-rising"]
    assert f.severity is Severity.INFO and "memory-growth" not in found
    assert f.title.startswith("Weighing: GPU 0 memory rises about 1.2 GB/min"), f.title
    assert "out of memory in" not in f.title + " ".join(f.evidence)
    found, _ = rule_findings(job(90))
    assert "memory-growth" in found and "memory-rising" not in found


def _cpu_loop_frames(t):
    """A CPU job's module-level loop (the new user's): `out = torch.randn(256, 1024) @ w`,
    `history.append(out)`, `time.sleep(0.02)` in turn; no forward, backward or optimizer."""
    line = (7, 8, 11)[int(t * 5) % 3]
    return (Frame("<module>", "/home/u/leak.py", line, code="x", loop=6),)


def _cpu_leak(seconds, main_frames=_cpu_loop_frames, per_s=27 * MiB):
    # RSS 0.5 GB -> 1.8 GB over the watch: ~27 MiB/s, a 23 GiB host far from its limit
    rss = lambda t: 512 * MiB + per_s * t  # noqa: E731
    return Job(seconds=seconds, util=None, workers=0, host_mem_total=23 * GiB,
               host_available=lambda t: 21 * GiB - per_s * t, target_rss=rss,
               main=lambda t: C.IDLE if int(t * 5) % 3 == 2 else C.OTHER, main_frames=main_frames)


def test_a_cpu_jobs_host_leak_in_a_short_watch_is_weighed():
    # A new user's 35 s advise on a CPU job leaking 1.6 GB/min said nothing of memory: the job's
    # loop does no forward/backward/optimizer, so no training loop was known and nothing was
    # weighed; and the host's growth, being the job's own RSS, dropped what that RSS rose at.
    found, ctx = rule_findings(_cpu_leak(35))
    assert not ctx.step.stepping and ctx.step.loop_at == ("<module>", "u/leak.py")
    f = found.get("memory-rising")
    assert f is not None, sorted(found)
    assert f.severity is Severity.INFO and "memory-growth" not in found
    assert f.title.startswith("Weighing: host memory rises about 1.6 GB/min"), f.title
    assert "`<module> (u/leak.py" in f.evidence[0] and "training loop" not in f.evidence[0], f.evidence
    # judged once it has the minute: named as growth, no longer weighed
    found, _ = rule_findings(_cpu_leak(90))
    assert "memory-growth" in found and "memory-rising" not in found
    # a job whose main thread stays on one line (loading, or not a loop of its own) is not weighed
    found, _ = rule_findings(_cpu_leak(35, main_frames=lambda t: (Frame("<module>", "/home/u/leak.py", 7),)))
    assert "memory-rising" not in found
    # a rise that would take more than the forecast's horizon (a day) to fill the host is nothing
    # to weigh: a healthy NCCL job's host memory read 0.1 MB/min and was "weighed" (replayed)
    found, _ = rule_findings(_cpu_leak(35, per_s=4 * 1024))
    assert "memory-rising" not in found


def test_the_hosts_growth_keeps_what_the_jobs_own_rss_is_seen_rising_at():
    # The host's growth is the job's own (its RSS): too short to judge, the rate that RSS rises
    # at since the training loop began is kept for memory-rising, not dropped for "too short".
    from gputop.analysis.memory_window import memory_view

    host = [HostSample(ts=T0 + k, cpu_percent=0, mem_total=23 * GiB, mem_available=21 * GiB - 27 * MiB * k)
            for k in range(36)]
    rss = {TARGET: [ProcSample(ts=T0 + k, pid=TARGET, ppid=1, name="python", rss=512 * MiB + 27 * MiB * k)
                    for k in range(36)]}
    view = memory_view((), {}, [], host, rss, {TARGET}, early_since=T0 + 5)
    assert not view.host.judged
    assert view.host.rising == pytest.approx(27 * MiB, rel=0.05) and view.host.rising_in_loop
    # no loop known: still measured, said as outside one
    view = memory_view((), {}, [], host, rss, {TARGET})
    assert view.host.rising == pytest.approx(27 * MiB, rel=0.05) and not view.host.rising_in_loop
    # the job's RSS flat while the host's used memory rises (a neighbour): nothing the job's
    flat = {TARGET: [replace(s, rss=512 * MiB) for s in rss[TARGET]]}
    assert memory_view((), {}, [], host, flat, {TARGET}, early_since=T0 + 5).host.rising == 0


def test_host_growth_evidence_says_the_hosts_used_memory_and_the_jobs_apart():
    # A new user read "the job's memory on the host ... grows 368 MB/min ...; 2.0G of 23.5G used"
    # as the job's 2.0G; its RSS was 1.0G. Each is named.
    rss = lambda t: 1 * GiB - 6 * MiB * (120 - t)  # noqa: E731  (1.0G at the end)
    job = Job(seconds=120, workers=0, host_mem_total=int(23.5 * GiB),
              host_available=lambda t: 21.5 * GiB - 6 * MiB * (t - 120), target_rss=rss)
    f = rule_findings(job)[0]["memory-growth"]
    first = f.evidence[0]
    assert first.startswith("the job's memory on the host"), first
    assert first.endswith("; the host: 2.0G of 23.5G used; the job 1.0G (its main process's RSS)"), first
