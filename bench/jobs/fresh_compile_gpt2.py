"""A GPT-2 language model trained with ``torch.compile(mode="max-autotune-no-cudagraphs")`` and bf16
autocast: a healthy job whose first minute or two is compilation (Dynamo tracing, Inductor
lowering, Triton autotuning of every matmul shape, forward and backward). The bench attaches while
it is still compiling (``attach_point`` before the first compiled step); once compiled it trains
at the GPU's pace.

Inductor's and Triton's caches are fresh folders, as in a new container, so every run compiles
from nothing. Hugging Face ``GPT2LMHeadModel`` built from GPT2Config (124M, no download), fused
or foreach AdamW, token blocks from a DataLoader. ``--tiny`` (a CPU smoke test of the loop) does not
compile: tracing alone takes longer than the smoke test may."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="fresh-compile-inductor-"))
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="fresh-compile-triton-"))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from common import Progress, attach_point, log, parser, watchdog  # noqa: E402


class Blocks(Dataset):
    """Fixed-length token blocks, as ``group_texts`` leaves a tokenized corpus."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int):
        return self.tokens[i]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--fused", action="store_true", help="AdamW(fused=True)")
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    if args.tiny:
        config = GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=2)
        batch, seq = 4, 32
    else:
        config = GPT2Config()  # gpt2 (124M)
        batch, seq = args.batch, args.seq
    model = GPT2LMHeadModel(config).to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True if args.fused else None)
    compiled = model if args.tiny else torch.compile(model, mode="max-autotune-no-cudagraphs")
    loader = DataLoader(Blocks(256 if args.tiny else 4096, seq, config.vocab_size), batch_size=batch, shuffle=True,
                        num_workers=args.workers, pin_memory=dev.type == "cuda", persistent_workers=args.workers > 0,
                        drop_last=True)
    progress = Progress(batch, warm_s=4.0 if args.tiny else 8.0)
    log(f"fresh_compile_gpt2: batch {batch} seq {seq} workers {args.workers} fused={args.fused}")
    first = True
    while True:
        for x in loader:
            x = x.to(dev, non_blocking=True)
            if first:
                attach_point()  # compilation starts with this step
                first = False
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = compiled(input_ids=x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            progress.step()


if __name__ == "__main__":
    main()
