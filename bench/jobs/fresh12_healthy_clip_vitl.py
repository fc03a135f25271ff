"""Domain CLIP for e-commerce product search: contrastive image-text pretraining of a ViT-L/14 image
tower (24 blocks, width 1,024, 16 heads, 224-pixel images, 257 tokens) and a 12-block text tower (width
768, 12 heads, 77 BPE tokens, causal mask, EOT pooling), trained in plain PyTorch on one GPU with bf16
autocast, ``F.scaled_dot_product_attention`` (flash attention), open_clip's LayerNorm (fused kernel,
cast back to the bf16 residual stream), fused AdamW, a learnable temperature and the symmetric InfoNCE loss over batches of 128 pairs.

The product photos (uint8, 256 x 256, memory-mapped from local disk; written to a temp dir here) and
their tokenized titles are read by 6 DataLoader workers that crop and flip in uint8, pinned and copied
asynchronously; normalisation happens on the GPU. The loss is read once a second.

This one is healthy: a step is ~67 TFLOP of large bf16 matmuls (the image tower is ~90 % of it) plus
flash attention, and the GPU spends ~75 % of its time in them; the workers deliver a batch in a fraction
of a step.

Prints ``step <n> samples/s <x>`` about once a second (samples are image-text pairs).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--patch", type=int, default=14)
    ap.add_argument("--vision-width", type=int, default=1024)
    ap.add_argument("--vision-layers", type=int, default=24)
    ap.add_argument("--text-width", type=int, default=768)
    ap.add_argument("--text-layers", type=int, default=12)
    ap.add_argument("--text-ctx", type=int, default=77)
    ap.add_argument("--vocab", type=int, default=49_408)
    ap.add_argument("--embed", type=int, default=768)
    ap.add_argument("--products", type=int, default=8_000, help="images in the memory-mapped shard")
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--lr", type=float, default=5e-4)
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.image, args.patch, args.vision_width, args.vision_layers = 8, 32, 8, 64, 2
        args.text_width, args.text_layers, args.text_ctx, args.vocab, args.embed = 64, 2, 16, 1000, 32
        args.products, args.workers = 256, min(args.workers, 1)
    return args


class LayerNorm(nn.LayerNorm):
    """open_clip's LayerNorm: computed in fp32 under autocast, cast back to the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        orig_type = x.dtype
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps).to(orig_type)


class Block(nn.Module):
    def __init__(self, width: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln_1 = LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln_2(x))


class VisionTower(nn.Module):
    def __init__(self, image: int, patch: int, width: int, layers: int, embed: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, patch, stride=patch, bias=False)
        self.cls = nn.Parameter(torch.randn(width) * width ** -0.5)
        self.pos = nn.Parameter(torch.randn((image // patch) ** 2 + 1, width) * width ** -0.5)
        self.ln_pre = LayerNorm(width)
        self.blocks = nn.ModuleList(Block(width, width // 64, causal=False) for _ in range(layers))
        self.ln_post = LayerNorm(width)
        self.proj = nn.Parameter(torch.randn(width, embed) * width ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], 1, -1).to(x.dtype), x], dim=1) + self.pos.to(x.dtype)
        x = self.ln_pre(x)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x[:, 0]) @ self.proj


class TextTower(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int, layers: int, embed: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(ctx, width) * 0.01)
        self.blocks = nn.ModuleList(Block(width, width // 64, causal=True) for _ in range(layers))
        self.ln_final = LayerNorm(width)
        self.proj = nn.Parameter(torch.randn(width, embed) * width ** -0.5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos
        for block in self.blocks:
            x = block(x)
        x = self.ln_final(x)
        eot = ids.argmax(dim=-1)  # the end-of-text token has the largest id
        return x[torch.arange(x.shape[0], device=x.device), eot] @ self.proj


class CLIP(nn.Module):
    def __init__(self, args) -> None:
        super().__init__()
        self.visual = VisionTower(args.image, args.patch, args.vision_width, args.vision_layers, args.embed)
        self.text = TextTower(args.vocab, args.text_ctx, args.text_width, args.text_layers, args.embed)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, images: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        img = F.normalize(self.visual(images), dim=-1)
        txt = F.normalize(self.text(ids), dim=-1)
        logits = self.logit_scale.exp().clamp(max=100) * img.float() @ txt.float().t()
        labels = torch.arange(len(logits), device=logits.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def write_shard(root: str, n: int, size: int, ctx: int, vocab: int) -> None:
    """Product photos (uint8 HWC) and tokenized titles ([SOT] ... [EOT], zero-padded), as .npy files."""
    rng = np.random.default_rng(0)
    images = np.lib.format.open_memmap(os.path.join(root, "images.npy"), mode="w+", dtype=np.uint8,
                                       shape=(n, size, size, 3))
    base = rng.integers(0, 256, (64, size, size, 3), dtype=np.uint8)
    for s in range(0, n, 512):
        k = min(512, n - s)
        images[s:s + k] = base[rng.integers(0, 64, k)] ^ rng.integers(0, 32, (k, 1, 1, 3), dtype=np.uint8)
    images.flush()
    titles = np.zeros((n, ctx), dtype=np.int32)
    lengths = rng.integers(6, ctx - 1, n)
    for i, length in enumerate(lengths):
        titles[i, 0] = vocab - 2
        titles[i, 1:length] = rng.integers(1, vocab - 2, length - 1)
        titles[i, length] = vocab - 1
    np.save(os.path.join(root, "titles.npy"), titles)


class Products(torch.utils.data.Dataset):
    def __init__(self, root: str, crop: int) -> None:
        self.crop = crop
        self.images = np.load(os.path.join(root, "images.npy"), mmap_mode="r")  # the forked workers share the map
        self.titles = np.load(os.path.join(root, "titles.npy"))

    def __len__(self) -> int:
        return len(self.titles)

    def __getitem__(self, i: int):
        img = self.images[i]
        y, x = np.random.randint(0, img.shape[0] - self.crop + 1, 2)
        img = img[y:y + self.crop, x:x + self.crop]
        if np.random.rand() < 0.5:
            img = img[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))), torch.from_numpy(self.titles[i])


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    root = tempfile.mkdtemp(prefix="products-")
    t0 = time.perf_counter()
    write_shard(root, args.products, args.image * 8 // 7, args.text_ctx, args.vocab)
    log(f"shard written in {time.perf_counter() - t0:.1f}s: {root}")
    dataset = Products(root, args.image)
    shutil.rmtree(root)  # the mapping stays valid; nothing is left behind in /tmp
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=True,
                                         drop_last=True, num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0,
                                         prefetch_factor=4 if args.workers else None)
    model = CLIP(args).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "pos" not in n and "cls" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "pos" not in n and "cls" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.2}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.98), eps=1e-6, fused=cuda)
    warmup, total = 2_000, 200_000
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else
        0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / (total - warmup)))))
    mean = torch.tensor([0.481, 0.458, 0.408], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.269, 0.261, 0.276], device=device).view(1, 3, 1, 1) * 255
    log(f"CLIP {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, batch {args.batch}, "
        f"workers {args.workers}")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        for images, ids in loader:
            images = images.to(device, non_blocking=True)
            ids = ids.to(device, non_blocking=True).long()
            x = (images.float() - mean) / std
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = model(x, ids)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            progress.step()
            step += 1
            seen += args.batch
            now = time.perf_counter()
            if now - t_last >= 1.0:
                loss_val = loss.item()
                now = time.perf_counter()
                log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.1f} loss {loss_val:.4f}")
                t_last, n_last = now, seen
                if not math.isfinite(loss_val):
                    raise RuntimeError("loss is not finite")


if __name__ == "__main__":
    raise SystemExit(main())
