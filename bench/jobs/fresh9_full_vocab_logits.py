"""Intent classification by prompting: a small multilingual decoder-only LM (Gemma-3-270M-sized: width
640, 18 layers, 262,144-token vocabulary, tied embeddings) fine-tuned with Hugging Face transformers
(``LlamaForCausalLM``) and a plain PyTorch loop on one GPU, bf16 autocast, fused AdamW.

Each example is a customer message followed by "Intent:", cut from the left to 256 tokens, and the
model is trained to put its next-token probability on the verbalizer token of the right intent (one
vocabulary token per each of the 12 intents): the job takes the log-softmax over the whole vocabulary
at the last position and applies cross entropy over the 12 verbalizer tokens' log-probabilities. The
real job loads the pretrained checkpoint; there is no network here, so the model is built from its
configuration.

The forward pass is called as ``model(input_ids)``, so the LM head computes logits for all 256
positions of every sequence (a 32 x 256 x 262,144 tensor), and the log-softmax runs over all of them in
fp32, although only position 255 is used.

``--logits-to-keep 1`` passes ``logits_to_keep=1`` to the model: the head and the log-softmax run on
the last position only (the loss is the same).

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--intents", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train forever)")
    ap.add_argument("--logits-to-keep", type=int, default=0,
                    help="logits_to_keep= of the forward pass (0, as written: logits for every position)")
    args = ap.parse_args(argv)
    if args.device == "cpu" or args.tiny:
        args.batch, args.seq_len, args.workers = 4, 32, 0
    return args


def model_config(args) -> LlamaConfig:
    if args.device == "cpu" or args.tiny:
        return LlamaConfig(vocab_size=4096, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                           max_position_embeddings=512, tie_word_embeddings=True)
    # Gemma-3-270M's dimensions, in the Llama architecture
    return LlamaConfig(vocab_size=262_144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=256, max_position_embeddings=32_768,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       attn_implementation="sdpa")


def make_prompts(n: int, seq_len: int, vocab: int, intents: int, seed: int = 0):
    """Tokenized prompts (message tokens, then the 'Intent:' tokens) and their intent: each intent
    favours its own band of the vocabulary, so the classifier has something to learn."""
    g = torch.Generator().manual_seed(seed)
    intent = torch.randint(0, intents, (n,), generator=g)
    common = torch.randint(1000, vocab - 1000, (n, seq_len), generator=g)
    band_w = (vocab - 2000) // intents
    band = 1000 + intent[:, None] * band_w + torch.randint(0, band_w, (n, seq_len), generator=g)
    ids = torch.where(torch.rand(n, seq_len, generator=g) < 0.2, band, common)
    ids[:, -3:] = torch.tensor([2, 600, 601])  # "<sep> Intent :"
    return ids, intent


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)

    config = model_config(args)
    ids, intents = make_prompts(20_000 if cuda else 1_000, args.seq_len, config.vocab_size, args.intents)
    data = torch.utils.data.TensorDataset(ids, intents)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0)
    # the verbalizer: one vocabulary token per intent (" billing", " cancel", " refund", ...)
    verbalizer = torch.arange(700, 700 + args.intents, device=device)

    # in the real job: AutoModelForCausalLM.from_pretrained(<the 270M checkpoint>)
    model = LlamaForCausalLM(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=cuda)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"LM classifier: {n_params:.0f}M parameters, vocab {config.vocab_size}, batch {args.batch} x "
        f"{args.seq_len} tokens, logits_to_keep={args.logits_to_keep}")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    correct = torch.zeros((), device=device)
    while True:
        for input_ids, labels in loader:
            input_ids = input_ids.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                out = model(input_ids=input_ids, use_cache=False, logits_to_keep=args.logits_to_keep)
            logprobs = F.log_softmax(out.logits.float(), dim=-1)  # normalized over the whole vocabulary
            scores = logprobs[:, -1, verbalizer]                   # next-token log-probs of the intent words
            loss = F.cross_entropy(scores, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            correct += (scores.argmax(-1) == labels).sum()
            progress.step(samples=input_ids.shape[0])
            step += 1
            seen += input_ids.shape[0]
            now = time.perf_counter()
            if now - t_last >= 1.0:
                loss_val, acc = loss.item(), correct.item() / (seen - n_last)
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
