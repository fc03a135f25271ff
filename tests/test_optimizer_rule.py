"""The unfused optimizer step: named from the implementation the stack shows, only when the
GPU waits for the CPU to launch it, and with the framework's own knob."""

import pytest

from gputop.advisor.rules.base import share_upper, wait_bound
from gputop.model import Category as C
from gputop.model import Frame

from synth import STACKS, GiB, Job, rule_findings

LAUNCH_GPM = {"sm_active": 15.0, "sm_occupancy": 3.0, "tensor_active": 0.5, "fp32_active": 4.0}
USER = Frame("<module>", "/home/u/train.py", 7)


def optim_frames(impl: str) -> tuple[Frame, ...]:
    # as py-spy reads torch 2.13's AdamW(foreach=False) step (captured on CPU)
    return (
        Frame(impl, "/usr/lib/python3.12/site-packages/torch/optim/adam.py", 544),
        Frame("adam", "/usr/lib/python3.12/site-packages/torch/optim/adam.py", 970),
        Frame("_disable_dynamo_if_unsupported.<locals>.wrapper.<locals>.maybe_fallback",
              "/usr/lib/python3.12/site-packages/torch/optim/optimizer.py", 148),
        Frame("Adam.step", "/usr/lib/python3.12/site-packages/torch/optim/adam.py", 248),
        Frame("Optimizer.profile_hook_step.<locals>.wrapper", "/usr/lib/python3.12/site-packages/torch/optim/optimizer.py", 530),
        USER,
    )


def job(impl="_single_tensor_adam", optimizer_every=2, util=lambda t: 30.0, extra_frames=(), mem_gib=60, gpm=LAUNCH_GPM):
    """Every ``optimizer_every``-th sample in the optimizer step, the rest forward/backward."""
    def cat(t):
        k = round(t * 5)
        return C.OPTIMIZER if k % optimizer_every == 0 else (C.FORWARD if k % 2 else C.BACKWARD)

    def frames(t):
        c = cat(t)
        return optim_frames(impl) if c is C.OPTIMIZER else tuple(extra_frames) + STACKS[c]

    # 60 of 80 GiB used: no larger batch fits
    return Job(util=util, main=cat, main_frames=frames, gpu={**gpm, "mem_used": mem_gib * GiB})




def test_a_python_loop_over_the_parameters_is_named_with_its_flag():
    found, ctx = rule_findings(job())
    f = found["unfused-optimizer"]
    assert "torch.optim.AdamW(model.parameters(), ..., fused=True)" in f.action
    assert any("_single_tensor_adam" in e and "foreach=False" in e for e in f.evidence)
    assert any("50 %" in e for e in f.evidence)  # half the main thread's samples
    # the bound: the step's launching gone entirely, half the loop's time (50 of 100 samples:
    # the bound takes the share's upper confidence limit, 58 %)
    assert len(ctx.main_stacks) == 100
    assert f.gain_predicted == pytest.approx(wait_bound(share_upper(50, 100)), rel=0.02)
    # most of what the thread launches is the optimizer and no larger batch fits: launch-bound
    # defers to it
    assert "launch-bound" not in found
    # the same on a GPU "busy" with kernels too small for its SMs: what launching costs counts
    found, _ = rule_findings(job(util=lambda t: 85.0))
    assert "unfused-optimizer" in found and "launch-bound" not in found


def test_with_memory_to_spare_a_larger_batch_amortises_the_step_too():
    # "busy" 85 % with its SMs active 15 %: small kernels (GPM), and 8 of 80 GiB used
    found, _ = rule_findings(job(mem_gib=8, util=lambda t: 85.0))
    lb, uo = found["launch-bound"], found["unfused-optimizer"]
    assert "batch fits" in lb.action and lb.cost_s > uo.cost_s  # ranked first
    assert lb.gain_predicted > uo.gain_predicted


def test_the_foreach_default_is_named_as_such():
    found, _ = rule_findings(job(impl="_multi_tensor_adam"))
    assert any("foreach default" in e for e in found["unfused-optimizer"].evidence)


def test_a_fused_step_or_a_busy_gpu_says_nothing():
    found, _ = rule_findings(job(impl="_fused_adam"))
    assert "unfused-optimizer" not in found
    # the GPU busy throughout with its SMs full: the CPU is ahead, the loop costs the GPU nothing
    found, _ = rule_findings(job(util=lambda t: 100.0, gpm={**LAUNCH_GPM, "sm_active": 90.0}))
    assert "unfused-optimizer" not in found


def test_a_small_optimizer_share_leaves_the_step_to_launch_bound():
    # one sample in five in the step (20 %): the model's launches lead, launch-bound names them
    found, _ = rule_findings(job(optimizer_every=5))
    assert "launch-bound" in found and "unfused-optimizer" in found
    assert found["launch-bound"].cost_s > found["unfused-optimizer"].cost_s
    # under the share bar: nothing of its own
    found, _ = rule_findings(job(optimizer_every=10))
    assert "unfused-optimizer" not in found and "launch-bound" in found


def test_hf_trainer_gets_its_optim_argument():
    trainer = (Frame("Trainer.training_step", "/usr/lib/python3.12/site-packages/transformers/trainer.py", 2044),
               Frame("Trainer._inner_training_loop", "/usr/lib/python3.12/site-packages/transformers/trainer.py", 1602))
    found, ctx = rule_findings(job(extra_frames=trainer))
    assert ctx.framework.name == "transformers"
    f = found["unfused-optimizer"]
    assert f.action.startswith('TrainingArguments(..., optim="adamw_torch_fused")')
    assert "fused=True" in f.action  # the plain form beside it


# --------------------------------------------------------------------------- an optimizer of its own
# transformers' Adafactor (a torch.optim.Optimizer subclass outside torch.optim) steps each tensor
# from Python: a held-out T5 measured 1.28-1.44x with fused AdamW (bench/results/real_jobs_fresh11.md).

def own_frames(line=1266):
    return (
        Frame("Adafactor.step", "/usr/lib/python3.12/site-packages/transformers/optimization.py", line),
        Frame("context_decorator.<locals>.decorate_context", "/usr/lib/python3.12/site-packages/torch/utils/_contextlib.py", 124),
        Frame("Optimizer.profile_hook_step.<locals>.wrapper", "/usr/lib/python3.12/site-packages/torch/optim/optimizer.py", 533),
        USER,
    )


def own_job(frames_of_step, **kw):
    def cat(t):
        k = round(t * 5)
        return C.OPTIMIZER if k % 2 == 0 else (C.FORWARD if k % 4 == 1 else C.BACKWARD)

    def frames(t):
        c = cat(t)
        return frames_of_step(round(t * 5)) if c is C.OPTIMIZER else STACKS[c]

    return Job(util=lambda t: 30.0, main=cat, main_frames=frames, gpu={**LAUNCH_GPM, "mem_used": 60 * GiB}, **kw)


def test_an_optimizer_of_its_own_stepping_from_python_is_named_with_its_class_and_place():
    found, _ = rule_findings(own_job(lambda k: own_frames(1257 + k % 30)))
    f = found["unfused-optimizer"]
    assert f.title.startswith("Unfused optimizer: `Adafactor.step` launches kernels per tensor from Python")
    assert "transformers/optimization.py:" in f.evidence[0] and "outside torch.optim" in f.evidence[0]
    assert "fused=True" in f.action and "foreach=True" in f.action


def test_a_step_not_called_through_torch_optims_wrapper_is_not_an_optimizer():
    # An EMA's or a scheduler's own .step(): not an Optimizer subclass's step.
    def ema(k):
        return (Frame("ModelEma.step", "/home/u/ema.py", 40 + k % 5), USER)

    found, _ = rule_findings(own_job(ema))
    assert "unfused-optimizer" not in found


def test_the_held_out_t5_with_adafactor_on_one_gpu_gets_both_changes_the_larger_batch_first():
    from pathlib import Path

    from test_rule_evaluation import replay

    shown, seen, _ = replay(Path(__file__).parent / "fixtures" / "recordings" / "h200-hf-t5-adafactor.gputop")
    # Measured on an H200: a 4x batch 2.21x (launch-bound's change), fused AdamW 1.28-1.44x.
    assert seen.get("launch-bound") is not None and seen["launch-bound"] <= 3.0, seen
    f = shown["unfused-optimizer"]
    assert "`Adafactor.step`" in f.title and 'optim="adamw_torch_fused"' in f.action
    assert f.gain_predicted is not None and f.gain_predicted >= 1.44  # an upper bound over what was measured
    assert max(shown.values(), key=lambda x: x.cost_s).id == "launch-bound"
