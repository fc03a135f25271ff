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


def _row(h, rss, **series):
    return {"sim_hours": h, "rss_mib": rss, "series": series}


def test_says_where_rss_levels_off_and_when_the_rings_are_full():
    bench = load()
    rows = [_row(0.5, 45.4, gpu0=900, host=900), _row(1.0, 47.9, gpu0=1800, host=1800),
            _row(2.0, 52.8, gpu0=3600, host=3600), _row(3.0, 53.3, gpu0=3600, host=3600),
            _row(4.0, 52.9, gpu0=3600, host=3600)]
    # Growth until the rings are full, then within the tolerance: flat from 2 h.
    assert bench.levels_off_at(rows)["sim_hours"] == 2.0
    assert bench.levels_off_at(rows, tolerance=0.1)["sim_hours"] == 3.0
    # Still rising at the last checkpoint: no level to report.
    assert bench.levels_off_at(rows[:2]) is None
    caps = {"gpu0": 3600, "host": 3600}
    assert bench.rings_full_at(rows, caps)["sim_hours"] == 2.0
    assert bench.rings_full_at(rows[:2], caps) is None
    # GPU and host rings fill a sample a poll; the 200 ms utilisation points with time.
    fill = bench.fill_seconds({"gpu0": 3600, "host": 3600, "util0": 4500}, interval=2.0)
    assert fill == {"gpu0": 7200.0, "host": 7200.0, "util0": 900.0}


def test_report_names_the_level_and_the_fill_time(tmp_path):
    bench = load()
    assert bench.main(["--out", str(tmp_path), "--hours", "0.02", "--gpus", "1", "--checkpoints", "3",
                       "--interval", "1"]) == 0
    data = json.loads((tmp_path / "soak_memory.json").read_text())
    assert data["params"]["interval"] == 1.0
    assert data["expected_full_h"] == 1.0  # 3600 polls of 1 s
    md = (tmp_path / "soak_memory.md").read_text()
    assert "## Where it levels off" in md and "they fill after 3600 polls, 1 h at 1 s" in md
    assert "Rings full: not within this run" in md
