"""The README's count of the thresholds behind the findings went stale (82 said, 84 listed): it is
now checked against what `gputop rules --json` lists."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from gputop.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


def _unique(thresholds) -> dict:
    return {(t["module"], t["name"]): t for t in thresholds}


def test_the_readme_counts_what_gputop_rules_lists(capsys):
    assert main(["rules", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    own = _unique(t for r in d["rules"] for t in r["thresholds"])
    shared = _unique(d["shared"])
    rules = {**own, **shared}
    basis = Counter(t["basis"] for t in rules.values())
    cited = sum(1 for t in rules.values() if t["basis"] == "judgement" and t.get("source"))
    analysis = Counter(t["basis"] for t in _unique(d["analysis"]).values())
    text = " ".join(README.read_text().split())
    want = (f"Of the rules' {len(rules)} thresholds ({len(own)} of the rules themselves, {len(shared)} shared by "
            f"every finding's confidence and stated bound), {basis['judgement']} are judgement ({cited} of them cite "
            f"the bench result or datasheet they were set against), {basis['derived']} are derived from another "
            f"number and {basis['documented']} are a vendor's or a library's documented value")
    assert want in text
    assert basis["measured"] == 0 and "none is a measurement taken as is" in text
    m = re.search(r"The analysis' own (\d+) thresholds .*? (\d+) judgement, (\d+) derived, (\d+) measured, "
                  r"(\d+) documented", text)
    assert m is not None
    assert tuple(int(x) for x in m.groups()) == (sum(analysis.values()), analysis["judgement"], analysis["derived"],
                                                 analysis["measured"], analysis["documented"])
