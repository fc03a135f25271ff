"""memory-bound-kernels: a GPU full of work (busy, SMs active) whose tensor cores idle, the fp32 and
FP64 units idle too, spends its time in elementwise/normalisation/layout kernels. A held-out GPT with
hand-written LayerNorm and GELU (H200: tensor cores 14 %, DRAM 58 %; nn.LayerNorm/nn.GELU measured
1.98x, bench/results/real_jobs_fresh11.md) got no finding; a healthy one (tensor cores 62 %) must
stay silent. The change is named only where the stacks show the site."""

from pathlib import Path

import pytest

from gputop.model import Category as C
from gputop.model import Frame

from synth import Job
from test_rules import run_rules

SITE = "/venv/lib/python3.12/site-packages"
RECORDINGS = Path(__file__).parent / "fixtures" / "recordings"

LINEAR = (Frame("Linear.forward", f"{SITE}/torch/nn/modules/linear.py", 134),
          Frame("Block.forward", "/home/u/model.py", 92), Frame("train", "/home/u/train.py", 40))
HAND_NORM = (Frame("LayerNorm.forward", "/home/u/model.py", 31, code="std = x.std(-1, keepdim=True)"),
             Frame("Block.forward", "/home/u/model.py", 91), Frame("train", "/home/u/train.py", 40))
FUSED_NORM = (Frame("RMSNorm.forward", "/home/u/model.py", 31, code="return F.rms_norm(x, self.shape, self.weight)"),
              Frame("Block.forward", "/home/u/model.py", 91), Frame("train", "/home/u/train.py", 40))
CONV = (Frame("Conv2d._conv_forward", f"{SITE}/torch/nn/modules/conv.py", 549),
        Frame("Conv2d.forward", f"{SITE}/torch/nn/modules/conv.py", 554), Frame("train", "/home/u/train.py", 40))
BWD = (Frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 869), Frame("train", "/home/u/train.py", 41))

STARVED = {"sm_active": 91.0, "tensor_active": 14.0, "fp32_active": 2.0, "dram_active": 58.0}


def gpu_bound(site, gpm=STARVED, **kw):
    """A GPU busy all the time; of every ten main-thread samples, two at ``site``, two in a Linear, six
    waiting in backward (a GPU-bound job's main thread runs ahead and waits)."""
    def frames(t):
        k = round(t * 5) % 10
        return site if k < 2 else (LINEAR if k < 4 else BWD)

    return Job(util=lambda t: 100.0, main=lambda t: C.BACKWARD if frames(t) is BWD else C.FORWARD,
               main_frames=frames, seconds=20.0, gpu=dict(gpm), **kw)


def test_hand_written_elementwise_math_on_a_starved_gpu_is_named_with_its_module():
    found, _ = run_rules(gpu_bound(HAND_NORM))
    f = found["memory-bound-kernels"]
    assert f.severity.value == "warning"
    assert "`LayerNorm.forward` (" in f.evidence[1] and "model.py:31" in f.evidence[1]
    assert "nn.LayerNorm" in f.action and "torch.compile" in f.action
    assert "tensor cores only 14 %" in f.evidence[0]


def test_convolutions_on_a_starved_gpu_weigh_channels_last():
    # Nothing sampled says whether the tensors are NCHW: weighed, not warned.
    found, _ = run_rules(gpu_bound(CONV))
    f = found["memory-bound-kernels"]
    assert f.severity.value == "info" and f.title.startswith("Weighing:")
    assert "channels_last" in f.action and "default NCHW" in f.action


def test_a_starved_gpu_whose_stacks_name_no_site_is_weighed():
    found, _ = run_rules(gpu_bound(FUSED_NORM))
    f = found["memory-bound-kernels"]
    assert f.severity.value == "info" and f.title.startswith("Weighing:")
    assert "torch.profiler" in f.action


@pytest.mark.parametrize("gpm", [
    {"sm_active": 94.0, "tensor_active": 62.0, "fp32_active": 3.5, "dram_active": 27.0},  # healthy bf16
    {"sm_active": 92.0, "tensor_active": 1.0, "fp32_active": 60.0, "dram_active": 30.0},  # fp32: no-tensor-cores'
    {"sm_active": 30.0, "tensor_active": 5.0, "fp32_active": 2.0, "dram_active": 10.0},  # not full: launches
])
def test_not_said_where_the_tensor_cores_work_the_math_is_fp32_or_the_gpu_is_not_full(gpm):
    found, _ = run_rules(gpu_bound(HAND_NORM, gpm=gpm))
    assert "memory-bound-kernels" not in found


def test_the_held_out_gpt_with_hand_written_layernorm_and_gelu_is_named_and_a_healthy_one_is_not():
    from test_rule_evaluation import replay

    shown, seen, _ = replay(RECORDINGS / "h200-gpt-handwritten-layernorm-gelu.gputop")
    assert seen.get("memory-bound-kernels") is not None and seen["memory-bound-kernels"] <= 3.0, seen
    f = shown["memory-bound-kernels"]
    assert f.severity.value == "warning" and "`LayerNorm.forward`" in f.evidence[1]
    shown, seen, _ = replay(RECORDINGS / "h200-healthy-long-context-lm.gputop")
    assert "memory-bound-kernels" not in seen
    assert not any(f.severity.value == "warning" for f in shown.values()), shown
