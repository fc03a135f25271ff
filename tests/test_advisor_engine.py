"""The advisor over time: hysteresis, supersession, stable ranking, and the pipeline source."""

import pytest

from gputop.advisor.engine import APPEAR_AFTER_S, CLEAR_AFTER_S, Advisor, AdvisorSource, changed
from gputop.advisor.stage import add_job_stage
from gputop.advisor.rules import Hit, Rule
from gputop.analysis.breakdown import Breakdown
from gputop.model import Category as C
from gputop.model import Event, Finding, Severity
from gputop.pipeline import Pipeline
from gputop.store import Store

from synth import T0, Job, periodic, phases

W = Severity.WARNING


def F(fid, cost=1.0, sev=W, title=None, action="do it"):
    return Finding(id=fid, title=title or fid, severity=sev, confidence=0.9, evidence=("e",), action=action, cost_s=cost)


def feed(adv, seq, t=0.0, dt=1.0):
    """Evaluate once per second with the findings of each step; returns the shown ids per step."""
    out = []
    for cands in seq:
        out.append([f.id for f in adv.update(cands, t)])
        t += dt
    return out


def test_a_finding_appears_only_after_it_holds():
    adv = Advisor()
    shown = feed(adv, [[F("data-starved")]] * 4)
    assert shown == [[], ["data-starved"], ["data-starved"], ["data-starved"]]  # two evaluations agree at t=1
    assert APPEAR_AFTER_S == 1.0


def test_two_evaluations_a_second_apart_agree_though_data_time_jitters():
    # by the wall clock a second apart; by the data's clock 0.9 s (a poll landed late)
    adv = Advisor()
    assert adv.update([F("data-starved")], 10.0) == []
    assert [f.id for f in adv.update([F("data-starved")], 10.9)] == ["data-starved"]
    # but not a half-second later: that is the same moment twice
    adv = Advisor()
    adv.update([F("data-starved")], 10.0)
    assert adv.update([F("data-starved")], 10.5) == []


def test_a_one_second_blip_never_shows():
    adv = Advisor()
    shown = feed(adv, [[F("io-bound")], [], [F("io-bound")], [], [F("io-bound")], []])
    assert all(s == [] for s in shown)


def test_it_stays_until_absent_for_longer_and_keeps_its_first_seen():
    adv = Advisor()
    feed(adv, [[F("host-sync")]] * 3)  # shown at t=1, last seen at t=2
    shown = []
    for t in range(3, 3 + int(CLEAR_AFTER_S) + 2):
        shown.append(adv.update([], float(t)))
    # the last sighting was t=2: it is kept up to t=11 and gone from t=12
    assert [bool(s) for s in shown] == [True] * 9 + [False] * 3
    assert shown[0][0].first_seen == 1.0


def test_first_seen_survives_updates_while_shown():
    adv = Advisor()
    feed(adv, [[F("host-sync", cost=c)] for c in (1, 2, 3, 4, 5)])
    (f,) = adv.update([F("host-sync", cost=6)], 5.0)
    assert f.first_seen == 1.0 and f.cost_s == 6


def test_facts_appear_at_once():
    adv = Advisor()
    assert feed(adv, [[F("cuda-launch-blocking")]]) == [["cuda-launch-blocking"]]


def test_stuck_supersedes_throughput_findings_at_once():
    adv = Advisor()
    feed(adv, [[F("io-bound", cost=30)]] * 3)
    shown = adv.update([F("io-bound", cost=30), F("stuck", cost=5, sev=Severity.CRITICAL)], 3.0)
    assert [f.id for f in shown] == ["stuck"]
    # and io-bound does not come back while stuck holds
    assert [f.id for f in adv.update([F("stuck", cost=6, sev=Severity.CRITICAL)], 4.0)] == ["stuck"]


def test_ranked_by_cost():
    adv = Advisor(appear_after_s=0.0)
    shown = adv.update([F("a", 1.0), F("b", 9.0), F("c", 4.0)], 0.0)
    assert [f.id for f in shown] == ["b", "c", "a"]


def test_critical_findings_lead_whatever_their_cost():
    adv = Advisor(appear_after_s=0.0)
    shown = adv.update([F("data-starved", 30.0), F("ecc-errors", 0.0, Severity.CRITICAL), F("x", 5.0)], 0.0)
    assert [f.id for f in shown] == ["ecc-errors", "data-starved", "x"]


def test_close_costs_do_not_swap_places():
    adv = Advisor(appear_after_s=0.0)
    assert [f.id for f in adv.update([F("a", 10.0), F("b", 9.0)], 0.0)] == ["a", "b"]
    # b now costs a little more: within the margin, the order holds
    assert [f.id for f in adv.update([F("a", 10.0), F("b", 11.0)], 1.0)] == ["a", "b"]
    # clearly more: it overtakes
    assert [f.id for f in adv.update([F("a", 10.0), F("b", 13.0)], 2.0)] == ["b", "a"]


def test_equal_costs_rank_severity_first():
    adv = Advisor(appear_after_s=0.0)
    shown = adv.update([F("x", 0.0, Severity.INFO), F("y", 0.0, Severity.CRITICAL), F("z", 0.0, W)], 0.0)
    assert [f.id for f in shown] == ["y", "z", "x"]


def test_changed_means_a_new_verdict_not_new_numbers():
    assert changed(None, F("a"))
    assert not changed(F("a", cost=1), F("a", cost=2))
    assert changed(F("a"), F("a", sev=Severity.CRITICAL))
    assert changed(F("a"), F("a", action="other"))


def test_a_broken_rule_is_reported_and_the_others_still_run():
    def boom(ctx):
        raise ValueError("bad")

    good = Rule("good", "Good", W, lambda ctx: Hit(evidence=("x",), action="y"), appear_after_s=0.0)
    adv = Advisor(rules=(Rule("bad", "Bad", W, boom), good))
    store = Job(seconds=5).store()
    assert [f.id for f in adv.evaluate(store)] == ["good"]
    assert adv.errors == {"bad": "ValueError: bad"}


# --------------------------------------------------------------------------- as a pipeline source


def starved_store(seconds=20.0):
    return Job(seconds=seconds, util=periodic(1.0, 0.4), main=phases(1.0, 0.4, C.FORWARD, C.DATA_FETCH)).store()


def test_advisor_source_publishes_findings_and_breakdowns():
    full = starved_store()
    store = Store()
    src = AdvisorSource(store)
    assert src.name == "advisor" and src.interval == 1.0
    assert src.poll() == []  # nothing collected yet
    # replay the synthetic job second by second, as the pipeline would deliver it
    emitted = []
    for sec in range(1, 21):
        t0, t1 = T0 + sec - 1, T0 + sec
        batch = [*full.util_window(0, t0 + 1e-9, t1), *full.gpu_window(0, t0 + 1e-9, t1),
                 *full.stack_window(t0 + 1e-9, t1), *full.host_window(t0 + 1e-9, t1)]
        batch += [p for pid in full.procs_latest() for p in full.proc_window(pid, t0 + 1e-9, t1)]
        if sec == 1:
            batch += [full.system, *full.gpu_info.values()]
        store.add(batch)
        out = src.poll()
        store.add(out)  # what the pipeline does with a stage's batch
        emitted.append(out)
    ids = [[x.id for x in out if isinstance(x, Finding)] for out in emitted]
    first = next(i for i, xs in enumerate(ids) if "data-starved" in xs)
    assert 2 <= first <= 6  # enough stack samples, then 2 s of holding
    assert sum(xs.count("data-starved") for xs in ids[first + 1 : first + 9]) == 0  # not re-emitted every second
    assert [f.id for f in store.findings()] == ["data-starved"]
    assert store.findings()[0].first_seen == pytest.approx(T0 + first + 1)
    (bd,) = store.breakdowns()
    assert isinstance(bd, Breakdown) and bd.idle_fraction == pytest.approx(0.6, abs=0.02)
    assert src.history["data-starved"][0] == pytest.approx(T0 + first + 1)


def test_a_cleared_finding_becomes_an_event():
    store = starved_store(seconds=10)
    src = AdvisorSource(store, window_s=60.0)
    src.advisor.appear_after_s = 0.0
    out = src.poll()
    assert [x.id for x in out if isinstance(x, Finding)] == ["data-starved"]
    # the window moves past the stall: the job is healthy from now on
    healthy = Job(seconds=10).store()
    later = [s for i in healthy.gpu_indices() for s in healthy.util_window(i, 0)]
    store.add([type(p)(p.ts + 100, p.index, p.util) for p in later])
    src.advisor.window_s = 5.0
    src.advisor.clear_after_s = 0.0
    out = src.poll()
    assert any(isinstance(x, Event) and x.message.startswith("cleared:") for x in out)
    assert store.findings() == []


def test_add_job_stage_puts_the_advisor_on_a_session_pipeline():
    class Session:
        store = Store()
        pipeline = Pipeline(store, [])
        target_pid = 1234
        stuck_after = 7.0
        window = 30.0
        interval = 2.0
        advisor_idle_every = 0.0

    stage = add_job_stage(Session)
    assert stage in Session.pipeline.sources
    src = stage.advisor
    assert src.advisor.window_s == 30.0 and src.advisor.stuck_after_s == 7.0 and src.advisor.target_pid == 1234
    # once a second whatever the sampling interval: stacks bring new evidence every second
    assert stage.interval == 1.0


@pytest.mark.parametrize("dt", [0.5, 1.0, 2.0, 60.0])
def test_the_verdict_does_not_depend_on_how_often_the_advisor_runs(dt):
    # The live UI and `advise` evaluate every 1 s, a 60x replay every 60 s of data: a
    # finding that holds must appear in all of them, once it has held APPEAR_AFTER_S of data time.
    adv = Advisor()
    steps = int(10 / dt) + 2
    shown = feed(adv, [[F("data-starved")]] * steps, dt=dt)
    first = next(i for i, s in enumerate(shown) if s)
    # held for APPEAR_AFTER_S, or for one step when a step is longer than that
    assert first * dt == pytest.approx(max(APPEAR_AFTER_S, dt))
    assert all(s == ["data-starved"] for s in shown[first:])


def test_a_seek_back_in_time_starts_the_findings_over():
    adv = Advisor()
    feed(adv, [[F("io-bound")]] * 4)  # shown from t=2
    assert adv.update([F("io-bound")], 1.0) == []  # back to t=1: it has not held since then
    assert [f.id for f in adv.update([F("io-bound")], 3.0)] == ["io-bound"]


# --------------------------------------------------------------------------- before the first verdict


def _fed_second_by_second(job: Job, seconds: int, target=None):
    """An AdvisorSource fed ``job`` a second at a time as the pipeline would; per second the
    store's ``collecting()`` and the Advisor tab's text."""
    from gputop.present.advice import advice_pane_lines

    full = job.store()
    store = Store()
    src = AdvisorSource(store, target_pid=target)
    seen = []
    for sec in range(1, seconds + 1):
        t0, t1 = T0 + sec - 1, T0 + sec
        batch = [x for i in full.gpu_indices() for x in (*full.util_window(i, t0 + 1e-9, t1), *full.gpu_window(i, t0 + 1e-9, t1))]
        batch += [*full.stack_window(t0 + 1e-9, t1), *full.host_window(t0 + 1e-9, t1)]
        batch += [p for pid in full.procs_latest() for p in full.proc_window(pid, t0 + 1e-9, t1)]
        if sec == 1:
            batch += [full.system, *full.gpu_info.values()]
        store.add(batch)
        store.add(src.poll())
        text = "\n".join("".join(t for t, _ in ln) for ln in advice_pane_lines(
            store.findings(), store.breakdowns(), 120, attached=target is not None, has_gpu=bool(store.gpu_indices()),
            pending=store.pending_findings(), collecting=store.collecting()))
        seen.append((store.collecting(), text))
    return seen


def test_the_advisor_tab_says_what_it_collects_until_the_first_verdict_has_enough():
    """'No findings' 2 s after attaching, before any evidence was in, and the real finding 2 s
    later: until an evaluation has enough stacks (and GPU samples), the tab says what it collects."""
    from gputop.advisor.engine import FIRST_VERDICT_STACKS
    from synth import TARGET

    # A healthy job attached at once: the stacks (5 Hz) are what is short at first.
    seen = _fed_second_by_second(Job(seconds=10), 10, target=TARGET)
    ev, text = seen[1]
    assert ev is not None and ev.stacks is not None and ev.stacks < FIRST_VERDICT_STACKS
    assert f"Collecting evidence: {ev.stacks} of ~{FIRST_VERDICT_STACKS} stacks" in text and "No findings" not in text
    ready = next(i for i, (ev, _) in enumerate(seen) if ev is None)
    assert 3 <= ready <= 5
    assert all("No findings" not in t and "Collecting evidence" in t for _, t in seen[:ready])
    assert all(ev is None and "No findings" in t for ev, t in seen[ready:])


def test_the_first_verdict_stays_once_it_had_enough():
    """After the first verdict the tab never goes back to 'collecting' (the window sliding past
    the attach, stacks that stop): the Advisor's state is per attach."""
    from gputop.advisor.engine import Evidence, FIRST_VERDICT_GPU_S

    # No job attached: GPU samples only, ready once they span FIRST_VERDICT_GPU_S.
    seen = _fed_second_by_second(Job(seconds=6, main=None), 6)
    assert seen[0][0] == Evidence(None, 20, seen[0][0].gpu_s, FIRST_VERDICT_GPU_S) and seen[0][0].gpu_s < FIRST_VERDICT_GPU_S
    assert "Collecting evidence: 0.8 of 2 s of GPU samples" in seen[0][1]
    assert all(ev is None for ev, _ in seen[2:])


def test_collecting_text_and_advise_text():
    from gputop.model import Evidence
    from gputop.present.advice import collecting_text, findings_text, advice_pane_lines

    ev = Evidence(stacks=6, stacks_needed=20, gpu_s=1.2, gpu_needed_s=2.0)
    assert collecting_text(ev) == ("Collecting evidence: 6 of ~20 stacks of the job's main thread, 1.2 of 2 s of GPU "
                                   "samples. Findings come once there is enough to judge.")
    assert findings_text([], collecting=ev).startswith("Collecting evidence: 6 of ~20")
    assert findings_text([]).startswith("No findings")
    # Stacks that cannot be read never come: the GPU samples decide alone.
    assert collecting_text(Evidence(6, 20, 3.0, 2.0), stacks_readable=False) is None
    text = "".join(t for ln in advice_pane_lines([], [], 100, no_stacks="not Python", collecting=Evidence(6, 20, 3.0, 2.0))
                   for t, _ in ln)
    assert "No findings" in text and "Collecting" not in text.replace("Collecting: the time breakdown", "")


def test_a_finding_kept_by_hysteresis_shows_its_latest_evidence():
    """Hysteresis keeps a finding on screen, never its old text: each evaluation that fires it
    gives it its evidence and title (the warm-up's age at that evaluation)."""
    from dataclasses import replace

    from gputop.advisor.engine import warmup_finding

    adv = Advisor()
    for age in range(1, 6):
        (w,) = adv.update([warmup_finding(f"the job started {age} s ago (first steps)", float(age))], float(age))
        assert w.title == f"Warming up: the job started {age} s ago (first steps)"
        assert w.evidence[0] == f"warming up: the job started {age} s ago (first steps)"
    feed(adv, [[replace(F("io-bound"), evidence=("old",))]] * 3, t=10.0)
    adv.update([], 13.0)  # silent once: kept
    (f,) = [x for x in adv.update([replace(F("io-bound"), evidence=("new",))], 14.0) if x.id == "io-bound"]
    assert f.evidence == ("new",) and f.first_seen == 11.0
