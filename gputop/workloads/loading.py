"""Scenarios where the training step waits on its DataLoader: CPU work, disk, threads, deadlock."""

from __future__ import annotations

import functools
import multiprocessing
import os
import shutil
import tempfile
import time

import torch
from torch.utils.data import DataLoader, RandomSampler

from . import data, models
from .runtime import Run

CLASSES_CUDA = 1000
CLASSES_CPU = 10


def _step_fn(run: Run, model: torch.nn.Sequential, opt: torch.optim.Optimizer, batch: int):
    def step(data: object) -> None:
        x, y = data  # type: ignore[misc]
        x = x.to(run.device, non_blocking=True)
        y = y.to(run.device, non_blocking=True)
        models.train_step(model, opt, x, y, amp=run.is_cuda)

    # One untimed step on a zero batch: lazy initialisation is not part of the measurement.
    run.warm_up(step, (torch.zeros(batch, model[0].in_features), torch.zeros(batch, dtype=torch.long)))
    return step


def _image_job(run: Run, passes_cuda: int, tiny_cpu_model: bool) -> tuple[data.SyntheticImages, torch.nn.Module, int]:
    if run.is_cuda:
        # 3x64x64 images, ~1 ms of CPU each; a model whose step is under a millisecond of GPU.
        ds = data.SyntheticImages(64, passes_cuda, CLASSES_CUDA)
        model = models.mlp(3 * 64 * 64, 4096, 8, CLASSES_CUDA)
        batch = 256
    else:
        ds = data.SyntheticImages(32, 8, CLASSES_CPU)  # ~1.5 ms per sample on a slow core
        # Either the CPU "healthy" model (so starved vs healthy compares the data path alone) or
        # one whose step is negligible (so a worker's cost is not hidden behind training).
        width, depth = (32, 2) if tiny_cpu_model else (128, 3)
        model = models.mlp(3 * 32 * 32, width, depth, CLASSES_CPU)
        batch = 16
    return ds, model.to(run.device), batch


def dataloader_starved(run: Run) -> None:
    ds, model, batch = _image_job(run, passes_cuda=4, tiny_cpu_model=False)
    opt = models.adamw(model, run.device)
    # num_workers=0: every __getitem__ runs on the training thread, between GPU steps.
    loader = DataLoader(ds, batch_size=batch, num_workers=0, pin_memory=run.is_cuda)
    step = _step_fn(run, model, opt, batch)
    run.loop_loader(loader, step, ready=dict(batch=batch, num_workers=0))


def _one_trainer_thread(run: Run) -> None:
    # CPU variants: the trainer's own intra-op threads would otherwise compete with the loader
    # workers for the few cores of a CI box, hiding whose time is short.
    if not run.is_cuda:
        torch.set_num_threads(1)


def workers_saturated(run: Run) -> None:
    _one_trainer_thread(run)
    ds, model, batch = _image_job(run, passes_cuda=8, tiny_cpu_model=True)
    opt = models.adamw(model, run.device)
    # Two workers (one on a CPU-only box) for transforms that need many: each runs flat out.
    workers = 2 if run.is_cuda else 1
    loader = DataLoader(
        ds,
        batch_size=batch,
        num_workers=workers,
        pin_memory=run.is_cuda,
        persistent_workers=True,
        prefetch_factor=2,
    )
    step = _step_fn(run, model, opt, batch)
    run.loop_loader(loader, step, ready=dict(batch=batch, num_workers=workers, cpu_count=os.cpu_count()))


# (files, bytes per file, samples per batch). CUDA: 384 MiB on disk, 64 MiB read per step; the
# page cache is bypassed, so every read goes to the device.
IO_FILES = {"cuda": (384, 1 << 20, 64), "cpu": (64, 1 << 20, 16)}


def io_bound(run: Run) -> None:
    _one_trainer_thread(run)
    count, nbytes, batch = IO_FILES[run.device.type]
    features, classes = (4096, CLASSES_CUDA) if run.is_cuda else (1024, CLASSES_CPU)
    workers = 2
    tmp = tempfile.mkdtemp(prefix="gputop-io-", dir=data.disk_tmpdir(run.tmpdir))
    try:
        paths = data.write_sample_files(tmp, count, nbytes)
        direct = data.direct_io_works(paths[0], nbytes)
        ds = data.FileSamples(paths, nbytes, features, classes, direct=direct)
        width, depth = (4096, 4) if run.is_cuda else (32, 2)
        model = models.mlp(features, width, depth, classes).to(run.device)
        opt = models.adamw(model, run.device)
        # Random reads with replacement: the dataset is re-read in a new order, never from cache.
        g = torch.Generator().manual_seed(0)
        sampler = RandomSampler(ds, replacement=True, num_samples=data.ENDLESS, generator=g)
        loader = DataLoader(
            ds, batch_size=batch, sampler=sampler, num_workers=workers, pin_memory=run.is_cuda
        )
        step = _step_fn(run, model, opt, batch)
        facts = dict(
            batch=batch,
            num_workers=workers,
            files=count,
            dataset_mib=count * nbytes // 2**20,
            cache="o_direct" if direct else "fadvise_dontneed",
            fs=data.fs_type(tmp) or "unknown",
        )
        run.loop_loader(loader, step, ready=facts)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def oversubscribed(run: Run) -> None:
    cores = os.cpu_count() or 1
    # The trainer itself stays single-threaded: a worker forked from a process whose OpenMP pool
    # is already running deadlocks in its first multi-threaded op (an OpenMP runtime limit), and
    # the oversubscription this scenario shows is the workers'.
    torch.set_num_threads(1)
    workers = max(2, cores)
    dim, classes, batch = (256, CLASSES_CUDA, 32) if run.is_cuda else (128, CLASSES_CPU, 8)
    ds = data.ThreadHungry(dim, 4, classes)
    width, depth = (2048, 4) if run.is_cuda else (32, 2)
    model = models.mlp(dim, width, depth, classes).to(run.device)
    opt = models.adamw(model, run.device)
    # One worker per core, and each worker told to use every core (what an unset
    # OMP_NUM_THREADS does to numpy/OpenCV in workers): cores x cores threads fight for cores.
    loader = DataLoader(
        ds,
        batch_size=batch,
        num_workers=workers,
        pin_memory=run.is_cuda,
        persistent_workers=True,
        worker_init_fn=functools.partial(data.set_threads, cores),
    )
    step = _step_fn(run, model, opt, batch)
    facts = dict(batch=batch, num_workers=workers, threads_per_worker=cores, cpu_count=cores)
    run.loop_loader(loader, step, ready=facts)


# Seconds of normal training before the workers block: long enough to see progress first.
STALL_AFTER_S = {"cuda": 5.0, "cpu": 1.0}


def stuck(run: Run) -> None:
    dim, classes, batch = (4096, CLASSES_CUDA, 512) if run.is_cuda else (3 * 32 * 32, CLASSES_CPU, 16)
    width, depth = (4096, 4) if run.is_cuda else (128, 3)
    model = models.mlp(dim, width, depth, classes).to(run.device)
    opt = models.adamw(model, run.device)
    ctx = multiprocessing.get_context()
    release = ctx.Event()  # set only at shutdown
    stall_at = ctx.Value("d", float("inf"))  # shared with the workers; set once ready
    after = STALL_AFTER_S[run.device.type]
    ds = data.StallingDataset(dim, classes, stall_at=stall_at, release=release)
    loader = DataLoader(ds, batch_size=batch, num_workers=2, pin_memory=run.is_cuda)
    step = _step_fn(run, model, opt, batch)

    def start_the_clock() -> None:
        stall_at.value = time.time() + after

    facts = dict(batch=batch, num_workers=2, stall_after_s=after)
    run.loop_loader(loader, step, ready=facts, on_exit=release.set, on_ready=start_the_clock)
