#!/usr/bin/env bash
# Real screenshots on a GPU machine: the live UI beside a GPU load and attached to workloads of
# the suite, and the replay of the recorded H100 session.
#   bash scripts/gpu_screenshots.sh OUTDIR
set -u
out=${1:-screenshots}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')  # h100, h200: the card the shots show
python3 scripts/gpu_load.py bf16 40 > "$out/load.log" 2>&1 &
load=$!
for _ in $(seq 60); do grep -q "ready" "$out/load.log" && break; sleep 1; done
sleep 4  # a few steps in the utilisation buffer
python3 scripts/screenshot.py --out "$out" --name "live-$gpu" --size 160x48 --seconds 8
python3 scripts/screenshot.py --out "$out" --name "live-$gpu-80x24" --size 80x24 --seconds 6
kill "$load" 2>/dev/null; wait "$load" 2>/dev/null
shot() {  # scenario name keys seconds
    python3 -m gputop.workloads "$1" --device cuda --duration 90 --exit-with-parent > "$out/$2.workload.log" 2>&1 &
    local wl=$!
    for _ in $(seq 60); do grep -q "ready" "$out/$2.workload.log" && break; sleep 1; done
    python3 scripts/screenshot.py --out "$out" --name "$2" --size 160x48 --seconds "$4" --pid "$wl" --keys "$3"
    kill "$wl" 2>/dev/null; wait "$wl" 2>/dev/null
}
shot dataloader-starved live-attached-starved "" 8
shot dataloader-starved advisor-starved 2 14
shot dataloader-starved stacks-starved 3 8
shot fp32-no-tensor-cores advisor-fp32 2 12
# A real job's shape: GPT-2 with AdamW(foreach=False) at batch 4 (launch-bound, unfused optimizer)
python3 bench/jobs/gpt.py --batch 4 --seq 128 --foreach-off --device cuda --seconds 120 > "$out/gpt.log" 2>&1 &
gpt=$!
for _ in $(seq 60); do grep -q "rate" "$out/gpt.log" && break; sleep 1; done
sleep 6
python3 scripts/screenshot.py --out "$out" --name advisor-launch-optimizer --size 160x48 --seconds 8 --pid "$gpt" --keys 2
python3 scripts/screenshot.py --out "$out" --name live-attached-launch --size 160x48 --seconds 6 --pid "$gpt"
kill "$gpt" 2>/dev/null; wait "$gpt" 2>/dev/null
python3 scripts/screenshot.py --out "$out" --name replay-checkpoint-stall --size 160x48 --seconds 3 \
    --replay tests/fixtures/recordings/h100-checkpoint-stall.gputop --start 40%
