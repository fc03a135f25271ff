"""Which py-spy gputop runs: the installed package's own binary before a wrapper on PATH (pyenv's
shim runs bash and pyenv for every dump; a new user's advisor stayed silent for want of stacks)."""

from __future__ import annotations

import os
import stat

from gputop.sources import pyspy_binary as pb


def _exe(path, head: bytes) -> str:
    path.write_bytes(head + b"\0" * 16)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_native_binary_on_path_is_taken_before_a_wrapper_script(tmp_path, monkeypatch):
    shims, real = tmp_path / "shims", tmp_path / "bin"
    shims.mkdir()
    real.mkdir()
    shim = _exe(shims / "py-spy", b"#!/usr/bin/env bash\nexec pyenv exec py-spy \"$@\"\n")
    binary = _exe(real / "py-spy", b"\x7fELF")
    monkeypatch.delenv(pb.PYSPY_ENV, raising=False)
    monkeypatch.setattr(pb, "_installed", lambda exe: [])
    monkeypatch.setattr(pb, "_script_dirs", lambda exe: [])
    monkeypatch.setenv("PATH", os.pathsep.join([str(shims), str(real)]))
    assert pb.find_pyspy() == binary
    assert pb.is_native(binary) and not pb.is_native(shim)
    # Only the wrapper: it is still used (better than nothing), and doctor says what it costs.
    monkeypatch.setenv("PATH", str(shims))
    assert pb.find_pyspy() == shim


def test_the_installed_distribution_says_where_its_binary_is(tmp_path, monkeypatch):
    binary = _exe(tmp_path / "py-spy", b"\x7fELF")
    monkeypatch.delenv(pb.PYSPY_ENV, raising=False)
    monkeypatch.setattr(pb, "_installed", lambda exe: [binary])
    monkeypatch.setenv("PATH", "")
    assert pb.find_pyspy() == binary
    # The real lookup reads the package's RECORD: a name it lists, resolved to a file.
    found = pb._installed("py-spy")
    assert all(os.path.isabs(p) and os.path.basename(p) == "py-spy" for p in found)


def test_doctor_says_a_wrapper_costs_stacks(tmp_path, monkeypatch):
    from gputop.commands import doctor

    shim = _exe(tmp_path / "py-spy", b"#!/bin/sh\n")
    monkeypatch.setattr("gputop.sources.find_pyspy", lambda: shim)
    name, ok, detail = doctor.ptrace_checks()[0]
    assert name == "py-spy binary" and not ok and "wrapper script" in detail and pb.PYSPY_ENV in detail
