"""cuDNN benchmark mode re-tuning each new input shape: the main thread inside convolution calls
while the GPU idles between full-size kernels. A held-out Lightning audio job (H200) was told
launch-bound; Trainer(benchmark=False) measured 6.76x. Told apart from a launch-bound conv net
(small kernels) and from a healthy one (conv calls a small share, the GPU busy)."""

from pathlib import Path

import pytest

from gputop.model import Category as C
from gputop.model import Frame

from synth import Job, periodic
from test_rules import run_rules

SITE = "/venv/lib/python3.12/site-packages"
CONV = (Frame("Conv1d._conv_forward", f"{SITE}/torch/nn/modules/conv.py", 370),
        Frame("Conv1d.forward", f"{SITE}/torch/nn/modules/conv.py", 375),
        Frame("AudioNet.forward", "/home/u/model.py", 30), Frame("train", "/home/u/train.py", 40))
BWD = (Frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 869), Frame("train", "/home/u/train.py", 41))
FULL = {"sm_active": 80.0, "sm_occupancy": 30.0, "tensor_active": 20.0, "fp32_active": 3.0}
SMALL = {"sm_active": 8.0, "sm_occupancy": 3.0, "tensor_active": 1.0, "fp32_active": 1.0}


def job(gpm, conv_share=0.45, busy_for=0.5):
    def main(t):
        return C.FORWARD if t % 1.0 < conv_share - 1e-9 else C.BACKWARD

    def frames(t):
        return CONV if t % 1.0 < conv_share - 1e-9 else BWD

    return Job(util=periodic(1.0, busy_for), main=main, main_frames=frames, gpu=gpm, seconds=20.0)


def test_a_main_thread_inside_conv_calls_while_full_kernels_leave_the_gpu_idle_is_named():
    from gputop.advisor.rules import RULES_BY_ID

    found, ctx = run_rules(job(FULL))
    f = found["cudnn-retune"]
    # compile or a larger batch would not touch it: launch-bound's warning gives way
    assert "launch-bound" in RULES_BY_ID["cudnn-retune"].supersedes
    inside = sum(1 for s in ctx.main_stacks if s.frames == CONV) / len(ctx.main_stacks)
    assert f"inside convolution calls in {round(inside * 100)} %" in f.evidence[0]
    assert "torch.backends.cudnn.benchmark = False" in f.action and "fixed shapes" in f.action
    assert f.gain_predicted is None  # the search's trials count as busy: no bound is stated
    assert f.title.startswith("cuDNN re-tunes convolutions: GPU 0 idle")


@pytest.mark.parametrize("gpm, share, busy_for", [
    (SMALL, 0.45, 0.5),   # small kernels: the launch-bound conv net's picture
    (FULL, 0.1, 0.5),     # conv calls a small share: a healthy conv net's dispatch
    (FULL, 0.45, 1.0),    # the GPU never idles: nothing to win
    ({}, 0.45, 0.5),      # no GPM to say the kernels are full
])
def test_not_said_where_the_evidence_does_not_tell_it_apart(gpm, share, busy_for):
    found, _ = run_rules(job(gpm, share, busy_for))
    assert "cudnn-retune" not in found


RECORDINGS = Path(__file__).parent / "fixtures" / "recordings"


def test_the_held_out_lightning_job_recorded_on_the_h200_is_named_and_not_launch_bound():
    from test_rule_evaluation import replay

    shown, seen, _ = replay(RECORDINGS / "h200-lightning-cudnn-benchmark.gputop")
    assert "cudnn-retune" in shown and seen["cudnn-retune"] <= 10.0, seen
    assert shown["cudnn-retune"].severity.value == "warning"
    assert "Trainer(benchmark=False)" in shown["cudnn-retune"].action  # Lightning's own knob first
    assert "launch-bound" not in shown


def test_the_held_out_hf_job_padded_to_512_is_weighed_not_told_launch_bound():
    # Its launch-bound warning promised 2.6x; the larger batch it named measured 1.07x (H100).
    from test_rule_evaluation import replay

    shown, seen, _ = replay(RECORDINGS / "h200-hf-trainer-pad-max-length.gputop")
    assert "cudnn-retune" not in seen
    lb = shown.get("launch-bound")
    assert lb is None or (lb.severity.value == "info" and lb.title.startswith("Weighing"))
    assert not any(f.severity.value in ("warning", "critical") for f in shown.values())
