"""Copies of the bundled recording cut short (a copy interrupted, a full disk on the way): each
opens, replays and reports what survived, and says exactly what the cut took."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputop.record.reader import Reader
from gputop.report import collect, render_text

REC = Path(__file__).parent / "fixtures" / "recordings" / "h100-checkpoint-stall.gputop"


def cut(tmp_path: Path, kb: int) -> Path:
    p = tmp_path / f"cut{kb}.gputop"
    p.write_bytes(REC.read_bytes()[: kb * 1024])
    return p


@pytest.mark.parametrize("kb, polls, stacks", [(20, 0, 0), (50, 23, 0), (80, 23, 633)])
def test_a_cut_copy_reads_what_survived_and_names_what_did_not(tmp_path, kb, polls, stacks):
    with Reader(REC) as full:
        n_polls = len(full.gpu_samples(0, 2e10))
        n_stacks = len(full.stack_rows(0, 2e10))
    with Reader(cut(tmp_path, kb)) as r:
        assert r.damage and f"{kb * 1024:,} of {REC.stat().st_size:,} bytes" in r.damage
        assert len(r.gpu_samples(0, 2e10)) == polls <= n_polls
        assert len(r.stack_rows(0, 2e10)) == stacks <= n_stacks
        for table in r.lost_tables:  # every table the cut took is named
            assert table in r.damage
        if polls == 0:
            assert "gpu_samples" in r.lost_tables
        else:
            assert "gpu_samples" not in r.lost_tables
            s = collect(r)  # the report reads it too
            assert s.gpus and s.damage and "truncated" in render_text(s)


def test_a_table_whose_later_pages_were_cut_is_named_as_partly_lost(tmp_path):
    # At 80 KB the findings and frames tables keep their first page but not the rows after it:
    # the copy must not read as "no findings recorded" without saying so.
    with Reader(cut(tmp_path, 80)) as r:
        assert {"findings", "frames"} <= set(r.lost_tables), r.lost_tables
        assert "partly lost (rows past the cut): " in r.damage and "findings" in r.damage
