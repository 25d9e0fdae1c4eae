#!/usr/bin/env bash
# The B-sweep of docs/tuning.md ("Does it predict?"): four batches at equal bytes,
# 128 x 64 x 600 = 4,915,200 bytes per run, K = 64, a cosine schedule with a warm-up of 1/30
# of the bytes, each at three or four learning rates, val on 256 KiB of the demo's val.
# Run from anywhere; results in runs/sweep/ (B<B>.json, B<B>.txt). About 30 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../../.."
mkdir -p runs/sweep
# B, optimizer steps, warm-up steps, learning rates
for cfg in "512 150 5 2e-2,4e-2,8e-2" "128 600 20 2e-2,4e-2,8e-2" \
    "32 2400 80 1e-2,2e-2,4e-2" "8 9600 320 5e-3,1e-2,2e-2,4e-2"; do
    read -r B steps warm lrs <<<"$cfg"
    .venv/bin/python -m atom_train.tune lr --corpus data/demo -B "$B" -K 64 --threads 2 \
        --runs "$lrs" --steps "$steps" --lr-schedule cosine --warmup-steps "$warm" \
        --val-bytes 262144 --out "runs/sweep/B$B.json" >"runs/sweep/B$B.txt" 2>&1
done
