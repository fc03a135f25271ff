"""A ViT image classifier whose loop validates after every training step: ``model.eval()``, a
forward of one validation batch (twice the training batch, as eval batches usually are) under
``torch.no_grad()``, accuracy and loss read with ``.item()``, ``model.train()`` -- a "quick sanity
check" left in the loop. ``--val-every 200`` is the fix: validate every 200 steps.

Hugging Face ``ViTForImageClassification`` built from a ViT-Base/16 config (no download), bf16
autocast, AdamW; training and validation images are synthetic tensors on the GPU, normalized."""

from __future__ import annotations

import torch
from transformers import ViTConfig, ViTForImageClassification

from common import Progress, log, parser, watchdog


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--val-batch", type=int, default=256)
    p.add_argument("--val-every", type=int, default=1)
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    if args.tiny:
        config = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128, num_labels=100)
        batch, val_batch = 4, 8
    else:
        config = ViTConfig(num_labels=1000)  # ViT-Base/16 at 224
        batch, val_batch = args.batch, args.val_batch
    model = ViTForImageClassification(config).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    size = config.image_size
    g = torch.Generator(device=dev).manual_seed(0)
    train_x = torch.randn(4 * batch, 3, size, size, device=dev, generator=g)
    train_y = torch.randint(0, config.num_labels, (4 * batch,), device=dev, generator=g)
    val_x = torch.randn(val_batch, 3, size, size, device=dev, generator=g)
    val_y = torch.randint(0, config.num_labels, (val_batch,), device=dev, generator=g)
    progress = Progress(batch)
    log(f"fresh_eval_every_step: vit-b/16 batch {batch} val batch {val_batch} val_every {args.val_every}")
    step = 0
    model.train()
    while True:
        i = (step % 4) * batch
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(pixel_values=train_x[i:i + batch], labels=train_y[i:i + batch]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % args.val_every == 0:
            model.eval()
            with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16):
                out = model(pixel_values=val_x, labels=val_y)
            val_acc = (out.logits.argmax(-1) == val_y).float().mean().item()
            val_loss = out.loss.item()
            model.train()
            if step % 100 == 0:
                log(f"step {step} train {loss.item():.4f} val {val_loss:.4f} acc {val_acc:.3f}")
        progress.step()


if __name__ == "__main__":
    main()
