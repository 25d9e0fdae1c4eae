#!/usr/bin/env bash
# `make demo`: build the French demo corpus, train a small model on the CPU (a few minutes on
# 2 cores), then print the validation bits/byte it reached, a chat reply to "Bonjour", and
# write a PNG of the training curves. Rerunning it resumes or, when done, just reports.
#
# Env overrides: DEMO_DIR (run folder, default runs/demo), DEMO_TICKS, DEMO_B, DEMO_THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
RUN=${DEMO_DIR:-runs/demo}
TICKS=${DEMO_TICKS:-120000}
B=${DEMO_B:-128}
THREADS=${DEMO_THREADS:-$(nproc)}

echo "== 1/4 demo corpus (French documentation from Debian packages)"
bash scripts/get_demo_corpus.sh --out data/demo

echo "== 2/4 training: B=$B streams x $TICKS ticks = $((B * TICKS)) bytes on the CPU -> $RUN"
$PY -m atom_train.train --corpus data/demo \
    -B "$B" --bptt 64 --total-ticks "$TICKS" --threads "$THREADS" \
    --lr 4e-2 --lr-schedule cosine --warmup-steps 50 \
    --ckpt-every 10000 --val-every 10000 --log-every 2000 --sample-every 40000 \
    --output-dir "$RUN"

echo "== 3/4 result"
$PY - "$RUN" <<'PY'
import json, sys
from pathlib import Path
status = json.loads((Path(sys.argv[1]) / "status.json").read_text())
val = status.get("val_bpb")
print(f"validation: {val:.3f} bits/byte" if val is not None else "validation: n/a")
PY
echo "chat reply to \"Bonjour\":"
$PY -m atom_train.chat --checkpoint "$RUN" --prompt "Bonjour" --max-bytes 200 --seed 0
echo

echo "== 4/4 training curves"
$PY -m atom_train.plot "$RUN"
