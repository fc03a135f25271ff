"""`gputop autopsy /nonexistent` said "no flight-recorder dumps at /nonexistent<rank>", and with
--json printed its errors as plain text. A path that is not there is said plainly; --json gets
its error as JSON on standard output, with the same non-zero status."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")  # autopsy needs PyTorch's analyzer before it looks at any file

from gputop.cli import main  # noqa: E402


def test_a_missing_path_is_said_plainly(tmp_path, capsys):
    missing = tmp_path / "nonexistent"
    assert main(["autopsy", str(missing)]) == 2  # bad input, as for every command (newuser6)
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == (f"gputop autopsy: error: {missing}: no such file or directory, and no flight-recorder dump "
                           "is named after it (nonexistent0, nonexistent1, …)")
    assert "<rank>" not in err


def test_json_errors_are_json_with_the_same_status(tmp_path, capsys):
    assert main(["autopsy", "--json", str(tmp_path)]) == 2  # a directory with no dumps: bad input
    out, err = capsys.readouterr()
    d = json.loads(out)
    assert d["exit_status"] == 2 and "no flight-recorder dumps in" in d["error"]
    assert err.strip() == f"gputop autopsy: error: {d['error']}"
