"""optimizer-offload: the optimizer step on the CPU over parameters kept in host memory (FSDP's
CPU offload, DeepSpeed's CPU Adam) while the GPU idles. The fifth held-out set's FSDP2 job with
CPUOffloadPolicy() where everything fits measured 9.81x without it; gputop had said launch-bound
and the unfused optimizer."""

from __future__ import annotations

from gputop.model import Category as C
from gputop.model import Frame

from synth import Job, rule_findings

ADAM = Frame("_single_tensor_adam", "/venv/lib/python3.12/site-packages/torch/optim/adam.py", 400)
STEP = Frame("Adam.step", "/venv/lib/python3.12/site-packages/torch/optim/adam.py", 240)
FSDP = Frame("FSDPParamGroup.pre_forward", "/venv/lib/python3.12/site-packages/torch/distributed/_composable/fsdp/"
             "_fsdp_param_group.py", 300)
CPU_ADAM = Frame("DeepSpeedCPUAdam.step", "/venv/lib/python3.12/site-packages/deepspeed/ops/adam/cpu_adam.py", 150)
LOOP = Frame("train", "/home/u/train.py", 80)


def job(step_frames, util, other=FSDP, step_share=0.8):
    def frames(t):
        return (*step_frames, LOOP) if (t * 10) % 10 < step_share * 10 else (other, LOOP)

    def category(t):
        return C.OPTIMIZER if (t * 10) % 10 < step_share * 10 else C.FORWARD

    return Job(seconds=40, util=util, main=category, main_frames=frames,
               gpu={"sm_active": 20.0, "sm_occupancy": 10.0, "tensor_active": 5.0, "fp32_active": 2.0,
                    "mem_used": 6 * 2**30})


def test_an_fsdp_step_on_the_cpu_with_the_gpu_idle_is_offload_not_an_unfused_optimizer():
    found, _ = rule_findings(job((ADAM, STEP), util=lambda t: 0.0))
    f = found["optimizer-offload"]
    assert "CPUOffloadPolicy()" in f.action and "fully_shard" in f.action
    assert f.title.startswith("The optimizer runs on the CPU")
    assert f.gain_predicted is not None and f.gain_predicted > 3  # the CPU step 80 % of the time: up to 5x


def test_deepspeeds_cpu_adam_is_named_with_its_config():
    found, _ = rule_findings(job((CPU_ADAM,), util=lambda t: 0.0, other=LOOP))
    assert "offload_optimizer" in found["optimizer-offload"].action


def test_an_unfused_step_on_the_gpu_keeps_it_busy_and_is_not_offload():
    assert "optimizer-offload" not in rule_findings(job((ADAM, STEP), util=lambda t: 90.0))[0]


def test_no_sharded_model_and_kernels_while_the_step_runs_is_no_offload():
    # A per-tensor step on the GPU keeps it a third busy (measured 32-70 %): its kernels are there.
    assert "optimizer-offload" not in rule_findings(job((ADAM, STEP), util=lambda t: 35.0, other=LOOP))[0]


def test_no_sharded_frame_but_no_kernel_while_the_step_runs_is_a_step_on_host_tensors():
    # FSDP2's hooks run on autograd's threads, not the main one: the GPU's silence while the step
    # runs says where its tensors are (a held-out FSDP2 job with CPUOffloadPolicy: 0 %, 20x without).
    f = rule_findings(job((ADAM, STEP), util=lambda t: 0.0, other=LOOP))[0]["optimizer-offload"]
    assert "host memory" in f.evidence[0] and "CPUOffloadPolicy()" in f.action and "offload_optimizer" in f.action


def test_the_real_fsdp2_job_with_cpu_offload_is_told_to_drop_it():
    from test_nccl_real import replay_findings

    evals = replay_findings("fsdp_cpu_offload-h200x2.gputop", every_s=1.0)
    _, _, shown = evals[-1]
    assert shown and shown[0].id == "optimizer-offload"
    assert "CPUOffloadPolicy()" in shown[0].action
    assert all(f.id not in ("unfused-optimizer", "launch-bound") for f in shown)
