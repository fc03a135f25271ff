"""A hang forming (analysis.hang_forming, advisor.engine): the main thread still longer than its
steps' waits and not yet stuck. A BERT job whose kernel never ended sat in `loss.item()` and was
told "host-device syncs every step" for 4 s before the stuck verdict (H200); the advisor now says
what it weighs and holds the step's findings until the thread moves or the verdict comes."""

from __future__ import annotations

from pathlib import Path

from gputop.advisor.engine import HELD_WHILE_FORMING, WEIGHING_ID, Advisor, weighing_finding
from gputop.analysis.hang_forming import FORMING_FACTOR, FORMING_MIN_S, Forming, hang_forming, longest_run
from gputop.analysis.stuck import StuckVerdict
from gputop.model import Category as C
from gputop.model import Frame, Severity, StackSample

TRAIN = "/home/u/train.py"
RECORDINGS = Path(__file__).parent / "fixtures" / "recordings"


def sample(ts, line):
    return StackSample(ts=ts, pid=1, thread_id=1, thread_name="MainThread", is_main=True, category=C.FORWARD,
                       frames=(Frame("step", TRAIN, line), Frame("main", TRAIN, 90)))


def verdict(held, since, works=None, stuck=False):
    return StuckVerdict(stuck, "", since=since, held_s=held, where="train.py:70 in step", works=works)


def stepping(until, period=0.2):
    """A loop whose stack changes at every 5 Hz sample, up to ``until``."""
    return [sample(k * period, 40 + k % 3) for k in range(int(until / period))]


def test_still_past_its_steps_and_not_yet_stuck_is_a_hang_forming():
    main = stepping(10.0)
    f = hang_forming(verdict(FORMING_MIN_S + 0.5, 10.0), main, 30.0)
    assert isinstance(f, Forming) and f.where == "train.py:70 in step" and f.longest_before_s <= 0.4
    assert hang_forming(verdict(FORMING_MIN_S - 0.5, 10.0), main, 30.0) is None  # a step's wait
    assert hang_forming(verdict(31.0, 10.0), main, 30.0) is None  # the stuck verdict's time
    assert hang_forming(verdict(5.0, 10.0, stuck=True), main, 30.0) is None  # stuck already


def test_a_wait_that_works_or_a_job_whose_steps_wait_as_long_is_not():
    main = stepping(10.0)
    assert hang_forming(verdict(5.0, 10.0, works="its DataLoader workers compute"), main, 30.0) is None
    # every step waits 2 s in one place: standing 4 s is two steps' worth, not a hang
    slow = [sample(t, 40 if (t // 2) % 2 else 41) for t in [k * 0.2 for k in range(50)]]
    assert longest_run(slow, 10.0) >= 1.8
    assert hang_forming(verdict(4.0, 10.0), slow, 30.0) is None
    assert hang_forming(verdict(FORMING_FACTOR * 2.0 + 0.5, 10.0), slow, 30.0) is not None


def test_the_engine_holds_the_steps_findings_and_says_what_it_weighs():
    class Ctx:  # the fields run_rules reads
        warmup = None
        forming = Forming(4.0, "train.py:70 in step", 0.4, 30.0)
        now = 100.0
        target_pid = 1234
        ranks = ()

    seen = []

    class Rule:
        def __init__(self, rid):
            self.id = rid

        def run(self, ctx):  # the engine runs a rule by its run()
            seen.append(self.id)
            return None

    adv = Advisor(rules=[Rule("host-sync"), Rule("launch-bound"), Rule("rank-straggler"), Rule("stuck")])
    out = adv.run_rules(Ctx())
    assert "host-sync" in HELD_WHILE_FORMING and "launch-bound" in HELD_WHILE_FORMING
    assert seen == ["rank-straggler", "stuck"]  # the ranks' and the hang's own rules still run
    (w,) = out
    assert w.id == WEIGHING_ID and w.severity is Severity.INFO
    assert "no progress for 4 s at train.py:70 in step" in w.title and "gputop stacks --pid 1234" in w.action


def test_a_shown_finding_is_withdrawn_at_once_when_its_rule_is_held():
    from gputop.model import Finding

    adv = Advisor(rules=[])
    f = Finding(id="host-sync", title="Host-device syncs every step", severity=Severity.WARNING, confidence=0.9,
                evidence=(), action="", ts=0.0)
    adv.update([f], 10.0)
    assert [x.id for x in adv.update([f], 11.0)] == ["host-sync"]
    adv._held = HELD_WHILE_FORMING  # what run_rules sets while a hang forms
    shown = adv.update([weighing_finding(Forming(4.0, "x.py:1 in f", 0.0, 30.0), 12.0)], 12.0)
    assert [x.id for x in shown] == [WEIGHING_ID]


def test_the_real_gpu_hang_is_weighed_then_stuck_never_host_sync():
    """The H200 recording of a BERT job whose kernel never ends: before, host-sync was shown from
    4 s to the stuck verdict; now the advisor weighs, then says stuck, and never host-sync."""
    from test_rule_evaluation import replay

    shown, seen, _ = replay(RECORDINGS / "h200-bert-gpu-hang.gputop")
    assert "stuck" in shown
    assert WEIGHING_ID in seen and seen[WEIGHING_ID] < seen["stuck"]
    assert "host-sync" not in seen and "launch-bound" not in seen


def test_real_jobs_that_step_are_never_weighed():
    from test_rule_evaluation import replay

    for name in ("h200-vit-validate-every-step", "h200-gpt2-log-every-step", "h200-roberta-accum-16",
                 "h100-checkpoint-stall"):
        _, seen, _ = replay(RECORDINGS / f"{name}.gputop")
        assert WEIGHING_ID not in seen, name


def test_a_sync_on_a_gpu_that_computes_is_a_long_steps_wait_not_a_hang_forming():
    """A compute-bound loop reading `loss.item()` every step samples the same stack for seconds
    while its GPU works (SMs busy); a spinning GPU (busy with nothing done) is a hang's."""
    main = stepping(10.0)
    v = StuckVerdict(False, "", since=10.0, held_s=5.0, where="train.py:70 in step", gpu="busy")
    assert hang_forming(v, main, 30.0, gpu_computing=True) is None
    assert hang_forming(v, main, 30.0, gpu_computing=False) is not None  # its polls all spins
