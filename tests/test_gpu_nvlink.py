"""NVLink rates on real GPUs (run on a machine with two NVLink-connected GPUs and torch:
``pytest -m gpu tests/test_gpu_nvlink.py``): while two ranks run a NCCL all_reduce loop, the
NVML source's samples, recorded and read back, show NVLink traffic both ways on both GPUs.

Skips, rather than fails, where the hardware or torch is not there. The ranks are separate
processes (this one never touches CUDA), with NVLink multicast (NVLS) off as on every shared
machine this project runs on.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time

import pytest

from gputop.analysis.ranks import topology
from gputop.model import Event, GpuSample
from gputop.record.reader import Reader
from gputop.record.writer import RecordWriter, SessionMeta
from gputop.sources.nvml import NvmlSource, NvmlUnavailable

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(90)]

LOOP_S = 8.0  # all_reduce traffic after NCCL is up
POLL_S = 0.5
WAIT_S = 60.0  # the ranks' start (NCCL init takes seconds) plus the loop, at most
MIB = 1024 * 1024

# One rank: NCCL up, then all_reduce of a 256 MiB fp32 tensor for LOOP_S seconds.
_RANK = r"""
import os, sys, time
import torch, torch.distributed as dist
rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", rank=rank, world_size=2)
x = torch.ones(64 * 1024 * 1024, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
dist.barrier()
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    dist.all_reduce(x)
    n += 1
    if n % 8 == 0:
        torch.cuda.synchronize()
torch.cuda.synchronize()
print(f"rank {rank}: {n} all_reduces", flush=True)
dist.destroy_process_group()
"""


def _nvlink_pair(batch: list[object]) -> tuple[int, int]:
    """The first two GPUs (NVML indices) joined by NVLink, from the first poll's topology event."""
    t = topology([e for e in batch if isinstance(e, Event) and e.source == "topology"])
    if t is None:
        pytest.skip("NVML gives no GPU topology here")
    gpus = sorted(t.nvlinks)
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            if (t.between(a, b) or ("",))[0] == "NVLink":
                return a, b
    pytest.skip(f"no two GPUs joined by NVLink (NVLinks up: {t.nvlinks or 'none'})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_nccl_all_reduce_shows_nvlink_traffic_on_both_gpus(tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    try:
        src = NvmlSource.open(interval=POLL_S)
    except NvmlUnavailable as exc:
        pytest.skip(f"no usable NVIDIA GPU: {exc}")
    procs: list[subprocess.Popen] = []
    path = tmp_path / "nvlink.gputop"
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="live", interval=POLL_S))
    try:
        first = src.poll()
        w.flush(first)
        pair = _nvlink_pair(first)
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
                   CUDA_DEVICE_ORDER="PCI_BUS_ID",  # CUDA's numbering as NVML's
                   CUDA_VISIBLE_DEVICES=",".join(map(str, pair)),
                   NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
        for rank in range(2):
            procs.append(subprocess.Popen([sys.executable, "-c", _RANK, str(LOOP_S)],
                                          env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        deadline = time.monotonic() + WAIT_S
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            w.flush(src.poll())
            time.sleep(POLL_S)
        w.flush(src.poll())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        out = [p.communicate()[0] for p in procs]
        w.finish()
        src.close()
    for p, text in zip(procs, out):
        assert p.returncode == 0, f"a rank failed (exit {p.returncode}):\n{text[-3000:]}"

    with Reader(path) as r:
        samples = r.gpu_samples(r.start_ts - 1, r.end_ts + 1)
    for g in pair:
        mine = [s for s in samples if isinstance(s, GpuSample) and s.index == g]
        tx = [s.nvlink_tx_bps for s in mine if s.nvlink_tx_bps is not None]
        rx = [s.nvlink_rx_bps for s in mine if s.nvlink_rx_bps is not None]
        seen = f"GPU {g}: tx MiB/s {[round(v / MIB) for v in tx]}, rx MiB/s {[round(v / MIB) for v in rx]}"
        assert tx and rx, f"no NVLink rate recorded: {seen}"
        assert max(tx) > 0 and max(rx) > 0, f"the all_reduce moved nothing over NVLink as NVML reads it: {seen}"
        assert min(tx + rx) >= 0, seen
