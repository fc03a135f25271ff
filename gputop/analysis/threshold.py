"""A threshold as data: its number, and where the number comes from. The advisor's rules and the
analysis decide with them alike (the analysis is the lower layer, so the type lives here).

``Threshold`` is a ``float`` and ``IntThreshold`` an ``int``: every comparison, every piece of
arithmetic and every format a rule applies to the plain number works on them unchanged (and
gives a plain number back), ``repr``, ``str`` and JSON write the number alone. What they add is
read only by whoever asks (``gputop rules``, the tests):

- ``unit``: what the number counts: "share" (of the time or of the samples, 0-1), "%" (of a
  core, of utilisation), "s", "x" (a ratio of rates or sizes), "samples", "polls", "bytes",
  "bytes/s", or a word for what is counted ("workers", "cores", "waits");
- ``basis``: how the number was chosen (``Basis``);
- ``why``: the gist, in a sentence or two; the comment above the constant keeps whatever it
  says beyond that (the measurements, the alternatives);
- ``source``: where the evidence is, if anywhere: a bench result file, a datasheet, a doc;
- ``module`` and ``name``: where it is defined, found by itself.

A count used where an integer is needed (a worker count written into an action, ``range``) is
an ``IntThreshold``, so it stays an ``int``.
"""

from __future__ import annotations

import sys
from enum import Enum
from typing import Any, Union

__all__ = [
    "DERIVED", "DOCUMENTED", "JUDGEMENT", "MEASURED", "AnyThreshold", "Basis", "IntThreshold", "Threshold",
    "is_threshold",
]


class Basis(Enum):
    """How a threshold's number was chosen."""

    MEASURED = "measured"  # the number is a measurement (a bench result says it)
    JUDGEMENT = "judgement"  # chosen by judgement, often between measurements that bound it (see source)
    DERIVED = "derived"  # follows from other numbers (another threshold, a formula)
    DOCUMENTED = "documented"  # a vendor's or a library's documented value


MEASURED, JUDGEMENT, DERIVED, DOCUMENTED = Basis.MEASURED, Basis.JUDGEMENT, Basis.DERIVED, Basis.DOCUMENTED


def _caller_module(depth: int = 2) -> str | None:
    """The module that constructs the threshold: where it is defined (``collections.namedtuple``
    finds its caller's module the same way)."""
    try:
        return sys._getframe(depth).f_globals.get("__name__")
    except (AttributeError, ValueError):  # not CPython, or no such frame
        return None


class _Provenance:
    """What ``Threshold`` and ``IntThreshold`` share: read-only metadata beside the number."""

    __slots__ = ()

    unit: str
    basis: Basis
    why: str
    source: str | None
    module: str | None

    def _init(self, unit: str, basis: Basis, why: str, source: str | None, module: str | None) -> None:
        if not isinstance(basis, Basis):
            raise TypeError(f"basis must be a Basis, not {basis!r}")
        for key, value in (("unit", unit), ("basis", basis), ("why", why), ("source", source), ("module", module)):
            object.__setattr__(self, key, value)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"a threshold is read-only ({key})")

    def __delattr__(self, key: str) -> None:
        raise AttributeError(f"a threshold is read-only ({key})")

    @property
    def value(self) -> float | int:
        """The plain number."""
        raise NotImplementedError

    @property
    def name(self) -> str | None:
        """The constant's name in the module that defines it (None if it is not bound there)."""
        mod = sys.modules.get(self.module or "")
        if mod is None:
            return None
        return next((k for k, v in vars(mod).items() if v is self), None)

    def __copy__(self) -> "_Provenance":
        return self  # immutable

    def __deepcopy__(self, memo: dict) -> "_Provenance":
        return self

    def __reduce__(self) -> tuple:
        return (_rebuild, (type(self), self.value, self.unit, self.basis.value, self.why, self.source, self.module))


def _rebuild(cls: type, value: float | int, unit: str, basis: str, why: str, source: str | None,
             module: str | None) -> "_Provenance":
    return cls(value, unit, Basis(basis), why, source, _module=module)


class Threshold(_Provenance, float):
    """A threshold: a ``float`` that carries its unit, basis, why and source."""

    __slots__ = ("unit", "basis", "why", "source", "module")

    def __new__(cls, value: float, unit: str, basis: Basis, why: str, source: str | None = None, *,
                _module: str | None = None) -> "Threshold":
        self = float.__new__(cls, value)
        self._init(unit, basis, why, source, _module or _caller_module())
        return self

    @property
    def value(self) -> float:
        return float(self)


class IntThreshold(_Provenance, int):
    """A count used where an integer is needed: an ``int`` that carries what a ``Threshold`` does.
    (An ``int`` subclass cannot have slots: its attributes live in its ``__dict__``.)"""

    def __new__(cls, value: int, unit: str, basis: Basis, why: str, source: str | None = None, *,
                _module: str | None = None) -> "IntThreshold":
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"an IntThreshold is a whole number, not {value!r}")
        self = int.__new__(cls, value)
        self._init(unit, basis, why, source, _module or _caller_module())
        return self

    @property
    def value(self) -> int:
        return int(self)


AnyThreshold = Union[Threshold, IntThreshold]


def is_threshold(x: object) -> bool:
    return isinstance(x, _Provenance)
