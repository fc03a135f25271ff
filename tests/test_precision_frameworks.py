"""Precision from the frameworks' own stacks and from the GPU's pipes: Lightning and HF Trainer
captures (tests/fixtures/stacks/fw-*.json) tell fp32 from mixed precision; a GPU busy on its fp32
pipes is called out even when some convolutions run on the tensor cores; bf16 jobs stay silent;
the action is written in the framework's knobs beside plain PyTorch's."""

import json
import os

import pytest

from gputop.analysis.classify import classify, is_library
from gputop.analysis.frameworks import (FP32, HF_TRAINER, LIGHTNING, MIXED, framework_of, loader_knob,
                                        precision_knob)
from gputop.model import Category as C
from gputop.sources.stacks import StackParser

from synth import Job, rule_findings

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "stacks")
# GPM as the H100 read it (bench/results/real_jobs.json): an fp32 conv net (TF32 convolutions),
# an fp32 ViT (conv stem on the tensor cores, fp32 linears), a bf16 transformer.
TF32_CONVS = {"sm_active": 87.0, "sm_occupancy": 46.0, "tensor_active": 9.1, "fp32_active": 1.6, "dram_active": 60.0}
FP32_LINEARS_WITH_CONV_STEM = {"sm_active": 94.0, "sm_occupancy": 17.0, "tensor_active": 2.7, "fp32_active": 58.0}
BF16 = {"sm_active": 84.0, "sm_occupancy": 19.0, "tensor_active": 10.4, "fp32_active": 1.9}


def fixture_main(name: str):
    """The marked main-thread stack of a framework capture: (frames, category)."""
    with open(os.path.join(HERE, f"{name}.json")) as f:
        doc = json.load(f)
    lines = doc["source_lines"]
    parser = StackParser(lambda fn, ln: lines.get(f"{fn}:{ln}"), classify, is_library)
    by_id = {str(s.thread_id): s for s in parser.samples(doc["dump"], 1.0)}
    s = by_id[next(iter(doc["expected"]))]
    return s.frames, s.category




def framework_job(fixture: str | None, gpm: dict, util: float = 99.0) -> Job:
    if fixture is None:
        return Job(util=lambda t: util, gpu=gpm)
    frames, cat = fixture_main(fixture)
    # every sample is the captured step: the forward (HF) or the step inside the plugin (Lightning)
    return Job(util=lambda t: util, gpu=gpm, main=lambda t: cat, main_frames=lambda t: frames)


@pytest.mark.parametrize("fixture, name, precision", [
    ("fw-lightning-auto-item", LIGHTNING, FP32),  # precision="32-true"
    ("fw-lightning-bf16-item", LIGHTNING, MIXED),  # precision="bf16-mixed"
    ("fw-hf-trainer-forward", HF_TRAINER, FP32),
    ("fw-hf-trainer-bf16-forward", HF_TRAINER, MIXED),  # TrainingArguments(bf16=True)
])
def test_framework_and_precision_from_real_captures(fixture, name, precision):
    frames, cat = fixture_main(fixture)
    _, ctx = rule_findings(Job(main=lambda t: cat, main_frames=lambda t: frames))
    seen = framework_of(ctx.main_stacks)
    assert (seen.name, seen.precision) == (name, precision)
    assert seen.evidence
    assert ctx.framework == seen  # read once per evaluation, for every rule


def test_one_sample_is_not_evidence_of_fp32():
    frames, cat = fixture_main("fw-hf-trainer-forward")
    _, ctx = rule_findings(Job(main=lambda t: cat, main_frames=lambda t: frames))
    assert framework_of(ctx.main_stacks[:2]).precision is None
    assert framework_of(()).name is None


def test_fp32_pipes_busier_than_tensor_cores_is_named_even_with_a_conv_stem():
    f = rule_findings(framework_job(None, FP32_LINEARS_WITH_CONV_STEM))[0]["no-tensor-cores"]
    assert any("fp32 pipes 58 %" in e and "tensor cores 2.7 %" in e for e in f.evidence)
    assert 'torch.autocast("cuda", dtype=torch.bfloat16)' in f.action


@pytest.mark.parametrize("gpm", [TF32_CONVS, BF16])
def test_tensor_core_work_alone_is_not_called_fp32(gpm):
    found = rule_findings(framework_job(None, gpm))[0]
    assert "no-tensor-cores" not in found
    assert "mixed-precision" not in found  # plain PyTorch: the stacks cannot tell fp32 from bf16


def test_lightning_32_true_on_a_busy_gpu_gets_bf16_mixed_in_its_own_knob():
    found = rule_findings(framework_job("fw-lightning-auto-item", TF32_CONVS))[0]
    f = found["mixed-precision"]
    assert f.action.startswith('Trainer(..., precision="bf16-mixed")')
    assert 'torch.autocast("cuda", dtype=torch.bfloat16)' in f.action  # the plain form beside it
    assert "channels_last" in f.action  # tensor cores at work: convolutions
    assert any("Lightning's base Precision plugin" in e for e in f.evidence)
    # bf16 halves the busy time at most: the bound is below 2x
    assert 1.5 < f.gain_predicted <= 2.0


def test_bf16_mixed_lightning_and_hf_jobs_stay_silent():
    for fixture in ("fw-lightning-bf16-item", "fw-hf-trainer-bf16-forward"):
        found = rule_findings(framework_job(fixture, BF16))[0]
        assert "mixed-precision" not in found and "no-tensor-cores" not in found, fixture


def test_hf_trainer_fp32_gets_training_arguments_bf16():
    found = rule_findings(framework_job("fw-hf-trainer-forward", {"sm_active": 85.0, "tensor_active": 1.0, "fp32_active": 54.0}))[0]
    f = found["no-tensor-cores"]
    assert f.action.startswith("TrainingArguments(..., bf16=True); in plain PyTorch:")
    assert "mixed-precision" not in found  # one finding for one change


def test_a_starved_gpu_is_not_a_precision_problem():
    found = rule_findings(framework_job("fw-lightning-auto-item", TF32_CONVS, util=40.0))[0]
    assert "mixed-precision" not in found


def test_knobs():
    assert precision_knob(LIGHTNING, bf16=False) == 'Trainer(..., precision="16-mixed")'
    assert precision_knob(None, bf16=True) is None
    assert loader_knob(HF_TRAINER, 8) == ("TrainingArguments(..., dataloader_num_workers=8, dataloader_pin_memory=True, "
                                          "dataloader_persistent_workers=True)")
    assert loader_knob(LIGHTNING, 8) is None


def test_a_starved_hf_trainer_job_gets_training_arguments_workers():
    # the Trainer's forward captured on CPU, the GPU idle 60 % while the main thread collates
    frames, _ = fixture_main("fw-hf-trainer-forward")
    from synth import periodic

    def cat(t):
        return C.FORWARD if t % 1.0 < 0.4 else C.DATA_FETCH

    job = Job(util=periodic(1.0, 0.4), main=cat, main_frames=lambda t: frames if cat(t) == C.FORWARD else None)
    f = rule_findings(job)[0]["data-starved"]
    assert f.action.startswith("TrainingArguments(..., dataloader_num_workers=")
    assert "in plain PyTorch: DataLoader(..., num_workers=" in f.action


def test_a_job_whose_stacks_show_autocast_is_not_told_to_use_it_whatever_the_fp32_pipes_read():
    # An HF Trainer job with bf16=True (the forward under torch.autocast in its stacks) read fp32
    # pipes 49 %, tensor cores 3.5 % on an H100 and was told "fp32 math -> autocast" (false).
    busy_fp32 = {"sm_active": 80.0, "tensor_active": 3.5, "fp32_active": 49.0}
    found = rule_findings(framework_job("fw-hf-trainer-bf16-forward", busy_fp32))[0]
    assert "no-tensor-cores" not in found and "mixed-precision" not in found
    # the same GPU reading with the fp32 forward's stacks is still named
    assert "no-tensor-cores" in rule_findings(framework_job("fw-hf-trainer-forward", busy_fp32))[0]


FLOAT64 = {"sm_active": 93.0, "sm_occupancy": 20.0, "tensor_active": 55.0, "fp32_active": 0.1,
           "dfma_active": 54.0, "fp64_active": 9.0}


def test_a_gpu_busy_with_fp64_tensor_cores_and_pipes_is_told_to_leave_float64():
    # A held-out job (model.double() on float64 batches) read like a bf16 one on GPM's any-tensor and
    # fp32 metrics (55 % and 0.1 %), and was told nothing; float32 + bf16 autocast measured 5.85x.
    found = rule_findings(framework_job(None, FLOAT64))[0]
    f = found["float64-math"]
    assert "FP64 tensor cores 54 %" in f.evidence[0] and "FP64 pipes 9 %" in f.evidence[0]
    assert "model.double()" in f.action and "float32" in f.action and "autocast" in f.action
    assert 1.5 < f.gain_predicted <= 14.8
    # bf16 and float32 jobs read no FP64 work; GPUs without the readings (older GPM) say nothing
    for gpm in (BF16, TF32_CONVS, {**BF16, "dfma_active": 0.0, "fp64_active": 0.3}):
        assert "float64-math" not in rule_findings(framework_job(None, gpm))[0]
    # a float64 job on a starved GPU: the idle time's cause comes first
    assert "float64-math" not in rule_findings(framework_job(None, FLOAT64, util=20.0))[0]
