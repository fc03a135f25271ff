"""`info`, `report` and `replay` of a cut recording contradicted each other: info counted 82 stack
samples while its DAMAGED line said the stacks were lost; the DAMAGED line said findings were
"partly lost" while the report said they were lost; info counted 82 stacks where the report read
80 (two past the readable end). One place (``Reader.lost``, the reader's settled lost tables and
its readable span) now decides what survived, and every reader says it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputop.cli import main
from gputop.record.reader import LOST_FINDINGS, Reader
from gputop.report import collect, render_text

REC = Path(__file__).parent / "fixtures" / "recordings" / "h100-checkpoint-stall.gputop"
CUTS_KB = (32, 50, 64, 80, 96, 112)


def cut(tmp_path: Path, kb: int) -> Path:
    p = tmp_path / f"cut{kb}.gputop"
    p.write_bytes(REC.read_bytes()[: kb * 1024])
    return p


def info_json(path: Path, capsys) -> dict:
    assert main(["info", "--json", str(path)]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kb", CUTS_KB)
def test_info_and_report_agree_on_what_survived(tmp_path, capsys, kb):
    path = cut(tmp_path, kb)
    d = info_json(path, capsys)
    with Reader(path) as r:
        readable = r.stack_samples(float("-inf"), r.end_ts)
        s = collect(r)
        # "partly lost" only where something of it can be read; else it is lost, said as such.
        for table in r.partly_tables:
            assert r._rows(f'SELECT 1 FROM "{table}" LIMIT 1'), table
        if "findings" in r.partly_tables:
            assert r.finding_rows()
        if r.lost("stacks") == "lost":
            assert not readable
    # info counts the stack samples a reader can use, up to where the readable data ends.
    assert d["counts"]["stack_samples"] == len(readable)
    assert d["stacks_lost"] == r.lost("stacks")
    # Findings: lost in info exactly when lost in the report; the report then judges the samples
    # that survived again, as a replay does, and says why.
    assert d["findings_lost"] == s.findings_lost
    text = " ".join(render_text(s, 100).split())
    if s.findings_lost:
        assert s.judged_again and "judged again from the recorded samples" in text
        assert "the file's findings were lost in the cut" in text
        assert "report or replay judges the samples that survived again" in LOST_FINDINGS
    # The DAMAGED line names no table as partly lost that info or the report call lost.
    if d["damage"] and "partly lost" in d["damage"]:
        partly = d["damage"].split("partly lost (rows past the cut): ", 1)[1].split(":")[0]
        assert not (s.findings_lost and not s.findings and "findings" in partly)


def test_a_cut_that_took_the_stacks_counts_none_and_says_so(tmp_path, capsys):
    # At 64 KB the samples' rows survived but their threads did not: none can be read.
    path = cut(tmp_path, 64)
    d = info_json(path, capsys)
    with Reader(path) as r:
        assert r.lost("stacks") == "lost"
        assert len(r.stack_rows(float("-inf"), r.end_ts)) > 0  # the rows are there, unusable
    assert d["counts"]["stack_samples"] == 0
    assert main(["info", str(path)]) == 0
    assert "0 stack (lost in the cut)" in capsys.readouterr().out


def test_replaying_a_cut_that_took_the_stacks_says_so_instead_of_collecting_forever(tmp_path):
    # A new user's replay of such a cut showed "Collecting evidence: 0 of ~20 stacks" to the end.
    from gputop.present.advice import collecting_text
    from gputop.model import Evidence
    from gputop.session import open_replay

    session = open_replay(cut(tmp_path, 64), advisor=False)
    assert session.attach_error is not None and "stacks were lost" in session.attach_error
    # what the panes pass on: stacks not readable, so nothing is said to be collected for them
    ev = Evidence(stacks=0, stacks_needed=20, gpu_s=30.0, gpu_needed_s=10.0)
    assert collecting_text(ev, stacks_readable=session.attach_error is None) is None
    assert open_replay(REC, advisor=False).attach_error is None
