"""Synthetic datasets that cost what real ones cost: CPU per sample, disk reads, or a deadlock.

Every sample is derived from its index (seeded generators), so runs are deterministic and nothing
is downloaded. All classes live at module level so DataLoader workers can be forked or spawned.
"""

from __future__ import annotations

import mmap
import os
import random
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

# Length of the synthetic datasets: long enough that an epoch never ends during a run, so
# DataLoader workers are not restarted mid-measurement.
ENDLESS = 10_000_000

# Binomial 5x5 blur: a stand-in for the decode/resize/augment work of an image pipeline.
_TAPS = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0])
_BLUR = (_TAPS[:, None] * _TAPS[None, :]) / 256.0


class SyntheticImages(Dataset):
    """3xSxS images made and augmented on the CPU in ``__getitem__``: blur passes, crop, flip."""

    def __init__(self, size: int, passes: int, classes: int, length: int = ENDLESS) -> None:
        self.size, self.passes, self.classes, self.length = size, passes, classes, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(idx)
        pad = 4
        x = torch.rand(1, 3, self.size + 2 * pad, self.size + 2 * pad, generator=g)
        kernel = _BLUR.expand(3, 1, 5, 5)
        for _ in range(self.passes):
            x = F.conv2d(x, kernel, padding=2, groups=3)
        top, left = (int(v) for v in torch.randint(0, 2 * pad + 1, (2,), generator=g))
        x = x[0, :, top : top + self.size, left : left + self.size]
        if torch.rand((), generator=g) < 0.5:
            x = x.flip(-1)
        x = (x - x.mean(dim=(1, 2), keepdim=True)) / (x.std(dim=(1, 2), keepdim=True) + 1e-5)
        return x.reshape(-1), idx % self.classes


class ThreadHungry(Dataset):
    """Each sample runs a chain of matmuls: multi-threaded by torch in whatever threads it has."""

    def __init__(self, dim: int, rounds: int, classes: int, length: int = ENDLESS) -> None:
        self.dim, self.rounds, self.classes, self.length = dim, rounds, classes, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(idx)
        x = torch.randn(self.dim, self.dim, generator=g)
        w = torch.randn(self.dim, self.dim, generator=g) / self.dim**0.5
        for _ in range(self.rounds):
            x = torch.tanh(x @ w)
        return x.mean(0), idx % self.classes


def set_threads(n: int, worker_id: int) -> None:
    """worker_init_fn that undoes torch's one-thread-per-worker default (with functools.partial)."""
    torch.set_num_threads(n)


class StallingDataset(Dataset):
    """Cheap samples until ``stall_at`` (a shared ``multiprocessing.Value`` holding epoch
    seconds, set by the trainer once it is ready), then ``__getitem__`` never returns.

    The wait polls ``release`` (set only when the job is being shut down) and the parent's pid,
    so a worker whose trainer was killed with SIGKILL exits instead of lingering as an orphan.
    """

    def __init__(self, dim: int, classes: int, stall_at, release, length: int = ENDLESS) -> None:
        self.dim, self.classes, self.stall_at, self.release, self.length = (
            dim,
            classes,
            stall_at,
            release,
            length,
        )

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        if time.time() >= self.stall_at.value:
            parent = os.getppid()
            while not self.release.wait(1.0):
                if os.getppid() != parent:
                    os._exit(0)
        g = torch.Generator().manual_seed(idx)
        return torch.randn(self.dim, generator=g), idx % self.classes


# --------------------------------------------------------------------------- files on disk

# Filesystems whose pages are the storage itself: neither O_DIRECT nor fadvise makes reads cost.
_MEMORY_FS = {"tmpfs", "ramfs", "hugetlbfs"}
O_DIRECT_ALIGN = 4096


def fs_type(path: str) -> str | None:
    """The filesystem type of ``path`` from /proc/mounts (longest matching mount point)."""
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) >= 3]
    except OSError:
        return None
    path = os.path.realpath(path)
    best, fstype = "", None
    for mnt, typ in mounts:
        mnt = mnt.replace("\\040", " ")
        if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, typ
    return fstype


def disk_tmpdir(preferred: str | None = None) -> str:
    """A temp directory on a real disk: the system one unless it lives in memory (tmpfs)."""
    candidates = [preferred] if preferred else []
    candidates += [tempfile.gettempdir(), "/var/tmp", os.getcwd()]
    for cand in candidates:
        if cand and os.path.isdir(cand) and os.access(cand, os.W_OK):
            if fs_type(cand) not in _MEMORY_FS:
                return cand
    return candidates[0] if preferred else tempfile.gettempdir()


def write_sample_files(directory: str, count: int, nbytes: int, seed: int = 0) -> list[str]:
    """``count`` files of ``nbytes`` random bytes, flushed to disk and evicted from the cache."""
    rng = random.Random(seed)
    paths = []
    for i in range(count):
        path = os.path.join(directory, f"sample-{i:05d}.bin")
        with open(path, "wb", buffering=0) as f:
            f.write(rng.randbytes(nbytes))
            os.fsync(f.fileno())
            _drop_cache(f.fileno())
        paths.append(path)
    return paths


def _drop_cache(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def direct_io_works(path: str, nbytes: int) -> bool:
    """Whether O_DIRECT reads of ``path`` succeed here (tmpfs and some overlays refuse them)."""
    if not hasattr(os, "O_DIRECT") or nbytes % O_DIRECT_ALIGN:
        return False
    try:
        _read_direct(path, mmap.mmap(-1, nbytes))
    except OSError:
        return False
    return True


def _read_direct(path: str, buf: mmap.mmap) -> int:
    # O_DIRECT needs an aligned buffer: an anonymous mmap is page-aligned.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        view = memoryview(buf)
        got = 0
        while got < len(buf):
            n = os.preadv(fd, [view[got:]], got)
            if n <= 0:
                break
            got += n
        return got
    finally:
        os.close(fd)


# Rows of `features` bytes turned into the sample's features; the rest of the file is only read.
DECODE_ROWS = 16


class FileSamples(Dataset):
    """Each sample is one file read from disk past the page cache, reduced to a feature vector."""

    def __init__(self, paths: list[str], nbytes: int, features: int, classes: int, direct: bool) -> None:
        self.paths, self.nbytes, self.features, self.classes, self.direct = (
            paths,
            nbytes,
            features,
            classes,
            direct,
        )
        self._buf: mmap.mmap | None = None
        self._buf_pid = -1

    def __len__(self) -> int:
        return len(self.paths)

    def _read(self, path: str) -> mmap.mmap:
        if self._buf is None or self._buf_pid != os.getpid():  # one buffer per worker process
            self._buf, self._buf_pid = mmap.mmap(-1, self.nbytes), os.getpid()
        if self.direct:
            _read_direct(path, self._buf)
        else:
            with open(path, "rb", buffering=0) as f:
                f.readinto(self._buf)
                _drop_cache(f.fileno())  # so the next epoch reads the disk again
        return self._buf

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        raw = torch.frombuffer(self._read(self.paths[idx]), dtype=torch.uint8)
        # A cheap reduction of the first rows: the cost of this sample must be the read, not CPU.
        rows = min(DECODE_ROWS, raw.numel() // self.features)
        x = raw[: rows * self.features].view(rows, self.features)
        return x.float().mean(0) / 255.0, idx % self.classes
