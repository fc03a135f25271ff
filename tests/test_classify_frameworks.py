"""The classifier on real frameworks' stacks (tests/fixtures/stacks/fw-*.json, captured by
tests/fixtures/stacks/capture.py from frameworks/), the text rules the issue named, and the
recognition of DataLoader workers. Needs none of the frameworks: the fixtures are JSON."""

import glob
import json
import os

import pytest

from gputop.advisor.context import context_from_samples
from gputop.analysis.classify import RULES, classify, explain, is_library
from gputop.analysis.efficiency import is_worker
from gputop.model import Category, Frame, ProcSample, StackSample
from gputop.sources.stacks import StackParser

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "stacks")
ALL = sorted(glob.glob(os.path.join(HERE, "*.json")))
FW = [p for p in ALL if os.path.basename(p).startswith("fw-")]
SITE = "/usr/lib/python3.11/site-packages/"
PROJ = "/home/user/project/train.py"
C = Category


def expectations(path, rules=RULES):
    """(scenario, thread name, expected, got) for every thread a fixture names."""
    with open(path) as f:
        doc = json.load(f)
    lines = doc["source_lines"]
    parser = StackParser(lambda fn, ln: lines.get(f"{fn}:{ln}"), lambda fr, a: classify(fr, a, rules), is_library)
    by_id = {str(s.thread_id): s for s in parser.samples(doc["dump"], 1.0)}
    return [(doc["scenario"], by_id[t].thread_name, want, by_id[t].category.value) for t, want in doc["expected"].items()]


def test_frameworks_are_captured():
    names = {os.path.basename(p)[3:-5] for p in FW}
    for want in ("lightning-auto-item", "lightning-manual-backward", "hf-trainer-forward", "accelerate-backward",
                 "ddp-allreduce-wait", "ddp-allreduce-wait-native", "ddp-straggler", "fsdp1-forward",
                 "fsdp2-forward", "checkpoint-wrapper-forward", "checkpoint-wrapper-backward", "compile-forward",
                 "dcp-save"):
        assert want in names


@pytest.mark.parametrize("path", FW, ids=[os.path.basename(p)[3:-5] for p in FW])
def test_framework_capture_is_classified_as_expected(path):
    for scenario, thread, want, got in expectations(path):
        assert got == want, (scenario, thread)


def test_fixtures_carry_no_machine_paths():
    for p in FW:
        with open(p) as f:
            text = f.read()
        assert "/tmp/venv" not in text and "/root/" not in text and "/work/" not in text, p


# Rules that name a framework the fixtures cannot come from here, and why. Every other rule that
# names a framework must be needed by some real capture (issue: "disabling ten framework-specific
# rules leaves the suite green").
NOT_CAPTURED = {
    "apex/bitsandbytes/deepspeed": "not installed; their optimizers subclass torch.optim.Optimizer, whose "
                                   "step wrapper in torch/optim/ already says optimizer",
    "deepspeed/horovod": "not installed; DeepSpeed's comm calls torch.distributed's",
    "accelerate/lightning": "the batch transfer is instant on CPU (no copy to a device): never sampled there",
    "lightning/transformers": "their save helpers end in torch.save or safetensors, which the path rules catch",
}


@pytest.mark.parametrize("rule", [r for r in RULES if r.framework], ids=lambda r: r.framework)
def test_each_framework_rule_is_needed_by_a_real_capture(rule):
    without = tuple(r for r in RULES if r is not rule)
    changed = [(s, t, want) for p in ALL for (s, t, want, got) in expectations(p, without) if got != want]
    if rule.framework in NOT_CAPTURED:
        assert not changed, f"{rule.framework} now has a capture: drop it from NOT_CAPTURED"
    else:
        assert changed, f"no fixture needs the {rule.framework} rule ({rule.why})"


# --------------------------------------------------------------------------- built stacks


def F(name, filename, line=1, code=None):
    return Frame(name=name, filename=filename, line=line, code=code)


def test_what_runs_in_an_optimizer_closure_decides():
    closure = [
        F("Closure.closure", SITE + "lightning/pytorch/loops/optimization/automatic.py", 131),
        F("SGD.step", SITE + "torch/optim/sgd.py", 116),
        F("Optimizer.profile_hook_step.<locals>.wrapper", SITE + "torch/optim/optimizer.py", 530),
        F("train", PROJ, 9, "opt.step(closure)"),
    ]
    step = [F("Model.training_step", PROJ, 24, "acc += loss.item()")] + closure
    assert classify(step) is C.HOST_SYNC
    bwd = [F("_engine_run_backward", SITE + "torch/autograd/graph.py", 979),
           F("Tensor.backward", SITE + "torch/_tensor.py", 623)] + closure
    assert classify(bwd) is C.BACKWARD
    # Nothing inside the closure says what it does: the optimizer step around it does.
    assert classify([F("Model.training_step", PROJ, 25, "n += 1")] + closure) is C.OPTIMIZER


@pytest.mark.parametrize("code", ["total += float(loss)", "torch.cuda.synchronize()",
                                  "x = y.to('cpu')", "x = y.to(device=\"cpu\")"])
def test_read_backs_are_host_syncs(code):
    assert classify([F("train", PROJ, 5, code)], active=False) is C.HOST_SYNC


def test_sync_and_format_frames_are_host_syncs():
    acc = [F("synchronize", SITE + "torch/accelerator/__init__.py", 246), F("train", PROJ, 4)]
    assert classify(acc, active=False) is C.HOST_SYNC
    fmt = [F("_tensor_str", SITE + "torch/_tensor_str.py", 400), F("Tensor.__repr__", SITE + "torch/_tensor.py", 590),
           F("train", PROJ, 4, "print(loss)")]
    assert classify(fmt) is C.HOST_SYNC


@pytest.mark.parametrize("code", ["work.wait()", "handle.wait()", "self._work.wait()", "reqs[0].wait()"])
def test_work_wait_is_a_collective(code):
    assert classify([F("train", PROJ, 5, code)], active=False) is C.COLLECTIVE


def test_copies_by_what_the_call_names():
    hf = [F("Trainer._prepare_input", SITE + "transformers/trainer.py", 2376, "return data.to(**kwargs)"),
          F("Trainer._prepare_inputs", SITE + "transformers/trainer.py", 2380)]
    assert classify(hf) is C.H2D_COPY
    for code in ("x = host[i].to(DEV)", "b = batch.to(self.device)", "dst.copy_(src, non_blocking=True)"):
        assert classify([F("t", PROJ, 1, code)]) is C.H2D_COPY, code
    for code in ("buf.copy_(src)", "x = x.to(torch.bfloat16)", "x = x.to(dtype=torch.float16)",
                 "x = x.to(memory_format=torch.channels_last)", "x = x.to(self.dtype)"):
        assert classify([F("t", PROJ, 1, code)]) is C.OTHER, code


def test_distributed_wrappers_are_not_collectives():
    wrapped = [F("Linear.forward", SITE + "torch/nn/modules/linear.py", 134),
               F("FullyShardedDataParallel.forward", SITE + "torch/distributed/fsdp/fully_sharded_data_parallel.py", 857),
               F("train", PROJ, 3)]
    assert classify(wrapped) is C.FORWARD
    ar = [F("all_reduce", SITE + "torch/distributed/distributed_c10d.py", 2500),
          F("_exception_logger.<locals>.wrapper", SITE + "torch/distributed/c10d_logger.py", 83),
          F("FullyShardedDataParallel.forward", SITE + "torch/distributed/fsdp/fully_sharded_data_parallel.py", 857)]
    assert explain(ar, active=False).category is C.COLLECTIVE


# --------------------------------------------------------------------------- DataLoader workers

TARGET = 1000


def proc(pid, name, role="worker", ppid=TARGET, ts=10.0):
    return ProcSample(ts=ts, pid=pid, ppid=ppid, name=name, role=role, cpu_percent=5.0)


def stack(pid, *frames, ts=10.0):
    return StackSample(ts=ts, pid=pid, thread_id=pid, thread_name="MainThread", frames=tuple(frames), is_main=True)


LOOP = F("_worker_loop", SITE + "torch/utils/data/_utils/worker.py", 330)
SERVICE = F("StreamMux.loop", SITE + "wandb/sdk/internal/service.py", 80)


def test_workers_by_name_or_loop_not_by_parentage():
    assert is_worker(proc(1001, "pt_data_worker"), TARGET)
    # torch before the thread name, or a name not read: the worker loop says it
    assert is_worker(proc(1002, "python"), TARGET, [stack(1002, LOOP)])
    # a child of the job that is something else: a logging service, with or without its stack
    assert not is_worker(proc(1003, "wandb-service"), TARGET)
    assert not is_worker(proc(1003, "python"), TARGET, [stack(1003, SERVICE)])
    assert not is_worker(proc(TARGET, "python", role="target", ppid=1), TARGET)


def test_an_unrelated_child_does_not_count_as_a_worker_in_the_context():
    procs = {
        TARGET: [proc(TARGET, "python", role="target", ppid=1)],
        1001: [proc(1001, "pt_data_worker")],
        1002: [proc(1002, "pt_data_worker")],
        1003: [proc(1003, "python")],  # a logging service the job started
    }
    stacks = [stack(TARGET, F("train", PROJ, 3)), stack(1001, LOOP), stack(1002, LOOP), stack(1003, SERVICE)]
    ctx = context_from_samples(now=10.5, window_s=60.0, procs=procs, stacks=stacks, target_pid=TARGET)
    assert sorted(w.pid for w in ctx.workers.current) == [1001, 1002]
    assert {s.pid for s in ctx.worker_stacks} == {1001, 1002}
