#!/usr/bin/env bash
# What a 2-rank NCCL job looks like to gputop's sources: for each mode of bench/multi_rank.py,
# a recording of the job (gputop record on the launcher), native and Python dumps of each rank's
# main thread, its /proc state and wait channel, and what NVML says while a rank waits.
# Usage: scripts/nccl_probe.sh OUTDIR [MODE ...]   (2 GPUs, NCCL; NVLink multicast stays off)
set -u
res=${1:?out dir}; shift
modes=${*:-straggler hang healthy}
mkdir -p "$res"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
{
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
  nvidia-smi --query-gpu=index,name,driver_version,power.draw,power.limit --format=csv
  nvidia-smi topo -m
  which ncclras || echo "no ncclras binary"
} > "$res/env.txt" 2>&1
for mode in $modes; do
  d="$res/$mode"; mkdir -p "$d"
  python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/multi_rank.py --job "$mode" --device cuda > "$d/job.log" 2>&1 &
  launcher=$!
  for _ in $(seq 120); do [ "$(grep -c ready "$d/job.log")" -ge 2 ] && break; sleep 0.5; done
  sleep 8
  ranks=$(pgrep -P "$launcher" | tr '\n' ' ')
  echo "launcher $launcher ranks $ranks" > "$d/pids.txt"
  python3 -m gputop record -o "$d/session.gputop" --pid "$launcher" --duration 25s --interval 0.5 > "$d/record.txt" 2>&1 &
  rec=$!
  sleep 10
  for p in $ranks; do
    {
      echo "== rank pid $p"; cat /proc/$p/status | grep -E "State|Threads"; echo "wchan: $(cat /proc/$p/wchan)"; cat /proc/$p/stat | cut -d' ' -f3,14,15
      echo "-- py-spy dump"; timeout 20 py-spy dump --pid "$p" 2>&1 | head -80
      echo "-- py-spy dump --native"; timeout 30 py-spy dump --native --pid "$p" 2>&1 | head -150
    } >> "$d/dumps.txt" 2>&1
  done
  (ss -ltnp 2>/dev/null || netstat -ltnp 2>/dev/null) | grep -E "2802|python" > "$d/ports.txt" 2>&1
  timeout 8 ncclras > "$d/ncclras.txt" 2>&1 || true
  nvidia-smi --query-gpu=index,utilization.gpu,power.draw,clocks.sm --format=csv -lms 200 -c 1 >> "$d/smi.txt" 2>&1
  python3 scripts/nccl_gpm.py 5 > "$d/gpm.txt" 2>&1
  wait $rec
  python3 -m gputop advise --pid "$launcher" --duration 15 --json > "$d/advise.json" 2> "$d/advise.err"
  kill "$launcher" 2>/dev/null; sleep 2; pkill -9 -f "bench/multi_rank.py" 2>/dev/null; wait 2>/dev/null
done
