#!/usr/bin/env bash
# The runs the divergence guard's thresholds were chosen on (docs/divergence.md): every one
# writes a line per optimizer step (--loss-log-rate 0), which
# `scripts/divergence_replay.py` replays through the guard offline. Healthy: the demo run
# (scripts/demo.sh's training flags) and the tuned-rate runs of docs/tuning.md's B-sweep
# (docs/tuning/bsweep/run.sh: the same B, K, rate, warm-up and bytes). Bad: a new user's
# short run (-B 8 --bptt 16, 2,000 ticks) at --lr 10 and --lr 1, the same run at 4e-2
# pivoted onto --lr 10 at its half, forks of its tick-1,000 checkpoint at rates from 5 down
# to 1e-2 (what a rewind's lowered rate meets), and a run over a corpus with random bytes
# planted where its streams read at one tick. Run from anywhere; results in runs/guard/.
# About 50 minutes of training on 2 cores (two runs side by side, one thread each).
#   docs/divergence/record.sh [NAME...]   # only these runs (default: all)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=".venv/bin/python"
OUT=runs/guard
mkdir -p "$OUT"
train() { # NAME, then the trainer's flags
    local name=$1
    shift
    nice -n 10 "$PY" -m atom_train.train --threads 1 --loss-log-rate 0 \
        --output-dir "$OUT/$name" "$@" >"$OUT/$name.txt" 2>&1 || true
}
demo() {
    train demo --corpus data/demo -B 128 --bptt 64 --total-ticks 120000 \
        --lr 4e-2 --lr-schedule cosine --warmup-steps 50 \
        --ckpt-every 10000 --val-every 10000 --log-every 2000 --sample-every 40000
}
sweep() { # B, steps, warm-up steps, lr: a B-sweep run (4,915,200 bytes, K = 64)
    local B=$1 steps=$2 warm=$3 lr=$4
    local ticks=$((steps * 64))
    train "sweep-B$B-$lr" --corpus data/demo -B "$B" --bptt 64 --total-ticks "$ticks" \
        --lr "$lr" --lr-schedule cosine --warmup-steps "$warm" --val-bytes 262144 \
        --ckpt-every 0 --val-every $((ticks / 4)) --log-every $((ticks / 20))
}
small() { # NAME, then flags: the new user's short run
    local name=$1
    shift
    train "$name" --corpus data/demo -B 8 --bptt 16 --total-ticks 2000 --ckpt-every 500 \
        --val-every 250 --log-every 100 "$@"
}
pivot() { # 4e-2 to tick 1,000, then --lr 10 from that checkpoint
    rm -rf "$OUT/pivot"
    small pivot --lr 4e-2 --total-ticks 1000
    mv "$OUT/pivot.txt" "$OUT/pivot-1.txt"
    small pivot --lr 10
}
rates() { # the short run at 4e-2 to tick 1,000, then forks of that checkpoint at each rate
    rm -rf "$OUT/lrbase"
    small lrbase --lr 4e-2 --total-ticks 1000
    for lr in 5 2.5 1.25 0.625 0.3125 0.15625 0.1 0.078125 4e-2 0.01; do
        rm -rf "$OUT/lr-$lr"
        small "lr-$lr" --fork "$OUT/lrbase/ckpt-final.safetensors" --lr "$lr"
    done
}
spike() { # random bytes where every 4th stream (spike-4) or every stream (spike-1) reads
    local every=$1 B=32 at=13312 span=256
    local dir="data/spike-$every"
    "$PY" - "$dir" "$B" "$at" "$span" "$every" <<'PY'
import random, shutil, sys
from pathlib import Path
dst, B, at, span, every = Path(sys.argv[1]), *map(int, sys.argv[2:])
src = sorted(Path("data/demo").glob("train-*.txt"))
dst.mkdir(parents=True, exist_ok=True)
data = bytearray(b"".join(p.read_bytes() for p in src))
size, rng = len(data), random.Random(0)
for i in range(0, B, every):  # stream i reads byte floor(i * size / B) + t at tick t
    start = i * size // B + at
    for j in range(span + 1):  # (+1: the target of the last tick)
        data[(start + j) % size] = rng.randrange(256)
offset = 0
for p in src:
    n = p.stat().st_size
    (dst / p.name).write_bytes(bytes(data[offset : offset + n]))
    offset += n
PY
    train "spike-$every" --data "$dir/train-*.txt" --val data/demo/val.txt -B "$B" --bptt 64 \
        --total-ticks 20480 --lr 2e-2 --lr-schedule cosine --warmup-steps 80 \
        --ckpt-every 4096 --val-every 4096 --log-every 1024
}
all=(demo sweep-512 sweep-128 sweep-32 sweep-8 sweep-8-4e-2 sweep-128-8e-2
    small-10 small-1 small-4e-2 pivot rates spike-1 spike-4)
for name in "${@:-${all[@]}}"; do
    case $name in
    demo) demo ;;
    sweep-512) sweep 512 150 5 4e-2 ;;
    sweep-128) sweep 128 600 20 4e-2 ;;
    sweep-32) sweep 32 2400 80 2e-2 ;;
    sweep-8) sweep 8 9600 320 2e-2 ;;
    sweep-8-4e-2) sweep 8 9600 320 4e-2 ;;
    sweep-128-8e-2) sweep 128 600 20 8e-2 ;;
    small-10) small small-10 --lr 10 ;;
    small-1) small small-1 --lr 1 ;;
    small-4e-2) small small-4e-2 --lr 4e-2 ;;
    pivot) pivot ;;
    rates) rates ;;
    spike-1) spike 1 ;;
    spike-4) spike 4 ;;
    *)
        echo "unknown run $name (one of: ${all[*]})" >&2
        exit 2
        ;;
    esac
done
