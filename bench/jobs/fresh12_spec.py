"""The fresh12 jobs: how to run each as-is on one H100/H200, the change that fixes it (or, for the
healthy control, the changes a false alarm would most likely name), and what a right diagnosis
says. One literal ``SPEC`` list, readable with ``ast.literal_eval``. The GPU figures were reasoned out,
not measured: no GPU was at hand when the set was written."""

SPEC = [
    {
        "name": "fresh12-torch-meshgraphnet-deterministic-algorithms",
        "framework": "torch",
        "script": "fresh12_torch_meshgraphnet_deterministic.py",
        "args": [],
        "tiny_args": [],
        "changes": [
            {
                "text": "Drop the reproducibility switch for training runs: keep the seeds but do not call "
                        "torch.use_deterministic_algorithms(True) (nor set CUBLAS_WORKSPACE_CONFIG), so that "
                        "index_add_ and the backward of index_select use the default atomic-add kernels "
                        "instead of the sort-based index_put_(accumulate=True) route.",
                "args": ["--no-deterministic"],
                "label": "torch.use_deterministic_algorithms(True) in a scatter-heavy GNN: every index_add_ (45 a step) sorted and summed serially instead of atomically",
            },
        ],
        "truth": "The template's seed_everything(deterministic=True) calls torch.use_deterministic_algorithms(True). "
                 "On CUDA, index_add_ then takes its deterministic branch: it multiplies the source by alpha "
                 "(a copy) and calls index_put_(..., accumulate=True), which sorts the 307,000 receiver "
                 "indices (cub radix sort plus index bookkeeping) and runs the sorted-accumulation kernel, "
                 "where a warp walks each run of equal indices serially. The MeshGraphNet does this 45 times "
                 "a step: the receiver sum in each of the 15 message-passing layers, and in the backward the "
                 "two index_select gathers per layer (senders, receivers), whose gradient is "
                 "zeros().index_add_(). Each such op costs ~0.5-0.8 ms against ~0.05-0.1 ms for the atomic "
                 "kernel (a public measurement of the same switch on scatter_add_: 605 us against 27 us). The "
                 "rest of the step (narrow 128-wide MLP GEMMs over 307k edges, concatenations, LayerNorms, "
                 "residuals: ~40 ms of mostly memory-bound work) is unaffected; the GPU is busy throughout, "
                 "just doing slower kernels. CUBLAS_WORKSPACE_CONFIG=:4096:8 costs little here, and no cuDNN "
                 "op is used.",
        "expected_gain": "about 1.5x (1.25x to 2.2x): fixed, a step (2 meshes, 51,200 nodes, 307,200 edges) is "
                         "~2.6 TFLOP of K=128-384 bf16 GEMMs over edge and node rows (~10 ms at ~250 TFLOPS) "
                         "plus ~7 GB per layer of gathers, concatenations, ReLUs, fp32 LayerNorm outputs and "
                         "residuals forward and backward (15 layers, ~105 GB, ~30 ms), the 45 atomic index_adds "
                         "(~3 ms) and the encoders, decoder, loss and fused AdamW (~2 ms): ~45 ms, ~44 meshes/s. "
                         "As-is the 45 index_adds cost ~0.6 ms each (~27 ms) instead of ~0.07 ms: ~70 ms, ~29 "
                         "meshes/s. 70 / 45 = 1.55x. The CPU issues ~1,500 kernels a step (~12 ms), far ahead.",
    },
    {
        "name": "fresh12-torch-vit-needless-grad-checkpointing",
        "framework": "torch",
        "script": "fresh12_torch_vit_grad_checkpointing.py",
        "args": ["--batch", "192"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Turn gradient checkpointing off (grad_checkpointing=False): the ViT-B's activations at "
                        "batch 192 take ~15 GB, so keep them instead of recomputing every block's forward "
                        "during the backward.",
                "args": ["--no-grad-checkpointing"],
                "label": "activation (gradient) checkpointing on every block of a model whose activations fit easily: each forward runs twice",
            },
        ],
        "truth": "Every ViT block runs under torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) "
                 "(the config inherited from a ViT-g recipe). The forward keeps only each block's input; the "
                 "backward re-runs each block's forward (qkv, flash attention, projection, two LayerNorms, the "
                 "4x MLP with GELU, residuals) before differentiating it, so the GPU does ~4/3 of the FLOPs and "
                 "~4/3 of the elementwise traffic of a plain step. Nothing else is wrong: data and augmentation "
                 "are on the GPU, bf16 autocast, flash attention, fused AdamW; the GPU is busy all the time, "
                 "with a third of its work being the recomputation. Memory is not the constraint: without "
                 "checkpointing the saved activations are ~15 GB on an 80-141 GB GPU.",
        "expected_gain": "about 1.3x (1.2x to 1.4x): fixed, a step is 192 x 105 GFLOP = 20 TFLOP of bf16 matmuls "
                         "(~40 ms at ~500 TFLOPS; M = 37,800 tokens, K/N = 768-3,072), flash attention over 197 "
                         "tokens (~1 ms), LayerNorm/GELU/residual/bias traffic (~90 GB forward and backward, "
                         "~27 ms), augmentation, clipping and fused AdamW (~2 ms): ~70 ms, ~2,750 images/s. As-is "
                         "the recomputed forward adds its third of the matmuls (~13 ms) and of the elementwise "
                         "traffic (~9 ms) plus the checkpoint bookkeeping (<1 ms): ~93 ms, ~2,070 images/s. "
                         "93 / 70 = 1.33x.",
    },
    {
        "name": "fresh12-torch-sasrec-one-hot-item-input",
        "framework": "torch",
        "script": "fresh12_torch_sasrec_onehot_items.py",
        "args": ["--batch", "256"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Look the input items up in an nn.Embedding(num_items, hidden, padding_idx=0) instead of "
                        "nn.Linear(num_items, hidden, bias=False) applied to F.one_hot(seq, num_items).float(): "
                        "the same function, without materialising a 51,200 x 40,000 one-hot matrix every step.",
                "args": ["--embedding"],
                "label": "item ids one-hot encoded (F.one_hot + .float()) and multiplied by a Linear: ~50 GB of one-hot traffic and ~4 TFLOP of useless matmul per step",
            },
        ],
        "truth": "The item input layer is nn.Linear(40,000, 512) over F.one_hot(seq, 40,000).float(), a Keras "
                 "Dense-over-one-hot port. Per step of 256 x 200 positions the GPU writes a 51,200 x 40,000 "
                 "int64 zeros tensor and scatters the ones (16.4 GB), converts it to fp32 (reads 16.4, writes "
                 "8.2 GB), autocast casts that to bf16 for the Linear (reads 8.2, writes 4.1 GB, kept for the "
                 "backward), multiplies it by the 40,000 x 512 weight (2.1 TFLOP) and, in the backward, forms "
                 "the weight gradient as another 51,200 x 40,000 x 512 GEMM (2.1 TFLOP); the scoring also "
                 "gathers item vectors from the transposed Linear weight (strided rows). The GPU is busy, all "
                 "of it memory traffic and matmul work that an embedding gather (51,200 rows of 512) and its "
                 "sorted row-accumulation backward replace. The transformer itself (4 blocks of width 512, "
                 "flash attention) and SASRec's sampled-negative BCE loss are ~14 ms a step.",
        "expected_gain": "about 3x (2x to 4.5x): fixed, 4 blocks x 1.57M parameters over 51,200 tokens are 1.9 "
                         "TFLOP (~5 ms), causal flash attention with dropout over 200 tokens (~1 ms), LayerNorm/"
                         "GELU/dropout/residual traffic (~12 GB, ~4 ms), the positive/negative item gathers, dot "
                         "products, BCE and the embedding backward (~2 ms), fused AdamW over 27M parameters (~0.5 "
                         "ms): ~13 ms, ~19,000 users/s. As-is add zeros+scatter of the int64 one-hot (16.4 GB "
                         "written, ~5 ms), .float() (24.6 GB, ~7 ms), autocast's bf16 copy (12.3 GB, ~3.5 ms), "
                         "the forward and weight-gradient GEMMs (4.2 TFLOP, ~8 ms) and the strided gathers from "
                         "the transposed weight (~1 ms): ~38 ms, ~6,700 users/s (on an H100; an H200's faster "
                         "memory puts it nearer 33 ms). 38 / 13 = 2.9x.",
    },
    {
        "name": "fresh12-torch-alibi-bias-built-on-cpu",
        "framework": "torch",
        "script": "fresh12_torch_dna_alibi_cpu_bias.py",
        "args": ["--batch", "16"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Build the ALiBi bias once, on the GPU (a non-persistent buffer for the maximum context, "
                        "sliced per call), instead of calling alibi_bias() in every attention forward, where "
                        "torch.arange without a device puts it on the CPU and .to(q.device) copies it over.",
                "args": ["--cached-bias"],
                "label": "ALiBi attention bias rebuilt on the CPU in every layer's forward and copied to the GPU with a blocking pageable copy (12 per step)",
            },
        ],
        "truth": "Each of the 12 ALiBiAttention modules calls alibi_bias(12, 1024) in forward: torch.arange "
                 "without a device, so the distances, the slope product, the causal masked_fill (12.6M "
                 "elements, 50 MB fp32 each pass) run on the CPU, then .to(q.device, q.dtype) converts to bf16 "
                 "on the CPU and copies 25 MB from pageable memory with non_blocking=False, i.e. a "
                 "cudaMemcpyAsync followed by a stream synchronize. So in every layer of every forward the "
                 "main thread spends several milliseconds building the bias while the GPU has nothing queued, "
                 "then waits for the GPU to drain the layers queued before the copy: the forward is "
                 "serialised layer by layer with host work, and the GPU idles most of the step. The backward "
                 "(no bias work) runs at full speed. Everything else is ordinary (bf16 autocast, "
                 "memory-efficient SDPA with the bias, fused AdamW, data on the GPU).",
        "expected_gain": "about 4x (2.5x to 6x): fixed, a step of 16 x 1,024 tokens is 8.7 TFLOP of matmuls (~17 "
                         "ms), memory-efficient attention with a bias over all 1,024 x 1,024 tiles (~2.2 TFLOP and "
                         "~15 GB of bias reads forward and backward, ~14 ms), LayerNorm/GELU/residual traffic "
                         "(~30 GB, ~10 ms), cross entropy, clipping and fused AdamW (~3 ms): ~45 ms, ~360 "
                         "windows/s. As-is each of the 12 layers adds the CPU bias build (5 passes over 12.6M "
                         "elements with the 16 host cores, ~6-12 ms; ~70 ms on one core, measured) and a 25 MB "
                         "pageable copy (~2-3 ms), with the GPU idle meanwhile: 12 x ~11 ms = ~130 ms on top of "
                         "the ~45 ms of GPU work: ~175 ms, ~90 windows/s. 175 / 45 = 3.9x.",
    },
    {
        "name": "fresh12-torch-healthy-clip-vit-large",
        "framework": "torch",
        "script": "fresh12_healthy_clip_vitl.py",
        "args": ["--batch", "128", "--workers", "6"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Use more DataLoader workers: num_workers=12.",
                "args": ["--workers", "12"],
                "label": "more DataLoader workers (false alarm)",
            },
            {
                "text": "Train with a larger batch (192 pairs) to use the GPU better.",
                "args": ["--batch", "192"],
                "label": "a larger batch (false alarm)",
            },
        ],
        "truth": "Healthy: CLIP with a ViT-L/14 image tower (24 x width 1,024, 257 tokens) and a 12-layer text "
                 "tower over 77 tokens, bf16 autocast, flash attention through SDPA (is_causal for the text), "
                 "open_clip's fused LayerNorm cast back to a bf16 residual stream, fused AdamW, batches of 128 "
                 "pairs. ~75 % of the GPU's ~150 ms step is large bf16 matmuls (M = 32,900 image tokens, K/N "
                 "1,024-4,096) and flash attention. The 6 workers slice uint8 crops from a memory-mapped shard "
                 "(~20 ms per 128-image batch each, one batch every ~3.5 ms together), the batch is pinned and "
                 "copied asynchronously, normalisation is on the GPU, and the only host sync is the "
                 "once-a-second loss read. Nothing needs changing.",
        "expected_gain": "none (under 1.1x for any change): a step is 128 x (3 x 162 GFLOP image + 3 x 13 GFLOP "
                         "text) = 67 TFLOP of matmuls (~105 ms at ~640 TFLOPS on an H100, ~95 ms on an H200), "
                         "flash attention (~3 ms), LayerNorm/cast/GELU/residual traffic (~24 layers x 32,900 "
                         "tokens x 1,024 x ~150 bytes = ~120 GB, ~35 ms), the contrastive loss, clipping and "
                         "fused AdamW over 430M parameters (~4 ms): ~150 ms, ~850 pairs/s. Workers: a batch "
                         "every ~3.5 ms from 6, against one per 150 ms needed, so 12 workers change nothing "
                         "(1.00x). Batch 192 (~50 GB of activations, fits) makes the same GEMMs 1.5x taller; they "
                         "are already large, and the per-step fixed costs (optimizer ~3 ms, launches hidden "
                         "behind the GPU) shrink from ~2 % to ~1.5 %: ~1.01x. Not offered: torch.compile could "
                         "fuse part of the ~35 ms of elementwise traffic (~1.05-1.1x), not a problem to fix.",
    },
]
