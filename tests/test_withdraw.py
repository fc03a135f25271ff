"""A check that takes its finding back: the pattern it names is there, but the evidence no longer
tells its cause from another. The finding leaves at once, where a rule gone silent lingers
(CLEAR_AFTER_S) with the evidence it last had."""

from __future__ import annotations

from pathlib import Path

from gputop.advisor.context import AnalysisContext
from gputop.advisor.engine import CLEAR_AFTER_S, Advisor
from gputop.advisor.rules import Hit, Rule
from gputop.advisor.rules.base import Withdraw
from gputop.model import Severity

NCCL = Path(__file__).parent / "fixtures" / "nccl"


def _advisor(answers: list) -> Advisor:
    """An advisor of one rule that answers ``answers`` in turn, one per evaluation."""
    it = iter(answers)
    rule = Rule("cause", "A cause", Severity.WARNING, lambda ctx: next(it))
    return Advisor(rules=(rule,))


def _shown(adv: Advisor, n: int) -> list[list[str]]:
    out = []
    for t in range(n):
        ctx = AnalysisContext(now=float(t), t0=0.0, t1=float(t), gpus=())
        out.append([f.id for f in adv.update(adv.run_rules(ctx), float(t))])
    return out


def test_a_withdrawn_finding_leaves_at_once_and_a_silent_one_lingers():
    hit = Hit(evidence=("e",), action="do it", cost_s=5.0)
    withdrawn = _shown(_advisor([hit, hit, Withdraw("another cause fits as well"), None, None]), 5)
    assert withdrawn == [[], ["cause"], [], [], []]
    silent = _shown(_advisor([hit, hit, None, None, None]), 5)
    assert silent == [[], ["cause"], ["cause"], ["cause"], ["cause"]]
    assert CLEAR_AFTER_S > 3


def test_the_withdrawal_and_its_reason_are_kept_for_the_evaluation_and_evaluate_reads_none():
    rule = Rule("cause", "A cause", Severity.WARNING, lambda ctx: Withdraw("syncs seen, too few yet"))
    ctx = AnalysisContext(now=1.0, t0=0.0, t1=1.0, gpus=())
    assert rule.evaluate(ctx) is None
    adv = Advisor(rules=(rule,))
    assert adv.run_rules(ctx) == [] and adv.withdrawn == {"cause": "syncs seen, too few yet"}


def _launch_bound_over(recording: Path) -> dict[int, Severity]:
    from gputop.record import Reader
    from gputop.report.rejudge import judged

    reader = Reader(recording)
    try:
        t0 = reader.start_ts
        return {round(t - t0): f.severity for t, shown, _ in judged(reader, 1.0) for f in shown if f.id == "launch-bound"}
    finally:
        reader.close()


def test_a_held_out_jobs_launch_bound_warning_gives_way_to_what_is_weighed():
    """NCCL, 2 x H200: per-step .item() and all_gather_object (removing them measured 1.25x).
    Launch-bound fired at 2-3 s, before any sync sample; from 4 s its rule saw syncs, too few to
    count, and host-sync named the cause at 10 s. The warning was on screen 3-13 s with its first
    seconds' evidence; then from 4 s an information saying what is weighed. Its rank 0 sits in
    backward 17x as often as in forward (waiting on the object collective), which launch-bound now
    weighs from its first second too: host-sync's warning, once it comes, is the only one."""
    seen = _launch_bound_over(NCCL / "ad_ctr-h200x2.gputop")
    warned = sorted(t for t, sev in seen.items() if sev is Severity.WARNING)
    assert warned == [], seen
    assert all(seen.get(t) is Severity.INFO for t in range(3, 10)), seen


def test_a_rise_to_a_warning_holds_as_an_appearance_does():
    """The healthy GPT-2 logging every step (H200): launch-bound weighed syncs (info) at 2 s, fired
    as a warning for the one evaluation at 3 s, weighed again from 4 s. The track had held, so the
    warning showed at once; a rise in severity must hold itself."""
    seen = _launch_bound_over(Path(__file__).parent / "fixtures" / "recordings" / "h200-gpt2-log-every-step.gputop")
    assert seen and Severity.WARNING not in seen.values(), seen


def test_the_engine_shows_the_milder_answer_until_the_graver_has_held():
    info = Hit(evidence=("weighed",), action="tell apart", cost_s=5.0, severity=Severity.INFO)
    warn = Hit(evidence=("sure",), action="do it", cost_s=5.0)
    adv = _advisor([info, info, warn, info, warn, warn, warn])
    sev = []
    for t in range(7):
        ctx = AnalysisContext(now=float(t), t0=0.0, t1=float(t), gpus=())
        shown = adv.update(adv.run_rules(ctx), float(t))
        sev.append(shown[0].severity.value if shown else None)
    assert sev == [None, "info", "info", "info", "info", "warning", "warning"], sev


def test_the_last_run_pairs_its_context_with_what_was_withdrawn():
    """advise --json's evaluation log reads the pair from another thread: one evaluation's both."""
    from gputop.store import Store

    rule = Rule("cause", "A cause", Severity.WARNING, lambda ctx: Withdraw("another cause fits as well"))
    adv = Advisor(rules=(rule,))
    assert adv.last_run is None
    adv.evaluate(Store(), now=1_700_000_000.0)
    ctx, withdrawn = adv.last_run
    assert ctx is adv.last_context and withdrawn == {"cause": "another cause fits as well"}
