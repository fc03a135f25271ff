"""A 2-rank gloo job on the CPU that hangs in a collective, with PyTorch's flight recorder on: the
dumps ``gputop autopsy`` reads, made by PyTorch itself.

    python bench/jobs/fr_hang.py --out DIR [--timeout 3] [--steps 4] [--shorten-paths]
    gputop autopsy DIR

The job, as its user would tell it: a linear model trained data-parallel by hand. Each step every
rank computes its gradients and all-reduces them, flattened into one buffer, then steps its
optimizer. The data is sharded unevenly: rank 1's shard is one batch shorter, so rank 1 leaves
its loop one step early and never calls the last all-reduce; rank 0 calls it and waits until
``init_process_group(timeout=...)`` runs out (3 s here).

The recorder is on (``TORCH_FR_BUFFER_SIZE=64``; ``TORCH_FR_DUMP_TEMP_FILE=DIR/nccl_trace_rank_``).
Gloo records every collective into it (``FlightRecorder<c10::Event>``, with the Python stack of
each call) but nothing dumps it on a timeout: dumping on timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``) is
ProcessGroupNCCL's watchdog (it writes each rank's buffer through ``DebugInfoWriter`` to
``PREFIX<rank>`` and tells the other ranks through the store to do the same), and ProcessGroupGloo
does not do it: with ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` and the dump file set, a gloo job that times
out writes no file (PyTorch 2.13, CPU build, tried). So this job does what that watchdog does, in Python: the rank
whose collective timed out writes ``torch._C._distributed_c10d._dump_fr_trace()`` (the recorder's
own pickle, the bytes the watchdog writes) to ``PREFIX<rank>`` and sets a key in the store; the
other rank, which is waiting for that key where it would otherwise go on to its next work, writes
its own. Each rank's dump is therefore PyTorch's, as written at the hang.

``--shorten-paths`` rewrites the file names in the dumps' stacks (this checkout's files relative
to it, the Python installation's as ``<env>/lib/pythonX.Y/...``) and pickles them again with the
same protocol: that is how the test fixtures were made (nothing of the machine in them). Without
it the dumps are left exactly as PyTorch wrote them.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pickle
import socket
import sys
import sysconfig
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
DUMP_KEY = "flight_recorder_dump"
BATCH = 16
FEATURES = 8


def dump_flight_recorder(rank: int) -> Path:
    """This rank's recorder buffer to ``$TORCH_FR_DUMP_TEMP_FILE<rank>``, as NCCL's watchdog writes it."""
    from torch._C._distributed_c10d import _dump_fr_trace

    path = Path(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank))
    path.write_bytes(_dump_fr_trace())
    return path


def shard(rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank r's batches: ``steps - r`` of them (the uneven split that makes rank 1 skip one)."""
    g = torch.Generator().manual_seed(rank)
    return [(torch.randn(BATCH, FEATURES, generator=g), torch.randn(BATCH, 4, generator=g))
            for _ in range(steps - rank)]


def all_reduce_gradients(model: torch.nn.Module) -> None:
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def train(rank: int, steps: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in shard(rank, steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        all_reduce_gradients(model)
        opt.step()


def run(rank: int, port: int, steps: int, timeout_s: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=timeout_s))
    store = dist.distributed_c10d._get_default_store()
    try:
        train(rank, steps)
    except RuntimeError as exc:  # gloo: "Timed out waiting 3000ms for recv operation to complete"
        print(f"rank {rank}: collective timed out: {str(exc).splitlines()[0][-100:]}", flush=True)
        print(f"rank {rank}: flight recorder dumped to {dump_flight_recorder(rank)}", flush=True)
        store.set(DUMP_KEY, str(rank))
        leave(store, rank, timeout_s)
    # Out of data: where this rank would go on to its next work, it waits for the dump signal
    # (NCCL's watchdog's, through the store), then writes its own buffer.
    store.wait([DUMP_KEY], datetime.timedelta(seconds=timeout_s + 60))
    print(f"rank {rank}: flight recorder dumped to {dump_flight_recorder(rank)}", flush=True)
    leave(store, rank, timeout_s)


def leave(store, rank: int, timeout_s: float) -> None:
    """Out without destructors: a process group whose collective timed out can abort in its own
    teardown ("terminate called without an active exception"), failing the run after its dump is
    written, one run in four. Rank 0 holds the store: it goes last, once the other has dumped."""
    store.set(f"dumped{rank}", "1")
    if rank == 0:
        store.wait(["dumped1"], datetime.timedelta(seconds=timeout_s + 60))
    os._exit(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shorten_paths(path: Path) -> None:
    """The dump at ``path`` with its stacks' file names shortened (see the module's docstring)."""
    roots = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")},
                   key=len, reverse=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"

    def short(name: str) -> str:
        p = Path(name)
        if p.is_absolute():
            try:
                return p.resolve().relative_to(ROOT).as_posix()
            except ValueError:
                pass
            for root in roots:
                if name.startswith(root.rstrip("/") + "/"):
                    rest = name[len(root.rstrip("/")) + 1:]
                    sub = "site-packages/" if "packages" in Path(root).name else ""
                    return f"<env>/lib/{version}/{sub}{rest}"
            return p.name
        return name

    dump = pickle.loads(path.read_bytes())  # our own job's file, just written
    for entry in dump.get("entries", ()):
        for frame in entry.get("frames", ()):
            frame["filename"] = short(frame["filename"])
    path.write_bytes(pickle.dumps(dump, protocol=2))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for the dumps (nccl_trace_rank_<rank>)")
    ap.add_argument("--steps", type=int, default=4, help="rank 0's batches (rank 1 has one fewer)")
    ap.add_argument("--timeout", type=float, default=3.0, help="init_process_group(timeout=...) in seconds")
    ap.add_argument("--buffer", type=int, default=64, help="TORCH_FR_BUFFER_SIZE")
    ap.add_argument("--shorten-paths", action="store_true", help="shorten the stacks' file names (fixtures)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(args.buffer)
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = str(args.out / "nccl_trace_rank_")
    mp.spawn(run, args=(free_port(), args.steps, args.timeout), nprocs=2)
    dumps = sorted(args.out.glob("nccl_trace_rank_*"))
    if args.shorten_paths:
        for p in dumps:
            shorten_paths(p)
    print(f"{len(dumps)} dumps in {args.out}: gputop autopsy {args.out}")
    return 0 if len(dumps) == 2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
