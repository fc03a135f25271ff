"""Supervised fine-tuning of a ~0.85B Llama-style causal LM (``LlamaForCausalLM`` from a
``LlamaConfig``: width 2048, 16 layers, GQA, 32k vocabulary) with Hugging Face Accelerate on one GPU.

``Accelerator(mixed_precision="bf16")``, ``accelerator.prepare`` on the model, AdamW, the
DataLoader (4 workers, pinned memory) and the LR schedule; 8 packed sequences of 1,024 tokens
per step, the prompt tokens masked out of the loss (label -100). The team wants the response-token
accuracy on the progress line next to the loss, so every step ``token_accuracy`` takes the
step's logits and labels to the CPU (``.float().cpu().numpy()``), takes the argmax there and
counts the matches on the response tokens; the progress line shows the running mean.

``--gpu-metrics`` computes the same counts on the GPU (argmax, compare, sum over the response
tokens) and adds them to two GPU counters that are read only when the progress line is printed.

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import time

import torch

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train forever)")
    ap.add_argument("--gpu-metrics", action="store_true",
                    help="count correct response tokens on the GPU, read the counters only when printing")
    args = ap.parse_args(argv)
    args.tiny = args.tiny or args.device == "cpu"
    if args.tiny:
        args.batch, args.context, args.workers = 4, 64, 0
    return args


class PackedSFT(torch.utils.data.Dataset):
    """Pre-tokenized prompt/response pairs packed into rows of ``context`` tokens; the prompt part of
    each row is masked out of the labels."""

    def __init__(self, n_rows: int, context: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(3, vocab, (n_rows, context), generator=g, dtype=torch.int32)
        self.prompt_len = torch.randint(context // 10, context * 6 // 10, (n_rows,), generator=g)
        self.virtual_len = 1_000_000

    def __len__(self) -> int:
        return self.virtual_len

    def __getitem__(self, i: int):
        i %= len(self.tokens)
        ids = self.tokens[i].long()
        labels = ids.clone()
        labels[: int(self.prompt_len[i])] = -100
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def token_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[int, int]:
    """Correct next-token predictions on the response tokens, and how many response tokens there are."""
    logits = logits.detach().float().cpu().numpy()
    labels = labels.cpu().numpy()
    preds = logits[:, :-1].argmax(axis=-1)
    target = labels[:, 1:]
    mask = target != -100
    return int((preds[mask] == target[mask]).sum()), int(mask.sum())


def token_accuracy_gpu(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    preds = logits.detach()[:, :-1].argmax(dim=-1)
    target = labels[:, 1:]
    mask = target != -100
    return ((preds == target) & mask).sum(), mask.sum()


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    from accelerate import Accelerator
    from transformers import LlamaConfig, LlamaForCausalLM, get_cosine_schedule_with_warmup

    cuda = args.device == "cuda"
    accelerator = Accelerator(cpu=not cuda, mixed_precision="bf16" if cuda else "no")
    torch.manual_seed(0)
    if args.tiny:
        cfg = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
        n_rows = 256
    else:
        cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                          num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
                          tie_word_embeddings=False)
        n_rows = 8192
    cfg.use_cache = False
    try:
        model = LlamaForCausalLM(cfg, attn_implementation="sdpa")
    except (TypeError, ValueError):
        model = LlamaForCausalLM(cfg)
    data = PackedSFT(n_rows, args.context, cfg.vocab_size)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=100, num_training_steps=100_000)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"Llama {n_params:.0f}M parameters, {args.batch} x {args.context} tokens per step, "
        f"mixed precision {accelerator.mixed_precision}, token accuracy "
        f"{'on the GPU' if args.gpu_metrics else 'on the CPU (numpy)'}")

    progress = Progress(args.batch)
    model.train()
    step, seen, n_last, t_last = 0, 0, 0, time.perf_counter()
    correct, total = 0, 0
    if args.gpu_metrics:
        correct = torch.zeros((), dtype=torch.long, device=accelerator.device)
        total = torch.zeros((), dtype=torch.long, device=accelerator.device)
    while True:
        for batch in loader:
            out = model(**batch)
            accelerator.backward(out.loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if args.gpu_metrics:
                c, n = token_accuracy_gpu(out.logits, batch["labels"])
                correct += c
                total += n
            else:
                c, n = token_accuracy(out.logits, batch["labels"])
                correct += c
                total += n
            progress.step(samples=batch["input_ids"].shape[0])
            step += 1
            seen += batch["input_ids"].shape[0]
            now = time.perf_counter()
            if now - t_last >= 1.0 or step == args.steps:
                loss_val = out.loss.item()
                acc = float(correct) / max(1, int(total))
                now = time.perf_counter()
                log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.1f} loss {loss_val:.4f} "
                    f"acc {acc:.4f}")
                n_last, t_last = seen, now
            if args.steps and step >= args.steps:
                return 0


if __name__ == "__main__":
    raise SystemExit(main())
