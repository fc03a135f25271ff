"""FP64 readings on a real GPU (run on a machine with an NVIDIA GPU with GPM, Hopper or newer, and
torch: ``pytest -m gpu tests/test_gpu_fp64.py``): while a float64 matmul loop runs, the NVML
source's GPM readings show its FP64 tensor cores (or FP64 pipes) busy, and `float64-math` names it;
a bf16 loop reads none. Skips where the hardware, GPM or torch is not there. The loops run in
separate processes (this one never touches CUDA)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import pytest

from gputop.sources.nvml import NvmlSource, NvmlUnavailable

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

LOOP_S = 10.0
_LOOP = r"""
import sys, time, torch
dtype = {"float64": torch.float64, "bfloat16": torch.bfloat16}[sys.argv[1]]
a = torch.randn(4096, 4096, device="cuda", dtype=dtype)
b = torch.randn(4096, 4096, device="cuda", dtype=dtype)
print("ready", flush=True)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    for _ in range(8):
        c = a @ b
    torch.cuda.synchronize()
"""


def _readings(dtype: str) -> list:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch")
    try:
        src = NvmlSource.open(interval=0.5)
    except NvmlUnavailable as exc:
        pytest.skip(str(exc))
    p = subprocess.Popen([sys.executable, "-c", _LOOP, dtype, str(LOOP_S)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        time.sleep(2.0)
        out = []
        end = time.time() + LOOP_S - 3.0
        while time.time() < end:
            out += [s for s in src.poll() if type(s).__name__ == "GpuSample" and s.index == 0]
            time.sleep(0.5)
        return out
    finally:
        p.kill()
        p.wait()
        src.close()


def test_a_float64_matmul_loop_reads_fp64_work_and_a_bf16_one_none():
    f64 = [s for s in _readings("float64") if s.tensor_active is not None]
    if not f64:
        pytest.skip("no GPM readings on this GPU")
    fp64 = max((s.dfma_active or 0.0) + (s.fp64_active or 0.0) for s in f64)
    assert fp64 >= 20.0, [(s.dfma_active, s.fp64_active, s.tensor_active) for s in f64]
    bf16 = [s for s in _readings("bfloat16") if s.tensor_active is not None]
    assert max((s.dfma_active or 0.0) + (s.fp64_active or 0.0) for s in bf16) < 5.0
