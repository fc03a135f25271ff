"""Audio event tagging: an Audio Spectrogram Transformer (ViT-S/16-sized: 12 blocks, width 384, 6 heads)
over 128-mel x 1,024-frame log-mel spectrograms, trained in plain PyTorch on one GPU with bf16 autocast,
fused AdamW and gradient clipping. The spectrograms are precomputed; DataLoader workers cut 10-second
crops out of them and apply SpecAugment-style time and frequency masks.

While the input pipeline was being tuned, the loop was wrapped in ``torch.profiler.profile`` with the
schedule of the PyTorch tutorial (``wait=1, warmup=1, active=3``), shapes, memory and Python stacks
recorded, and a handler that keeps the latest Chrome trace on disk. The schedule was written without
``repeat=1``, so it never ends: the profiler keeps cycling, recording three steps out of every five
and exporting a trace after each cycle. It is still there.

``--profile-cycles N`` passes ``repeat=N`` to the schedule (``1``: profile one cycle, then stop);
``--no-profile`` drops the profiler altogether.

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--mels", type=int, default=128)
    ap.add_argument("--frames", type=int, default=1024)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--classes", type=int, default=527)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train forever)")
    ap.add_argument("--profile-cycles", type=int, default=0,
                    help="repeat= of the profiler schedule (0, as written: cycle forever)")
    ap.add_argument("--no-profile", action="store_true", help="no torch.profiler around the loop")
    args = ap.parse_args(argv)
    if args.device == "cpu" or args.tiny:
        args.batch, args.mels, args.frames, args.d_model, args.layers, args.heads = 4, 32, 128, 64, 2, 4
        args.classes, args.workers = 32, 0
    return args


class Spectrograms(torch.utils.data.Dataset):
    """Precomputed log-mel spectrograms of longer clips (fp16, normalized) and their multi-hot tags;
    serves a random ``frames``-long crop with two frequency masks and two time masks."""

    def __init__(self, n: int, mels: int, frames: int, classes: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.clip_frames = frames + frames // 4
        self.specs = torch.randn(n, mels, self.clip_frames, generator=g).half()
        self.tags = (torch.rand(n, classes, generator=g) < 0.02).float()
        self.frames = frames

    def __len__(self) -> int:
        return 2_000_000  # the full AudioSet-sized epoch; the shard is sampled with replacement

    def __getitem__(self, i: int):
        j = int(torch.randint(0, len(self.specs), ()))
        s = int(torch.randint(0, self.clip_frames - self.frames + 1, ()))
        x = self.specs[j, :, s:s + self.frames].float()
        for _ in range(2):
            f0, fw = int(torch.randint(0, x.shape[0] - 24, ())), int(torch.randint(0, 24, ()))
            x[f0:f0 + fw] = 0
            t0, tw = int(torch.randint(0, x.shape[1] - 96, ())), int(torch.randint(0, 96, ()))
            x[:, t0:t0 + tw] = 0
        return x, self.tags[j]


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class AST(nn.Module):
    def __init__(self, mels: int, frames: int, d: int, layers: int, heads: int, classes: int, patch: int = 16) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(1, d, patch, stride=patch)
        n_patches = (mels // patch) * (frames // patch)
        self.pos = nn.Parameter(torch.randn(1, n_patches + 1, d) * 0.02)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, spec: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(spec.unsqueeze(1)).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)

    data = Spectrograms(2048 if cuda else 32, args.mels, args.frames, args.classes)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=False, drop_last=True,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0)
    model = AST(args.mels, args.frames, args.d_model, args.layers, args.heads, args.classes).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05, fused=cuda)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6

    trace_dir = os.path.join(tempfile.gettempdir(), f"fresh9_ast_profile_{os.getpid()}")
    os.makedirs(trace_dir, exist_ok=True)

    def keep_latest_trace(prof) -> None:
        # one file, overwritten each time: the latest trace is the one to open in Perfetto
        prof.export_chrome_trace(os.path.join(trace_dir, "latest_trace.json"))

    if args.no_profile:
        prof = contextlib.nullcontext()
    else:
        prof = profile(
            activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []),
            schedule=schedule(wait=1, warmup=1, active=3, repeat=args.profile_cycles),
            on_trace_ready=keep_latest_trace,
            record_shapes=True,
            profile_memory=True,
            with_stack=True,
        )
    log(f"AST {n_params:.1f}M parameters, batch {args.batch} x {args.mels} mels x {args.frames} frames, "
        f"{args.workers} workers, profiler: "
        f"{'off' if args.no_profile else f'repeat={args.profile_cycles}, traces in {trace_dir}'}")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    with prof:
        while True:
            for spec, tags in loader:
                spec = spec.to(device, non_blocking=True)
                tags = tags.to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                    logits = model(spec)
                loss = F.binary_cross_entropy_with_logits(logits.float(), tags)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                if not args.no_profile:
                    prof.step()
                progress.step(samples=spec.shape[0])
                step += 1
                seen += spec.shape[0]
                now = time.perf_counter()
                if now - t_last >= 1.0:
                    loss_val = loss.item()
                    now = time.perf_counter()
                    log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.1f} loss {loss_val:.4f}")
                    t_last, n_last = now, seen
                    if not math.isfinite(loss_val):
                        raise RuntimeError("loss is not finite")
                if args.steps and step >= args.steps:
                    log(f"step {step} samples/s {(seen - n_last) / max(1e-9, time.perf_counter() - t_last):.1f}")
                    return 0


if __name__ == "__main__":
    raise SystemExit(main())
