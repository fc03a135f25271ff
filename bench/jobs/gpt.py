"""A GPT trained by a plain loop in the shape of nanoGPT's train.py: bf16 autocast, AdamW, token
batches on the GPU, optional ``torch.compile``, and a checkpoint (model + optimizer state,
``torch.save``) every ``--ckpt-every`` steps, written on the training thread as nanoGPT does."""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.nn.functional as F

from common import Progress, log, parser, watchdog


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.fc, self.out = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)
        self.heads = heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab: int, seq: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(seq, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln, self.head = torch.nn.LayerNorm(dim), torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--fused", action="store_true")
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--foreach-off", action="store_true",
                   help="AdamW(foreach=False): the per-parameter loop some codebases pick (determinism, memory)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--sync-every-step", action="store_true",
                   help="print the loss and synchronize each step, as many hand-written loops do")
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    vocab, seq, dim, layers, heads = (1000, 32, 64, 2, 2) if args.tiny else (50304, args.seq, args.dim, args.layers, 12)
    batch = 2 if args.tiny else args.batch
    model = GPT(vocab, seq, dim, layers, heads).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=args.fused or None,
                            foreach=False if args.foreach_off and not args.fused else None)
    step_fn = torch.compile(model) if args.compile else model
    data = torch.randint(0, vocab, (64, seq + 1), device=dev)
    ckpt = os.path.join(tempfile.mkdtemp(prefix="gpt-job-"), "ckpt.pt")
    progress = Progress(batch, warm_s=8.0 if args.compile else 4.0)
    log(f"gpt: compile={args.compile} fused={args.fused} foreach_off={args.foreach_off} ckpt_every={args.ckpt_every} "
        f"batch {batch} seq {seq} dim {dim} layers {layers}")
    step = 0
    while True:
        i = (step * batch) % (len(data) - batch)
        x, y = data[i:i + batch, :-1], data[i:i + batch, 1:]
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = step_fn(x)
            loss = F.cross_entropy(logits.reshape(-1, vocab).float(), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if args.ckpt_every and step % args.ckpt_every == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, ckpt)
        if args.sync_every_step:
            torch.cuda.synchronize() if dev.type == "cuda" else None
            print(f"step {step} loss {loss.item():.4f}", file=sys.stderr)
        progress.step()


if __name__ == "__main__":
    main()
