"""Mechanics of bench/soak_memory.py on a short simulated session."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load():
    spec = importlib.util.spec_from_file_location("soak_memory", ROOT / "bench" / "soak_memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_short_soak_writes_checkpoints_and_a_report(tmp_path, capsys):
    bench = load()
    assert bench.main(["--out", str(tmp_path), "--hours", "0.01", "--gpus", "1", "--checkpoints", "3"]) == 0
    data = json.loads((tmp_path / "soak_memory.json").read_text())
    rows = data["rows"]
    assert len(rows) == 3 and rows[-1]["sim_hours"] == 0.01
    # The store fills as the simulated session goes on, and the process has a real size.
    assert rows[0]["store_items"] < rows[-1]["store_items"]
    assert all(r["rss_mib"] > 10 and r["objects"] > 1000 for r in rows)
    md = (tmp_path / "soak_memory.md").read_text()
    assert md.count("\n| 0.0") == 3 and "Second half of the session" in md


def test_bad_arguments_are_refused(tmp_path):
    bench = load()
    try:
        bench.main(["--out", str(tmp_path), "--hours", "0"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--hours 0 accepted")
