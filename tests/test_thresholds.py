"""The rules' thresholds are data with their provenance (analysis/threshold.py), and each
rule's list of thresholds is held to its code; the analysis' numbers are thresholds too.

A numeric UPPER_CASE constant of a rules module is a Threshold (or IntThreshold) with a basis
and a why; each check says which thresholds it decides with (``@uses``), and that list is
checked against what its code reaches: every threshold the check names (in its body, its
lambdas, or the theme modules' helpers it calls) is listed, and nothing is listed that its code
cannot reach. base's helpers (``significant``, ``enough_stacks``, ``spinning``...) apply their
bars as their arguments say, so the thresholds reached only through them may be listed or not:
the rule's author says which apply. A numeric UPPER_CASE constant of an analysis module is a
threshold of its own (but for NVML's bit values and the CPU device's index), which ``gputop rules``
lists under the analysis.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import dis
import importlib
import json
import math
import pickle
import pkgutil
import re
import types
from pathlib import Path
from statistics import NormalDist

import pytest

import gputop.advisor.rules as rules_pkg
import gputop.analysis as analysis_pkg
from gputop.advisor.rules import RULES
from gputop.advisor.rules.base import STATEMENT_THRESHOLDS, USES
from gputop.analysis import ANALYSIS_THRESHOLDS
from gputop.advisor.rules.threshold import (
    DERIVED, JUDGEMENT, Basis, IntThreshold, Threshold, is_threshold,
)

ROOT = Path(__file__).resolve().parents[1]
PKG = rules_pkg.__name__
BASE = f"{PKG}.base"
MODULES = [importlib.import_module(f"{PKG}.{m.name}") for m in pkgutil.iter_modules(rules_pkg.__path__)]


def _defined_upper(module: types.ModuleType) -> list[str]:
    """The UPPER_CASE names the module's own code assigns at its top level (not those it imports)."""
    tree = ast.parse(Path(module.__file__).read_text())
    out = []
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for t in targets:
            for n in ([t] if isinstance(t, ast.Name) else getattr(t, "elts", [])):
                if isinstance(n, ast.Name) and n.id.isupper():
                    out.append(n.id)
    return out


def _numeric(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


DEFINED = [(m, name, getattr(m, name)) for m in MODULES for name in _defined_upper(m)]
THRESHOLDS = {id(v): v for _, _, v in DEFINED if is_threshold(v)}


# --------------------------------------------------------------------------- every number is a Threshold


def test_every_numeric_constant_of_the_rules_is_a_threshold_with_its_provenance():
    missing = []
    for m, name, v in DEFINED:
        if not _numeric(v):
            continue  # ids, strings, compute capabilities (tuples), buckets: not a number with a unit
        short = f"{m.__name__.rsplit('.', 1)[1]}.{name}"
        if not is_threshold(v):
            missing.append(f"{short} = {v!r}: not a Threshold")
            continue
        if not isinstance(v.basis, Basis):
            missing.append(f"{short}: no basis")
        if not (v.why or "").strip():
            missing.append(f"{short}: no why")
        if not (v.unit or "").strip():
            missing.append(f"{short}: no unit")
        if v.module != m.__name__ or v.name != name:
            missing.append(f"{short}: found as {v.module}.{v.name}")
    assert not missing, "\n".join(missing)
    assert len(THRESHOLDS) >= 80  # the 82 converted: the scan does find them


# The analysis' numbers are thresholds too (its own, listed by ``gputop rules`` under the analysis),
# but for those that are names rather than bars: NVML's throttle-reason bits and their masks, and
# the index the CPU device stands at.
ANALYSIS_MODULES = [importlib.import_module(f"{analysis_pkg.__name__}.{m.name}")
                    for m in pkgutil.iter_modules(analysis_pkg.__path__)]
NOT_BARS = {"throttle": {"*"}, "breakdown": {"CPU_DEVICE"}}


def test_every_numeric_constant_of_the_analysis_is_a_threshold_with_its_provenance():
    missing, found = [], []
    for m in ANALYSIS_MODULES:
        short = m.__name__.rsplit(".", 1)[1]
        skip = NOT_BARS.get(short, set())
        for name in _defined_upper(m):
            v = getattr(m, name)
            if not _numeric(v) or "*" in skip or name in skip:
                continue
            if not is_threshold(v):
                missing.append(f"{short}.{name} = {v!r}: not a Threshold")
                continue
            found.append(v)
            if not (v.why or "").strip() or not (v.unit or "").strip():
                missing.append(f"{short}.{name}: no why or no unit")
            if v.module != m.__name__ or v.name != name:
                missing.append(f"{short}.{name}: found as {v.module}.{v.name}")
            if isinstance(v, IntThreshold) != isinstance(v.value, int):
                missing.append(f"{short}.{name}: a whole number is an IntThreshold, a fraction a Threshold")
            if len(v.why) > 320:
                missing.append(f"{short}.{name}: keep the why to a sentence or two (the comment holds the rest)")
            for path in re.findall(r"(?:bench|tests)/[\w./-]+\w", v.source or ""):
                if not (ROOT / path).exists():
                    missing.append(f"{short}.{name} cites {path}, which is not there")
    assert not missing, "\n".join(missing)
    # What gputop rules lists under the analysis is exactly these, each once.
    assert [id(t) for t in ANALYSIS_THRESHOLDS] == [id(t) for t in sorted(found, key=lambda t: t.module)]
    assert len(ANALYSIS_THRESHOLDS) >= 70


def test_whole_numbers_stay_ints_and_fractions_floats():
    for t in THRESHOLDS.values():
        assert isinstance(t, IntThreshold) == isinstance(t.value, int), t.name
        assert type(t.value) in (int, float) and t.value == t


def test_a_why_is_a_sentence_or_two_and_a_cited_bench_file_exists():
    for t in THRESHOLDS.values():
        assert len(t.why) <= 320, f"{t.name}: keep the why to a sentence or two (the comment holds the rest)"
        for path in re.findall(r"bench/[\w./-]+\w", t.source or ""):
            assert (ROOT / path).exists(), f"{t.name} cites {path}, which is not there"


def test_derived_thresholds_agree_with_what_they_are_derived_from():
    from gputop.advisor.rules import base, distributed, host

    assert base.SHARE_UPPER_Z.basis is DERIVED
    assert base.SHARE_UPPER_Z == pytest.approx(NormalDist().inv_cdf(base.SHARE_UPPER_LEVEL), abs=1e-4)
    assert distributed.GPU_OTHERS_WAIT_MIN == distributed.GPU_STRAGGLER_GAP == base.MIN_COST_FRACTION
    assert math.exp(-host.SYNC_SAMPLES_PER_STRETCH) == pytest.approx(0.05, abs=0.001)


# --------------------------------------------------------------------------- a Threshold is its number


def test_a_threshold_reads_writes_and_computes_as_its_number():
    t = Threshold(0.30, "share", JUDGEMENT, "a third of the time waiting is a pattern, not jitter")
    n = IntThreshold(8, "workers", JUDGEMENT, "half the cores, at most this")
    assert (repr(t), str(t), f"{t}", f"{t:.0f}", f"{100 * t:.0f} %") == ("0.3", "0.3", "0.3", "0", "30 %")
    assert (repr(n), str(n), f"{n}", f"num_workers={n}", f"{n:>3}") == ("8", "8", "8", "num_workers=8", "  8")
    assert json.dumps({"t": t, "n": n, "l": [t, n]}) == '{"t": 0.3, "n": 8, "l": [0.3, 8]}'
    assert type(t * 2) is float and type(n + 1) is int and type(n // 2) is int and type(-t) is float
    assert round(t, 1) == 0.3 and round(t) == 0 and hash(t) == hash(0.3) and {0.3: "x"}[t] == "x"
    three = IntThreshold(3, "polls", JUDGEMENT, "x")
    assert list(range(three)) == [0, 1, 2] and "abcd"[:three] == "abc"
    assert t.module == __name__ and t.basis.value == "judgement" and t.source is None


def test_a_threshold_is_read_only_and_copies_and_pickles_with_its_provenance():
    t = Threshold(20e6, "bytes/s", JUDGEMENT, "far above a loader reading from the page cache",
                  "bench/results/harness.md")
    with pytest.raises(AttributeError):
        t.why = "changed"
    assert copy.copy(t) is t and copy.deepcopy([t])[0] is t
    back = pickle.loads(pickle.dumps(t))
    assert (back, type(back), back.unit, back.basis, back.why, back.source, back.module) == (
        t, Threshold, t.unit, t.basis, t.why, t.source, t.module)

    @dataclasses.dataclass
    class Holder:
        n: int

    assert dataclasses.asdict(Holder(IntThreshold(4, "samples", JUDGEMENT, "x"))) == {"n": 4}


def test_a_threshold_needs_a_basis_and_an_int_threshold_a_whole_number():
    with pytest.raises(TypeError):
        Threshold(0.5, "share", "judgement", "a string is not a basis")
    with pytest.raises(TypeError):
        IntThreshold(2.5, "samples", JUDGEMENT, "not whole")


# --------------------------------------------------------------------------- each rule's list, against its code


def _codes(code: types.CodeType):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def _ours(obj: object) -> bool:
    mod = getattr(obj, "__module__", None) or ""
    return mod == PKG or mod.startswith(PKG + ".")


def _functions(obj: object, depth: int = 0):
    """The functions of the rules package an object a check names stands for: a function, a
    class's methods and properties, a table's entries (nccl's SETTINGS and their lambdas)."""
    if depth > 3:
        return
    if isinstance(obj, types.FunctionType):
        if _ours(obj):
            yield obj
    elif isinstance(obj, type):
        if _ours(obj):
            for v in vars(obj).values():
                v = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
                if isinstance(v, property):
                    yield from (f for f in (v.fget, v.fset, v.fdel) if f is not None)
                elif isinstance(v, types.FunctionType):
                    yield v
    elif isinstance(obj, (tuple, list, set, frozenset)):
        for x in obj:
            yield from _functions(x, depth + 1)
    elif dataclasses.is_dataclass(obj) and _ours(type(obj)):
        for f in dataclasses.fields(obj):
            yield from _functions(getattr(obj, f.name), depth + 1)


def reached(check, into_base: bool) -> tuple[set[int], set[int]]:
    """(ids of the thresholds the check's code names, ids of those only in the default arguments
    of the functions it reaches), following the rules package's functions it names, transitively;
    ``into_base`` False: not into base's helpers."""
    named, defaults, seen, todo = set(), set(), set(), [check]
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if f is not check and not into_base and f.__module__ == BASE:
            continue
        given = (f.__defaults__ or ()) + tuple((f.__kwdefaults__ or {}).values())
        defaults |= {id(d) for d in given if is_threshold(d)}
        for code in _codes(f.__code__):
            for ins in dis.get_instructions(code):
                if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                    v = f.__globals__.get(ins.argval)
                    if is_threshold(v):
                        # The analysis' own bars a check reads (the stuck rule words its line with
                        # progress.TREE_BUSY_CORES) are listed under the analysis, not per rule.
                        if (v.module or "").startswith(PKG + "."):
                            named.add(id(v))
                    else:
                        todo.extend(_functions(v))
    return named, defaults - named


STATEMENT = {id(t) for t in STATEMENT_THRESHOLDS}


def _names(ids) -> list[str]:
    return sorted(THRESHOLDS[i].name for i in ids)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_every_check_says_which_thresholds_it_decides_with(rule):
    # @uses(...) above the check, empty for a rule that judges a fact (an environment variable).
    assert rule.check in USES, f"{rule.check.__name__}: add @uses(...) with its thresholds"
    listed = [id(t) for t in rule.thresholds]
    assert all(is_threshold(t) for t in rule.thresholds)
    assert len(set(listed)) == len(listed), f"{rule.id} lists a threshold twice"
    assert all(i in THRESHOLDS for i in listed), f"{rule.id} lists a threshold that is no constant of the rules"
    assert not set(listed) & STATEMENT, f"{rule.id}: STATEMENT_THRESHOLDS are shared, not listed per rule"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_a_rules_list_is_what_its_code_reaches(rule):
    listed = {id(t) for t in rule.thresholds}
    must, _ = reached(rule.check, into_base=False)
    may_named, may_defaults = reached(rule.check, into_base=True)
    forgotten = (must - STATEMENT) - listed
    assert not forgotten, f"{rule.id} decides with {_names(forgotten)}: list them in @uses(...)"
    stale = listed - may_named - may_defaults
    assert not stale, f"{rule.id} lists {_names(stale)}, which its code does not reach"
    # Each is a threshold of its own module, base, or the module of a helper it calls.
    for t in rule.thresholds:
        assert t.module.startswith(PKG + "."), t.name


def test_every_threshold_is_listed_by_a_rule_or_shared():
    used = {id(t) for r in RULES for t in r.thresholds} | STATEMENT
    assert not set(THRESHOLDS) - used, f"used by no rule: {_names(set(THRESHOLDS) - used)}"


def test_the_statement_thresholds_are_reached_by_the_checks_that_state_bounds():
    # They are the numbers behind every stated bound and confidence: a rule stating a bound
    # reaches them through base's wording helpers.
    reach_all = set()
    for r in RULES:
        named, defaults = reached(r.check, into_base=True)
        reach_all |= named | defaults
    assert STATEMENT <= reach_all
