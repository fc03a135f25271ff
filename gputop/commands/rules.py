"""`gputop rules [ID] [--json]`: the advisor's rules and the thresholds each decides with.

Every rule (id, severity, title) with its thresholds: each one's value in its unit, how the
number was chosen (measured, judgement, derived, documented), why, and where the evidence is;
then the thresholds every finding's confidence and stated bound share, then the analysis' own
(the bars of the evidence the rules read), module by module. With an id, that rule alone;
``--json`` prints ``{"rules": [...], "shared": [...], "analysis": [...]}`` either way.

Exit status: 0; 2 for an id that names no rule (one line).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys

from ..errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rules",
        help="list the advisor's rules and the thresholds each decides with: value, basis, why, source",
        description="List the advisor's rules (id, severity, title) and the thresholds each decides with: "
        "each one's value and unit, how the number was chosen (measured, judgement, derived, documented), "
        "why, and the evidence it rests on; then the analysis' thresholds (the bars of the evidence the "
        "rules read: idle time, the stuck verdict, spin, the ranks, memory).",
    )
    p.add_argument("rule", nargs="?", metavar="ID", help="one rule, by its id (data-starved, launch-bound, ...)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..advisor import RULES, RULES_BY_ID, STATEMENT_THRESHOLDS
    from ..analysis import ANALYSIS_THRESHOLDS
    from ..present import rules_dict, rules_text

    rules = RULES
    if args.rule is not None:
        rule = RULES_BY_ID.get(args.rule)
        if rule is None:
            near = difflib.get_close_matches(args.rule, list(RULES_BY_ID), n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise UserError(f"no rule {args.rule!r}: {hint}`gputop rules` lists the {len(RULES)} rules", exit_code=2)
        rules = (rule,)
    if args.json:
        sys.stdout.write(json.dumps(rules_dict(rules, STATEMENT_THRESHOLDS, ANALYSIS_THRESHOLDS), indent=2) + "\n")
    else:
        sys.stdout.write(rules_text(rules, STATEMENT_THRESHOLDS, one=args.rule is not None,
                                    analysis=ANALYSIS_THRESHOLDS))
    return 0
