#!/usr/bin/env bash
# setup_gpu_box.sh: set up atom on your own GPU box (with network), check CUDA, measure.
#
#   scripts/setup_gpu_box.sh [OUTDIR]     (default OUTDIR: runs/gpu-setup)
#
# 1. checks nvidia-smi, free disk and Python (>= 3.11);
# 2. creates .venv and installs a CUDA build of torch (PyPI's default torch is one) and the
#    project: from the abi3 wheel in dist/ if there is one (`make wheel` on any Linux x86_64
#    machine with Rust), else built here with maturin if cargo is present;
# 3. asserts that torch sees CUDA and that Triton imports;
# 4. runs scripts/gpu_check.sh OUTDIR: the CUDA tests and a short step bench, whose figures
#    it prints and writes to OUTDIR (summary.txt, bench.json, bench.png).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu-setup}
PYTHON=${PYTHON:-python3}
die() { echo "setup_gpu_box: $*" >&2; exit 2; }

command -v nvidia-smi >/dev/null || die "nvidia-smi not found: install the NVIDIA driver first"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    || die "nvidia-smi fails: is the driver loaded?"
free_gb=$(df -BG --output=avail . | tail -1 | tr -dc '0-9')
[ "${free_gb:-0}" -ge 10 ] || die "only ${free_gb} GB free here: torch needs ~6 GB, checkpoints more"
$PYTHON -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
    || die "$PYTHON is older than 3.11: set PYTHON=python3.11 (or newer)"

[ -x .venv/bin/python ] || $PYTHON -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet torch numpy safetensors tqdm matplotlib pytest hypothesis
WHEEL=$(ls dist/atom_train-*.whl 2>/dev/null | tail -1 || true)
if [ -n "$WHEEL" ]; then
    .venv/bin/python -m pip install --quiet --no-deps --force-reinstall "$WHEEL"
    # The checkout's sources shadow the installed package when run from here: give them the
    # wheel's native module.
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    cp "$site"/atom_train/_atomdata*.so atom_train/
elif command -v cargo >/dev/null; then
    .venv/bin/python -m pip install --quiet "maturin>=1.9,<2"
    .venv/bin/maturin develop --release --quiet
else
    die "no dist/atom_train-*.whl and no cargo: run 'make wheel' on a machine with Rust, copy dist/"
fi
.venv/bin/python - <<'EOF' || die "torch does not see CUDA (a CPU-only torch?) or Triton is missing"
import torch, triton
assert torch.cuda.is_available(), "no CUDA"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, "
      f"{torch.cuda.get_device_name(0)}")
EOF
PYTHON=.venv/bin/python scripts/gpu_check.sh "$OUT"
echo "setup_gpu_box: figures in $OUT/summary.txt, $OUT/bench.json, $OUT/bench.png"
