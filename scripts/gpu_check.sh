#!/usr/bin/env bash
# gpu_check.sh OUTDIR: the CUDA checks and the GPU step bench, on a GPU machine with no
# network and no Rust toolchain, in under 8 minutes on one H200.
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
# What it does, printing as it goes (and everything into OUTDIR):
#   1. installs the wheel (into OUTDIR/site) and puts its native module next to the sources,
#      so `python -m atom_train...` from this checkout runs the wheel's loader;
#   2. runs the CUDA tests (tests/test_cuda.py, the Triton parity tests compiled on CUDA,
#      the batched CUDA test), bounded to 4 minutes;
#   3. runs the step bench at B in {256, 1024, 4096, 16384}, K = 64: the fused (eager) loop
#      and the Triton loop on windows in memory, and the Triton loop fed by the loader
#      through the prefetcher at B = 1024 and 4096, each configuration bounded in time;
#   4. writes OUTDIR/bench.json, bench.png, tests.txt and summary.txt (one screen).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
T0=$(date +%s)
say() { echo "[gpu_check +$(($(date +%s) - T0))s] $*" | tee -a "$OUT/summary.txt"; }

say "host: $(hostname); $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "python $($PY -c 'import sys; print(sys.version.split()[0])'); $($PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available())' 2>&1)"

WHEEL=$(ls dist/atom_train-*.whl 2>/dev/null | tail -1)
if [ -z "$WHEEL" ]; then
    say "no dist/atom_train-*.whl: run 'make wheel' on a machine with Rust and carry dist/"
    exit 2
fi
$PY -m pip install --quiet --no-index --no-deps --target "$OUT/site" dist/*.whl >"$OUT/pip.txt" 2>&1 \
    || { say "pip install of $WHEEL failed: see $OUT/pip.txt"; exit 2; }
cp "$OUT"/site/atom_train/_atomdata*.so atom_train/
say "installed $(basename "$WHEEL"); native module: $(ls atom_train/_atomdata*.so)"
rm -rf "$OUT/site"

say "CUDA tests (bounded to 240 s)"
timeout 240 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_field_triton.py \
    "tests/test_batched.py::test_cuda_matches_cpu" >"$OUT/tests.txt" 2>&1
rc=$?
say "tests: exit $rc; $(tail -1 "$OUT/tests.txt")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -10 | tee -a "$OUT/summary.txt"


say "step bench, K=64 (each configuration bounded)"
BENCH=(-m atom_train.bench step --device cuda -K 64 --threads 1 --loader-threads 8 --seconds 5)
timeout 150 $PY "${BENCH[@]}" -B 256,1024,4096,16384 --recurrence fused --modes isolated \
    --out "$OUT/bench-fused.json" --plot "$OUT/bench-fused.png" 2>&1 | tee "$OUT/bench-fused.txt" \
    | grep -E "^ +isolated|error" | tee -a "$OUT/summary.txt"
timeout 200 $PY "${BENCH[@]}" -B 256,1024,4096,16384 --recurrence triton --modes isolated \
    --out "$OUT/bench-triton.json" --plot "$OUT/bench-triton.png" 2>&1 | tee "$OUT/bench-triton.txt" \
    | grep -E "^ +isolated|error" | tee -a "$OUT/summary.txt"
timeout 120 $PY "${BENCH[@]}" -B 1024,4096 --recurrence triton --modes trainer \
    --out "$OUT/bench-trainer.json" --plot "$OUT/bench.png" 2>&1 | tee "$OUT/bench-trainer.txt" \
    | grep -E "^ +trainer|error" | tee -a "$OUT/summary.txt"
$PY - "$OUT" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = []
for name in ("bench-fused.json", "bench-triton.json", "bench-trainer.json"):
    p = out / name
    if p.exists():
        rows += json.loads(p.read_text())["results"]
json.dump({"results": rows}, open(out / "bench.json", "w"), indent=1)
print(f"{'mode':>9} {'loop':>7} {'B':>6} {'MB/s':>8} {'min/med/max MB/s':>22} {'dev MB':>8} {'wait':>6}")
for r in rows:
    if "error" in r:
        print(f"{r['mode']:>9} {r.get('recurrence')!s:>7} {r['B']:>6} error: {r['error']}")
        continue
    mb = lambda k: r[k] / 1e6
    wait = r.get("loader_wait_share")
    print(f"{r['mode']:>9} {r['recurrence']:>7} {r['B']:>6} {mb('bytes_per_s'):>8.2f} "
          f"{mb('bytes_per_s_min'):>6.2f}/{mb('bytes_per_s_median'):.2f}/{mb('bytes_per_s_max'):.2f} "
          f"{r.get('peak_device_mb') or 0:>8.0f} {'-' if wait is None else f'{100 * wait:.1f}%':>6}")
EOF
say "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $rc
