"""The eleventh held-out sets' confident wrong causes (bench/results/real_jobs_fresh11.md and
multi_rank.md, H200): an HF Trainer job that fell into nn.DataParallel on a two-GPU host (told "use
bf16" while bf16 was on, then launch-bound; one GPU alone ran twice as fast), and DDP over gloo on
CUDA tensors (told launch-bound for 16 s while its main thread waited in backward; NCCL measured
4.7x). Each is told apart by what the other causes do not show: the main thread inside
DataParallel's replicate/parallel_apply, and a backward many times longer than its forward."""

from pathlib import Path

import pytest

from gputop.model import Category as C
from gputop.model import Frame

from synth import Job, periodic
from test_rules import run_rules

SITE = "/venv/lib/python3.12/site-packages"
PAR = f"{SITE}/torch/nn/parallel"
RECORDINGS = Path(__file__).parent / "fixtures" / "recordings"
NCCL = Path(__file__).parent / "fixtures" / "nccl"

LINEAR = (Frame("Linear.forward", f"{SITE}/torch/nn/modules/linear.py", 134),
          Frame("Block.forward", "/home/u/model.py", 92), Frame("train", "/home/u/train.py", 40))
BWD = (Frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 869), Frame("train", "/home/u/train.py", 41))
DP_FORWARD = (Frame("Module._call_impl", f"{SITE}/torch/nn/modules/module.py", 1790),
              Frame("DataParallel.forward", f"{PAR}/data_parallel.py", 193), Frame("train", "/home/u/train.py", 40))
REPLICATE = (Frame("replicate", f"{PAR}/replicate.py", 162), Frame("DataParallel.replicate", f"{PAR}/data_parallel.py", 201),
             *DP_FORWARD[1:])
JOIN = (Frame("Thread.join", "/usr/lib/python3.12/threading.py", 1147),
        Frame("parallel_apply", f"{PAR}/parallel_apply.py", 136), *DP_FORWARD[1:])


def dp_job(inside, **kw):
    """A loop whose forward goes through ``inside`` half the time, its GPUs idle 60 %."""
    def frames(t):
        k = t % 1.0
        return inside if k < 0.5 else (LINEAR if k < 0.7 else BWD)

    return Job(util=periodic(1.0, 0.4), main=lambda t: C.BACKWARD if frames(t) is BWD else C.FORWARD,
               main_frames=frames, seconds=20.0, **kw)


def test_a_main_thread_replicating_and_joining_replicas_is_data_parallel():
    from gputop.advisor.rules import RULES_BY_ID

    def alternating(t):
        return REPLICATE if int(t * 5) % 2 else JOIN

    found, _ = run_rules(Job(
        util=periodic(1.0, 0.4), main=lambda t: C.FORWARD if t % 1.0 < 0.7 else C.BACKWARD,
        main_frames=lambda t: alternating(t) if t % 1.0 < 0.5 else (LINEAR if t % 1.0 < 0.7 else BWD),
        seconds=20.0, gpus=2))
    f = found["data-parallel"]
    assert f.title.startswith("nn.DataParallel: one process drives GPUs 0, 1"), f.title
    assert "DistributedDataParallel" in f.action and "torchrun --nproc-per-node 2" in f.action
    assert "at least" in f.expected_gain
    for other in ("launch-bound", "no-tensor-cores", "mixed-precision", "memory-headroom"):
        assert other in RULES_BY_ID["data-parallel"].supersedes


def test_data_parallel_over_one_gpu_calls_the_module_directly_and_is_not_the_finding():
    # DataParallel with one device runs self.module(...) in place: no replicate, no threads.
    found, _ = run_rules(dp_job(DP_FORWARD + LINEAR[:1]))
    assert "data-parallel" not in found


def test_a_forward_without_data_parallel_is_not_it():
    found, _ = run_rules(dp_job(LINEAR, gpus=2))
    assert "data-parallel" not in found


@pytest.mark.parametrize("name", ["h200x2-hf-trainer-dataparallel.gputop",
                                  # the same job, run again with the rule in: the stacks came in later
                                  # than the GPM readings, and "use bf16" was shown 3-5 s on them alone
                                  "h200x2-hf-trainer-dataparallel-rerun.gputop"])
def test_the_held_out_hf_trainer_under_data_parallel_is_named_and_never_told_to_use_bf16(name):
    from test_rule_evaluation import replay

    shown, seen, _ = replay(RECORDINGS / name)
    assert seen.get("data-parallel") is not None and seen["data-parallel"] <= 4.0, seen
    f = shown["data-parallel"]
    # The Trainer's knob: its launcher, not a line of the script.
    assert "torchrun --nproc-per-node 2" in f.action and "CUDA_VISIBLE_DEVICES=0" in f.action
    assert "no-tensor-cores" not in seen  # bf16 was on; the replicas' threads ran fp32
    assert not any(k in shown and shown[k].severity.value == "warning" for k in ("launch-bound", "no-tensor-cores"))


# --------------------------------------------------------------------------- the backward that waits

def backward_job(fwd_of_10, **kw):
    """Of every ten stack samples (5 a second), ``fwd_of_10`` in the forward and the rest in backward."""
    def frames(t):
        return LINEAR if round(t * 5) % 10 < fwd_of_10 else BWD

    return Job(util=periodic(1.0, 0.2), main=lambda t: C.BACKWARD if frames(t) is BWD else C.FORWARD,
               main_frames=frames, main_active=lambda t: frames(t) is not BWD, seconds=20.0,
               gpu={"sm_active": 20.0}, **kw)


def test_a_backward_many_times_its_forward_is_weighed_not_called_launch_bound():
    found, _ = run_rules(backward_job(1))
    f = found["launch-bound"]
    assert f.severity.value == "info" and f.title.startswith("Weighing:"), f.title
    assert "while the backward waits" in f.title
    assert "gradient all-reduce" in f.action and "not launch overhead" in f.action


def test_a_backward_about_as_long_as_its_forward_stays_launch_bound():
    found, _ = run_rules(backward_job(4))
    f = found["launch-bound"]
    assert f.severity.value == "warning" and f.title.startswith("Launch-bound"), f.title


def test_ddp_over_gloo_on_cuda_tensors_is_never_a_launch_bound_warning_and_is_told_about_gloo():
    from test_rule_evaluation import replay

    shown, seen, _ = replay(NCCL / "shelf_products-h200x2.gputop")
    assert "collectives-off-nvlink" in shown and seen["collectives-off-nvlink"] <= 7.0, seen
    f = shown["collectives-off-nvlink"]
    # No NCCL setting in the ranks' environment: the gloo backend is named first.
    assert f.action.startswith("if the process group is gloo"), f.action
    assert 'init_process_group("nccl"' in f.action
    assert "launch-bound" not in shown or shown["launch-bound"].severity.value == "info"
