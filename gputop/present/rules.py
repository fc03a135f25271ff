"""The advisor's rules and the thresholds each decides with, as text and JSON (``gputop rules``).
Pure: no I/O.

A threshold reads as its name, its value in its unit, how its number was chosen (its basis), why,
and where the evidence is. The thresholds behind how every finding is stated (its confidence, its
bound) are shared by all the rules and shown once; the analysis' own (the bars of the evidence the
rules read: idle time, the stuck verdict, spin, the ranks, memory) follow, module by module.
"""

from __future__ import annotations

import textwrap
from typing import Any, Iterable, Sequence

from ..advisor import AnyThreshold, Rule

BASES = "measured, judgement, derived (from another number) or documented (a vendor's or a library's value)"


def value_text(t: AnyThreshold) -> str:
    """The value in its unit: a share as a percentage ('30 %'), a size or rate in bytes' units,
    seconds past an hour with the hours beside them."""
    v, unit = t.value, t.unit
    if unit == "share":
        return f"{100 * v:g} %"
    if unit == "confidence":
        return f"{100 * v:g} % confidence"
    if unit == "%" or unit.startswith("% "):
        return f"{v:g} {unit}"
    if unit == "x":
        return f"{v:g}x"
    if unit == "bytes":
        for size, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if v >= size and v % size == 0:
                return f"{v // size:g} {name}"
        return f"{v:g} bytes"
    if unit == "bytes/s":
        return f"{v / 1e6:g} MB/s" if v >= 1e6 else f"{v:g} bytes/s"
    if unit == "s" and v >= 3600:
        return f"{v:g} s ({v / 3600:g} h)"
    return f"{v:g} {unit}"


def threshold_dict(t: AnyThreshold) -> dict[str, Any]:
    return {"name": t.name, "module": t.module, "value": t.value, "unit": t.unit, "basis": t.basis.value,
            "why": t.why, "source": t.source}


def rule_dict(rule: Rule) -> dict[str, Any]:
    return {"id": rule.id, "title": rule.title, "severity": rule.severity.value,
            "thresholds": [threshold_dict(t) for t in rule.thresholds]}


def rules_dict(rules: Iterable[Rule], shared: Sequence[AnyThreshold],
               analysis: Sequence[AnyThreshold] = ()) -> dict[str, Any]:
    """``{"rules": [...], "shared": [...], "analysis": [...]}``: the same shape for one rule as for
    all of them."""
    return {"rules": [rule_dict(r) for r in rules], "shared": [threshold_dict(t) for t in shared],
            "analysis": [threshold_dict(t) for t in analysis]}


def _threshold_lines(t: AnyThreshold, width: int, seen_at: str | None = None) -> list[str]:
    """A threshold's lines: name, value and basis, then its why and source; or (``seen_at``: the
    rule under which a listing already gave them) one line that points there."""
    head = f"  {t.name or '?'} = {value_text(t)}  ({t.basis.value})"
    if seen_at is not None:
        return [f"{head}  as under {seen_at}"]
    more = "      "
    out = [head]
    out.extend(textwrap.wrap(t.why, width, initial_indent=more, subsequent_indent=more, break_on_hyphens=False))
    if t.source:
        out.extend(textwrap.wrap(f"source: {t.source}", width, initial_indent=more,
                                 subsequent_indent=more + "  ", break_on_hyphens=False))
    return out


def rule_lines(rule: Rule, width: int = 100, seen: dict[int, str] | None = None) -> list[str]:
    """A rule's heading and its thresholds. ``seen`` (threshold id -> the rule it was first given
    under) shortens a threshold a listing already explained, and is filled as it goes."""
    out = [f"{rule.id}  [{rule.severity.value}]  {rule.title}"]
    for t in rule.thresholds:
        out.extend(_threshold_lines(t, width, None if seen is None else seen.get(id(t))))
        if seen is not None:
            seen.setdefault(id(t), rule.id)
    if not rule.thresholds:
        out.append("  no threshold of its own: it reports what it reads as soon as it reads it")
    return out


def analysis_lines(analysis: Sequence[AnyThreshold], width: int = 100) -> list[str]:
    """The analysis' thresholds under a heading per module (``stuck``, ``spin``, ...)."""
    out = [f"The analysis' {len(analysis)} thresholds: the bars of the evidence the rules read, by module"]
    module = None
    for t in analysis:
        if t.module != module:
            module = t.module
            out.append(f"analysis.{(module or '?').rsplit('.', 1)[-1]}")
        out.extend(_threshold_lines(t, width))
    return out


def rules_text(rules: Sequence[Rule], shared: Sequence[AnyThreshold], width: int = 100, one: bool = False,
               analysis: Sequence[AnyThreshold] = ()) -> str:
    """Every rule in ``rules`` with its thresholds (a threshold several rules share explained the
    first time), then the shared ones, then the analysis' (``analysis``); or (``one``: a rule asked
    for by its id) that rule in full and a line naming the shared ones."""
    out: list[str] = []
    seen: dict[int, str] | None = None if one else {}
    if not one:
        out.append(f"The advisor's {len(rules)} rules, in the order they break ties, and the thresholds each "
                   "decides with.")
        out.extend(textwrap.wrap(f"Each threshold: its value; how the number was chosen: {BASES}; why; and the "
                                 "evidence, where there is some.", width))
        out.append("")
    for r in rules:
        out.extend(rule_lines(r, width, seen))
        out.append("")
    names = ", ".join(t.name or "?" for t in shared)
    if one:
        out.extend(textwrap.wrap(f"Every finding's confidence and stated bound also use {names} "
                                 "(gputop rules shows them"
                                 + (f", and the analysis' {len(analysis)} thresholds" if analysis else "")
                                 + ").", width))
    else:
        out.append("Shared by every rule: how a finding's confidence and its stated bound are worked out")
        for t in shared:
            out.extend(_threshold_lines(t, width))
        if analysis:
            out.append("")
            out.extend(analysis_lines(analysis, width))
    return "\n".join(out).rstrip("\n") + "\n"
