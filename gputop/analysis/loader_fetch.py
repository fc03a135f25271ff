"""Where loader workers spend their fetch: in the per-row machinery of a map-style DataLoader
(torch calls the Dataset's ``__getitem__`` once per index and ``default_collate`` stacks the
rows) or in per-sample work of the Dataset's own (decoding, transforms, reads). Pure.

A batch of B rows costs B ``__getitem__`` calls, B small tensors and a ``torch.stack`` over them;
when each row is a slice of tensors already in memory, that machinery is the workers' whole time
and fetching the batch with one index operation removes it. A worker decoding an image spends
milliseconds in PIL or a transform per sample, beside which the per-row calls are microseconds:
its samples sit in the code ``__getitem__`` calls, not in ``__getitem__``'s own lines.

What stacks cannot tell: a ``__getitem__`` whose own line calls heavy C code (``cv2.imdecode``,
a large numpy expression) shows no frame below that line, and is read here as a trivial one.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ..model import Frame, StackSample
from .classify import is_library, short_path

_FETCH_FILE = "/torch/utils/data/_utils/fetch.py"
_COLLATE_FILE = "/torch/utils/data/_utils/collate.py"
# default_collate and the generic collate it calls (collate_tensor_fn and the other per-type
# functions under it) stack a list of per-row samples; default_convert (the collate_fn of a
# DataLoader with batch_size=None) converts an already batched sample and is no per-row sign.
_STACKING = ("default_collate", "collate")


def _norm(filename: str) -> str:
    return filename.replace("\\", "/")


def _base(name: str) -> str:
    """A frame's function without its class: py-spy names methods ``Class.method`` (Python 3.11+)."""
    return name.split(".<locals>")[0].rsplit(".", 1)[-1]


def _is_map_fetch(f: Frame) -> bool:
    return "<locals>" not in f.name and _base(f.name) == "fetch" and _norm(f.filename).endswith(_FETCH_FILE) and (
        "_MapDatasetFetcher" in f.name or "." not in f.name)


def _is_fetch_comprehension(f: Frame) -> bool:
    """The fetch's ``[self.dataset[idx] for idx in possibly_batched_index]``: a frame of its own
    before Python 3.12 (PEP 709 inlined comprehensions)."""
    return _norm(f.filename).endswith(_FETCH_FILE) and "<listcomp>" in f.name


# A __getitem__ line that calls one of these waits or does real work per sample in C code that
# has no Python frame of its own (a sleep, a read, a file opened, an image decoded): what the
# sample shows is that call, not the per-row overhead. The names are judgement, the common ones.
_HEAVY_CODE = re.compile(r"\b(sleep|wait|recv\w*|urlopen|open|read\w*|load|imread|imdecode|decode)\(")


@dataclass(frozen=True)
class PerRowFetch:
    """The loader workers' samples inside a map-style fetch, by where they are."""

    samples: int = 0  # worker samples inside _MapDatasetFetcher.fetch
    in_getitem: int = 0  # in a Dataset's __getitem__ called per index, in its own lines only
    in_collate: int = 0  # in default_collate stacking the rows
    in_loop: int = 0  # in the fetch's own per-index loop
    per_sample_work: int = 0  # below __getitem__, in code it calls (decode, transforms, reads)
    waiting: int = 0  # off the CPU (a sleep, a read, a lock): a wait, not per-row overhead
    per_index: bool = False  # the fetch is seen calling __getitem__ per index (collate, its comprehension)
    batched: bool = False  # a __getitems__ seen: the Dataset already takes the batch's indices
    getitem: str | None = None  # "TensorDataset.__getitem__ (torch/utils/data/dataset.py:206)"

    @property
    def per_row(self) -> int:
        """Samples in the per-row machinery: the loop, a trivial __getitem__, default_collate."""
        return self.in_getitem + self.in_collate + self.in_loop

    @property
    def share(self) -> float:
        return self.per_row / self.samples if self.samples else 0.0


def _getitem_frame(inner: Sequence[Frame]) -> Frame | None:
    """The Dataset's __getitem__ among the frames the fetch called (newest first): the user's own
    where a library wrapper (Subset, ConcatDataset) sits around it, else the innermost."""
    items = [f for f in inner if _base(f.name) == "__getitem__"]
    if not items:
        return None
    return next((f for f in items if not is_library(f.filename)), items[0])


def _trivial(inner: Sequence[Frame]) -> bool:
    """Every frame the fetch called is a __getitem__ or code nested in one (its generator or
    comprehension): the sample is in the per-row call itself, not in work it calls."""
    return all(_base(f.name) == "__getitem__" or ("__getitem__.<locals>" in f.name) for f in inner)


def per_row_fetch(workers: Sequence[StackSample]) -> PerRowFetch:
    """Sort the workers' main-thread samples inside a map-style fetch: per-row machinery (the
    per-index loop, a __getitem__'s own lines, default_collate, on the CPU), per-sample work below
    __getitem__ (anything else it calls) or a wait (off the CPU)."""
    n = getitem = collate = loop = work = waiting = 0
    per_index = batched = False
    places: Counter = Counter()
    lines: dict[tuple[str, str], Counter] = {}
    for s in workers:
        i = next((k for k, f in enumerate(s.frames) if _is_map_fetch(f)), None)
        if i is None:
            continue
        n += 1
        if not s.active:
            # Per-row overhead is Python running on a core; a worker blocked in its fetch waits
            # (workers-blocked's class), and batching its calls is not what it needs first.
            waiting += 1
            continue
        inner = [f for f in s.frames[:i] if not _is_fetch_comprehension(f)]
        if len(inner) < i:
            per_index = True  # the fetch's own comprehension over the indices (Python < 3.12)
        if not inner:
            loop += 1
            continue
        outer = inner[-1]  # what the fetch called
        if _base(outer.name) == "__getitems__":
            batched = True
            work += 1
            continue
        if _norm(outer.filename).endswith(_COLLATE_FILE):
            if _base(outer.name) in _STACKING and all(_norm(f.filename).endswith(_COLLATE_FILE) for f in inner):
                per_index = True
                collate += 1
            else:
                work += 1
            continue
        f = _getitem_frame(inner)
        trivial = f is not None and _trivial(inner) and not _HEAVY_CODE.search(inner[0].code or "")
        if f is not None:
            # The __getitem__ named is the one seen in the per-row calls, before any other.
            key = (not trivial, f.name.split(".<locals>")[0], short_path(f.filename))
            places[key] += 1
            lines.setdefault(key, Counter())[f.line] += 1
        if trivial:
            getitem += 1
        else:
            work += 1
    place = None
    if places:
        key = min(places, key=lambda k: (k[0], -places[k]))
        place = f"{key[1]} ({key[2]}:{lines[key].most_common(1)[0][0]})"
    return PerRowFetch(n, getitem, collate, loop, work, waiting, per_index, batched, place)
