"""The house keeps its shape: the import-linter contracts in pyproject.toml hold, and the rooms
are where the README's Architecture section says they are."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "gputop"


def test_the_layer_contracts_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.fail("lint-imports is missing: pip install -e '.[test]' installs import-linter")
    proc = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_the_top_level_is_the_spine_only():
    modules = sorted(p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert modules == ["cli.py", "errors.py", "model.py", "pipeline.py", "redact.py", "session.py", "store.py",
                       "units.py"]


def test_one_place_assembles_a_session():
    # Pipelines and the sources' constructors appear only in the composition root (and in the
    # sources' own package, and the exporter's --attach all which adds samplers to a session).
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("gputop/session.py", "gputop/pipeline.py") or rel.startswith(("gputop/sources/", "gputop/workloads/")):
            continue
        text = path.read_text()
        for needle in ("Pipeline(", "NvmlSource.open(", "HostSource(", "PySpySource(", "FakeGpuSource(", "ReplaySource("):
            if needle in text:
                offenders.append(f"{rel}: {needle}")
    assert offenders == []


def test_no_argparse_below_the_commands():
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "gputop/cli.py" or rel.startswith(("gputop/commands/", "gputop/workloads/")):
            continue
        assert "import argparse" not in path.read_text(), rel


def test_the_window_is_the_one_reader_of_the_store_in_analysis():
    # analysis.window reads the store once a tick; every other analysis module works on what it
    # read, so no two readers of one tick can disagree about the evidence.
    import re

    queries = re.compile(r"\.(stack_window|gpu_window|util_window|proc_window|task_windows|host_window|"
                         r"gpu_processes|procs_latest|latest_proc|gpu_indices|events)\(")
    offenders = []
    for path in sorted((PKG / "analysis").glob("*.py")):
        if path.name == "window.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if queries.search(line) and "store" in line:
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert offenders == []
