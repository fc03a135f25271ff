"""The flight-recorder autopsy's pure part (``gputop.analysis.flight_recorder``), on dumps built
here in the recorder's format (the fields ``torch.distributed.flight_recorder`` reads, NCCL's
naming and states), and PyTorch's own analyzer on the same dumps where torch is importable.
The command on real dumps made by PyTorch (gloo, CPU) is ``test_autopsy.py``."""

from __future__ import annotations

import copy

import pytest

from gputop.analysis.flight_recorder import (
    DESYNC, MISSING_RANK, NO_HANG, STALLED, analyzer_view, autopsy, autopsy_dict, autopsy_hint, autopsy_text,
    buffer_size, dump_prefix, dump_problem, rebuild_pg_config,
)

DIST = "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/usr/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"
TRAIN = "/home/u/job/train.py"


def frames(line: int, fn: str = "train_step") -> list[dict]:
    return [{"filename": DIST, "line": 2950, "name": "all_reduce"},
            {"filename": LOGGER, "line": 83, "name": "wrapper"},
            {"filename": TRAIN, "line": line, "name": fn},
            {"filename": TRAIN, "line": 120, "name": "main"}]


def entry(seq: int, op: str = "all_reduce", state: str = "completed", pg=("0", "default_pg"), sizes=((1024,),),
          record: int | None = None, line: int = 57, backend: str = "nccl", dtype: str = "Float") -> dict:
    """One entry as the recorder writes it (ProcessGroupNCCL, format 2.x)."""
    return {
        "record_id": seq - 1 if record is None else record, "pg_id": int(pg[0]), "process_group": tuple(pg),
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"{backend}:{op}",
        "time_created_ns": 1_700_000_000_000_000_000 + seq * 1_000_000, "input_sizes": [list(s) for s in sizes],
        "input_dtypes": [dtype], "output_sizes": [list(s) for s in sizes], "output_dtypes": [dtype],
        "state": state, "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
        "retired": state == "completed", "timeout_ms": 600000, "is_p2p": False, "frames": frames(line),
    }


def dump(entries: list[dict], world: int = 4, groups: dict | None = None) -> dict:
    groups = groups or {"0": ("default_pg", list(range(world)))}
    return {
        "version": "2.10",
        "pg_config": {n: {"name": n, "desc": d, "ranks": str(r)} for n, (d, r) in groups.items()},
        "pg_status": {},
        "comm_lib_version": "2.28.9",
        "entries": entries,
    }


def job(last: dict[int, int], pending_state: str = "started", world: int = 4) -> dict[int, dict]:
    """Each rank's dump: collectives 1..last[rank] of one all_reduce a step, the last one pending
    on the ranks ahead."""
    hi = max(last.values())
    out = {}
    for r, n in last.items():
        es = [entry(s, state="completed" if (s < hi or n < hi) else pending_state) for s in range(1, n + 1)]
        out[r] = dump(es, world)
    return out


# --------------------------------------------------------------------------- the verdicts


def test_the_rank_behind_never_joined_and_the_others_wait_in_the_next_collective():
    dumps = job({0: 10, 1: 10, 2: 9, 3: 10})
    a = autopsy(dumps)
    assert a.kind == MISSING_RANK
    assert a.culprits == (2,) and a.waiting == (0, 1, 3)
    assert a.collective is not None and (a.collective.op, a.collective.seq) == ("all_reduce", 10)
    assert a.collective.group == "0" and a.collective.desc == "default_pg"
    assert a.culprit_last is not None and a.culprit_last.rank == 2 and a.culprit_last.seq == 9
    site = a.culprit_last.call_site()
    assert site is not None and (site.name, site.line) == ("train_step", 57)
    text = autopsy_text(a, "4 dumps at /tmp/nccl_trace_rank_<rank>")
    assert "Rank 2 never joined all_reduce #10 on process group 0 (default_pg): ranks 0, 1, 3 wait in it" in text
    assert "rank 2's last recorded collective: nccl all_reduce #9" in text
    assert "job/train.py:57 in train_step" in text
    assert "distributed_c10d.py" not in text  # torch's own frames are not the user's call
    d = autopsy_dict(a, {"prefix": "/tmp/nccl_trace_rank_"})
    assert d["culprit_ranks"] == [2] and d["waiting_ranks"] == [0, 1, 3]
    assert d["collective"]["type"] == "all_reduce" and d["collective"]["seq"] == 10
    assert d["collective"]["input_sizes"] == [[1024]]
    assert d["culprit_last_entry"]["stack"][0] == {"file": TRAIN, "line": 57, "function": "train_step"}


def test_ranks_at_the_same_number_in_different_collectives_are_a_desync():
    dumps = {r: dump([entry(s) for s in range(1, 5)] + [entry(5, "broadcast" if r == 2 else "all_reduce",
                                                              state="started")]) for r in range(4)}
    a = autopsy(dumps)
    assert a.kind == DESYNC and a.culprits == (2,) and a.waiting == (0, 1, 3)
    assert a.culprit_entry is not None and a.culprit_entry.op == "broadcast"
    assert a.summary.startswith("Desync at #5 on process group 0 (default_pg): ranks 0, 1, 3 called all_reduce")
    assert "rank 2 broadcast" in a.summary


def test_other_sizes_at_the_same_number_are_a_desync_too():
    dumps = {r: dump([entry(1), entry(2, state="started", sizes=((512,),) if r == 1 else ((1024,),))], world=2)
             for r in range(2)}
    a = autopsy(dumps)
    assert a.kind == DESYNC
    # One rank on each side: the dumps cannot say which is wrong, and the verdict says so.
    assert "which side is wrong is not told" in a.summary
    assert {a.culprits, a.waiting} == {(0,), (1,)}


def test_every_rank_in_the_same_collective_that_did_not_complete_is_a_stall_not_a_missing_rank():
    a = autopsy(job({0: 7, 1: 7, 2: 7, 3: 7}, pending_state="started"))
    assert a.kind == STALLED and a.culprits == () and a.waiting == (0, 1, 2, 3)
    assert "no rank is missing" in a.summary


def test_everything_completed_is_no_hang():
    a = autopsy(job({0: 7, 1: 7}, pending_state="completed", world=2))
    assert a.kind == NO_HANG and a.culprits == ()


def test_a_member_without_a_dump_is_named_as_the_likely_culprit():
    dumps = job({0: 10, 1: 10, 3: 10})
    a = autopsy(dumps)
    assert a.kind == MISSING_RANK and a.culprits == (2,) and a.no_dump == (2,)
    assert "rank 2 left no dump" in a.summary and a.summary.startswith("Ranks 0, 1, 3 wait in all_reduce #10")


def test_the_hang_is_found_in_the_subgroup_that_holds_it():
    groups = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("tp", [0, 1]), "2": ("tp", [2, 3])}
    dumps = {}
    for r in range(4):
        tp = ("1", "tp") if r < 2 else ("2", "tp")
        mine = {k: v for k, v in groups.items() if k == "0" or r in v[1]}
        es = [entry(1), entry(1, pg=tp, record=1, sizes=((64,),)), entry(2, pg=tp, record=2, sizes=((64,),))]
        if r != 3:
            es.append(entry(3, pg=tp, record=3, state="started", sizes=((64,),), line=88))
        dumps[r] = dump(es, groups=mine)
    a = autopsy(dumps)
    assert a.kind == MISSING_RANK and a.culprits == (3,) and a.waiting == (2,)
    assert a.collective is not None and a.collective.group == "2" and a.collective.seq == 3
    assert "on process group 2 (tp)" in a.summary


def test_a_rank_whose_buffer_holds_none_of_the_groups_collectives_reads_its_status():
    dumps = job({0: 10, 1: 10})
    dumps[1]["entries"] = []
    dumps[1]["pg_status"] = {"0": {"last_enqueued_collective": 10, "last_started_collective": 10,
                                   "last_completed_collective": 9}}
    a = autopsy(dumps)
    assert 1 not in a.culprits  # its status says it enqueued #10 like rank 0


# --------------------------------------------------------------------------- the dumps' shape


def test_gloo_dumps_have_their_process_groups_rebuilt_and_nccl_dumps_are_left_alone():
    gloo = {r: {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
                "pg_status": {}, "entries": [entry(1, backend="gloo")]} for r in (0,)}
    fixed, note = rebuild_pg_config(gloo)
    assert fixed[0]["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    assert note and "rebuilt" in note
    assert gloo[0]["pg_config"] == {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}  # the input is not changed
    nccl = job({0: 3, 1: 3}, world=2)
    same, none = rebuild_pg_config(nccl)
    assert none is None and same == nccl
    # The rebuilt default group keeps the rank that left no dump: it is named.
    a = autopsy(fixed)
    assert a.no_dump == (1,) and a.culprits == (1,)


def test_dump_problem_accepts_the_recorder_s_shape_only():
    assert dump_problem(dump([entry(1)])) is None
    assert dump_problem([1, 2]) == "it holds a list, not the recorder's dict"
    assert dump_problem({"version": "2.10", "pg_config": {}}) == "it has no 'entries'"
    assert "profiling_name" in dump_problem(dump([{"record_id": 0, "collective_seq_id": 1,
                                                   "process_group": ("0", "default_pg")}]))
    # PyTorch's analyzer eval()s a ranks string that parses to a string: only rank numbers pass.
    evil = dump([entry(1)])
    evil["pg_config"]["0"]["ranks"] = "'__import__(\"os\").system(\"true\")'"
    assert "not a list of rank numbers" in dump_problem(evil)
    evil["pg_config"]["0"]["ranks"] = "[0, 1]; print(1)"
    assert "not a list of rank numbers" in dump_problem(evil)


# --------------------------------------------------------------------------- the environment


def test_the_hint_names_the_dumps_prefix_when_the_environment_turns_the_recorder_on():
    env = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
           "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr/trace_"}
    hint = autopsy_hint(env)
    assert hint is not None and "`gputop autopsy /scratch/fr/trace_`" in hint and "TORCH_FR_BUFFER_SIZE=2000" in hint
    # The older names, and PyTorch's default prefix.
    old = autopsy_hint({"TORCH_NCCL_TRACE_BUFFER_SIZE": "100", "TORCH_NCCL_DUMP_ON_TIMEOUT": "true"})
    assert old is not None and "gputop autopsy /tmp/nccl_trace_rank_" in old
    assert dump_prefix({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/a/b_"}) == ("/a/b_", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    # On without dumping on a timeout: say what is missing.
    half = autopsy_hint({"TORCH_FR_BUFFER_SIZE": "2000"})
    assert half is not None and "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in half
    assert autopsy_hint({}) is None and autopsy_hint({"TORCH_FR_BUFFER_SIZE": "0"}) is None
    assert buffer_size({"TORCH_FR_BUFFER_SIZE": "x"}) == 0


# --------------------------------------------------------------------------- PyTorch's analyzer


def test_the_analyzer_s_finding_is_quoted_with_whether_it_agrees():
    dumps = job({0: 10, 1: 9}, world=2)
    said = {"torch_version": "2.13.0", "error": None,
            "log": ["Not all ranks joining collective, sequence number: 10", "missing ranks: {1}"],
            "collectives": [{"collective_seq_id": 10, "collective_name": "nccl:all_reduce", "pg_desc": "0:default_pg",
                             "pass_check": True, "missing_ranks": [1], "expected_ranks": [0, 1],
                             "mismatch_collectives": {}}]}
    a = autopsy(dumps, analyzer_view(said))
    assert a.agrees is True
    assert "agrees: Not all ranks joining collective, sequence number: 10" in autopsy_text(a, "x")
    other = copy.deepcopy(said)
    other["collectives"][0]["missing_ranks"] = [0]
    assert autopsy(dumps, analyzer_view(other)).agrees is False
    failed = autopsy(dumps, analyzer_view({"torch_version": "2.13.0", "error": "KeyError: ('0', 0)"}))
    assert failed.agrees is None and failed.culprits == (1,)
    assert "could not read these dumps: KeyError: ('0', 0)" in autopsy_text(failed, "x")


def _analyzer():
    pytest.importorskip("torch.distributed.flight_recorder")
    from gputop.sources.flight_recorder import run_analyzer

    return run_analyzer


def test_pytorch_s_analyzer_agrees_on_a_missing_rank_in_nccl_shaped_dumps():
    run_analyzer = _analyzer()
    dumps = job({0: 10, 1: 10, 2: 9, 3: 10})
    result = run_analyzer(dumps)
    assert result["error"] is None, result
    view = analyzer_view(result)
    assert view.finding is not None and view.finding.missing_ranks == (2,) and view.finding.seq == 10
    assert "Not all ranks joining collective, sequence number: 10" in view.finding.message
    a = autopsy(dumps, view)
    assert a.agrees is True
    assert dumps[0]["entries"][-1]["collective_seq_id"] == 10  # the analyzer got copies (it pops entries)


def test_pytorch_s_analyzer_names_the_desynced_rank_in_nccl_shaped_dumps():
    run_analyzer = _analyzer()
    dumps = {r: dump([entry(s) for s in range(1, 5)] + [entry(5, "broadcast" if r == 2 else "all_reduce",
                                                              state="started")]) for r in range(4)}
    view = analyzer_view(run_analyzer(dumps))
    assert view.finding is not None, view
    assert view.finding.culprits() == (2,)
    assert any("COLLECTIVE_TYPE_MISMATCH" in m for _, m in view.finding.mismatched)
    assert autopsy(dumps, view).agrees is True


def test_pytorch_s_analyzer_without_a_rank_s_dump_is_quoted_neither_agreeing_nor_differing():
    run_analyzer = _analyzer()
    dumps = job({0: 10, 1: 10, 3: 10})
    a = autopsy(dumps, analyzer_view(run_analyzer(dumps)))
    assert a.culprits == (2,) and a.agrees is None
    assert a.analyzer is not None and "missed FR dumps from ranks ({2})" in a.analyzer.remark
    assert "PyTorch's analyzer (torch " in autopsy_text(a, "x") and ") says: We cannot decide" in autopsy_text(a, "x")
