#!/usr/bin/env bash
# gpu_check.sh OUTDIR: the first contact with a GPU machine that has no network and no Rust
# toolchain, in about 11 minutes on one H200: what the compiler made of the Triton kernels,
# the CUDA tests, the kernels' own times, the loader-fed training window, and the
# pre-flight of the runbook's command.
#
# Prepare it on a machine with the toolchain (here):
#   make wheel                      # dist/atom_train-<v>-cp311-abi3-manylinux_2_34_x86_64.whl
# then copy the repository with dist/ to the GPU machine (the device tool: carry ["dist"]).
# The GPU machine brings Python 3.12, torch 2.11 and Triton 3.6, numpy, safetensors, tqdm,
# matplotlib, pytest and hypothesis: the wheel is the only thing installed, with
# `pip install --no-index --no-deps`, and the machine's torch is used. No other wheel is
# needed; on a machine lacking one of those pure-Python packages, download it here with
# `pip download --no-deps -d dist <package>` and it is installed from dist/ the same way.
#
# The parts, each bounded in time and reported whatever the others did:
#   1. installs the wheel (into OUTDIR/site) and puts its native module next to the sources,
#      so `python -m atom_train...` from this checkout runs the wheel's loader;
#   2. the kernel report on the device's own target and SM count (registers there are the
#      truth): OUTDIR/kernel-report.json and .txt (90 s);
#   3. the CUDA tests (tests/scenarios/test_cuda.py whole, the Triton parity tests compiled on CUDA,
#      the batched CUDA test), each test reported: OUTDIR/tests.xml and tests.txt (200 s);
#   4. per-kernel times with CUDA events (python -m atom_train.bench.kernels): the loop's
#      forward alone, its backward alone and a whole training window, triton against fused,
#      B = 256, 1024, 4096, 16384 and n = 32, 64, 128: OUTDIR/timing.json (170 s);
#   5. the trainer's real window (the loader feeding the step through the prefetcher) at
#      B = 1024 and 4096, triton: OUTDIR/bench.json and bench.png (90 s);
#   6. the pre-flight of the runbook's command (B = 1024, K = 64, a week at the projected
#      rate) on 64 MB of synthetic text: the trainer's own window on CUDA, its reserved
#      memory and the largest B, the checkpoint's cost at this B, kill -9 and resume, the
#      supervisor: OUTDIR/preflight.txt and preflight.json (200 s);
#   7. one summary screen, OUTDIR/summary.txt, and OUTDIR/summary.json (every part's exit
#      code and seconds, the tests one by one, the launches, the times).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
T0=$(date +%s)
say() { echo "[gpu_check +$(($(date +%s) - T0))s] $*" | tee -a "$OUT/summary.txt"; }
: >"$OUT/parts.tsv"
# part NAME SECONDS CMD...: run CMD bounded to SECONDS, record its exit code and duration.
part() {
    local name=$1 limit=$2 t rc
    shift 2
    t=$(date +%s)
    timeout "$limit" "$@"
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t))" "$limit" >>"$OUT/parts.tsv"
    say "$name: exit $rc in $(($(date +%s) - t)) s (bound $limit s)"
    return $rc
}

say "host: $(hostname); $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "python $("$PY" -c 'import sys; print(sys.version.split()[0])'); $("$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available())' 2>&1)"

shopt -s nullglob
wheels=(dist/atom_train-*.whl)
shopt -u nullglob
if [ ${#wheels[@]} -eq 0 ]; then
    say "no dist/atom_train-*.whl: run 'make wheel' on a machine with Rust and carry dist/"
    exit 2
fi
WHEEL=${wheels[-1]}
"$PY" -m pip install --quiet --no-index --no-deps --target "$OUT/site" dist/*.whl >"$OUT/pip.txt" 2>&1 \
    || { say "pip install of $WHEEL failed: see $OUT/pip.txt"; exit 2; }
cp "$OUT"/site/atom_train/_atomdata*.so atom_train/
say "installed $(basename "$WHEEL")"
rm -rf "$OUT/site"

# The device's target and SMs, for the report and the launcher's figures.
read -r TARGET SMS < <("$PY" -c 'import torch
p = torch.cuda.get_device_properties(0)
print(f"sm_{p.major}{p.minor}", p.multi_processor_count)' 2>/dev/null || echo "sm_90 132")
say "kernel report: $TARGET, $SMS SMs"
part kernel-report 90 "$PY" -m atom_train.kernel_report --variants quick --target "$TARGET" \
    --sm "$SMS" -B 256,1024,4096,16384 --json >"$OUT/kernel-report.json" 2>"$OUT/kernel-report.err"
"$PY" -c 'import json, sys
from atom_train.kernel_report import format_report
print(format_report(json.load(open(sys.argv[1]))))' "$OUT/kernel-report.json" \
    >"$OUT/kernel-report.txt" 2>&1

say "CUDA tests"
part tests 200 "$PY" -m pytest -q -p no:cacheprovider --junitxml "$OUT/tests.xml" \
    tests/scenarios/test_cuda.py tests/model/test_field_triton.py "tests/model/test_batched.py::test_cuda_matches_cpu" \
    >"$OUT/tests.txt" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -10 | tee -a "$OUT/summary.txt"

say "kernel times (CUDA events)"
part timing 170 "$PY" -m atom_train.bench.kernels -B 256,1024,4096,16384 --n-modes 32,64,128 \
    -K 64 --repeat 5 --seconds 2 --out "$OUT/timing.json" >"$OUT/timing.txt" 2>&1

say "the trainer's window, fed by the loader"
part bench-trainer 90 "$PY" -m atom_train.bench step --device cuda -K 64 --threads 1 \
    --loader-threads 8 --seconds 5 -B 1024,4096 --recurrence triton --modes trainer \
    --out "$OUT/bench.json" --plot "$OUT/bench.png" >"$OUT/bench-trainer.txt" 2>&1

say "the pre-flight of the runbook's command"
"$PY" -c 'import sys
from atom_train.data.synthetic import write_synthetic_corpus
write_synthetic_corpus(sys.argv[1] + "/train.txt", 64 << 20, seed=0)
write_synthetic_corpus(sys.argv[1] + "/val.txt", 1 << 20, seed=1)' "$OUT"
part preflight 200 "$PY" -m atom_train.preflight --minutes 2 --json "$OUT/preflight.json" \
    --on-complete true -- --data "$OUT/train.txt" --val "$OUT/val.txt" -B 1024 --bptt 64 \
    --device cuda --tf32 --total-bytes 1.2e13 --ckpt-every 2000 --snapshot-every 200000 \
    --val-every 2000 --sample-every 20000 --output-dir "$OUT/preflight-run" \
    >"$OUT/preflight.txt" 2>&1
grep -E "^  (PASS|WARN|FAIL) " "$OUT/preflight.txt" | tee -a "$OUT/summary.txt"
rm -f "$OUT/train.txt" "$OUT/val.txt"

"$PY" scripts/gpu_summary.py "$OUT" | tee -a "$OUT/summary.txt"
say "done; files in $OUT"
# Exit 0 only if every part passed.
! cut -f2 "$OUT/parts.tsv" | grep -qv '^0$'
