"""`gputop --pid` given a DataLoader worker's PID (a new user's report: "no findings" for a job
that slept 92 % of its time; its worker read as stuck on its index queue): the worker is named as
such, with its parent to attach to, and nothing else is said of it."""

from __future__ import annotations

from gputop.advisor.context import context_from_samples
from gputop.advisor.engine import Advisor
from gputop.model import Category as C
from gputop.model import Frame, ProcSample, StackSample

T0 = 1_767_225_600.0
WORKER, PARENT = 4321, 4300
TORCH = "/venv/lib/python3.12/site-packages/torch/utils/data/_utils/worker.py"
QUEUES = "/usr/lib/python3.12/multiprocessing/queues.py"


def _ctx(frames: tuple[Frame, ...], n: int = 40):
    stacks = [StackSample(ts=T0 + i * 0.2, pid=WORKER, thread_id=1, thread_name="MainThread", is_main=True,
                          active=False, frames=frames, category=C.IDLE) for i in range(n)]
    procs = {WORKER: [ProcSample(ts=T0 + k, pid=WORKER, ppid=PARENT, name="python3", cpu_percent=1.0, role="target",
                                 create_time=T0 - 30) for k in range(9)]}
    return context_from_samples(now=T0 + 8.0, stacks=stacks, procs=procs, target_pid=WORKER)


def _found(ctx):
    adv = Advisor()
    found = {f.id: f for f in adv.run_rules(ctx)}
    assert adv.errors == {}
    return found


def test_a_worker_is_named_with_its_parent_to_attach_to():
    waiting = (Frame("Queue.get", QUEUES, 113), Frame("_worker_loop", TORCH, 301),
               Frame("BaseProcess.run", "/usr/lib/python3.12/multiprocessing/process.py", 108))
    found = _found(_ctx(waiting))
    f = found["attached-to-worker"]
    assert f.title == f"PID {WORKER} is a DataLoader worker, not the training process"
    assert f"gputop --pid {PARENT}" in f.action and f"DataLoader worker of PID {PARENT}" in f.evidence[0]


def test_a_training_process_is_not_a_worker():
    training = (Frame("Linear.forward", "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", 134),
                Frame("main", "/home/u/train.py", 40, loop=38))
    assert "attached-to-worker" not in _found(_ctx(training))
    assert "attached-to-worker" not in _found(_ctx((Frame("Queue.get", QUEUES, 113), Frame("_worker_loop", TORCH, 301)), n=5))
