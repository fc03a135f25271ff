"""Topic classifier as a linear probe on a BERT-base encoder: Hugging Face transformers model, plain
PyTorch loop, one GPU.

News articles are pre-tokenized and cut into 256-token windows (no padding: every window is full);
the classification head on top of the encoder is trained on 20 topics while the encoder keeps its
pretrained weights. The job builds ``BertForSequenceClassification`` from a BERT-base config (the
real job loads the pretrained checkpoint; there is no network here) and trains under bf16 autocast.
"Keeping the encoder fixed" is done by giving the optimizer only the head's parameters:
``AdamW(model.classifier.parameters())``.

``--freeze-encoder`` also sets ``requires_grad=False`` on the encoder (``model.bert``), so autograd
records nothing for it and the backward pass stops at the head.

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import time

import torch
from transformers import BertConfig, BertForSequenceClassification

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--labels", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train forever)")
    ap.add_argument("--freeze-encoder", action="store_true",
                    help="requires_grad=False on model.bert: no backward through the encoder")
    args = ap.parse_args(argv)
    if args.device == "cpu" or args.tiny:
        args.batch, args.seq_len, args.workers = 8, 32, 0
    return args


def bert_config(args) -> BertConfig:
    if args.device == "cpu" or args.tiny:
        return BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=256, num_labels=args.labels)
    return BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072, max_position_embeddings=512, num_labels=args.labels)


def make_windows(n: int, seq_len: int, labels: int, seed: int = 0):
    """Tokenized article windows ([CLS] ... [SEP]) and their topic: each topic favours its own band of
    the vocabulary, so a probe on the encoder output has something to learn."""
    g = torch.Generator().manual_seed(seed)
    topic = torch.randint(0, labels, (n,), generator=g)
    common = torch.randint(1000, 30000, (n, seq_len), generator=g)
    band = 1000 + topic[:, None] * 1400 + torch.randint(0, 1400, (n, seq_len), generator=g)
    ids = torch.where(torch.rand(n, seq_len, generator=g) < 0.3, band, common)
    ids[:, 0], ids[:, -1] = 101, 102
    return ids, topic


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)

    ids, topics = make_windows(50_000 if cuda else 2_000, args.seq_len, args.labels)
    data = torch.utils.data.TensorDataset(ids, topics)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0)

    # in the real job: BertForSequenceClassification.from_pretrained("bert-base-uncased", num_labels=20)
    model = BertForSequenceClassification(bert_config(args)).to(device)
    if args.freeze_encoder:
        model.bert.requires_grad_(False)
    # linear probe: only the classification head is trained, the encoder keeps its pretrained weights
    optimizer = torch.optim.AdamW(model.classifier.parameters(), lr=args.lr, weight_decay=0.01)
    n_all = sum(p.numel() for p in model.parameters()) / 1e6
    n_opt = sum(p.numel() for p in model.classifier.parameters())
    log(f"BERT probe: {n_all:.1f}M parameters, {n_opt} trained (head), batch {args.batch} x {args.seq_len} tokens, "
        f"encoder requires_grad={next(model.bert.parameters()).requires_grad}")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    correct = torch.zeros((), device=device)
    while True:
        for input_ids, labels in loader:
            input_ids = input_ids.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                out = model(input_ids=input_ids, labels=labels)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            correct += (out.logits.argmax(-1) == labels).sum()
            progress.step(samples=input_ids.shape[0])
            step += 1
            seen += input_ids.shape[0]
            now = time.perf_counter()
            if now - t_last >= 1.0:
                loss_val, acc = out.loss.item(), correct.item() / (seen - n_last)
                correct.zero_()
                now = time.perf_counter()
                log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.1f} loss {loss_val:.4f} acc {acc:.3f}")
                t_last, n_last = now, seen
                if not math.isfinite(loss_val):
                    raise RuntimeError("loss is not finite")
            if args.steps and step >= args.steps:
                log(f"step {step} samples/s {(seen - n_last) / max(1e-9, time.perf_counter() - t_last):.1f}")
                return 0


if __name__ == "__main__":
    raise SystemExit(main())
