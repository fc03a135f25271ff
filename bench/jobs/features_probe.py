"""A classifier head trained on features cached from a frozen backbone, the way linear-probe and
feature-extraction scripts do it: the extracted features sit in host RAM as one float32 tensor
(shuffled once when they were cached), a plain loop slices a batch and copies it with
``.to(device)``, an MLP head, AdamW, the loss printed every 100 steps.

``--pin`` is the usual fix: pin the features once (``feats.pin_memory()``) and copy with
``non_blocking=True``; ``--precision bf16`` runs the head under bf16 autocast. Synthetic features, no download."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from common import Progress, log, parser, watchdog


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--dim", type=int, default=4096,
                   help="feature width (a ViT-g/14's CLS + patch mean, or 4 layers' CLS tokens)")
    p.add_argument("--rows", type=int, default=131072)
    p.add_argument("--pin", action="store_true")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    rows, dim, batch = (4096, 256, 256) if args.tiny else (args.rows, args.dim, args.batch)
    g = torch.Generator().manual_seed(0)
    feats = torch.empty(rows, dim).normal_(generator=g)  # features.pt, as torch.load returns it
    labels = torch.randint(0, 1000, (rows,), generator=g)
    if args.pin and dev.type == "cuda":
        feats, labels = feats.pin_memory(), labels.pin_memory()
    head = torch.nn.Sequential(torch.nn.Linear(dim, 2048), torch.nn.GELU(), torch.nn.Dropout(0.1),
                               torch.nn.Linear(2048, 1000)).to(dev)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=1e-4)
    progress = Progress(batch)
    log(f"features_probe: {rows} x {dim} features, batch {batch}, pinned={args.pin} {args.precision}")
    step = 0
    head.train()
    while True:
        for i in range(0, rows - batch + 1, batch):
            x = feats[i:i + batch].to(dev, non_blocking=args.pin)
            y = labels[i:i + batch].to(dev, non_blocking=args.pin)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                loss = F.cross_entropy(head(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 100 == 0:
                log(f"step {step} loss {loss.item():.4f}")
            progress.step()


if __name__ == "__main__":
    main()
