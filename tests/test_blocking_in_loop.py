"""The training loop blocking in a call of its own (a sleep, a metrics POST): off the CPU, in the
user's code, while the GPU (or the job) waits."""

from gputop.advisor.context import build_context
from gputop.advisor.engine import Advisor
from gputop.model import Category as C
from gputop.model import Frame

from synth import Job, periodic

LOG = (Frame("log_metrics", "/home/u/train.py", 10, code="time.sleep(0.03)"),
       Frame("train", "/home/u/train.py", 40), Frame("<module>", "/home/u/train.py", 60))
STEP = (Frame("forward", "/home/u/model.py", 20), Frame("train", "/home/u/train.py", 35),
        Frame("<module>", "/home/u/train.py", 60))
GPM = {"sm_active": 80.0, "tensor_active": 30.0}


def _found(job):
    return {f.id: f for f in Advisor().run_rules(build_context(job.store()))}


def _job(util):
    def cat(t):
        return C.IDLE if (t * 5) % 5 < 4 else C.FORWARD

    return Job(seconds=20, util=util, main=cat, main_frames=lambda t: LOG if (t * 5) % 5 < 4 else STEP,
               main_active=lambda t: not ((t * 5) % 5 < 4), gpu=GPM)


def test_a_sleep_in_the_loop_while_the_gpu_waits_is_named_with_its_line():
    found = _found(_job(periodic(1.0, 0.2)))
    f = found["blocking-in-loop"]
    assert "`log_metrics`" in f.title and "time.sleep(0.03)" in " ".join(f.evidence)
    assert "background thread" in f.action and "every N steps" in f.action


def test_a_wait_the_gpu_does_not_feel_is_not_a_cost():
    # The GPU stays busy (the sleep overlaps queued work): nothing to give back.
    assert "blocking-in-loop" not in _found(_job(lambda t: 100.0))


# A loop written at module level (the new user's leak.py: `time.sleep(0.02); r.tick()` on line
# 12 of the loop itself): there is no function to hand to a thread. It was told "take `<module>`
# off the training loop's thread".
MODULE_SLEEP = (Frame("<module>", "/home/u/leak.py", 12, code="time.sleep(0.02); r.tick()"),)
MODULE_STEP = (Frame("Linear.forward", "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", 116),
               Frame("<module>", "/home/u/leak.py", 9))
# The same inside the loop's own function (`def train(): while ...: time.sleep(...)`): its frame
# also holds the model's work, so it is the loop, not a helper it calls.
TRAIN_SLEEP = (Frame("train", "/home/u/train.py", 44, code="time.sleep(0.02)"), Frame("<module>", "/home/u/train.py", 60))
TRAIN_STEP = (Frame("Linear.forward", "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", 116),
              Frame("train", "/home/u/train.py", 41), Frame("<module>", "/home/u/train.py", 60))


def _loop_job(sleep, step):
    def blocked(t):
        return (t * 5) % 5 < 4

    return Job(seconds=20, util=None, main=lambda t: C.IDLE if blocked(t) else C.FORWARD,
               main_frames=lambda t: sleep if blocked(t) else step, main_active=lambda t: not blocked(t))


def test_a_loop_at_module_level_is_told_to_change_its_blocking_line():
    f = _found(_loop_job(MODULE_SLEEP, MODULE_STEP))["blocking-in-loop"]
    text = f.title + f.action
    assert "`<module>`" not in text and "take `" not in f.action
    assert "`time.sleep(0.02); r.tick()` (u/leak.py:12)" in f.title
    assert f.action.startswith("the loop itself blocks at `time.sleep(0.02); r.tick()` (u/leak.py:12)")


def test_a_sleep_in_the_loops_own_function_is_the_line_not_the_function():
    f = _found(_loop_job(TRAIN_SLEEP, TRAIN_STEP))["blocking-in-loop"]
    assert "take `train`" not in f.action
    assert f.action.startswith("the loop itself blocks at `time.sleep(0.02)` (u/train.py:44)")


def test_a_helper_the_loop_calls_is_moved_and_its_line_named():
    f = _found(_job(periodic(1.0, 0.2)))["blocking-in-loop"]
    assert f.action.startswith("take `log_metrics` (it blocks at `time.sleep(0.03)` (u/train.py:10)) off")
    assert "at `time.sleep(0.03)` (u/train.py:10)" in f.title


def test_one_wait_the_loop_has_not_left_is_a_hang_forming_not_a_per_step_cost():
    """A job waiting for ever on a queue nobody fills was told "remove that call from the loop"
    before it was called stuck (new user, CPU): the loop must come back to the wait to make it a
    cost of every step."""
    get = (Frame("wait", "/usr/lib/python3.12/threading.py", 320),
           Frame("train", "/home/u/train.py", 40, code="x, y = batches.get()"),
           Frame("<module>", "/home/u/train.py", 60))
    # 4 s of steps, then the same wait from 4 s on: one episode of blocking in `train`
    hung = Job(seconds=20, util=periodic(1.0, 0.2), main=lambda t: C.IDLE if t >= 4 else C.FORWARD,
               main_frames=lambda t: get if t >= 4 else STEP, main_active=lambda t: t < 4, gpu=GPM)
    assert "blocking-in-loop" not in _found(hung)
    # the same wait, left and come back to every second: a cost of every step
    steps = Job(seconds=20, util=periodic(1.0, 0.2), main=lambda t: C.IDLE if (t * 5) % 5 < 4 else C.FORWARD,
                main_frames=lambda t: get if (t * 5) % 5 < 4 else STEP, main_active=lambda t: not ((t * 5) % 5 < 4),
                gpu=GPM)
    assert "blocking-in-loop" in _found(steps)


def test_a_cpu_job_sleeping_in_its_own_loop_function_is_told_to_remove_the_call():
    # A new user's CPU job (a tiny model: no forward/backward sample to tell the loop's function
    # by) sleeps 10 ms a step in `main`, the function that holds its loop. The report said "take
    # `main` off the training loop's thread: hand it to a background thread", moving the loop
    # itself; the step model's loop frame, seen at several of its lines, says `main` is the loop.
    from pathlib import Path

    from test_rule_evaluation import replay

    shown, _, _ = replay(Path(__file__).parent / "fixtures" / "recordings" / "cpu-sleep-in-main-loop.gputop")
    f = shown["blocking-in-loop"]
    assert f.title.startswith("The training loop blocks at `time.sleep(0.01)`"), f.title
    assert "remove that call from the loop" in f.action and "take `main`" not in f.action


def test_workers_asleep_with_no_storage_evidence_are_not_told_io_bound():
    # A new user's CPU job (three sessions appended in one file): two DataLoader workers sleeping
    # 2 ms per item in __getitem__, no iowait, 409 B/s of disk reads, none of the workers' stacks in
    # a read. The report said "waits for storage 22 % of the time: input is IO-bound", its own
    # evidence reading "no storage evidence": the IO-wait share came from a process of the job seen
    # in disk sleep at a few polls alone.
    import json
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / "recordings" / "cpu-workers-sleep-three-sessions.gputop"
    out = subprocess.run([sys.executable, "-m", "gputop", "report", str(path), "--json"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ids = [f["id"] for f in json.loads(out.stdout)["findings"]]
    assert "io-bound" not in ids and "blocking-in-loop" in ids, ids
