"""Copies of the bundled recording cut short (a copy interrupted, a full disk on the way): each
opens, replays and reports what survived, and says exactly what the cut took."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputop.cli import main
from gputop.errors import UserError
from gputop.record.reader import Reader
from gputop.report import collect, render_html, render_text, summary_dict

REC = Path(__file__).parent / "fixtures" / "recordings" / "h100-checkpoint-stall.gputop"


def cut(tmp_path: Path, kb: int) -> Path:
    p = tmp_path / f"cut{kb}.gputop"
    p.write_bytes(REC.read_bytes()[: kb * 1024])
    return p


@pytest.mark.parametrize("kb, polls, stacks", [(32, 23, 0), (50, 23, 0), (80, 23, 633)])
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
        assert "gpu_samples" not in r.lost_tables
        s = collect(r)  # the report reads it too
        assert s.gpus and s.damage and "truncated" in render_text(s)


def test_a_table_whose_later_pages_were_cut_is_named_as_lost_when_none_of_its_rows_survived(tmp_path):
    # At 80 KB the findings and frames tables keep their first page but none of the rows under
    # it: the copy must not read as "no findings recorded" without saying so, and says "lost", not
    # "partly lost" (which info and the report, reading no row, contradicted).
    with Reader(cut(tmp_path, 80)) as r:
        assert {"findings", "frames"} <= set(r.lost_tables), r.lost_tables
        assert not r.finding_rows()
        assert r.lost("findings") == "lost" and "partly lost" not in r.damage
        assert "lost with the cut: " in r.damage and "findings" in r.damage


# --------------------------------------------------------------------------- nothing survived


@pytest.mark.parametrize("kb", [4, 20])  # the header alone; the header and the session's row
def test_a_cut_that_left_nothing_readable_is_refused_not_read_as_an_empty_recording(tmp_path, kb):
    with pytest.raises(UserError) as e:
        Reader(cut(tmp_path, kb))
    msg = str(e.value)
    assert f"truncated ({kb * 1024:,} of {REC.stat().st_size:,} bytes)" in msg and "nothing readable" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("argv", [
    ["info"], ["info", "--json"], ["info", "--check"],
    ["report"], ["report", "--json"], ["report", "--html"],
    ["report", "-o", "r.html"], ["report", "-o", "r.json"], ["report", "--text", "-o", "r.txt"],
    ["report", "--json", "-o", "-"],
    ["replay"],  # said before the UI starts (no terminal needed to see it)
])
def test_every_command_says_nothing_survived_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv):
    p = cut(tmp_path, 4)
    monkeypatch.chdir(tmp_path)
    before = sorted(x.name for x in tmp_path.iterdir())
    assert main([argv[0], str(p), *argv[1:]]) != 0
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert cap.out == ""
    assert err.startswith(f"gputop {argv[0]}: error:") and len(err.splitlines()) == 1 and "nothing readable survived" in err, err
    assert sorted(x.name for x in tmp_path.iterdir()) == before  # no report file, no -wal left
    assert "1970" not in err


# --------------------------------------------------------------------------- some tables survived


def test_findings_lost_in_the_cut_are_not_reported_as_none_recorded(tmp_path):
    # At 50 KB the samples survive and the findings table (and the stacks) are gone.
    with Reader(cut(tmp_path, 50)) as r:
        assert "findings" in r.lost_tables
        s = collect(r)
    text = render_text(s, 100)
    # The samples that survived are judged again, as a replay judges them, and the report says why.
    flat = " ".join(text.split())
    assert "findings: none recorded" not in text and "the file's findings were lost in the cut" in flat
    assert s.judged_again
    assert "(stack samples lost in the cut: unattributed)" in text and "no stack samples" not in text
    # Judged again without its stacks: not a bare "none" (a clean bill for a job whose warning went
    # with the cut), but what the surviving samples can and cannot show.
    assert not s.findings and s.stacks_lost
    assert "findings: none the surviving samples can show" in flat and "\nfindings: none\n" not in text + "\n"
    assert "None the surviving samples can show" in render_html(s)
    page = render_html(s)
    assert "None recorded." not in page and "the file&#x27;s findings were lost in the cut" in page
    assert "No stack samples were recorded" not in page and "stack samples were lost in the cut" in page
    d = summary_dict(s)
    assert d["findings_lost"] is True and d["findings"] == [] and "findings" in d["lost_tables"]


def test_a_whole_recording_says_its_findings_were_recorded(tmp_path):
    with Reader(REC) as r:
        s = collect(r)
    d = summary_dict(s)
    assert d["findings_lost"] is False and d["lost_tables"] == [] and d["findings"]
    assert "lost in the cut" not in render_text(s, 100) + render_html(s)


def test_info_of_a_cut_copy_says_its_findings_were_lost(tmp_path, capsys):
    assert main(["info", str(cut(tmp_path, 50))]) == 0
    out = capsys.readouterr().out
    assert "findings    the recorded ones were lost in the cut" in out
    assert main(["info", "--json", str(cut(tmp_path, 50))]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["findings_lost"] is True


def test_a_fifo_named_like_a_recording_is_refused_at_once_not_read_forever(tmp_path):
    import os
    import subprocess
    import sys

    fifo = tmp_path / "fifo.gputop"
    os.mkfifo(fifo)
    for cmd in (["info", str(fifo)], ["report", str(fifo)]):
        res = subprocess.run([sys.executable, "-m", "gputop", *cmd], capture_output=True, text=True, timeout=30)
        assert res.returncode != 0 and "not a regular file" in res.stderr, (cmd, res.stderr)
        assert "Traceback" not in res.stderr
