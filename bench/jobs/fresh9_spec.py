"""The fresh9 jobs: how to run each as-is on one H100, the change that fixes it (or, for the
healthy control, the changes a false alarm would most likely name), and what a right diagnosis
says. One literal ``SPEC`` list, readable with ``ast.literal_eval``."""

SPEC = [
    {
        "name": "fresh9-torch-randperm-per-step",
        "framework": "torch",
        "script": "fresh9_randperm_sampler.py",
        "args": ["--batch", "1024"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Draw one permutation of the 2.5M rows per epoch, on the GPU (torch.randperm(n, device='cuda') "
                        "with a generator seeded by seed + epoch), and slice consecutive batches out of it, instead "
                        "of reseeding a CPU generator and running torch.randperm over all 2.5M rows every step.",
                "args": ["--epoch-permutation"],
                "label": "a full 2.5M-element torch.randperm on the CPU every step to pick 1,024 rows",
            },
        ],
        "truth": "The table lives on the GPU, but the batch indices are drawn on the CPU: to make batches "
                 "reproducible after a restart, every step reseeds a CPU torch.Generator with seed + step and "
                 "calls torch.randperm(2_500_000, generator=g)[:1024]. randperm on the CPU is a single-threaded "
                 "Fisher-Yates shuffle of a 20 MB int64 array, about 100 ms, only to keep 1,024 of its entries "
                 "(0.04 %). The main thread spends nearly the whole step in it; the GPU finishes the ~18 ms step "
                 "that was queued and then idles until the next indices arrive. One permutation per epoch on the "
                 "GPU (or sampling with torch.randint on the GPU) fixes it; the batches stay reproducible.",
        "expected_gain": "about 5x (3x to 9x): the FT-Transformer step is 1,024 rows x 65 tokens = 66,560 tokens "
                         "through 6 pre-LN blocks of width 256 (0.66M parameters each): 6 x 3.9M x 66,560 = 1.6 TFLOP "
                         "of matmuls at width 256 (~5 ms at ~300 TFLOPS), ~0.1 TFLOP of attention over 65 tokens (~1 "
                         "ms), ~300 bytes per hidden unit per token and layer of LayerNorm, cast, dropout, GELU, "
                         "residual and head-reshaping traffic (31 GB, ~11 ms), and a negligible optimizer over 4M "
                         "parameters: ~18 ms on the GPU with ~6 ms of CPU launching (~700 ops) running ahead, ~57k "
                         "rows/s. torch.randperm(2.5M) measured on the development CPU: 44 ns per element with one "
                         "thread (110 ms; 55-65 ns per element under load), so 70-160 ms on a server core, plus the "
                         "~6 ms of launches that cannot overlap with it: ~100 ms per step, ~10k rows/s. 100 / 18 = "
                         "~5.5x; the fixed run pays ~1 ms per epoch of 2,441 steps for the GPU permutation.",
    },
    {
        "name": "fresh9-torch-profiler-cycles",
        "framework": "torch",
        "script": "fresh9_profiler_cycles.py",
        "args": ["--batch", "48", "--workers", "6"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Give the profiler schedule repeat=1 (profile one wait/warmup/active cycle, then stop), as "
                        "in the PyTorch tutorial.",
                "args": ["--profile-cycles", "1"],
                "label": "torch.profiler schedule without repeat=1: records 3 of every 5 steps with shapes, memory and stacks, exports a trace per cycle, forever",
            },
            {
                "text": "Remove the torch.profiler.profile context from the training loop.",
                "args": ["--no-profile"],
                "label": "no profiler around the loop",
            },
        ],
        "truth": "A torch.profiler.profile left around the training loop from a tuning session, with the "
                 "tutorial's schedule(wait=1, warmup=1, active=3) but without repeat=1, so the default repeat=0 "
                 "makes it cycle for ever. In every cycle of 5 steps, 4 (warmup and active) run under the "
                 "profiler with record_shapes, profile_memory and with_stack: each of the ~10,000 aten ops per step "
                 "records its shapes and Python stack, the Python tracer hooks every Python call (~8,000 per "
                 "step), each allocation is an event (~5,000 per step) and CUPTI records every launch and kernel. "
                 "At the end of each cycle the profiler synchronizes the GPU, stops (post-processing ~80,000 "
                 "events) and the handler writes a ~30 MB Chrome trace JSON, then the next cycle restarts "
                 "Kineto. The step is bound by the CPU (profiler bookkeeping and trace export); the GPU idles "
                 "for most of each cycle. repeat=1 (or no profiler) fixes it.",
        "expected_gain": "about 5x (2.5x to 8x): healthy, a step is 48 clips x 513 tokens = 24,624 tokens through "
                         "a ViT-S-sized encoder (12 blocks of 1.77M parameters): 6 x 21M x 24,624 = 3.1 TFLOP of "
                         "matmuls (~7 ms at ~450 TFLOPS for width 384), 0.8 TFLOP of flash attention over 513 tokens "
                         "(~3 ms), ~250 bytes per hidden unit per token and layer of LayerNorm, cast, GELU and "
                         "residual traffic (28 GB, ~10 ms), under 1 ms of fused AdamW and clipping: ~20 ms on the "
                         "GPU with ~9 ms of CPU launching ahead, ~2,400 clips/s. Profiled, measured on the "
                         "development CPU with the same 12 blocks (tiny width): 3 active steps make 30,870 cpu_op, "
                         "23,312 python_function and 15,169 memory events and a 25 MB trace whose export alone took "
                         "~290 ms. At ~3-5 us of bookkeeping per op, ~1 us per Python call and allocation, and ~3 us "
                         "of CUPTI per launch, each warmup or active step costs ~40-60 ms of CPU, above the GPU's 20 "
                         "ms; the cycle end (synchronize, stop and post-process ~80k events, export ~30 MB of JSON, "
                         "restart Kineto) ~300-600 ms. A cycle of 5 steps: 20 + 4 x 50 + 450 = ~670 ms against 100 "
                         "ms healthy: ~6.5x; with the cheaper ends of the ranges ~3x.",
    },
    {
        "name": "fresh9-timm-nchw-amp",
        "framework": "timm",
        "script": "fresh9_timm_nchw.py",
        "args": ["--batch", "256", "--workers", "10"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Put the model and every input batch in channels_last (NHWC) memory format: "
                        "model.to(memory_format=torch.channels_last) and images.contiguous(memory_format="
                        "torch.channels_last), timm's --channels-last.",
                "args": ["--channels-last"],
                "label": "conv net under bf16 autocast in NCHW: cuDNN transposes every conv's inputs and outputs to and from NHWC",
            },
        ],
        "truth": "ResNet-50 is trained under bf16 autocast in PyTorch's default NCHW (contiguous) memory format. "
                 "The tensor-core convolution kernels cuDNN uses on Hopper work on NHWC data, so for each of the 53 "
                 "convolutions, in the forward pass and in both backward passes (data and weight gradients), cuDNN "
                 "runs extra nchwToNhwc / nhwcToNchw transpose kernels over the activations and gradients on "
                 "either side of the convolution. These memory-bound transposes move about as many bytes as the "
                 "batch norms and ReLUs, and more time than the 1x1 convolutions themselves take. The GPU is "
                 "busy, a third of the time with layout conversions. channels_last for the model and the "
                 "inputs (timm's --channels-last) removes them.",
        "expected_gain": "about 1.6x (1.35x to 2x): ResNet-50 at 224 pixels is 8.2 GFLOP per image forward, 24.6 GFLOP "
                         "forward and backward, 6.3 TFLOP per 256-image step (~22 ms of cuDNN convolutions in NHWC "
                         "at ~290 TFLOPS); its convolutions output ~10.8M activations per image, each followed by a "
                         "batch norm (and mostly a ReLU and a residual add): ~28 bytes per activation over forward "
                         "and backward, 77 GB per step (~30 ms); SGD over 25.6M parameters and the loss are under 1 "
                         "ms: ~55 ms, ~4,600 images/s (workers: ~25 ms per 256-image batch each, 10 of them, far "
                         "ahead). In NCHW, each convolution's forward transposes its input and output (2 bytes read "
                         "+ 2 written per element, ~21.6M elements per image), the data-gradient pass its output "
                         "gradient and input gradient, and the weight-gradient pass its input and output gradient: "
                         "~3 x 86 MB = 260 MB per image, 66 GB per step, ~30 ms at ~2.2 TB/s; ~85 ms per step, "
                         "~3,000 images/s. 85 / 55 = ~1.55x, more where cuDNN's NCHW choices are worse kernels "
                         "rather than transposes (the 7x7 stem, strided 1x1 downsampling).",
    },
    {
        "name": "fresh9-transformers-full-vocab-logits",
        "framework": "transformers",
        "script": "fresh9_full_vocab_logits.py",
        "args": ["--batch", "32", "--seq-len", "256"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Call the model with logits_to_keep=1, so the LM head (262,144 x 640) and the fp32 "
                        "log-softmax run on the last position only, the only one the loss reads.",
                "args": ["--logits-to-keep", "1"],
                "label": "LM head and fp32 log-softmax over the full vocabulary at all 256 positions; only the last is used",
            },
        ],
        "truth": "The classifier only uses the next-token log-probabilities at the last position of each "
                 "prompt, but the model is called without logits_to_keep, so LlamaForCausalLM applies its "
                 "262,144-token LM head to all 32 x 256 = 8,192 positions (a 4.3 GB bf16 logits tensor), and the "
                 "job then upcasts all of it to fp32 (8.6 GB) and takes the log-softmax over the whole vocabulary "
                 "at every position before selecting position 255. The backward pass materializes an 8.6 GB "
                 "zero-filled gradient for the selection, runs the log-softmax and cast backward over all of it, "
                 "and then the head's data- and weight-gradient GEMMs over all 8,192 positions. The GPU is busy, "
                 "more than half the time on logits nobody reads. logits_to_keep=1 (or slicing the hidden states "
                 "to the last position before the head) fixes it; the loss is unchanged.",
        "expected_gain": "about 2.2x (1.7x to 2.8x): the body of the model is 18 blocks of 5.6M parameters (width 640, "
                         "4 query heads and 1 key-value head of 256, MLP 2,048): 6 x 100M x 8,192 = 4.9 TFLOP of "
                         "narrow matmuls (~12 ms at ~400 TFLOPS), attention over 256 tokens (<1 ms), ~570 bytes per "
                         "hidden unit per token and layer of HF's fp32 RMSNorms, autocast casts, rotary embeddings, "
                         "SiLU-gating and residual traffic over forward and backward (54 GB, ~20 ms), the "
                         "embedding gradient into the 168M-row tied table (~1.5 ms), fused AdamW over 268M "
                         "parameters (7.5 GB, ~3 ms) and clipping (~1 ms): ~38 ms, ~840 prompts/s. The full-vocabulary "
                         "head adds 3 x 2 x 8,192 x 262,144 x 640 = 8.2 TFLOP (~15 ms at ~550 TFLOPS) and the logits "
                         "traffic: the fp32 upcast (4.3 GB read, 8.6 GB written), the log-softmax (two reads and a "
                         "write of 8.6 GB), the zero-filled selection gradient (8.6 GB), its backward (three reads "
                         "and a write of 8.6 GB) and the cast back (8.6 GB read, 4.3 GB written): ~100 GB, ~37 ms at "
                         "~2.7 TB/s. ~90 ms per step, ~355 prompts/s. 90 / 38 = ~2.4x.",
    },
    {
        "name": "fresh9-lightning-healthy-protein-mlm",
        "framework": "lightning",
        "script": "fresh9_healthy_protein_mlm.py",
        "args": ["--batch", "8", "--context", "1024", "--workers", "4"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Use more DataLoader workers: num_workers=8.",
                "args": ["--workers", "8"],
                "label": "more DataLoader workers (false alarm)",
            },
            {
                "text": "Double the batch to 16 crops per step (GPU memory is about half used).",
                "args": ["--batch", "16"],
                "label": "larger batch (false alarm)",
            },
            {
                "text": "Wrap the LightningModule in torch.compile.",
                "args": ["--compile"],
                "label": "torch.compile (false alarm)",
            },
        ],
        "truth": "Healthy: Lightning with bf16-mixed precision keeps the GPU busy with a 1.26B-parameter "
                 "bidirectional encoder step (width 2,560, 16 blocks, no biases or dropout, flash attention over "
                 "1,024 tokens, fused AdamW) of ~150 ms, mostly large matmuls (8,192 rows by widths 2,560 / 7,680 "
                 "/ 10,240); the 4 workers only cut 1,024-byte crops out of an in-memory array and mask 15 % of "
                 "them, and nothing in the loop synchronizes with the host besides the once-a-second loss read. "
                 "Nothing needs changing.",
        "expected_gain": "none (under 1.1x for any change): a step is 6 x 1.26B x 8,192 = 61.9 TFLOP of matmuls (~100 "
                         "ms at ~620 TFLOPS), 4.8 TFLOP of non-causal flash attention (~10 ms), ~184 bytes per hidden "
                         "unit per token and layer of LayerNorm, cast, GELU and residual traffic (62 GB, ~22 ms), "
                         "~13 ms of fused AdamW over 1.26B fp32 parameters (35 GB), and a negligible 33-token head "
                         "and loss: ~145 ms, ~55 crops/s. Workers: 8 crops per 145 ms, each ~0.1 ms of numpy, so 8 "
                         "workers change nothing (1.00x). Batch 16: only the ~13 ms of optimizer is paid per step: "
                         "145 / 8 = 18.1 ms per crop against (2 x 132 + 13) / 16 = 17.3 ms, ~1.05x; memory grows from "
                         "~36 GB to ~50 GB. torch.compile leaves the matmuls and flash attention as they are and can "
                         "only fuse the elementwise work: saving ~40 % of its ~22 ms is ~9 ms (~1.06x).",
    },
]
