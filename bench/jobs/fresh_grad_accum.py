"""A RoBERTa-base sequence classifier fine-tuned by a hand-written loop with gradient accumulation:
micro-batches of 4 sequences, 16 accumulation steps, an effective batch of 64 -- settings carried
over from a smaller GPU, although 64 sequences of 256 tokens fit on this one at once. Each
micro-batch is a full forward and backward of a 12-layer model on 1,024 tokens. The fix is
``--micro-batch 64 --accum 1``: the same effective batch in one forward and backward.

Hugging Face ``RobertaForSequenceClassification`` built from a RobertaConfig (no download), bf16
autocast, AdamW with a linear schedule, pre-tokenized synthetic sentences padded per batch by a
collate function in 2 DataLoader workers. Throughput is compared in samples/s."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import RobertaConfig, RobertaForSequenceClassification, get_linear_schedule_with_warmup

from common import Progress, log, parser, watchdog


class Tokenized(Dataset):
    """Token id lists of 160..256 tokens (as a tokenizer with truncation leaves them) and labels."""

    def __init__(self, n: int, max_len: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        lens = torch.randint(max_len * 5 // 8, max_len + 1, (n,), generator=g).tolist()
        self.rows = [[0] + torch.randint(5, vocab, (k - 2,), generator=g).tolist() + [2] for k in lens]
        self.labels = torch.randint(0, 3, (n,), generator=g).tolist()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return self.rows[i], self.labels[i]


def collate(batch):
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), 1, dtype=torch.long)  # <pad> = 1
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for j, (ids, _) in enumerate(batch):
        input_ids[j, :len(ids)] = torch.tensor(ids)
        mask[j, :len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": torch.tensor([y for _, y in batch])}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--accum", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    if args.tiny:
        config = RobertaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=128, max_position_embeddings=72, num_labels=3)
        micro, seq = 2, 32
    else:
        config = RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, num_labels=3)
        micro, seq = args.micro_batch, args.seq
    model = RobertaForSequenceClassification(config).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=500, num_training_steps=100_000)
    loader = DataLoader(Tokenized(512 if args.tiny else 8192, seq, config.vocab_size), batch_size=micro, shuffle=True,
                        collate_fn=collate, num_workers=args.workers, pin_memory=dev.type == "cuda",
                        persistent_workers=args.workers > 0, drop_last=True)
    progress = Progress(micro)
    log(f"fresh_grad_accum: roberta micro-batch {micro} x accum {args.accum} seq {seq} workers {args.workers}")
    model.train()
    micro_step = 0
    while True:
        for batch in loader:
            batch = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = model(**batch).loss / args.accum
            loss.backward()
            micro_step += 1
            if micro_step % args.accum == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
            progress.step()


if __name__ == "__main__":
    main()
