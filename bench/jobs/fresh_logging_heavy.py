"""A GPT-2 language-model loop that logs everything at every step: a ``tqdm`` bar with
``set_postfix(loss=loss.item(), ...)``, and a metrics dict -- loss, perplexity, token accuracy,
learning rate, total gradient norm, and the gradient and weight norm of every parameter tensor (for
the dashboards) -- each value read with ``.item()``, the scalars written to the log and the whole
dict appended to a local metrics file (a JSON line, as a local tracker keeps it), every step. Each
``.item()`` waits for the GPU, and the step's GPU work cannot run ahead of the CPU.
``--log-every 50`` is the fix: the same metrics every 50 steps.

Hugging Face ``GPT2LMHeadModel`` built from GPT2Config (124M, no download), bf16 autocast, AdamW,
a cosine schedule, token batches on the GPU."""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile

import torch
from tqdm import tqdm
from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup

from common import Progress, log, parser, watchdog

logger = logging.getLogger("train")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--log-every", type=int, default=1)
    args = p.parse_args()
    watchdog(args.seconds)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")  # to stderr
    dev = torch.device(args.device)
    if args.tiny:
        config = GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=2)
        batch, seq = 4, 32
    else:
        config = GPT2Config()
        batch, seq = args.batch, args.seq
    model = GPT2LMHeadModel(config).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=200, num_training_steps=100_000)
    corpus = torch.randint(0, config.vocab_size, (256, seq + 1), device=dev)
    named = list(model.named_parameters())
    tracker = open(os.path.join(tempfile.mkdtemp(prefix="gpt2-run-"), "metrics.jsonl"), "a")
    progress = Progress(batch)
    log(f"fresh_logging_heavy: gpt2 batch {batch} seq {seq} log_every {args.log_every}")
    model.train()
    pbar = tqdm(total=100_000, desc="train", dynamic_ncols=True)
    step = 0
    while True:
        i = (step * batch) % (len(corpus) - batch)
        x, y = corpus[i:i + batch, :-1], corpus[i:i + batch, 1:]
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        step += 1
        if step % args.log_every == 0:
            metrics = {
                "loss": loss.item(),
                "ppl": math.exp(min(loss.item(), 20.0)),
                "acc": (logits.argmax(-1) == y).float().mean().item(),
                "lr": sched.get_last_lr()[0],
                "grad_norm": grad_norm.item(),
            }
            for name, prm in named:
                if prm.grad is None:
                    continue
                metrics[f"grad/{name}"] = prm.grad.norm().item()
                metrics[f"weight/{name}"] = prm.detach().norm().item()
            pbar.set_postfix(loss=f"{metrics['loss']:.4f}", acc=f"{metrics['acc']:.3f}",
                             gnorm=f"{metrics['grad_norm']:.2f}")
            logger.info("step %d %s", step,
                        " ".join(f"{k}={metrics[k]:.5g}" for k in ("loss", "ppl", "acc", "lr", "grad_norm")))
            tracker.write(json.dumps({"step": step, **metrics}) + "\n")
            tracker.flush()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        pbar.update(1)
        progress.step()


if __name__ == "__main__":
    main()
