"""Activation checkpointing where the model and its activations fit: the forward recomputed
inside backward costs time the memory does not need.

Checkpointing trades time for memory: a checkpointed block keeps only its inputs in forward and
runs its forward again in backward (analysis.recompute reads where). A job that checkpoints with
most of its GPU's memory to spare pays the recomputation for nothing: a config copied from a
larger model's recipe keeps it on (a ~300M Qwen2 under FSDP2, ``gradient_checkpointing_enable()``
from a 7B recipe, peaked at 8 % of an H200's memory and ran 1.15x faster with it off; the stacks
of its two ranks showed the recomputation in 13 % of their samples).

Both must hold: the recomputation seen (its share of the ranks' sampled instants), and memory to
spare on the job's GPUs as memory-headroom judges it (``memory_to_spare``). A job near its memory
limit needs the checkpointing: nothing is said.
"""

from __future__ import annotations

from ...analysis import (
    ACCELERATE, CKPT_COMPOSABLE, CKPT_DEEPSPEED, CKPT_HF, CKPT_MEGATRON, CKPT_PLAIN, CKPT_WRAPPER, CPU_DEVICE,
    HF_TRAINER, LIGHTNING,
)
from ...model import Severity
from ...units import fmt_bytes
from ..context import AnalysisContext
from .base import (
    MIN_MAIN_SAMPLES, WORTHWHILE_GAIN, Hit, ShareLimit, bounded, confidence, gain, pct, share_upper, uses,
    wait_bound,
)
from .memory import MEM_HEADROOM, MIN_BUSY_POLLS, memory_to_spare
from .threshold import JUDGEMENT, IntThreshold

# The recomputation must be seen in at least this many sampled instants, over all the ranks,
# before it is named. Judgement: one or two could be the backward of a single checkpointed block
# caught twice; three separate instants are the steps' pattern. (Whether checkpointing is on at
# all is told by one: no other code runs those frames.)
RECOMPUTE_MIN_SAMPLES = IntThreshold(
    3, "samples", JUDGEMENT,
    "The recomputation is named once seen in this many sampled instants over the ranks: one or two could be one "
    "block's backward caught twice.")

_FEWER = ("; if the activations then do not fit, checkpoint fewer blocks instead of none (every second one: "
          "check_fn in apply_activation_checkpointing, or checkpoint() around only some blocks)")


def _switch(api: str | None, framework: str | None, caller: str | None) -> str:
    """The exact change that turns checkpointing off, in the API the stacks show it comes from."""
    if api == CKPT_HF:
        if framework == HF_TRAINER:
            return ("TrainingArguments(..., gradient_checkpointing=False); outside the Trainer, drop "
                    "model.gradient_checkpointing_enable() (or call model.gradient_checkpointing_disable())")
        return "drop model.gradient_checkpointing_enable() (or call model.gradient_checkpointing_disable())"
    if api == CKPT_WRAPPER:
        if framework == LIGHTNING:
            return "FSDPStrategy(..., activation_checkpointing_policy=None) (Lightning's checkpoint_wrapper)"
        if framework == ACCELERATE:
            return ("FullyShardedDataParallelPlugin(..., activation_checkpointing=False) "
                    "(fsdp_activation_checkpointing: false in the accelerate config)")
        return ("drop apply_activation_checkpointing(model, ...) / checkpoint_wrapper(block) "
                "(torch.distributed.algorithms._checkpoint.checkpoint_wrapper)")
    if api == CKPT_COMPOSABLE:
        return "drop torch.distributed._composable.checkpoint(block) on the blocks"
    if api == CKPT_DEEPSPEED:
        return "call the blocks directly instead of deepspeed.checkpointing.checkpoint(block, x)"
    if api == CKPT_MEGATRON:
        return "drop --recompute-activations / --recompute-granularity (recompute_granularity=None)"
    if api == CKPT_PLAIN:
        where = f"in {caller}: " if caller else ""
        return f"{where}call the block directly, block(x), instead of torch.utils.checkpoint.checkpoint(block, x, ...)"
    return ("turn activation checkpointing off: model.gradient_checkpointing_disable() (Hugging Face; Trainer: "
            "gradient_checkpointing=False), FSDPStrategy(activation_checkpointing_policy=None) (Lightning), "
            "activation_checkpointing=False in accelerate's FSDP plugin, or drop apply_activation_checkpointing / "
            "checkpoint_wrapper / torch.utils.checkpoint.checkpoint(block, x) around the blocks")


_API_NAMES = {
    CKPT_HF: "Hugging Face's gradient checkpointing (GradientCheckpointingLayer)",
    CKPT_WRAPPER: "torch.distributed's checkpoint_wrapper",
    CKPT_COMPOSABLE: "torch.distributed._composable.checkpoint",
    CKPT_DEEPSPEED: "DeepSpeed's activation checkpointing",
    CKPT_MEGATRON: "Megatron's activation recomputation",
    CKPT_PLAIN: "torch.utils.checkpoint.checkpoint",
}


@uses(RECOMPUTE_MIN_SAMPLES, MIN_MAIN_SAMPLES, WORTHWHILE_GAIN, MEM_HEADROOM, MIN_BUSY_POLLS)
def check_activation_checkpointing(ctx: AnalysisContext) -> Hit | None:
    rc = ctx.recompute
    n, k = rc.samples, rc.recompute
    if n < MIN_MAIN_SAMPLES or k < RECOMPUTE_MIN_SAMPLES:
        return None
    # Memory to spare on every GPU of the job that has a reading: turning checkpointing off must
    # fit on the fullest of them.
    gpus = [g for g in ctx.gpus if g.index != CPU_DEVICE and g.efficiency.mem_peak_fraction is not None]
    if not gpus or not all(memory_to_spare(g, ctx) for g in gpus):
        return None
    g = max(gpus, key=lambda x: x.efficiency.mem_peak_fraction or 0.0)
    share = rc.share
    # The stated bound takes the pooled share at its upper confidence limit (share_upper); the
    # severity is the estimate's: a warning only where the estimate itself clears the bar.
    upper = ShareLimit(share_upper(k, n), n)
    if bounded(share, upper=upper) < WORTHWHILE_GAIN:
        return None
    severity = Severity.WARNING if wait_bound(share) >= WORTHWHILE_GAIN else Severity.INFO
    if len(rc.procs) > 1:
        per = ", ".join(f"rank {p.rank} {pct(p.share)}" if p.rank is not None else f"pid {p.pid} {pct(p.share)}"
                        for p in rc.procs)
        seen = (f"backward recomputes the forward of checkpointed blocks in {pct(share)} of the ranks' sampled "
                f"instants ({per})")
    else:
        seen = f"backward recomputes the forward of checkpointed blocks in {pct(share)} of the main thread's samples"
    evidence = [seen]
    if rc.api is not None:
        line = f"checkpointing entered through {_API_NAMES.get(rc.api, rc.api)}"
        evidence.append(line + (f", from {rc.caller}" if rc.caller else ""))
    e = g.efficiency
    evidence.append(f"{g.name} memory peaked at {fmt_bytes(e.mem_used_peak)} of {fmt_bytes(e.mem_total)} "
                    f"({pct(e.mem_peak_fraction)}): the activations checkpointing saves room for fit")
    return Hit(
        evidence=tuple(evidence),
        action=_switch(rc.api, ctx.framework.name, rc.caller) + _FEWER,
        expected_gain=gain(share, upper=upper) + ": the checkpointed forwards run once, their activations kept "
        "(the peak grows by them)",
        gain_bound=bounded(share, upper=upper),
        cost_s=share * g.breakdown.total_s,
        confidence=confidence(0.8, n),
        gpu_index=g.index,
        severity=severity,
        title=f"Activation checkpointing recomputes the forward while {g.name} has memory to spare",
    )
