"""Warm-up: imports, compilation, worker start-up and the first seconds hold the throughput
findings; the pane says the job is warming up; hangs and system faults are not held."""

from dataclasses import replace

from gputop.advisor.context import build_context, warmup_of
from gputop.advisor.engine import WARMUP_ID, Advisor
from gputop.model import Category as C
from gputop.model import Frame, ProcSample
from gputop.present.advice import advice_pane_lines
from gputop.store import Store

from synth import Job, periodic, stack

HEALTHY_GPM = {"sm_active": 85.0, "sm_occupancy": 40.0, "tensor_active": 45.0, "fp32_active": 5.0, "fp16_active": 30.0}
LIB = "/usr/lib/python3.11/site-packages/torch"
COMPILING = (Frame("_compile", f"{LIB}/_dynamo/convert_frame.py", 700),
             Frame("Net.forward", "/home/u/model.py", 20), Frame("train", "/home/u/train.py", 40))


def born(store: Store, age_at_end: float) -> Store:
    """The same samples, the target process started ``age_at_end`` s before the last sample."""
    out = Store()
    items = [store.system, *store.gpu_info.values()]
    for i in store.gpu_indices():
        items += store.util_window(i, 0) + store.gpu_window(i, 0)
    items += store.host_window(0) + store.stack_window(0)
    for pid in store.procs_latest():
        items += [replace(p, create_time=store.now - age_at_end) if p.role == "target" else p
                  for p in store.proc_window(pid, 0)]
    items += store.gpu_processes()
    items.sort(key=lambda s: s.ts)
    for s in items:
        out.add([s])
    return out


def evaluate(store):
    ctx = build_context(store, window_s=60.0, stuck_after_s=30.0)
    adv = Advisor()
    found = {f.id: f for f in adv.run_rules(ctx)}
    assert adv.errors == {}
    return found, ctx


def job_store(seconds: float, compiling: bool, age: float | None, **kw) -> Store:
    # GPU busy 40 % of each second; the main thread loads data the rest (num_workers=0) and,
    # while compiling, shows dynamo's compile frames in its busy part and part of its loading
    def main(t):
        if t % 1.0 < 0.4 - 1e-9:
            return C.FORWARD
        return C.DATA_FETCH

    kw.setdefault("gpu", HEALTHY_GPM)
    job = Job(seconds=seconds, util=periodic(1.0, 0.4), main=main, **kw)
    st = job.store()
    if compiling:
        # replace the main thread's samples of the last 5 s: 60 % of them in the compiler
        keep = st.stack_window(0)
        st2 = Store()
        items = [st.system, *st.gpu_info.values()]
        for i in st.gpu_indices():
            items += st.util_window(i, 0) + st.gpu_window(i, 0)
        items += st.host_window(0) + st.gpu_processes()
        for pid in st.procs_latest():
            items += st.proc_window(pid, 0)
        for k, s in enumerate(keep):
            if s.ts >= st.now - 5.0 and k % 5 < 3:
                s = stack(s.ts, C.FORWARD, frames=COMPILING)
            items.append(s)
        items.sort(key=lambda s: s.ts)
        for s in items:
            st2.add([s])
        st = st2
    return born(st, age) if age is not None else st


def test_warmup_of_a_stack():
    assert warmup_of(stack(0, C.FORWARD, frames=COMPILING)) == "compiling (torch.compile)"
    imp = (Frame("<module>", f"{LIB}/nn/__init__.py", 1), Frame("_call_with_frames_removed", "<frozen importlib._bootstrap>", 241),
           Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176), Frame("<module>", "/home/u/train.py", 1))
    assert warmup_of(stack(0, C.OTHER, frames=imp)) == "importing modules"
    # a loop run from inside an import: import frames only at the bottom of a deep stack
    deep = tuple(Frame(f"f{i}", "/home/u/model.py", i) for i in range(10)) + imp[1:]
    assert warmup_of(stack(0, C.FORWARD, frames=deep)) is None
    steady = (Frame("_fn", f"{LIB}/_dynamo/eval_frame.py", 600), Frame("train", "/home/u/train.py", 40))
    assert warmup_of(stack(0, C.FORWARD, frames=steady)) is None  # a compiled model's steady step


def test_a_young_compiling_job_is_warming_up_and_60_s_later_data_starved():
    found, ctx = evaluate(job_store(3.0, compiling=True, age=3.0))
    assert ctx.warmup and ctx.warmup.startswith("compiling (torch.compile)")
    assert "data-starved" not in found
    assert found[WARMUP_ID].title.startswith("Warming up: compiling")
    # the same data-starved evidence, the job 60 s old and its compilation over
    found, ctx = evaluate(job_store(20.0, compiling=False, age=60.0))
    assert ctx.warmup is None and "data-starved" in found and WARMUP_ID not in found


def test_the_first_seconds_are_warm_up_by_age_alone():
    found, ctx = evaluate(job_store(5.0, compiling=False, age=5.0))
    assert ctx.warmup == "the job started 5 s ago (first steps)"
    assert "data-starved" not in found and WARMUP_ID in found


def test_a_job_that_has_ended_is_not_warming_up():
    """A job that exits 5 s after its start was 'warming up, the job started N s ago' with N
    counting on after its death; an ended job warms up no more."""
    from gputop.advisor.context import warming_up

    procs = [ProcSample(ts=99.0 + k, pid=7, ppid=1, create_time=98.0) for k in range(2)]
    main = [stack(100.0, C.FORWARD)]
    assert warming_up(101.0, procs, main, []) == "the job started 3 s ago (first steps)"
    ended = procs + [replace(procs[-1], ts=101.0, status="exited")]
    assert warming_up(104.0, ended, main, []) is None  # 6 s after its start, 3 s after its exit


def test_a_young_job_whose_stacks_are_not_read_is_young_with_no_claim_of_steps():
    # A report of a `sleep` (not Python) said "warming up: first steps"; nothing is known of steps.
    from gputop.advisor.context import warming_up

    procs = [ProcSample(ts=99.0 + k, pid=7, ppid=1, create_time=98.0) for k in range(2)]
    assert warming_up(101.0, procs, [], []) == "the job started 3 s ago"


def test_a_long_compile_holds_until_the_age_limit():
    found, ctx = evaluate(job_store(20.0, compiling=True, age=120.0))
    assert ctx.warmup and "data-starved" not in found
    found, ctx = evaluate(job_store(20.0, compiling=True, age=700.0))
    assert ctx.warmup is None and "data-starved" in found


def test_system_findings_are_not_held_while_warming_up():
    job = Job(seconds=5.0, gpu={**HEALTHY_GPM, "throttle_reasons": 0x20, "sm_clock_mhz": 1700, "temperature_c": 88.0})
    found, ctx = evaluate(born(job.store(), 5.0))
    assert ctx.warmup and "throttling" in found


def test_the_pane_and_the_engine_say_warming_up_not_no_findings():
    st = job_store(3.0, compiling=True, age=3.0)
    adv = Advisor()
    shown = adv.evaluate(st)
    assert [f.id for f in shown] == [WARMUP_ID]  # at once, no hysteresis
    text = "\n".join("".join(t for t, _ in ln) for ln in advice_pane_lines(shown, []))
    assert "Warming up: compiling (torch.compile)" in text and "No findings" not in text
    # once warm, the note goes at once
    later = job_store(20.0, compiling=False, age=60.0)
    adv2 = Advisor()
    adv2.update(adv.run_rules(build_context(st)), 1.0)
    assert WARMUP_ID not in {f.id for f in adv2.update(adv.run_rules(build_context(later)), 2.0)}


def test_oversubscription_is_not_held_while_the_job_warms_up():
    # It is read from the configuration, and it is what can make a start-up crawl.
    from gputop.advisor.engine import HELD_WHILE_WARMING

    assert "cpu-oversubscribed" not in HELD_WHILE_WARMING
    assert {"data-starved", "workers-saturated", "io-bound", "host-sync"} <= set(HELD_WHILE_WARMING)


def test_a_running_forked_worker_is_not_starting():
    # A forked DataLoader worker's stack as py-spy shows it (torchvision-style job, H100): the
    # parent's frames down to the fork stay below the worker's own for its whole life.
    torch_data = f"{LIB}/utils/data"
    worker = (
        Frame("Images.__getitem__", "/home/u/train.py", 40),
        Frame("_MapDatasetFetcher.fetch", f"{torch_data}/_utils/fetch.py", 52),
        Frame("_worker_loop", f"{torch_data}/_utils/worker.py", 349),
        Frame("BaseProcess.run", "/usr/lib/python3.12/multiprocessing/process.py", 108),
        Frame("BaseProcess._bootstrap", "/usr/lib/python3.12/multiprocessing/process.py", 314),
        Frame("Popen._launch", "/usr/lib/python3.12/multiprocessing/popen_fork.py", 71),
        Frame("Popen.__init__", "/usr/lib/python3.12/multiprocessing/popen_fork.py", 19),
        Frame("BaseProcess.start", "/usr/lib/python3.12/multiprocessing/process.py", 121),
        Frame("_MultiProcessingDataLoaderIter.__init__", f"{torch_data}/dataloader.py", 1120),
        Frame("main", "/home/u/train.py", 90),
    )
    assert warmup_of(stack(0, C.DATA_FETCH, frames=worker)) is None
    # the same worker before it reached its loop is still starting
    assert warmup_of(stack(0, C.OTHER, frames=worker[3:])) == "starting DataLoader workers"


SITE = "/usr/lib/python3.11/site-packages"
BOOT = "<frozen importlib._bootstrap>"
BOOT_EXT = "<frozen importlib._bootstrap_external>"


def _sample(frames):
    from gputop.model import StackSample

    return StackSample(ts=0.0, pid=1, thread_id=1, thread_name="MainThread", frames=tuple(frames), active=True,
                       is_main=True, category=C.OTHER)


def test_importing_a_compilers_modules_is_importing_not_compiling():
    # The first optimizer step of a job that never compiles imports torch._dynamo: its module code
    # (convert_frame.py's top level) runs under importlib, inside the optimizer step.
    lazy = [Frame("<module>", f"{SITE}/torch/_dynamo/convert_frame.py", 40), Frame("_call_with_frames_removed", BOOT, 241),
            Frame("exec_module", BOOT_EXT, 940), Frame("_load_unlocked", BOOT, 690),
            Frame("step", f"{SITE}/torch/optim/adamw.py", 200), Frame("train", "/home/u/train.py", 55)]
    assert warmup_of(_sample(lazy)) == "importing modules"
    # dynamo's functions running (below any import): compiling, even while it imports a module.
    compiling = [Frame("_compile", f"{SITE}/torch/_dynamo/convert_frame.py", 700),
                 Frame("__call__", f"{SITE}/torch/_dynamo/convert_frame.py", 500),
                 Frame("forward", "/home/u/model.py", 10), Frame("train", "/home/u/train.py", 55)]
    assert warmup_of(_sample(compiling)) == "compiling (torch.compile)"
    importing_while_compiling = [Frame("<module>", f"{SITE}/torch/_inductor/codegen/x.py", 1),
                                 Frame("_load_unlocked", BOOT, 690)] + compiling
    assert warmup_of(_sample(importing_while_compiling)) == "compiling (torch.compile)"


def test_a_module_being_imported_is_not_its_files_category():
    from gputop.analysis.classify import classify

    # `import torch` runs torch/distributed/... and torch/optim/... top-level code: not a
    # collective or an optimizer step (the Stacks tab called it both, dump after dump).
    for mod in ("torch/distributed/distributed_c10d.py", "torch/optim/adamw.py", "torch/utils/data/dataloader.py"):
        frames = [Frame("<module>", f"{SITE}/{mod}", 1), Frame("_call_with_frames_removed", BOOT, 241),
                  Frame("exec_module", BOOT_EXT, 940), Frame("<module>", "/home/u/train.py", 3)]
        assert classify(frames, active=True) is C.OTHER, mod
    # A lazy import inside the optimizer step keeps the step's category.
    lazy = [Frame("<module>", f"{SITE}/torch/_dynamo/eval_frame.py", 40), Frame("_load_unlocked", BOOT, 690),
            Frame("step", f"{SITE}/torch/optim/adamw.py", 200), Frame("train", "/home/u/train.py", 55)]
    assert classify(lazy, active=True) is C.OPTIMIZER
    # A training loop run from inside an import (runpy, importlib at the bottom) is classified as usual.
    deep = [Frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2500)] + [
        Frame(f"f{i}", "/home/u/train.py", i) for i in range(9)] + [Frame("_load_unlocked", BOOT, 690)]
    assert classify(deep, active=False) is C.COLLECTIVE


IMPORTING = (Frame("<module>", f"{LIB}/_dynamo/__init__.py", 7),
             Frame("_find_and_load", "<frozen importlib._bootstrap>", 1173),
             Frame("SGD.__init__", f"{LIB}/optim/sgd.py", 30), Frame("<module>", "/home/u/train.py", 13))


def test_the_windows_evidence_starts_after_the_start_up_imports():
    # A new user's job, attached while its first optimizer step imported torch._dynamo: 20 import
    # samples of the attach burst, then the loop on a loaded host (a sample every 2 s). It was told
    # its `<module>` was 80 % "CPU work in the training loop" for 12 s.
    from gputop.analysis.window import STARTUP_STRETCH, startup_end

    imports = [stack(t * 0.1, C.OTHER, frames=IMPORTING) for t in range(20)]
    loop = [stack(2.0 + 2 * k, C.FORWARD) for k in range(5)]
    assert startup_end(imports + loop) == 20
    assert startup_end(imports) == 0  # still importing: the warm-up verdict's, the window keeps it all
    # one lazy import mid-run (fewer than STARTUP_STRETCH in a row) does not cut the evidence
    stray = [stack(30.0 + k, C.FORWARD) for k in range(4)]
    stray[1] = stack(31.0, C.OTHER, frames=IMPORTING)
    assert STARTUP_STRETCH > 1 and startup_end(stray) == 0

    def main(t):
        return C.OTHER if t < 6.0 else C.FORWARD

    job = Job(seconds=14.0, util=periodic(1.0, 0.4), main=main, gpu=HEALTHY_GPM,
              main_frames=lambda t: IMPORTING if t < 6.0 else None)
    _, ctx = evaluate(born(job.store(), 60.0))
    assert ctx.main_stacks and all(s.ts >= ctx.main_stacks[0].ts for s in ctx.main_stacks)
    assert not any(s.frames == IMPORTING for s in ctx.main_stacks)
    # the warm-up verdict still reads the whole history
    _, ctx = evaluate(born(Job(seconds=4.0, util=periodic(1.0, 0.4), main=lambda t: C.OTHER, gpu=HEALTHY_GPM,
                               main_frames=lambda t: IMPORTING).store(), 60.0))
    assert ctx.warmup and ctx.warmup.startswith("importing modules")
