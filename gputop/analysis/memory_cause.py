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
# `val_total += F.cross_entropy(model(xv), yv)`: a loss computed in the sum itself, its graph (a
# forward's activations, where no backward frees them) kept by the sum.
_ACCUMULATE_CALL = re.compile(
    r"^\s*[\w.\[\]]+\s*\+=\s*((?:[\w.]+\.)?(?:\w*loss\w*|criterion|cross_entropy|nll|mse|bce\w*|"
    r"binary_cross_entropy\w*|kl_div|smooth_l1|l1)\s*\(.*\))\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class LeakLine:
    where: str  # "train.py:57"
    code: str
    fix: str
    graph: bool = True  # keeps a step's tensor with its autograd graph; False: grows a container
    read: bool = False  # read from the source of the loop the stacks show, not caught in a sample
    kept: str = ""  # the name kept: "loss", "cache"
    called: str = ""  # read from a function the training loop calls ("train_step"), not the loop's own body
    # The tensor kept is the one a backward ran on in the same step (``total_loss += loss`` after
    # ``loss.backward()``): backward freed its activations, so the line keeps the graph's nodes and
    # a scalar a step (KB), too little to be a fast growth's cause while another line keeps more.
    freed: bool = False


def leak_line(code: str) -> tuple[str, str] | None:
    """(the kept name, the fix) when ``code`` keeps a step's tensor with its graph."""
    if _RELEASES.search(code):
        return None
    for pattern, fix in ((_ACCUMULATE, "{line}  →  {name}.item() (or {name}.detach()) in the sum"),
                         (_APPEND, "{line}  →  append {name}.detach() (.item() where it holds one number; "
                                   ".detach().cpu() to keep it off the GPU)"),
                         (_ACCUMULATE_CALL, "{line}  →  {line}.item() (and a forward that no backward follows under "
                                            "torch.no_grad(): it keeps no graph at all)")):
        m = pattern.search(code)
        if m:
            name = m.group(1)
            return name, fix.format(line=code.strip(), name=name)
    return None


# A loop's keeper that grows a container (sources.loop_source found the loop adds to it every
# turn and never takes from it): `xs.append(v)`, `cache[step] = v`. A sum (`total += v`) keeps
# its size unless it keeps a graph (leak_line's case).
_GROWN = re.compile(r"^\s*([\w.]+)(?:\.(?:append|extend|insert|add|update|appendleft|setdefault)\(|\[.*?\]\s*=[^=])")


def grown_line(code: str) -> tuple[str, str] | None:
    """(the container, the fix) for a loop's keeper that grows something every step without a
    graph to blame: a cache keyed by the step, a list of (detached) tensors. Read only from a
    loop's keepers: alone, `d[k] = v` says nothing of growth."""
    if re.search(r"\.item\(\)|\.tolist\(\)|\bfloat\(|\bint\(", code):
        return None  # a number a step: bytes, not the megabytes a step that exhaust memory
    m = _GROWN.match(code)
    if not m:
        return None
    name = m.group(1)
    return name, (f"{code.strip()}  →  bound `{name}` (drop what is no longer needed, e.g. the oldest entry each "
                  "step), or keep a number (.item(), for one number) or a CPU copy (.detach().cpu()) instead of the "
                  "tensor")


def leak_lines(stacks: Sequence[StackSample], loop: tuple[str, str] | None = None) -> tuple[LeakLine, ...]:
    """Every line of the job's own code that keeps a step's tensor: first those a sample caught
    (most often seen first), then the keepers of the training loop (``loop``: its function and
    short path, as the step model found it) read from its source, those that keep a graph before
    those that grow a container. A keeper line runs for microseconds, so a sample rarely catches
    it: its absence from the samples proves nothing, and the loop's source is where it is."""
    seen: dict[tuple[str, int], list] = {}
    keepers: dict[tuple[str, int], str] = {}
    callers: dict[tuple[str, int], str] = {}  # a keeper of a function the loop calls -> its name
    freed: set[tuple[str, int]] = set()  # keepers adding a tensor a backward ran on (Frame.freed)
    for s in stacks:
        at = None
        if loop is not None:
            at = next((i for i, f in enumerate(s.frames) if (f.name, short_path(f.filename)) == loop), None)
        for i, f in enumerate(s.frames):
            if is_library(f.filename):
                continue
            # The loop's keepers, and those of a function it calls (train_step, Trainer.step) that
            # add to something beyond the call (outside any loop of the function's own: a loop in
            # a model's forward keeps its list for one call).
            if at is not None and f.keeps and (i == at or (i < at and f.loop == 0)):
                for ln, code in f.keeps:
                    keepers.setdefault((f.filename, ln), code)
                    if ln in f.freed:
                        freed.add((f.filename, ln))
                    if i < at:
                        callers.setdefault((f.filename, ln), f.name)
            if not f.code:
                continue
            key = (f.filename, f.line)
            if key in seen:
                seen[key][0] += 1
                continue
            hit = leak_line(f.code)
            if hit is not None:
                seen[key] = [1, f.code.strip(), hit]
    ranked = sorted(seen.items(), key=lambda kv: -kv[1][0])
    out = [LeakLine(f"{short_path(fn)}:{ln}", code, hit[1], kept=hit[0]) for (fn, ln), (_, code, hit) in ranked]
    named = {(fn, ln) for (fn, ln), _ in ranked}
    grows, slow = [], []
    for (fn, ln), code in sorted(keepers.items()):
        if (fn, ln) in named:
            continue
        called = callers.get((fn, ln), "")
        hit = leak_line(code)
        if hit is not None:
            line = LeakLine(f"{short_path(fn)}:{ln}", code, hit[1], read=True, kept=hit[0], called=called,
                            freed=(fn, ln) in freed)
            (slow if line.freed else out).append(line)
            continue
        grew = grown_line(code)
        if grew is not None:
            grows.append(LeakLine(f"{short_path(fn)}:{ln}", code, grew[1], graph=False, read=True, kept=grew[0],
                                  called=called))
    # A sum of the losses a backward ran on keeps KB a step: after every line that keeps more.
    return tuple(out + grows + slow)


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
# A container's memory (its working set) within this share of its cgroup's limit: the kernel has
# no cache of the group's left to drop and kills in the group. Judgement, as GPU_FULL_SHARE: a
# poll a second misses the last moments' growth.
CGROUP_FULL_SHARE = Threshold(
    0.95, "share", JUDGEMENT,
    "A container's working set within this share of its cgroup's limit when the job ended: the kernel kills in the "
    "group (a poll a second misses the last moments' growth).")
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
    # Killed outright (SIGKILL), or ended with an error once the kernel killed one of its
    # processes (a DataLoader worker's death raises in the main process: "DataLoader worker (pid N)
    # is killed by signal: Killed", exit code 1). A clean exit or a stop signal is not the OOM killer.
    killed = status is None or status == "signal SIGKILL" or (status.startswith("code ") and status != "code 0")
    if not near_host or not killed:
        return None
    if status is None:
        how = ("its exit status is unknown (not gputop's child); the kernel log says for sure: "
               "journalctl -k | grep -i 'killed process'")
    elif status == "signal SIGKILL":
        how = "killed by SIGKILL"
    else:
        how = (f"it exited with {status}: the kernel likely killed one of its processes (a DataLoader worker's "
               "death ends the main process with an error)")
    # A container's limit binds before the host's: the group at its limit (its working set, page
    # cache left out) is the OOM killer's ground while the host has room.
    grouped = [h for h in near_host if h.cgroup_limit and h.cgroup_used is not None]
    if grouped:
        top = max(grouped, key=lambda h: h.cgroup_used / h.cgroup_limit)
        if top.cgroup_used >= CGROUP_FULL_SHARE * top.cgroup_limit:
            return (f"likely the OOM killer: the job's cgroup used {top.cgroup_used / 2**20:.0f} MiB of its "
                    f"{top.cgroup_limit / 2**20:.0f} MiB limit just before the job ended; {how}")
    low = min(near_host, key=lambda h: h.mem_available)
    if low.mem_available <= HOST_FULL_SHARE * low.mem_total:
        return (f"likely the OOM killer: the host had {low.mem_available / 2**20:.0f} MiB of "
                f"{low.mem_total / 2**30:.0f} GiB available just before the job ended; {how}")
    return None


_STATUS = re.compile(r"exited at \S+ with (code -?\d+|signal \w+)")


def exit_status_of(message: str) -> str | None:
    """The exit status the stack sampler's exit message states ("signal SIGKILL"), if any."""
    m = _STATUS.search(message)
    return m.group(1) if m else None


__all__ = ["CGROUP_FULL_SHARE", "EXIT_LOOKBACK_S", "GPU_FULL_SHARE", "HOST_FULL_SHARE", "LeakLine", "exit_cause", "exit_status_of",
           "leak_line", "leak_lines"]
