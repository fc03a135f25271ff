"""Why memory grows or ran out, as far as the evidence tells: a source line in the job's stacks
that keeps a tensor with its autograd graph across steps, and how the target ended (at the
card's limit: a CUDA OOM is likely; killed with the host at its limit: the OOM killer is)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..model import GpuSample, HostSample, StackSample
from .classify import is_library, short_path
from .threshold import JUDGEMENT, Threshold

# Names that usually hold a step's loss or model output: a tensor still tied to its graph.
_TENSORISH = r"[\w.\[\]]*(?:loss|out|logit|pred|hidden|feat|emb|score)[\w.\[\]]*"
# What turns such a tensor into a number or cuts it from its graph: a line that has one of
# these keeps nothing alive.
_RELEASES = re.compile(r"\.item\(\)|\.detach\(\)|\.tolist\(\)|\.numpy\(\)|\bfloat\(|\bint\(|no_grad|inference_mode")
# `total_loss += loss`, `running = running + outputs.loss`: a sum of graphs grows every step.
_ACCUMULATE = re.compile(rf"^\s*[\w.\[\]]+\s*(?:\+=|=\s*[\w.\[\]]+\s*\+)\s*({_TENSORISH})\s*$", re.IGNORECASE)
# `losses.append(loss)`, `all_outputs.append(outputs)`: every step's graph kept in a list.
_APPEND = re.compile(rf"\.(?:append|extend)\(\s*({_TENSORISH})\s*\)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class LeakLine:
    where: str  # "train.py:57"
    code: str
    fix: str


def leak_line(code: str) -> tuple[str, str] | None:
    """(the kept name, the fix) when ``code`` keeps a step's tensor with its graph."""
    if _RELEASES.search(code):
        return None
    for pattern, fix in ((_ACCUMULATE, "{line}  →  {name}.item() (or {name}.detach()) in the sum"),
                         (_APPEND, "{line}  →  append {name}.detach() (or {name}.item() for a number; "
                                   ".detach().cpu() to keep outputs off the GPU)")):
        m = pattern.search(code)
        if m:
            name = m.group(1)
            return name, fix.format(line=code.strip(), name=name)
    return None


def leak_lines(stacks: Sequence[StackSample]) -> tuple[LeakLine, ...]:
    """Every line of the job's own code in ``stacks`` that keeps a step's tensor with its graph,
    most often seen first. Such a line runs for microseconds, so it is in the stacks only when
    a sample happened to catch it: its absence proves nothing."""
    seen: dict[tuple[str, int], list] = {}
    for s in stacks:
        for f in s.frames:
            if not f.code or is_library(f.filename):
                continue
            key = (f.filename, f.line)
            if key in seen:
                seen[key][0] += 1
                continue
            hit = leak_line(f.code)
            if hit is not None:
                seen[key] = [1, f.code.strip(), hit[1]]
    ranked = sorted(seen.items(), key=lambda kv: -kv[1][0])
    return tuple(LeakLine(f"{short_path(fn)}:{ln}", code, fix) for (fn, ln), (_, code, fix) in ranked)


# A GPU's memory within this share of its total when the job ended: the allocator had no room
# left, so a CUDA OOM is the likely end. Judgement: the allocator keeps some slack and NVML counts
# the context (~500 MB on an H100) in the process's figure.
GPU_FULL_SHARE = Threshold(
    0.97, "share", JUDGEMENT,
    "A GPU's memory within this share of its total when the job ended leaves the allocator no room: a CUDA OOM is "
    "the likely end (the allocator keeps slack; NVML counts the context).")
# The host's available memory below this share of its total: the OOM killer's ground. Judgement.
HOST_FULL_SHARE = Threshold(
    0.03, "share", JUDGEMENT,
    "The host's available memory below this share of its total: the OOM killer's ground.")
# The readings that count are those this close before the exit (a poll or two).
EXIT_LOOKBACK_S = Threshold(
    10.0, "s", JUDGEMENT,
    "The memory readings that count are those this close before the exit: a poll or two.")


def exit_cause(exited_at: float, status: str | None, gpu_samples: Mapping[int, Sequence[GpuSample]],
               host: Sequence[HostSample], gpus: Sequence[int] | None = None) -> str | None:
    """What likely ended the target at ``exited_at``, with the evidence, or None. ``status``:
    "code N" / "signal NAME" where it could be read (only for gputop's own child)."""
    t0 = exited_at - EXIT_LOOKBACK_S
    for i in sorted(gpus if gpus is not None else gpu_samples):
        near = [s for s in gpu_samples.get(i, ()) if t0 <= s.ts <= exited_at and s.mem_used is not None and s.mem_total]
        if not near:
            continue
        top = max(near, key=lambda s: s.mem_used)
        share = top.mem_used / top.mem_total
        if share >= GPU_FULL_SHARE and (status is None or not status.startswith("code 0")):
            how = f", {status}" if status else ""
            return (f"likely CUDA out of memory: GPU {i}'s memory was at {share * 100:.0f} % of its "
                    f"{top.mem_total / 2**30:.0f} GiB just before the job exited{how}")
    near_host = [h for h in host if t0 <= h.ts <= exited_at and h.mem_total]
    if near_host and (status is None or status == "signal SIGKILL"):
        low = min(near_host, key=lambda h: h.mem_available)
        if low.mem_available <= HOST_FULL_SHARE * low.mem_total:
            how = ("killed by SIGKILL" if status else
                   "its exit status is unknown (not gputop's child); the kernel log says for sure: "
                   "journalctl -k | grep -i 'killed process'")
            return (f"likely the OOM killer: the host had {low.mem_available / 2**20:.0f} MiB of "
                    f"{low.mem_total / 2**30:.0f} GiB available just before the job ended; {how}")
    return None


_STATUS = re.compile(r"exited at \S+ with (code -?\d+|signal \w+)")


def exit_status_of(message: str) -> str | None:
    """The exit status the stack sampler's exit message states ("signal SIGKILL"), if any."""
    m = _STATUS.search(message)
    return m.group(1) if m else None


__all__ = ["EXIT_LOOKBACK_S", "GPU_FULL_SHARE", "HOST_FULL_SHARE", "LeakLine", "exit_cause", "exit_status_of",
           "leak_line", "leak_lines"]
