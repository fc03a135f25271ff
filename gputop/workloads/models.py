"""Small models and the training step the scenarios share."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


def mlp(in_dim: int, width: int, depth: int, classes: int) -> nn.Sequential:
    """``depth`` hidden Linear+GELU layers: big matmuls when wide, the shape of most trainers."""
    layers: list[nn.Module] = [nn.Linear(in_dim, width), nn.GELU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.GELU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


class _TinyBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def tiny_net(dim: int, blocks: int, classes: int) -> nn.Sequential:
    """Many layers of microscopic work: every kernel finishes faster than the next is launched."""
    return nn.Sequential(*[_TinyBlock(dim) for _ in range(blocks)], nn.Linear(dim, classes))


def adamw(model: nn.Module, device: torch.device, **kw: object) -> torch.optim.Optimizer:
    # The fused kernel is what a tuned CUDA trainer uses; on CPU keep torch's default.
    fused = True if device.type == "cuda" else None
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused, **kw)


def autocast(device: torch.device, enabled: bool):
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def train_step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    amp: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimiser step. Returns (loss, logits, per-sample loss), all still on the device."""
    with autocast(x.device, amp):
        logits = model(x)
        per_sample = F.cross_entropy(logits.float(), y, reduction="none")
        loss = per_sample.mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss, logits, per_sample


def batch_pool(
    count: int, batch: int, in_dim: int, classes: int, device: torch.device, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A few fixed batches, generated on the device: training data that costs nothing to load."""
    g = torch.Generator(device=device).manual_seed(seed)
    return [
        (
            torch.randn(batch, in_dim, generator=g, device=device),
            torch.randint(0, classes, (batch,), generator=g, device=device),
        )
        for _ in range(count)
    ]
