"""Scenarios whose data is already in memory: the bottleneck is in the training step itself.

Sizes are picked per device: on CUDA large enough to show the effect on an H100 while staying
far under 20 GiB of GPU memory; on CPU tiny, so a smoke test runs in seconds.
"""

from __future__ import annotations

import os
import tempfile
import time

import torch

from . import models
from .data import disk_tmpdir
from .runtime import Run

CLASSES_CUDA = 1000
CLASSES_CPU = 10


def _cpu_model_and_pool(run: Run):
    # The CPU baseline shared with the loader scenarios' CPU variants (3x32x32 inputs, batch 16),
    # so that "starved vs healthy" on CPU compares the data path alone.
    model = models.mlp(3 * 32 * 32, 128, 3, CLASSES_CPU)
    return model, models.batch_pool(4, 16, 3 * 32 * 32, CLASSES_CPU, run.device)


def healthy(run: Run) -> None:
    if run.is_cuda:
        # ~6.6 TFLOP per step in bf16: each step is ~10 ms of tensor-core work; ~4 GiB in all.
        model = models.mlp(4096, 4096, 8, CLASSES_CUDA).to(run.device)
        pool = models.batch_pool(4, 8192, 4096, CLASSES_CUDA, run.device)
    else:
        model, pool = _cpu_model_and_pool(run)
    opt = models.adamw(model, run.device)

    def step(i: int) -> None:
        x, y = pool[i % len(pool)]
        models.train_step(model, opt, x, y, amp=run.is_cuda)

    run.warm_up(step, 0)
    run.ready(batch=pool[0][0].shape[0], amp=run.is_cuda)
    run.loop(step)


def host_sync(run: Run) -> None:
    if run.is_cuda:
        # A step of ~1 ms of GPU work: comparable to the time the CPU needs to launch it, so
        # losing the ability to queue ahead costs a large share of the GPU's time.
        model = models.mlp(1024, 1024, 8, CLASSES_CUDA).to(run.device)
        pool = models.batch_pool(4, 8192, 1024, CLASSES_CUDA, run.device)
    else:
        model, pool = _cpu_model_and_pool(run)
    opt = models.adamw(model, run.device)
    history: list[float] = []

    def step(i: int) -> None:
        x, y = pool[i % len(pool)]
        loss, logits, per_sample = models.train_step(model, opt, x, y, amp=run.is_cuda)
        with run.phase("sync"):
            # The everyday logging that forces a sync: a scalar, a per-sample list, accuracy, and
            # an explicit synchronize "for accurate timing".
            history.append(loss.item())
            worst = max(per_sample.detach().cpu().tolist())
            acc = (logits.argmax(1).cpu() == y.cpu()).float().mean().item()
            if run.is_cuda:
                torch.cuda.synchronize()
        if len(history) > 1000:
            del history[:500]
        run.extra["last_worst_loss"] = round(worst, 3)
        run.extra["last_acc"] = round(acc, 3)

    run.warm_up(step, 0)
    run.ready(batch=pool[0][0].shape[0], amp=run.is_cuda)
    run.loop(step)


def pageable_h2d(run: Run) -> None:
    # CUDA only. 4096 x 16384 fp32 = 256 MiB per batch; two pageable host buffers, alternately
    # copied; the model is small (~3 ms of bf16 work) so the copy dominates the step.
    batch, dim, classes = 4096, 16384, CLASSES_CUDA
    model = models.mlp(dim, 2048, 4, classes).to(run.device)
    opt = models.adamw(model, run.device)
    g = torch.Generator().manual_seed(0)
    host = [torch.randn(batch, dim, generator=g) for _ in range(2)]  # not pinned: the point
    labels = torch.randint(0, classes, (batch,), generator=g).to(run.device)

    def step(i: int) -> None:
        with run.phase("h2d"):
            x = host[i % 2].to(run.device)
        models.train_step(model, opt, x, labels, amp=True)

    run.warm_up(step, 0)
    run.ready(batch=batch, copy_mib=batch * dim * 4 // 2**20, pinned=False)
    run.loop(step)


def fp32_no_tensor_cores(run: Run) -> None:
    # Everything a user does to end up on the fp32 pipes: no autocast, TF32 explicitly off.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    # CUDA only. 8192-wide fp32 matmuls, ~13 TFLOP per step: a few steps/s; ~6 GiB in all.
    model = models.mlp(8192, 8192, 4, CLASSES_CUDA).to(run.device)
    pool = models.batch_pool(2, 8192, 8192, CLASSES_CUDA, run.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step(i: int) -> None:
        x, y = pool[i % len(pool)]
        models.train_step(model, opt, x, y, amp=False)

    run.warm_up(step, 0)
    run.ready(batch=pool[0][0].shape[0], amp=False, tf32=False)
    run.loop(step)


def launch_bound(run: Run) -> None:
    # 12 blocks of 64-wide layers at batch 4 plus a per-parameter (for-loop) optimizer: several
    # hundred kernels of a few microseconds each per step; the CPU's launch rate is the limit.
    model = models.tiny_net(64, 12, 10).to(run.device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    pool = models.batch_pool(4, 4, 64, 10, run.device)

    def step(i: int) -> None:
        x, y = pool[i % len(pool)]
        models.train_step(model, opt, x, y, amp=False)

    run.warm_up(step, 0)
    run.ready(batch=4)
    run.loop(step)


# Seconds of training between two checkpoints: short enough that a 15 s window holds several.
CHECKPOINT_EVERY_S = {"cuda": 3.0, "cpu": 0.5}


def checkpoint_stall(run: Run) -> None:
    if run.is_cuda:
        # ~243 M parameters: weights + SGD momentum = ~1.9 GiB written by every torch.save.
        model = models.mlp(4096, 8192, 4, CLASSES_CUDA).to(run.device)
        pool = models.batch_pool(2, 2048, 4096, CLASSES_CUDA, run.device)
    else:
        model = models.mlp(3 * 32 * 32, 512, 4, CLASSES_CPU)  # ~20 MiB of state
        pool = models.batch_pool(2, 16, 3 * 32 * 32, CLASSES_CPU, run.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    every = CHECKPOINT_EVERY_S[run.device.type]
    with tempfile.TemporaryDirectory(prefix="gputop-ckpt-", dir=disk_tmpdir(run.tmpdir)) as tmp:
        path = os.path.join(tmp, "checkpoint.pt")
        state_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 2
        last_save = time.monotonic()
        saves = 0

        def step(i: int) -> None:
            nonlocal last_save, saves
            x, y = pool[i % len(pool)]
            models.train_step(model, opt, x, y, amp=run.is_cuda)
            if time.monotonic() - last_save >= every:
                with run.phase("ckpt"):
                    # Synchronous: copies every tensor to the host, then writes, while the GPU idles.
                    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": i}, path)
                saves += 1
                run.extra["saves"] = saves
                last_save = time.monotonic()

        run.warm_up(step, 0)
        run.ready(batch=pool[0][0].shape[0], state_mib=state_bytes // 2**20, every_s=every)
        run.loop(step)
