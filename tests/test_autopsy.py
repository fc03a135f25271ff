"""`gputop autopsy` on real flight-recorder dumps made by PyTorch (2.13, CPU build, gloo):
``tests/fixtures/flight_recorder/gloo_skip/`` is what ``bench/jobs/fr_hang.py --shorten-paths``
wrote, a 2-rank job whose rank 1 has one batch fewer and never calls the last gradient
all-reduce (collective #4); rank 0 timed out in it. Also: where the dumps are looked for, the
files refused (truncated, foreign, a pickle that names code, a bad shape) in one line, and the
command without torch."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gputop.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "flight_recorder" / "gloo_skip"
PY = sys.executable

pytest.importorskip("torch.distributed.flight_recorder")


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_"))}
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def gputop(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [PY, "-c", code, *args] if code else [PY, "-m", "gputop", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env(), cwd=str(ROOT),
                          stdin=subprocess.DEVNULL)


def one_line_error(rc: int, err: str, out: str, *words: str) -> str:
    assert rc != 0
    assert "Traceback" not in out + err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gputop autopsy: error: "), err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(autouse=True)
def _no_recorder_env(monkeypatch):
    for k in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_BUFFER_SIZE"):
        monkeypatch.delenv(k, raising=False)


def test_the_fixture_is_pytorch_s_own_dump_with_nothing_of_the_machine_in_it():
    names = sorted(p.name for p in FIXTURE.iterdir())
    assert names == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    for p in FIXTURE.iterdir():
        raw = p.read_bytes()
        assert raw.startswith(b"\x80\x02") and len(raw) < 4096
        d = pickle.loads(raw)
        assert d["version"] == "2.10" and d["entries"][0]["profiling_name"] == "gloo:all_reduce"
        files = {f["filename"] for e in d["entries"] for f in e["frames"]}
        assert "bench/jobs/fr_hang.py" in files
        assert all(f.startswith(("<env>/lib/", "bench/", "<string>")) for f in files), files


def test_autopsy_json_names_rank_1_and_the_all_reduce_it_never_joined():
    """End to end, as a script runs it: a fresh interpreter, PyTorch's analyzer included."""
    proc = gputop("autopsy", str(FIXTURE), "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # the analyzer's log is caught, not printed
    d = json.loads(proc.stdout)
    assert d["kind"] == "missing-rank"
    assert d["culprit_ranks"] == [1] and d["waiting_ranks"] == [0]
    c = d["collective"]
    assert (c["backend"], c["type"], c["seq"], c["process_group"], c["pg_desc"]) == ("gloo", "all_reduce", 4, "0",
                                                                                    "default_pg")
    assert c["input_sizes"] == [[36]] and c["dtypes"] == ["Float"]
    assert c["stack"][0] == {"file": "bench/jobs/fr_hang.py", "line": c["stack"][0]["line"],
                             "function": "all_reduce_gradients"}
    last = d["culprit_last_entry"]
    assert last["rank"] == 1 and last["seq"] == 3 and last["type"] == "all_reduce"
    assert [f["function"] for f in last["stack"][:3]] == ["all_reduce_gradients", "train", "run"]
    a = d["analyzer"]
    assert a["error"] is None and a["agrees"] is True
    assert a["finding"]["missing_ranks"] == [1] and a["finding"]["seq"] == 4
    assert a["finding"]["message"] == "Not all ranks joining collective, sequence number: 4"
    assert any("rebuilt" in n for n in d["notes"])  # gloo's unnamed process-group table
    assert d["source"]["files"] == {"0": str(FIXTURE / "nccl_trace_rank_0"), "1": str(FIXTURE / "nccl_trace_rank_1")}


def test_autopsy_text_says_who_did_not_join_where_the_other_waits_and_the_culprit_s_last_call(capsys):
    assert main(["autopsy", str(FIXTURE)]) == 0
    out = capsys.readouterr().out
    assert "Rank 1 never joined all_reduce #4 on process group 0 (default_pg): rank 0 waits in it" in out
    assert "rank 0 called it at jobs/fr_hang.py:" in out and " in all_reduce_gradients:" in out
    assert "rank 1's last recorded collective: gloo all_reduce #3" in out
    assert "PyTorch's analyzer (torch " in out and ") agrees: Not all ranks joining collective, sequence number: 4" in out


@pytest.mark.slow
def test_the_bench_job_s_fresh_dumps_from_the_installed_torch_give_the_same_verdict(tmp_path):
    """The fixtures' maker run again with the torch installed here: its dumps (left as PyTorch
    wrote them) still read, and rank 1 is still the one that never joined the last all-reduce."""
    out = tmp_path / "dumps"
    job = subprocess.run([PY, str(ROOT / "bench" / "jobs" / "fr_hang.py"), "--out", str(out), "--steps", "3"],
                         capture_output=True, text=True, timeout=300, env=env(), cwd=str(tmp_path))
    assert job.returncode == 0, job.stdout + job.stderr
    assert sorted(p.name for p in out.iterdir()) == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    proc = gputop("autopsy", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["culprit_ranks"] == [1] and d["waiting_ranks"] == [0]
    assert (d["collective"]["type"], d["collective"]["seq"]) == ("all_reduce", 3)
    assert d["culprit_last_entry"]["seq"] == 2
    assert d["analyzer"]["agrees"] is True, d["analyzer"]


@pytest.mark.parametrize("how", ["prefix", "one dump", "variable", "older variable"])
def test_the_dumps_are_found_by_prefix_by_one_of_them_and_by_the_recorder_s_variables(how, capsys, monkeypatch):
    prefix = str(FIXTURE / "nccl_trace_rank_")
    args = {"prefix": [prefix], "one dump": [prefix + "1"], "variable": [], "older variable": []}[how]
    if how == "variable":
        monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", prefix)
        monkeypatch.setenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/nonexistent/x_")  # the newer name wins
    if how == "older variable":
        monkeypatch.setenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", prefix)
    assert main(["autopsy", *args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["culprit_ranks"] == [1] and sorted(d["source"]["files"]) == ["0", "1"]
    assert d["source"]["named_by"] == {"prefix": "the argument", "one dump": "the argument",
                                       "variable": "TORCH_FR_DUMP_TEMP_FILE",
                                       "older variable": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}[how]


def test_the_culprit_s_missing_dump_is_named(tmp_path, capsys):
    shutil.copy(FIXTURE / "nccl_trace_rank_0", tmp_path / "nccl_trace_rank_0")
    assert main(["autopsy", str(tmp_path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["culprit_ranks"] == [1] and d["ranks_without_dump"] == [1] and d["ranks"] == [0]
    assert "rank 1 left no dump" in d["summary"]


def _refused(capsys, *args: str) -> str:
    rc = main(["autopsy", *args])
    cap = capsys.readouterr()
    return one_line_error(rc, cap.err, cap.out)


def test_no_dumps_is_one_line_naming_where_it_looked(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(tmp_path / "trace_"))
    line = _refused(capsys)
    assert f"no flight-recorder dumps at {tmp_path / 'trace_'}<rank>" in line
    assert "in " + str(tmp_path) in _refused(capsys, str(tmp_path))
    assert "no such file or directory" in _refused(capsys, str(tmp_path / "no" / "where_"))


def test_a_truncated_dump_is_one_line_and_exit_1(tmp_path, capsys):
    raw = (FIXTURE / "nccl_trace_rank_1").read_bytes()
    shutil.copy(FIXTURE / "nccl_trace_rank_0", tmp_path / "nccl_trace_rank_0")
    (tmp_path / "nccl_trace_rank_1").write_bytes(raw[: len(raw) // 2])
    rc = main(["autopsy", str(tmp_path)])
    cap = capsys.readouterr()
    line = one_line_error(rc, cap.err, cap.out, "nccl_trace_rank_1", "cut short")
    assert rc == 1, line
    (tmp_path / "nccl_trace_rank_1").write_bytes(b"")
    assert "is empty" in _refused(capsys, str(tmp_path))


def test_every_cut_of_a_dump_is_refused_as_cut_short(tmp_path):
    from gputop.sources import DumpError, load_dump

    raw = (FIXTURE / "nccl_trace_rank_1").read_bytes()
    path = tmp_path / "nccl_trace_rank_1"
    for n in range(1, len(raw)):
        path.write_bytes(raw[:n])
        with pytest.raises(DumpError, match="cut short|not a pickle"):
            load_dump(path)
    path.write_bytes(raw + b"\x00")
    with pytest.raises(DumpError, match="data follows its pickle"):
        load_dump(path)


def test_foreign_files_are_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "nccl_trace_rank_0").write_text('{"entries": []}\n')
    assert "not a pickle" in _refused(capsys, str(tmp_path))
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}}))
    assert "has no 'entries'" in _refused(capsys, str(tmp_path))
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps([1, 2, 3]))
    assert "holds a list" in _refused(capsys, str(tmp_path))


class _Runs:
    """A pickle that runs a command when loaded: what a planted file would hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_names_code_is_refused_before_it_runs(tmp_path, capsys):
    marker = tmp_path / "ran"
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [_Runs(marker)],
                                                               "pg_config": {}}))
    line = _refused(capsys, str(tmp_path))
    assert "names posix.system" in line or "names os.system" in line, line
    assert not marker.exists()


def test_a_ranks_string_the_analyzer_would_eval_is_refused_before_it(tmp_path, capsys):
    marker = tmp_path / "ran"
    d = pickle.loads((FIXTURE / "nccl_trace_rank_0").read_bytes())
    d["pg_config"] = {"0": {"name": "0", "desc": "default_pg",
                            "ranks": repr(f"__import__('os').system('touch {marker}')")}}
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(d, protocol=2))
    assert "not a list of rank numbers" in _refused(capsys, str(tmp_path))
    assert not marker.exists()


def test_a_directory_with_several_name_patterns_asks_for_the_prefix(tmp_path, capsys):
    for name in ("a_trace_0", "b_dump_1"):
        shutil.copy(FIXTURE / "nccl_trace_rank_0", tmp_path / name)
    line = _refused(capsys, str(tmp_path))
    assert "several names" in line and "a_trace_<rank>" in line and "b_dump_<rank>" in line


def test_without_torch_it_says_so_in_one_line_and_exits_2():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from gputop.cli import main\n"
            "sys.argv[0] = 'gputop'\n"
            "raise SystemExit(main(['autopsy', *sys.argv[1:]]))")
    proc = gputop(str(FIXTURE), code=code)
    assert proc.returncode == 2, proc.stderr
    one_line_error(proc.returncode, proc.stderr, proc.stdout, "needs torch importable", "pip install torch")
    assert proc.stdout == ""


def test_a_directory_of_files_that_merely_end_in_a_number_has_no_dumps(tmp_path, capsys):
    """A directory with no dumps but a file called ``sums2`` was read as a broken dump (exit 1):
    it holds no dumps (bad input, exit 2), as an empty directory does."""
    (tmp_path / "sums2").write_text("1 2 3\n")
    rc = main(["autopsy", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and f"no flight-recorder dumps in {tmp_path}" in err and "sums2" in err
