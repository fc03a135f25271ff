"""Which training framework runs the job, and what its stacks say of its precision.

Pure: reads the main thread's stack samples. Two uses:
- an action written in the framework's own knobs (``TrainingArguments(bf16=True)``,
  ``Trainer(precision="bf16-mixed")``, ``Accelerator(mixed_precision="bf16")``) beside the plain
  PyTorch form;
- precision evidence that GPU counters cannot give. A conv net in fp32 runs its convolutions as
  TF32 on the tensor cores (PyTorch's default ``cudnn.allow_tf32=True``): its counters look like a
  bf16 job's. The frameworks leave a trace of their precision in every step's stack:

  * Lightning runs ``training_step`` and backward inside its precision plugin's
    ``optimizer_step``: ``MixedPrecision`` (plugins/precision/amp.py) for "16-mixed"/"bf16-mixed",
    ``HalfPrecision`` (half.py) for "bf16-true"/"16-true", the base ``Precision`` (precision.py)
    alone for "32-true".
  * Hugging Face Trainer and accelerate wrap the prepared model's forward in
    ``torch.autocast`` as a decorator (torch/amp/autocast_mode.py ``decorate_autocast``) and
    accelerate's ``ConvertOutputsToFp32`` when mixed precision is on; in fp32 the model's
    forward is called directly.
  * A ``GradScaler`` (torch/amp/grad_scaler.py) exists only for fp16 mixed precision.

  Plain ``with torch.autocast(...)`` leaves no frame: a plain PyTorch job's precision is unknown.
  (Captured from lightning 2.6, transformers 5.2x and accelerate 1.1x on CPU and on the H100:
  tests/fixtures/stacks/fw-*.json.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..model import Category, StackSample
from .threshold import IntThreshold, JUDGEMENT

HF_TRAINER = "transformers"
LIGHTNING = "lightning"
ACCELERATE = "accelerate"

MIXED, HALF, FP32 = "mixed", "half", "fp32"

# A precision is claimed from this many samples that could show it (a Lightning step inside
# its plugin, a forward of a prepared model). Judgement: one sample could be a validation step
# or an evaluation forward; three in the window are training.
MIN_EVIDENCE = IntThreshold(
    3, "samples", JUDGEMENT,
    "A precision is claimed from this many samples that could show it: one could be a validation step, three in "
    "the window are training.")

_LIGHTNING_DIRS = ("lightning/pytorch/", "pytorch_lightning/")
_PLUGIN_DIR = "plugins/precision/"
_AUTOCAST_FILE = "torch/amp/autocast_mode.py"
_SCALER_FILE = "torch/amp/grad_scaler.py"
_CUDA_SCALER_FILE = "torch/cuda/amp/grad_scaler.py"


@dataclass(frozen=True)
class FrameworkSeen:
    name: str | None  # HF_TRAINER, LIGHTNING, ACCELERATE, or None (plain PyTorch or unknown)
    precision: str | None  # MIXED, HALF, FP32, or None: the stacks cannot tell
    evidence: str = ""  # what in the stacks says so, for a finding's evidence line


def _files(s: StackSample) -> list[str]:
    return [f.filename.replace("\\", "/") for f in s.frames]


def framework_of(main: Sequence[StackSample]) -> FrameworkSeen:
    """The framework and precision the main thread's samples show (newest last)."""
    name = None
    plugin_files: set[str] = set()
    plugin_samples = 0
    forwards = 0
    autocast_forwards = 0
    scaler = False
    for s in main:
        files = _files(s)
        if any(d in f for f in files for d in _LIGHTNING_DIRS):
            name = LIGHTNING
        elif name is None and any(f.endswith("transformers/trainer.py") for f in files):
            name = HF_TRAINER
        elif name is None and any("/accelerate/" in f for f in files):
            name = ACCELERATE
        if any(f.endswith(_SCALER_FILE) or f.endswith(_CUDA_SCALER_FILE) for f in files):
            scaler = True
        plugins = {f.rsplit("/", 1)[-1] for f in files if _PLUGIN_DIR in f}
        if plugins:
            plugin_samples += 1
            plugin_files |= plugins
        if s.category == Category.FORWARD:
            forwards += 1
            if any(f.endswith(_AUTOCAST_FILE) for f in files) or any(
                fr.name.startswith("ConvertOutputsToFp32") for fr in s.frames
            ):
                autocast_forwards += 1
    if scaler:
        return FrameworkSeen(name, MIXED, "a GradScaler in the step (fp16 mixed precision)")
    if name == LIGHTNING and plugin_samples >= MIN_EVIDENCE:
        if "amp.py" in plugin_files:
            return FrameworkSeen(name, MIXED, "Lightning's MixedPrecision plugin runs the step")
        if "half.py" in plugin_files:
            return FrameworkSeen(name, HALF, "Lightning's HalfPrecision plugin runs the step")
        if plugin_files == {"precision.py"}:
            return FrameworkSeen(name, FP32, f"Lightning's base Precision plugin runs the step "
                                             f"({plugin_samples} samples; precision=\"32-true\")")
        return FrameworkSeen(name, None)  # FSDP, DeepSpeed, double ...: their own precision
    if name in (HF_TRAINER, ACCELERATE):
        if autocast_forwards:
            return FrameworkSeen(name, MIXED, f"the prepared model's forward runs under torch.autocast ({autocast_forwards} samples)")
        if forwards >= MIN_EVIDENCE:
            return FrameworkSeen(name, FP32, f"the prepared model's forward runs without autocast ({forwards} samples)")
    return FrameworkSeen(name, None)


# --------------------------------------------------------------------------- knobs


def precision_knob(name: str | None, bf16: bool) -> str | None:
    """The framework's own switch for mixed precision, or None for plain PyTorch."""
    dtype = "bf16" if bf16 else "fp16"
    if name == HF_TRAINER:
        return f"TrainingArguments(..., {dtype}=True)"
    if name == LIGHTNING:
        return f'Trainer(..., precision="{"bf16" if bf16 else "16"}-mixed")'
    if name == ACCELERATE:
        return f'Accelerator(mixed_precision="{dtype}")'
    return None


def loader_knob(name: str | None, workers: int, pin: bool = True, persistent: bool = True) -> str | None:
    """The framework's own DataLoader settings, or None where the user builds the DataLoader."""
    if name == HF_TRAINER:
        parts = [f"dataloader_num_workers={workers}"]
        if pin:
            parts.append("dataloader_pin_memory=True")
        if persistent and workers > 0:
            parts.append("dataloader_persistent_workers=True")
        return f"TrainingArguments(..., {', '.join(parts)})"
    return None
