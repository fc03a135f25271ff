"""The stack classifier: real py-spy captures (tests/fixtures/stacks) and the table's rules."""

import glob
import json
import os

import pytest

from gputop.analysis.classify import (
    PRIORITY,
    RULES,
    Rule,
    classify,
    explain,
    is_library,
    own_frames,
    project_frame,
    short_path,
    stack_key,
    where,
)
from gputop.model import Category, Frame
from gputop.sources.stacks import StackParser

FIXTURES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "fixtures", "stacks", "*.json")))
SITE = "/usr/lib/python3.11/site-packages/"
STD = "/usr/lib/python3.11/"
PROJ = "/home/user/project/train.py"


def load(path):
    with open(path) as f:
        doc = json.load(f)
    lines = doc["source_lines"]
    parser = StackParser(lambda fn, ln: lines.get(f"{fn}:{ln}"), classify, is_library)
    return doc, parser.samples(doc["dump"], 1.0)


def test_every_category_has_a_real_capture():
    scenarios = set()
    for p in FIXTURES:
        with open(p) as f:
            doc = json.load(f)
        scenarios.update(doc["expected"].values())
    # gc/idle/other included; every category the issue names is covered by a real stack.
    assert scenarios == {c.value for c in Category}


@pytest.mark.parametrize("path", FIXTURES, ids=[os.path.basename(p)[:-5] for p in FIXTURES])
def test_real_capture_is_classified_as_expected(path):
    doc, samples = load(path)
    by_id = {str(s.thread_id): s for s in samples}
    assert doc["expected"], "fixture without expectations"
    for tid, want in doc["expected"].items():
        s = by_id[tid]
        assert s.category.value == want, (doc["scenario"], s.thread_name, explain(s.frames, s.active))


def test_parser_marks_main_thread_and_keeps_idle_samples():
    doc, samples = load(os.path.join(os.path.dirname(__file__), "fixtures", "stacks", "data-wait.json"))
    main = [s for s in samples if s.is_main]
    assert len(main) == 1 and main[0].thread_name == "MainThread"
    assert samples[0] is main[0]  # main thread first
    assert main[0].os_thread_id == main[0].pid
    # Waiting for data is py-spy's "idle": kept, and classified as data-wait, not dropped.
    assert main[0].active is False and main[0].category is Category.DATA_WAIT
    assert len(samples) == len(doc["dump"])


def test_parser_interns_repeated_frames():
    _, a = load(FIXTURES[0])
    with open(FIXTURES[0]) as f:
        doc = json.load(f)
    parser = StackParser(lambda fn, ln: doc["source_lines"].get(f"{fn}:{ln}"), classify, is_library)
    s1 = parser.samples(doc["dump"], 1.0)
    s2 = parser.samples(doc["dump"], 2.0)
    assert s1[0].frames is s2[0].frames
    assert s2[0].ts == 2.0


def test_worker_inherited_frames_are_cut_at_fork():
    doc, samples = load(os.path.join(os.path.dirname(__file__), "fixtures", "stacks", "worker-fetch.json"))
    main = next(s for s in samples if s.is_main)
    own = own_frames(main.frames)
    assert len(own) < len(main.frames)
    assert own[-1].name == "BaseProcess._bootstrap"
    # The parent's `for x, y in loader` below the fork must not make the worker "data-wait".
    assert where(main.frames).endswith("in SlowDataset.__getitem__")


# --------------------------------------------------------------------------- rules on built stacks


def F(name, filename, line=1, code=None):
    return Frame(name=name, filename=filename, line=line, code=code)


def test_code_rules_only_apply_to_the_newest_frame():
    leaf = F("step", PROJ, 10, "loss_val = loss.item()")
    assert classify([leaf]) is Category.HOST_SYNC
    # The same text on an outer frame means that line called a Python function: not a sync.
    callee = F("helper", PROJ, 20, "x = 1")
    assert classify([callee, leaf]) is Category.OTHER


def test_host_sync_inside_forward_wins_over_forward():
    stack = [
        F("Net.forward", PROJ, 5, "n = int(mask.sum().item())"),
        F("Module._call_impl", SITE + "torch/nn/modules/module.py", 1750),
        F("Module._wrapped_call_impl", SITE + "torch/nn/modules/module.py", 1739),
        F("train", PROJ, 30, "out = model(x)"),
    ]
    m = explain(stack)
    assert m.category is Category.HOST_SYNC and m.index == 0


def test_torch_load_in_a_dataset_is_data_fetch_not_checkpoint():
    stack = [
        F("_load", SITE + "torch/serialization.py", 1500),
        F("load", SITE + "torch/serialization.py", 1400),
        F("MyData.__getitem__", PROJ, 12, "return torch.load(self.files[i])"),
        F("_MapDatasetFetcher.fetch", SITE + "torch/utils/data/_utils/fetch.py", 52),
        F("_SingleProcessDataLoaderIter._next_data", SITE + "torch/utils/data/dataloader.py", 789),
        F("train", PROJ, 30),
    ]
    assert classify(stack) is Category.DATA_FETCH
    assert classify(stack[:2] + [F("train", PROJ, 40, "torch.save(sd, p)")]) is Category.CHECKPOINT_IO


def test_forward_recomputed_in_backward_is_backward():
    stack = [
        F("Linear.forward", SITE + "torch/nn/modules/linear.py", 125),
        F("Module._call_impl", SITE + "torch/nn/modules/module.py", 1750),
        F("CheckpointFunction.backward", SITE + "torch/utils/checkpoint.py", 300),
        F("_engine_run_backward", SITE + "torch/autograd/graph.py", 824),
        F("Tensor.backward", SITE + "torch/_tensor.py", 626),
        F("train", PROJ, 31, "loss.backward()"),
    ]
    assert classify(stack) is Category.BACKWARD


def test_optimizer_internal_item_is_optimizer():
    stack = [
        F("_get_value", SITE + "torch/optim/optimizer.py", 90, "return x.item()"),
        F("_single_tensor_adam", SITE + "torch/optim/adam.py", 400),
        F("Adam.step", SITE + "torch/optim/adam.py", 240),
        F("train", PROJ, 33, "opt.step()"),
    ]
    assert classify(stack) is Category.OPTIMIZER


def test_collective_and_synchronize_by_frame():
    ar = [F("all_reduce", SITE + "torch/distributed/distributed_c10d.py", 2500), F("train", PROJ, 3)]
    assert classify(ar, active=False) is Category.COLLECTIVE
    sync = [F("synchronize", SITE + "torch/cuda/__init__.py", 985), F("train", PROJ, 4)]
    assert classify(sync) is Category.HOST_SYNC
    ev = [F("Event.synchronize", SITE + "torch/cuda/streams.py", 220), F("train", PROJ, 4)]
    assert classify(ev, active=False) is Category.HOST_SYNC


def test_h2d_rule_needs_a_device_not_a_dtype():
    assert classify([F("t", PROJ, 1, "x = x.to(device, non_blocking=True)")]) is Category.H2D_COPY
    assert classify([F("t", PROJ, 1, "x = x.cuda()")]) is Category.H2D_COPY
    assert classify([F("t", PROJ, 1, "x = x.to(torch.float16)")]) is Category.OTHER


def test_fallback_uses_pyspy_idle_flag():
    stack = [F("wait_for_signal", PROJ, 7, "ev.wait()")]
    assert classify(stack, active=False) is Category.IDLE
    assert classify(stack, active=True) is Category.OTHER
    assert classify([], active=False) is Category.IDLE


def test_loader_worker_waiting_for_indices_is_idle():
    stack = [
        F("_PollLikeSelector.select", STD + "selectors.py", 415),
        F("Queue.get", STD + "multiprocessing/queues.py", 113),
        F("_worker_loop", SITE + "torch/utils/data/_utils/worker.py", 330),
        F("BaseProcess.run", STD + "multiprocessing/process.py", 108),
        F("BaseProcess._bootstrap", STD + "multiprocessing/process.py", 314),
        # inherited from the parent at fork time
        F("DataLoader.__iter__", SITE + "torch/utils/data/dataloader.py", 505),
        F("train", PROJ, 30),
    ]
    assert classify(stack, active=False) is Category.IDLE


def test_table_is_extensible():
    mine = Rule(Category.CHECKPOINT_IO, path=r"/mylib/ckpt\.py$", why="in-house async checkpointing")
    stack = [F("write_shard", "/opt/mylib/ckpt.py", 9), F("train", PROJ, 50)]
    assert classify(stack) is Category.OTHER
    assert classify(stack, rules=(mine,) + RULES) is Category.CHECKPOINT_IO


def test_rule_needs_a_condition_and_every_category_is_ranked():
    with pytest.raises(ValueError):
        Rule(Category.GC)
    assert set(PRIORITY) == set(Category)
    assert {r.category for r in RULES} <= set(PRIORITY)


# --------------------------------------------------------------------------- frame helpers


def test_library_and_project_files():
    assert is_library(SITE + "torch/nn/modules/module.py")
    assert is_library("/usr/lib/python3.12/threading.py")
    assert is_library("<frozen importlib._bootstrap>")
    assert is_library("/opt/conda/lib/python3.10/site-packages/numpy/core.py")
    assert not is_library(PROJ)
    assert short_path(SITE + "torch/nn/modules/module.py") == "torch/nn/modules/module.py"
    assert short_path(STD + "multiprocessing/queues.py") == "multiprocessing/queues.py"
    assert short_path(PROJ) == "project/train.py"


def test_where_prefers_the_newest_project_frame():
    stack = [F("Queue.get", STD + "queue.py", 171), F("train_step", PROJ, 42), F("main", PROJ, 90)]
    assert project_frame(stack).line == 42
    assert where(stack) == "project/train.py:42 in train_step"
    assert where([F("Queue.get", STD + "queue.py", 171)]) == "queue.py:171 in Queue.get"
    assert where([]) == "no Python frames"
    assert stack_key(stack) != stack_key(stack[1:])


def test_a_library_module_imported_deep_in_a_stack_is_an_import_not_what_it_is_named_for():
    # A new user's start-up: `torch.optim.SGD(...)` imports torch.distributed._functional_collectives,
    # whose top-level code registers custom ops and reads source files 9 frames above the import
    # machinery. It was "collective/communication wait" in a job with no process group.
    site = "/venv/lib/python3.11/site-packages/torch"
    boot = "<frozen importlib._bootstrap>"
    frames = (
        Frame("getsourcefile", "/usr/lib/python3.11/inspect.py", 941),
        Frame("getframeinfo", "/usr/lib/python3.11/inspect.py", 1688),
        Frame("get_source", f"{site}/_library/utils.py", 45),
        Frame("Library._register_fake", f"{site}/library.py", 331),
        Frame("CustomOpDef._register_fake_dispatcher_impl", f"{site}/_library/custom_ops.py", 786),
        Frame("CustomOpDef._register_to_dispatcher", f"{site}/_library/custom_ops.py", 750),
        Frame("CustomOpDef.__init__", f"{site}/_library/custom_ops.py", 309),
        Frame("custom_op.<locals>.inner", f"{site}/_library/custom_ops.py", 249),
        Frame("<module>", f"{site}/distributed/_functional_collectives.py", 1325),
        Frame("_call_with_frames_removed", boot, 241),
        Frame("_load_unlocked", boot, 690),
        Frame("Optimizer.__init__", f"{site}/optim/optimizer.py", 380),
        Frame("SGD.__init__", f"{site}/optim/sgd.py", 63),
        Frame("<module>", "/home/u/short.py", 2, code="m = model(); opt = torch.optim.SGD(m.parameters(), lr=0.01)"),
    )
    assert classify(frames, active=True) is Category.OTHER  # making an optimizer, importing what it needs
    # the user's own module run by an import (`python -c "import train"`) is the user's work
    loop = (Frame("all_reduce", f"{site}/distributed/distributed_c10d.py", 2500),
            *(Frame("wrapper", f"{site}/distributed/c10d_logger.py", 80 + k) for k in range(8)),
            Frame("<module>", "/home/u/train.py", 40, code="dist.all_reduce(t)"),
            Frame("_call_with_frames_removed", boot, 241))
    assert classify(loop, active=False) is Category.COLLECTIVE
    # and the step of an optimizer is still its step
    assert classify((Frame("SGD.step", f"{site}/optim/sgd.py", 80),
                     Frame("<module>", "/home/u/short.py", 6, code="opt.step()")), active=True) is Category.OPTIMIZER
