"""`gputop rules [ID] [--json]`: the advisor's rules and their thresholds, with their provenance;
then the analysis' thresholds."""

from __future__ import annotations

import json

from gputop.advisor import RULES, STATEMENT_THRESHOLDS, IntThreshold, Threshold
from gputop.advisor.rules.threshold import DOCUMENTED, JUDGEMENT
from gputop.cli import COMMANDS, main
from gputop.present.rules import value_text


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["rules", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_rules_lists_every_rule_with_its_thresholds_and_their_basis(capsys):
    assert "rules" in COMMANDS
    rc, out, err = run(capsys)
    assert rc == 0 and err == ""
    for r in RULES:
        assert f"{r.id}  [{r.severity.value}]  {r.title}\n" in out
        for t in r.thresholds:
            assert f"  {t.name} = " in out
    # A known threshold: its value in its unit, its basis, its why (the first time it is given).
    assert "  OTHERS_WAIT_MIN = 30 %  (judgement)\n      Every other rank waits in collectives" in out
    assert "  SMALL_SHM_BYTES = 1 GiB  (documented)" in out and "source: Docker's `docker run --shm-size`" in out
    # A bar several rules share is explained once, then pointed to.
    assert out.count("A claim from the stacks needs 2 s") == 1
    assert "  MIN_MAIN_SAMPLES = 10 samples  (judgement)  as under attached-to-worker" in out
    # The numbers behind every finding's confidence and bound, once, at the end.
    assert "Shared by every rule" in out and "  SHARE_UPPER_Z = 1.6449 z  (derived)" in out
    for t in STATEMENT_THRESHOLDS:
        assert f"  {t.name} = " in out.split("Shared by every rule")[1]


def test_rules_id_gives_that_rule_in_full(capsys):
    rc, out, err = run(capsys, "rank-straggler")
    assert rc == 0 and err == ""
    assert out.startswith("rank-straggler  [warning]  One rank holds the others back\n")
    assert "  STRAGGLER_LEVEL = 95 % confidence  (judgement)" in out and "source: bench/multi_rank.py" in out
    assert "  MIN_MAIN_SAMPLES = 10 samples  (judgement)\n      A claim from the stacks" in out  # not "as under"
    assert "data-starved" not in out
    assert "also use FULL_CONFIDENCE_SAMPLES" in out


def test_rules_json_for_scripts(capsys):
    rc, out, _ = run(capsys, "--json")
    assert rc == 0
    d = json.loads(out)
    assert [r["id"] for r in d["rules"]] == [r.id for r in RULES]
    starved = next(r for r in d["rules"] if r["id"] == "data-starved")
    assert starved["severity"] == "warning"
    workers = next(t for t in starved["thresholds"] if t["name"] == "MAX_DEFAULT_WORKERS")
    assert workers == {
        "name": "MAX_DEFAULT_WORKERS", "module": "gputop.advisor.rules.data", "value": 8, "unit": "workers",
        "basis": "judgement", "why": workers["why"], "source": None,
    }
    assert workers["why"] and type(workers["value"]) is int
    assert [t["name"] for t in d["shared"]] == [t.name for t in STATEMENT_THRESHOLDS]
    rc, out, _ = run(capsys, "collective-bound", "--json")
    one = json.loads(out)
    assert rc == 0 and [r["id"] for r in one["rules"]] == ["collective-bound"] and one["shared"] == d["shared"]
    bases = {t["basis"] for r in d["rules"] for t in r["thresholds"]}
    assert bases <= {"measured", "judgement", "derived", "documented"}


def test_an_unknown_id_is_one_line_and_exit_2(capsys):
    rc, out, err = run(capsys, "data-stravd")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("gputop rules: error: no rule 'data-stravd'")
    assert "did you mean data-starved?" in err
    rc, out, err = run(capsys, "no-such-rule", "--json")
    assert rc == 2 and out == "" and err.count("\n") == 1


def test_a_value_reads_in_its_unit():
    def t(v, unit):
        return (IntThreshold if isinstance(v, int) else Threshold)(v, unit, JUDGEMENT, "x")

    assert value_text(t(0.3, "share")) == "30 %"
    assert value_text(t(0.95, "confidence")) == "95 % confidence"
    assert value_text(t(150.0, "% of a core")) == "150 % of a core"
    assert value_text(t(1.25, "x")) == "1.25x"
    assert value_text(t(20e6, "bytes/s")) == "20 MB/s"
    assert value_text(IntThreshold(1 << 30, "bytes", DOCUMENTED, "x")) == "1 GiB"
    assert value_text(t(7200.0, "s")) == "7200 s (2 h)"
    assert value_text(t(3, "polls")) == "3 polls"


def test_the_analysis_thresholds_follow_the_rules_by_module(capsys):
    from gputop.analysis import ANALYSIS_THRESHOLDS

    rc, out, _ = run(capsys)
    assert rc == 0
    rest = out.split("The analysis' ", 1)[1]
    assert rest.startswith(f"{len(ANALYSIS_THRESHOLDS)} thresholds: the bars of the evidence the rules read")
    # Under the heading of its module, with its value, basis and why as a rule's threshold reads.
    stuck = rest.split("\nanalysis.stuck\n", 1)[1]
    assert stuck.startswith("  DEFAULT_STUCK_AFTER_S = 30 s  (judgement)\n      No progress this long")
    assert "  NCCL_SPIN_SM = 18 %  (measured)" in rest and "source: bench/multi_rank.py" in rest
    assert "  HANG_MIN_FROZEN_S = 5 s  (documented)" in rest
    for t in ANALYSIS_THRESHOLDS:
        assert f"  {t.name} = " in rest
    rc, out, _ = run(capsys, "stuck")
    assert f"and the analysis' {len(ANALYSIS_THRESHOLDS)} thresholds" in out and "analysis.stuck" not in out
    rc, out, _ = run(capsys, "--json")
    d = json.loads(out)
    assert [t["name"] for t in d["analysis"]] == [t.name for t in ANALYSIS_THRESHOLDS]
    gap = next(t for t in d["analysis"] if t["name"] == "STRAGGLER_MIN_GAP_OPS")
    assert (gap["module"], gap["value"], gap["unit"], gap["basis"]) == (
        "gputop.analysis.nccl_ras", 32, "operations", "judgement") and type(gap["value"]) is int
    rc, out, _ = run(capsys, "stuck", "--json")
    assert json.loads(out)["analysis"] == d["analysis"]  # the same shape for one rule
