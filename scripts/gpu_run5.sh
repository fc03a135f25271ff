#!/usr/bin/env bash
# One batch on the GPU machine: monitor CPU benchmark, screenshots, a recorded session with its
# report and a replay screenshot. Results go to $1 (a folder), packed by the caller.
set -u
res=${1:?out dir}
mkdir -p "$res"
python3 -m pytest -m gpu tests/test_gpu_nvml.py -q -p no:cacheprovider > "$res/gpu_tests.txt" 2>&1
timeout 150 python3 bench/monitor_cpu.py --out "$res/monitor" > "$res/monitor_log.txt" 2>&1
timeout 60 python3 bench/monitor_cpu.py --out "$res/monitor_1s" --tools gputop --gputop-args="--interval 1" > "$res/monitor_1s_log.txt" 2>&1
bash scripts/gpu_screenshots.sh "$res/shots" > "$res/shots_log.txt" 2>&1
python3 -m gputop.workloads checkpoint-stall --device cuda --duration 120 --exit-with-parent > "$res/rec_workload.log" 2>&1 &
wl=$!
for _ in $(seq 60); do grep -q ready "$res/rec_workload.log" && break; sleep 1; done
python3 -m gputop record -o "$res/session.gputop" --pid "$wl" --duration 45s > "$res/record_log.txt" 2>&1
kill $wl; wait $wl 2>/dev/null
python3 -m gputop info "$res/session.gputop" > "$res/info.txt" 2>&1
python3 -m gputop report "$res/session.gputop" -o "$res/report.html" > "$res/report_log.txt" 2>&1
python3 -m gputop report "$res/session.gputop" --text > "$res/report.txt" 2>&1
python3 scripts/screenshot.py --replay "$res/session.gputop" --start 60% --speed 1 --out "$res/shots" --name replay --size 160x48 --seconds 4 > "$res/replay_log.txt" 2>&1
ls -la "$res" "$res/shots"
