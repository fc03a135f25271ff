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
