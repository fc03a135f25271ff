"""A tensor made on the CPU in the step and then copied to the GPU, read from the main thread's
samples. Pure: samples in, the site out.

A line such as ``bias = alibi_bias(heads, t).to(q.device)`` says two things the stacks can
read without running anything: the function's result is a host tensor (it is moved to a device
on the same line), and every sample inside that function, or on that line, is the main thread
making or copying it while the GPU has nothing queued. Each reads as something else on its
own: the function's torch calls on CPU tensors as the model's dispatching (launch-bound), the
copy as a pageable transfer (pin the memory), a ``float("-inf")`` fill as a sync. What fixes it is
to make the tensor on the GPU, or once: a held-out ALiBi model rebuilt its [heads, seq, seq] bias
on the CPU in every layer of every step (5.57x when it was made once on the GPU; H200).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ..model import Frame, StackSample
from .classify import TO_NOT_A_COPY, short_path

# ``name(args).to(<a device>)`` or ``name(args).cuda(``: the result of the call goes to a device.
# ``name`` may be dotted (``self.make_mask``, ``torch.tensor``); the ``.to(`` must name something
# other than a dtype or a memory format (the classifier's reading of a copy).
_MOVED_CALL = re.compile(r"(?P<fn>[A-Za-z_][\w.]*)\s*\((?P<args>.*)\)\s*\.\s*(?:to\((?!" + TO_NOT_A_COPY
                         + r")|cuda\()")
# A module's call machinery: a call under it is the model's forward, not a helper's tensor.
_MODULE_CALL = ("Module._call_impl", "Module._wrapped_call_impl")


@dataclass(frozen=True)
class BuiltOnCpu:
    fn: str  # the function whose result is moved: "alibi_bias", "torch.tensor"
    site: str  # the line that moves it: "model.py:93"
    code: str  # that line's text
    building: int  # samples inside ``fn`` (its own frames under the line)
    copying: int  # samples on the line itself (the copy, or a builtin making the tensor)
    samples: int  # all main-thread samples read

    @property
    def share(self) -> float:
        return (self.building + self.copying) / self.samples if self.samples else 0.0


def _moved_call(f: Frame) -> str | None:
    m = _MOVED_CALL.search(f.code or "")
    return m.group("fn") if m else None


def _where(s: StackSample) -> tuple[str, Frame, bool] | None:
    """(the function moved, the frame of its line, whether the sample is inside the function)
    where the sample is making or copying such a tensor; None otherwise."""
    for i, f in enumerate(s.frames):
        fn = _moved_call(f)
        if fn is None:
            continue
        newer = s.frames[:i]
        if any(g.name in _MODULE_CALL for g in newer):
            return None  # a module called on that line (``model(x).to(...)``): the model's own work
        short = fn.rsplit(".", 1)[-1]
        inside = any(g.name.rsplit(".", 1)[-1] == short for g in newer)
        if inside or i == 0:
            return fn, f, inside
        return None
    return None


def built_on_cpu(main: Sequence[StackSample]) -> BuiltOnCpu | None:
    """The commonest such site in ``main`` (the target's main-thread samples), or None."""
    if not main:
        return None
    building: Counter = Counter()
    copying: Counter = Counter()
    codes: dict[tuple[str, str], str] = {}
    for s in main:
        w = _where(s)
        if w is None:
            continue
        fn, f, inside = w
        key = (fn, f"{short_path(f.filename)}:{f.line}")
        codes[key] = (f.code or "").strip()
        (building if inside else copying)[key] += 1
    if not codes:
        return None
    key = max(codes, key=lambda k: (building[k] + copying[k], k))
    return BuiltOnCpu(key[0], key[1], codes[key], building[key], copying[key], len(main))


__all__ = ["BuiltOnCpu", "built_on_cpu"]
