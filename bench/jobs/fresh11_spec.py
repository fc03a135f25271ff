"""The fresh11 jobs: how to run each as-is on one H100, the change that fixes it (or, for the
healthy control, the changes a false alarm would most likely name), and what a right diagnosis
says. One literal ``SPEC`` list, readable with ``ast.literal_eval``."""

SPEC = [
    {
        "name": "fresh11-transformers-t5-hf-adafactor",
        "framework": "transformers",
        "script": "fresh11_hf_t5_adafactor.py",
        "args": [],
        "tiny_args": [],
        "changes": [
            {
                "text": "Use the Trainer's default fused AdamW (optim='adamw_torch_fused', learning rate 3e-4) "
                        "instead of optim='adafactor', which runs transformers.optimization.Adafactor, a Python "
                        "loop of ~22 small kernels per parameter tensor; T5-base's AdamW state is only 1.8 GB.",
                "args": ["--optim", "adamw_torch_fused"],
                "label": "transformers' Adafactor (optim='adafactor'): a per-parameter Python loop, ~5,700 kernel launches per optimizer step",
            },
        ],
        "truth": "The Seq2SeqTrainer runs with optim='adafactor', i.e. transformers.optimization.Adafactor "
                 "(scale_parameter=False, relative_step=False). Its step() loops in Python over T5-base's 257 "
                 "parameter tensors and issues ~22 separate kernels for each: grad**2 + eps, the row and column "
                 "means and their two exponential moving averages (mul_ + add_ each), the row-mean "
                 "normalization, two rsqrt, the outer product, the multiply by the gradient, the update's RMS "
                 "(norm, div, clamp, div_), the learning-rate multiply, a negate and the parameter add, plus "
                 "the parameter RMS it computes even when scale_parameter is off: 5,674 launching ops per step "
                 "(counted), ~40 ms of CPU, while the GPU's share of that work is ~7 ms of memory traffic "
                 "(~19 GB). The Trainer's NaN/Inf filter (torch.isnan(tr_loss_step) in a Python if) "
                 "synchronizes right after backward, so the GPU has drained before the optimizer loop starts "
                 "and nothing overlaps it: every step is ~40 ms of GPU-bound forward/backward followed by ~40 "
                 "ms of the GPU waiting on Python. Fused AdamW updates all 257 tensors in one multi-tensor "
                 "kernel sequence (~2 ms).",
        "expected_gain": "about 1.8x (1.4x to 2.4x): forward and backward of T5-base on 32 x (256 -> 64) tokens in "
                         "bf16 are 6.4 TFLOP of matmuls (encoder 6 x 85M x 8,192, decoder 6 x 99M x 2,048, "
                         "cross-attention keys/values 6 x 14M x 8,192, tied LM head 6 x 24.7M x 2,048), ~16 ms at "
                         "~400 TFLOPS for these d_model-768 GEMMs; T5's eager attention with fp32 softmax over 32 x "
                         "12 x 256 x 256 encoder scores and 64 x 256 cross-attention scores (~28 GB forward and "
                         "backward) and its RMS norms, dropouts, ReLU, residual adds and casts (~38 GB): ~22 ms; "
                         "cross entropy and weight casts ~2 ms: ~40 ms, GPU-bound (the CPU issues the ~3,300 "
                         "kernels in ~22 ms). Gradient clipping ~1 ms. Adafactor: 5,674 ops at ~6 us of CPU each "
                         "(dispatch and launch) plus ~20 us of Python per tensor, ~40 ms, with its ~7 ms of GPU work "
                         "underneath. Scheduler, callbacks, zero_grad and the main-process collation of 32 samples "
                         "~3 ms: ~84 ms per step, ~380 pairs/s. With fused AdamW (223M parameters x 28 bytes = 6.2 "
                         "GB, ~2 ms): 40 + 1 + 2 + 3 = ~46 ms, ~700 pairs/s. 84 / 46 = 1.8x.",
    },
    {
        "name": "fresh11-timm-dino-per-view-forward",
        "framework": "timm",
        "script": "fresh11_timm_dino_view_loop.py",
        "args": ["--batch", "32", "--workers", "4"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Call the networks once per resolution, as DINO's MultiCropWrapper does: "
                        "student(torch.cat(views[:2])), student(torch.cat(views[2:])) and "
                        "teacher(torch.cat(views[:2])), instead of one call per view (same outputs in the same "
                        "order, so the loss is unchanged).",
                "args": ["--batch-views"],
                "label": "multi-crop views sent through the ViT one at a time: 12 student and 2 teacher calls of 32 images per step, launch-bound",
            },
        ],
        "truth": "The DINO step calls the student once per view, torch.cat([student(v) for v in views]) over 2 "
                 "global 224-pixel views and 10 local 96-pixel views of 32 images, and the teacher once per "
                 "global view: 14 network calls per step. Each student call is ~250 kernels forward and ~330 "
                 "backward (12 ViT-S blocks with drop-path, the position-embedding resampling for 96-pixel "
                 "inputs, the DINO head and its weight-normalized 65,536-way layer), ~4 ms of CPU in timm's "
                 "module calls, dispatch, launches and the autograd engine. For a local view the GPU work of a "
                 "call is tiny (32 x 37 = 1,184 tokens: GEMMs of 1,184 x 384 x 1,152, a few microseconds "
                 "each), so 10 of the 14 calls are bound by the CPU issuing kernels while the GPU idles between "
                 "them: ~56 ms of CPU per step against ~33 ms of GPU work. Concatenating the views of equal "
                 "resolution runs the same computation in 2 student calls and 1 teacher call with 5-10x larger "
                 "matrices, and the step becomes GPU-bound at ~25 ms. Data is not the limit: the workers only "
                 "batch stored uint8 images and the crops are batched grid_sample calls on the GPU.",
        "expected_gain": "about 2.2x (1.6x to 2.8x): per view, CPU: 12 student calls x ~4 ms (~250 forward kernels at "
                         "~9 us of timm Python, dispatch and launch, ~330 backward at ~5 us) + 2 teacher forwards x "
                         "~1.1 ms + the GPU augmentation (12 views x ~35 kernels, ~3 ms) + the DINO loss over 22 "
                         "view pairs (~1.5 ms) + clipping, fused AdamW and the foreach EMA (~1 ms) + data (~0.5 ms) "
                         "= ~56 ms. GPU: a global student call is 6,304 tokens, 0.8 TFLOP (~2.7 ms) plus ~7 GB of "
                         "LayerNorm, GELU, drop-path and residual traffic (~2.4 ms), ~5 ms; a local call ~1.7 ms "
                         "(~580 kernels at a ~3 us floor); a teacher call ~1.7 ms; the rest ~3 ms: 2 x 5 + 10 x 1.7 "
                         "+ 2 x 1.7 + 3 = ~33 ms. The step is CPU-bound at ~57 ms, ~560 images/s. Batched: the "
                         "student on the 64 global views (12,608 tokens, 1.6 TFLOP and ~14 GB, ~9 ms) and on the "
                         "320 local views (11,840 tokens, ~9 ms), the teacher on the 64 global views (~3 ms), "
                         "augmentation, loss and optimizer (~3 ms): ~24 ms of GPU against ~15 ms of CPU (3 calls "
                         "plus the rest): ~25 ms, ~1,280 images/s. 57 / 25 = 2.3x. The 4 workers each batch 32 "
                         "stored 256 x 256 images (6 MB) in a few milliseconds, far ahead.",
    },
    {
        "name": "fresh11-torch-gpt-handwritten-layernorm-gelu",
        "framework": "torch",
        "script": "fresh11_torch_gpt_handwritten_norm.py",
        "args": ["--batch", "16"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Use nn.LayerNorm and nn.GELU(approximate='tanh') (one fused kernel each forward, one or "
                        "two backward) instead of the hand-written LayerNorm (mean, std, sub, mul, div, add) and "
                        "tanh-GELU (pow, mul, add, mul, tanh, add, mul, mul) modules.",
                "args": ["--fused-ops"],
                "label": "hand-written LayerNorm and tanh-GELU built from elementwise tensor ops: ~146 GB of extra memory traffic per step",
            },
        ],
        "truth": "The GPT's LayerNorm (the Annotated Transformer's: x.mean, x.std, subtract, scale, divide by std + "
                 "eps, shift) and GELU (BERT-pytorch's 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * "
                 "x**3)))) are composed of separate tensor operations. Under autocast, mean/std/pow run in fp32 "
                 "and promote the rest of each chain to fp32, so each of the 25 LayerNorms is ~7 full-size fp32 "
                 "kernels forward and ~15 backward (autograd through every op, plus summing three gradient paths "
                 "into x), and each of the 12 GELUs ~8 forward and ~15 backward over the 3,072-wide MLP "
                 "activation (16,384 x 3,072 per layer). Counting what every non-matmul op of one block reads "
                 "and writes, the hand-written pair moves ~1,200 bytes per hidden unit per token against ~230 "
                 "with the fused kernels: ~970 x 768 x 16,384 x 12 = ~146 GB more per step, ~50 ms of "
                 "memory-bound elementwise kernels on top of a ~48 ms step. The GPU is busy throughout; the CPU, "
                 "which issues ~1,600 kernels per step, runs far ahead.",
        "expected_gain": "about 2x (1.5x to 2.6x): with fused ops a step is 12.2 TFLOP of matmuls (6 x 85M x 16,384 in "
                         "the blocks and 6 x 38.6M x 16,384 in the tied LM head, ~22 ms at ~550 TFLOPS), 1.1 TFLOP "
                         "of causal flash attention over 1,024 tokens (~4 ms), ~230 bytes per hidden unit per token "
                         "and layer of fused LayerNorm, GELU, residual, bias-gradient and qkv split/concat traffic "
                         "(~35 GB, ~12 ms), the fp32 cross entropy over 16,384 x 50,304 logits (~28 GB, ~9 ms) and "
                         "fused AdamW plus clipping over 124M parameters (~2 ms): ~48 ms, ~330 sequences/s. The "
                         "hand-written ops add 25 LayerNorms x ~150 extra bytes per element and 12 GELUs x ~170 "
                         "extra bytes per element of the 4x-wide activation, ~146 GB, ~50 ms at ~2.9 TB/s: ~98 ms, "
                         "~165 sequences/s. 98 / 48 = 2.0x. The main-process batch slicing (16 windows) takes well "
                         "under a millisecond and overlaps the GPU.",
    },
    {
        "name": "fresh11-lightning-tabular-per-row-collate",
        "framework": "lightning",
        "script": "fresh11_lightning_tabular_rows.py",
        "args": ["--batch", "8192", "--workers", "4"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Draw whole batches from the in-memory tensors: pass BatchSampler(RandomSampler(data), "
                        "8192, drop_last=True) as the DataLoader's sampler with batch_size=None, so the dataset "
                        "is indexed once per batch with all 8,192 indices (one gather per field, no collation), "
                        "instead of TensorDataset per-row indexing and default_collate.",
                "args": ["--batched-sampler"],
                "label": "in-memory TensorDataset batched row by row: 8,192 __getitem__ calls and three 8,192-way torch.stack per batch",
            },
        ],
        "truth": "The 4M-row table (96 numeric features, 20 categorical codes, the label) is already in RAM as "
                 "tensors, but the DataLoader builds every 8,192-row batch one row at a time: the fetcher calls "
                 "TensorDataset.__getitem__ for each index (three tensor indexings and a tuple per row) and "
                 "default_collate stacks 8,192 one-row tensors for each field. That is ~25,000 tiny tensor "
                 "indexings and three 8,192-way torch.stack calls, ~7.5 us of Python per row, ~60 ms per batch "
                 "in a worker, so the 4 workers together deliver a batch every ~15 ms. The model (an MLP of "
                 "1.1M parameters over 416 inputs plus an 85,000 x 16 embedding) needs ~0.5 ms of GPU per batch "
                 "and Lightning's training step ~3 ms of CPU: the loop waits on the DataLoader ~75 % of the time "
                 "and the GPU is almost idle. Indexing the tensors once per batch with the whole index list "
                 "removes the per-row work (~3 ms per batch in a worker), and the step becomes bound by "
                 "Lightning's per-step overhead.",
        "expected_gain": "about 3.5x (2.5x to 5x): per row, TensorDataset indexing of 3 tensors and the tuple, the "
                         "fetcher's list comprehension and default_collate's share of stacking cost ~7.5 us "
                         "(measured 8.4 us of CPU time per row on a 2-core VM), ~60 ms per 8,192-row batch; 4 "
                         "workers deliver one every ~15 ms; RandomSampler's randperm(4M).tolist() in the main "
                         "process adds ~250 ms per 488-step epoch (~0.5 ms per step): ~15.5 ms per step, ~530,000 "
                         "rows/s. Batched: a worker turns one list of 8,192 indices into a tensor and does three "
                         "gathers (~3 MB) in ~3 ms, far ahead; the main process needs Lightning's "
                         "automatic-optimization loop, hooks and the on-epoch self.log accumulation, ~100 kernel "
                         "launches for the embedding, four Linear/BatchNorm/ReLU/Dropout layers, BCE, backward and "
                         "foreach AdamW (~3 ms), receiving and pinning the batch (~0.5 ms), and the per-epoch "
                         "randperm (~0.5 ms per step): ~4 ms, ~2,000,000 rows/s; the GPU work is ~53 GFLOP of "
                         "small GEMMs and a few MB of elementwise traffic (~0.5 ms). 15.5 / 4 = ~3.9x.",
    },
    {
        "name": "fresh11-torch-healthy-long-context-lm",
        "framework": "torch",
        "script": "fresh11_healthy_long_context_lm.py",
        "args": ["--micro-batch", "4", "--accum", "4", "--workers", "2"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Use more DataLoader workers: num_workers=8.",
                "args": ["--workers", "8"],
                "label": "more DataLoader workers (false alarm)",
            },
            {
                "text": "Wrap the model in torch.compile.",
                "args": ["--compile"],
                "label": "torch.compile (false alarm)",
            },
            {
                "text": "Accumulate over 8 micro-batches (128k tokens per optimizer step) so that the optimizer "
                        "step and clipping run half as often.",
                "args": ["--accum", "8"],
                "label": "more gradient-accumulation steps (false alarm)",
            },
        ],
        "truth": "Healthy: a 1.4B-parameter decoder (16 pre-LayerNorm blocks, width 2,560, heads of 128) "
                 "trained at 4,096-token context with bf16 autocast, flash attention through SDPA "
                 "(is_causal=True), fused nn.LayerNorm and tanh-GELU kernels, fused AdamW and micro-batches of "
                 "16,384 tokens; the GPU spends ~80 % of its ~345 ms per micro-batch in large bf16 matmuls and "
                 "causal flash attention. The 2 workers only slice 4,097-token windows out of a memory-mapped "
                 "shard, and the only host synchronization is the once-a-second loss read. Nothing needs "
                 "changing; the remaining non-matmul time (LayerNorm/GELU/residual traffic ~46 ms, the fp32 "
                 "cross entropy ~8 ms, autocast's per-micro-batch weight casts and fp32 gradient accumulation "
                 "~11 ms) is spread over many ops, none worth 10 %.",
        "expected_gain": "none (under 1.1x for any change): a micro-batch is 6 x 1.39B x 16,384 = 136 TFLOP of matmuls "
                         "(~220 ms at ~620 TFLOPS), 19.2 TFLOP of causal flash attention over 4,096 tokens (16 "
                         "layers x 4 sequences x 86 GFLOP forward x 3.5, ~55 ms), ~200 bytes per hidden unit per "
                         "token and layer of fp32 residual, LayerNorm, casts, the attention-output transpose and "
                         "GELU traffic (137 GB, ~46 ms), the fp32 cross entropy over 16,384 x 50,304 logits (~25 "
                         "GB, ~8 ms), the bf16 weight casts and fp32 gradient accumulation (24 bytes x 1.4B = 34 "
                         "GB, ~11 ms) and a quarter of a fused AdamW step plus clipping (~5 ms): ~345 ms, ~11.6 "
                         "sequences/s. Workers: 4 windows per 345 ms, each a ~50 us slice, so 8 workers change "
                         "nothing (1.00x). torch.compile cannot touch the matmuls, flash attention or weight casts; "
                         "fusing about half of the 46 ms of elementwise work and the cross entropy saves ~25 ms: "
                         "~1.08x. Accumulating 8 micro-batches halves the ~18 ms optimizer-plus-clipping share "
                         "(~2.3 ms per micro-batch): ~1.01x. Not offered as changes: micro-batch 8 would need ~95 GB "
                         "(not on an 80 GB H100) for ~1.02x; pure bf16 weights would save the casts and some "
                         "residual traffic (~24 ms, ~1.07x) at the cost of bf16 optimizer updates.",
    },
]
