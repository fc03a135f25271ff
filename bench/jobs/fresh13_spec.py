"""The fresh13 jobs: how to run each as-is on one H100/H200, the change that fixes it (or, for the
healthy control, the changes a false alarm would most likely name), what a right diagnosis says, and the
problem's class. One literal ``SPEC`` list, readable with ``ast.literal_eval``. The GPU figures were
reasoned out, not measured: no GPU was at hand when the set was written."""

SPEC = [
    {
        "name": "fresh13-torchvision-multitask-backward-per-task",
        "framework": "torchvision",
        "class": "backward-per-task-loss",
        "script": "fresh13_tv_multitask_per_task_backward.py",
        "args": ["--batch", "16"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Call backward once, on the weighted sum of the three task losses, instead of once per "
                        "task loss with retain_graph=True: PCGrad is off, so the per-task gradients are only "
                        "summed in .grad anyway, and one backward gives the same gradients while running the "
                        "shared ResNet-50's backward once.",
                "args": ["--single-backward"],
                "label": "one loss.backward(retain_graph=True) per task loss: the shared dilated ResNet-50 encoder's backward runs three times a step",
            },
        ],
        "truth": "After one forward of the shared dilated ResNet-50 (output stride 8) and the three DeepLabHead "
                 "decoders, the step calls backward three times, on the semantic, depth and normal losses, "
                 "with retain_graph=True for the first two (the PCGrad code path without the projection). Each "
                 "backward starts at its task's loss, goes through that task's upsampling and ASPP head and then "
                 "through the whole encoder: every conv's input and weight gradients, every BatchNorm and ReLU "
                 "backward (layer3 and layer4 run at 36 x 48 with 1,024-2,048 channels), and the encoder's "
                 "weight gradients are added into .grad three times. The result is the gradient of the summed "
                 "loss, which one backward gives. Per frame the encoder's backward is ~168 GFLOP (twice its "
                 "~84 GFLOP forward); each head is ~54 GFLOP forward and ~108 backward. So the GPU does ~1,074 "
                 "GFLOP per frame instead of ~738, plus two extra passes of the encoder's BatchNorm/ReLU/"
                 "residual backward traffic. The GPU is busy throughout (bf16 autocast, channels_last, cuDNN "
                 "benchmark on a fixed size, data and augmentation on the GPU, the losses read once a second); "
                 "a third of its work repeats the encoder's backward. Activation memory is the same as for one "
                 "backward (retain_graph keeps what the first pass would keep anyway, until the last pass).",
        "expected_gain": "about 1.65x (1.4x to 1.9x): fixed, a step of 16 frames of 288 x 384 is 11.8 TFLOP of "
                         "bf16 convolutions (~34 ms at ~350 TFLOPS effective for these dilated 3x3 and 1x1 convs "
                         "in channels_last), the encoder's BatchNorm/ReLU/residual traffic (~80M activations per "
                         "frame, ~5 passes forward and ~10 backward at 2 bytes: ~39 GB, ~13 ms), the heads' "
                         "traffic, the bilinear upsampling and the three losses (~2 ms) and SGD over 72M "
                         "parameters (~0.5 ms): ~50 ms, ~320 frames/s. As-is the two extra encoder backwards add "
                         "5.4 TFLOP (~15 ms) and ~52 GB of BatchNorm/ReLU backward traffic (~17 ms): ~82 ms, ~195 "
                         "frames/s. 82 / 50 = 1.65x. The host issues ~1,500-2,500 kernels a step (~15-25 ms), "
                         "behind the GPU in both variants.",
    },
    {
        "name": "fresh13-torch-patchtst-whole-series-rescaled-per-batch",
        "framework": "torch",
        "class": "whole-dataset-transform-per-batch",
        "script": "fresh13_torch_sensor_forecast_rescale.py",
        "args": ["--batch", "2048"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Z-score the readings once, when the data set is built (in place, with the "
                        "training-span statistics), and only gather the windows in sample(); or gather first and "
                        "scale the 2,048 x 608 window values. Either way, not (readings - mean) / std over the "
                        "whole 2,000,000 x 1,024 matrix on every batch.",
                "args": ["--scale-once"],
                "label": "the whole 8.2 GB readings matrix z-scored ((x - mean) / std) on every batch before 2,048 windows are cut out of it: ~33 GB of elementwise traffic per step",
            },
        ],
        "truth": "SensorWindows.sample() computes scaled = (self.readings - self.mean) / self.std over the whole "
                 "[2,000,000 x 1,024] fp32 readings matrix (2.05 billion values) on every call and then gathers "
                 "2,048 windows of 608 values (1.2 million) from the result. That is two broadcast elementwise "
                 "kernels per step, each reading 8.2 GB and writing 8.2 GB (~33 GB of HBM traffic), and two "
                 "8.2 GB temporaries from the caching allocator (reused, so no cudaMalloc after the first step). "
                 "The model step itself (PatchTST with RevIN over 2,048 x 64 patch tokens of width 128, 3 layers, "
                 "flash attention, bf16 autocast, fused AdamW) is ~7 ms of GPU work. The GPU is busy all the "
                 "time, with no host stall: the CPU queues the step far ahead; the time goes to the two "
                 "memory-bound kernels at the start of each step, which take more than half of it.",
        "expected_gain": "about 2.5x (1.8x to 3.5x): fixed, a step is ~0.32 TFLOP of narrow bf16 matmuls "
                         "(K/N 128-384 over 131,072 tokens, ~2 ms), flash attention over 64-token sequences "
                         "(~0.3 ms), LayerNorm/GELU/dropout/residual traffic (~11 GB, ~4 ms on an H100), RevIN, "
                         "patching, the flatten head, loss, clipping and AdamW (~0.5 ms): ~7 ms, ~290,000 "
                         "windows/s; ~300 kernels (~3-4 ms of host time) keep up. As-is the z-scoring adds ~33 GB "
                         "at ~2.9 TB/s: ~11.5 ms, so ~18.5 ms, ~110,000 windows/s: 2.6x on an H100; on an H200 "
                         "(~4.3 TB/s) ~5.5 ms against ~13 ms: 2.4x.",
    },
    {
        "name": "fresh13-hf-roberta-cuda-launch-blocking",
        "framework": "transformers",
        "class": "cuda-launch-blocking",
        "script": "fresh13_hf_roberta_launch_blocking.py",
        "args": ["--batch", "32"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Remove the leftover os.environ['CUDA_LAUNCH_BLOCKING'] = '1' at the top of the script (a "
                        "debugging aid for locating a device-side assert), so that kernel launches are "
                        "asynchronous again.",
                "args": ["--no-launch-blocking"],
                "label": "CUDA_LAUNCH_BLOCKING=1 left set in the script: every kernel launch and copy synchronous, the host's overheads serialised with the GPU's work",
            },
        ],
        "truth": "The script sets CUDA_LAUNCH_BLOCKING=1 in its environment before torch initialises CUDA, so the "
                 "CUDA runtime runs every kernel launch and every memcpy synchronously: cudaLaunchKernel returns "
                 "only once the kernel has finished. A Trainer step issues ~1,000 kernels (for each of the 12 "
                 "RoBERTa layers: the q/k/v, output and MLP GEMMs with fused bias, SDPA flash attention with "
                 "dropout, dropouts, residual adds, LayerNorms and autocast's casts, forward and backward; the "
                 "embedding backward; clipping; the fused AdamW; the Trainer's per-step isnan check) and "
                 "~11-12 ms of host work (HF modules' Python, autocast dispatch, the autograd engine, the "
                 "Trainer's loop and callbacks, fetching the pinned batch). Without the variable the host runs "
                 "ahead and the GPU executes back to back (~19 ms of work a step); with it, host work and "
                 "GPU work no longer overlap, and each kernel adds a launch-to-completion round trip "
                 "(~5-8 us), so the GPU idles between every two kernels for the host's overhead of the next "
                 "op. Nothing else is wrong: bf16 autocast, SDPA, full-length sequences (no padding), fused "
                 "AdamW, 2 pinned workers that keep up easily.",
        "expected_gain": "about 1.7x (1.4x to 2.3x): fixed, a step of 32 x 256 tokens is 4.2 TFLOP of bf16 GEMMs "
                         "(~9 ms), flash attention (~0.3 ms), LayerNorm/dropout/GELU/residual/cast traffic "
                         "(~18 GB forward and backward, ~6.5 ms), the 50,265 x 768 embedding gradient (~1 ms), "
                         "clipping and fused AdamW over 125M parameters (~2 ms): ~19 ms of GPU work, ahead of "
                         "~12 ms of host work, plus ~2 ms of bubbles around the Trainer's per-step isnan sync: "
                         "~21 ms, ~1,500 tickets/s. As-is ~19 ms + ~12 ms + ~1,000 x ~6 us = ~37 ms, ~860 "
                         "tickets/s. 37 / 21 = 1.75x.",
    },
    {
        "name": "fresh13-torch-gcn-dense-adjacency",
        "framework": "torch",
        "class": "dense-adjacency-matmul",
        "script": "fresh13_torch_gcn_dense_adjacency.py",
        "args": ["--nodes", "40000"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Keep the normalised propagation matrix D^-1/2 (A + I) D^-1/2 as a sparse (COO/CSR) tensor "
                        "with its ~600,000 non-zeros and aggregate with torch.sparse.mm (cuSPARSE SpMM), "
                        "instead of a dense 40,000 x 40,000 fp32 matrix multiplied with adj @ h.",
                "args": ["--sparse-adjacency"],
                "label": "GCN propagation matrix stored dense (40,000 x 40,000, 6.4 GB) and applied with dense GEMMs: 3.5 TFLOP a step over 0.04 %-dense data",
            },
        ],
        "truth": "propagation_matrix() builds D^-1/2 (A + I) D^-1/2 of the 40,000-node citation graph as a dense "
                 "fp32 tensor (1.6 billion entries, 6.4 GB, ~600,000 of them non-zero) and each of the 3 GCN "
                 "layers aggregates with adj @ (h @ W). In the forward that is three GEMMs with M = K = 40,000 "
                 "and N = 256, 256 and 40 (1.77 TFLOP in TF32); in the backward autograd computes adj.T @ grad "
                 "for each (another 1.77 TFLOP; adj itself needs no gradient). Each 256-wide product is "
                 "compute-bound at ~2.6 ms on an H100's TF32 tensor cores; each 40-wide one streams the 6.4 GB "
                 "matrix for ~2 ms. The rest of the step (the feature linears, BatchNorm, ReLU, dropout, cross "
                 "entropy on 21,600 training nodes, fused AdamW over 110k parameters) is well under 1 ms. The "
                 "GPU is busy throughout, almost entirely in these six GEMMs multiplying zeros; a sparse "
                 "product does the same aggregation with ~1.3 GFLOP.",
        "expected_gain": "about 6x (3.5x to 9x): as-is the six dense products take ~4 x 2.6 + 2 x 2.1 = ~14.6 "
                         "ms on an H100 (~13.5 on an H200, whose faster memory helps the two 40-wide ones) plus "
                         "~0.6 ms for everything else: ~15 ms per full-batch step, ~1.4M training nodes/s. Fixed, "
                         "the six cuSPARSE SpMMs over 600,000 non-zeros (the 10 MB-40 MB feature matrices stay in "
                         "L2), the COO-to-CSR conversions and the backward's transpose-and-coalesce (a sort of "
                         "600,000 indices) take ~1.5 ms, and with the rest the step is ~2.1 ms of GPU work against "
                         "~1.5-2 ms of host work for ~100 kernels: ~2.5 ms, ~8.6M nodes/s. 15 / 2.5 = 6x.",
    },
    {
        "name": "fresh13-lightning-healthy-timm-convnext",
        "framework": "lightning",
        "class": "healthy",
        "script": "fresh13_healthy_lightning_convnext.py",
        "args": ["--batch", "256", "--workers", "8"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Use more DataLoader workers: num_workers=12.",
                "args": ["--workers", "12"],
                "label": "more DataLoader workers (false alarm)",
            },
            {
                "text": "Train with a larger batch (384 photos) to use the GPU better.",
                "args": ["--batch", "384"],
                "label": "a larger batch (false alarm)",
            },
        ],
        "truth": "Healthy: a timm ConvNeXt-Tiny (28M parameters) in a LightningModule, precision='bf16-mixed', "
                 "channels_last model and inputs, fused AdamW, clipping through gradient_clip_val, batches of "
                 "256 crops of 224 px. Each step is ~6.9 TFLOP of convolutions and pointwise-MLP matmuls plus "
                 "the depthwise 7x7 convs, LayerNorms and GELUs over 4x-expanded features, which keep the GPU "
                 "busy ~150-180 ms per step on an H100. The 8 persistent workers cut uint8 crops from frames in "
                 "host memory (~90 ms per batch each: one batch every ~11 ms together, against one per ~160 ms "
                 "needed), Lightning pins the batch and copies it asynchronously, normalisation runs on the GPU "
                 "in on_after_batch_transfer, nothing goes through self.log and the progress bar is off, so "
                 "there is no per-step host sync (the loss is read once a second). Nothing needs changing.",
        "expected_gain": "none (under 1.1x for any change): ConvNeXt-T trains at ~1,500-1,700 photos/s on an H100 "
                         "in eager bf16: ~6.9 TFLOP a step at an effective ~40-45 TFLOPS, because the "
                         "memory-bound depthwise convs, LayerNorms and GELUs take about half the time: ~160 ms a "
                         "step. Workers: 8 give a batch every ~11 ms, so 12 change nothing (1.00x). "
                         "Batch 384 (~35 GB of activations, fits) makes the same kernels 1.5x larger; they "
                         "already fill the GPU, and the per-step fixed costs (AdamW over 28M parameters, "
                         "~0.3 ms; launches hidden behind the GPU) are under 1 %: ~1.01x.",
    },
]
