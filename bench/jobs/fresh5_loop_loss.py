"""A named-entity tagger (BIO tags over 9 labels) fine-tuned from a BERT-base encoder, whose loss is
computed sentence by sentence in a Python loop so that padding never counts: for each of the
batch's 256 sentences the loop reads the sentence's length with ``int(attention_mask[i].sum())``,
takes ``F.cross_entropy(logits[i, :n], labels[i, :n])`` and adds it up, then divides by the batch
size. Each ``int()`` waits for the GPU to finish everything queued, and each sentence adds its own
small kernels to the forward and the backward, so the GPU idles while the loop walks the batch.
``--vectorized-loss`` is the fix: the same per-sentence mean computed for the whole batch at once,
``F.cross_entropy(..., reduction="none")`` masked by ``attention_mask`` and summed per row.

Hugging Face ``BertForTokenClassification`` built from a BERT-base config (no download), bf16
autocast, AdamW with a linear warm-up and decay; synthetic sentences of 8 to 64 word pieces padded
to 64 (as ``padding="max_length"`` does), made on the GPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForTokenClassification, get_linear_schedule_with_warmup

from common import Progress, log, parser, watchdog

NUM_LABELS = 9


def loop_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    loss = logits.new_zeros((), dtype=torch.float32)
    for i in range(logits.size(0)):
        n = int(mask[i].sum())
        loss = loss + F.cross_entropy(logits[i, :n].float(), labels[i, :n])
    return loss / logits.size(0)


def vectorized_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_token = F.cross_entropy(logits.float().transpose(1, 2), labels, reduction="none")
    m = mask.to(per_token.dtype)
    return ((per_token * m).sum(1) / m.sum(1)).mean()


def make_batches(n: int, batch: int, length: int, vocab: int, dev: torch.device):
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    for _ in range(n):
        lengths = torch.randint(8, length + 1, (batch, 1), device=dev, generator=g)
        mask = (torch.arange(length, device=dev).unsqueeze(0) < lengths).long()
        ids = torch.randint(1000, vocab, (batch, length), device=dev, generator=g) * mask
        ids[:, 0] = 101  # [CLS]
        labels = torch.randint(0, NUM_LABELS, (batch, length), device=dev, generator=g) * mask
        out.append((ids, mask, labels))
    return out


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--vectorized-loss", action="store_true", help="the fix: one batched, masked cross-entropy")
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    if args.tiny:
        config = BertConfig(vocab_size=2000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=128, num_labels=NUM_LABELS)
        batch, length = 16, 32
    else:
        config = BertConfig(num_labels=NUM_LABELS)  # bert-base-uncased's shape
        batch, length = args.batch, args.max_length
    model = BertForTokenClassification(config).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=500, num_training_steps=100_000)
    batches = make_batches(8, batch, length, config.vocab_size, dev)
    loss_fn = vectorized_loss if args.vectorized_loss else loop_loss
    progress = Progress(batch)
    log(f"fresh5_loop_loss: bert-base token classification batch {batch} max_length {length} "
        f"loss {'vectorized' if args.vectorized_loss else 'per-sentence loop'}")
    model.train()
    step = 0
    while True:
        ids, mask, labels = batches[step % len(batches)]
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(input_ids=ids, attention_mask=mask).logits
        loss = loss_fn(logits, labels, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 200 == 0:
            log(f"step {step} loss {loss.item():.4f}")
        progress.step()


if __name__ == "__main__":
    main()
