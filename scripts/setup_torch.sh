#!/usr/bin/env bash
# Installs torch into a venv before `make setup` installs the other dependencies, choosing
# its build for the machine:
#
#   - with an NVIDIA driver (nvidia-smi answers, or /proc/driver/nvidia/version exists):
#     PyPI's torch, the CUDA build (the default on a GPU box; installed with the rest);
#   - without one: the CPU-only build from PyTorch's CPU index ($CPU_INDEX, about 200 MB
#     instead of a venv of several GB), when that index answers; when it does not, one line
#     says so and PyPI's CUDA build is installed with the rest (it runs on a CPU too).
#
# Usage: scripts/setup_torch.sh [--dry-run] VENV_PYTHON
#   --dry-run     print the choice and the pip command, install nothing
#   TORCH_INDEX   the pip index to take torch from, whatever the machine ("pypi": PyPI's)
#   NVIDIA_SMI    the nvidia-smi to ask (default: nvidia-smi from PATH)
#   NVIDIA_PROC   the driver's /proc file (default: /proc/driver/nvidia/version)
set -euo pipefail

CPU_INDEX=https://download.pytorch.org/whl/cpu
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

dry_run=0
if [ "${1:-}" = --dry-run ]; then
    dry_run=1
    shift
fi
[ $# -eq 1 ] || { echo "usage: $0 [--dry-run] VENV_PYTHON" >&2; exit 2; }
py=$1

say() { echo "[setup] $*"; }

has_nvidia_driver() {
    local smi=${NVIDIA_SMI:-nvidia-smi}
    [ -e "${NVIDIA_PROC:-/proc/driver/nvidia/version}" ] && return 0
    command -v "$smi" >/dev/null 2>&1 && "$smi" -L >/dev/null 2>&1
}

# The torch requirement, as pyproject.toml states it (e.g. torch>=2.1).
spec=$("$py" "$here/list_deps.py" "$here/../pyproject.toml" | grep -E '^torch([<>=!~ ;]|$)' | head -n1)
[ -n "$spec" ] || { echo "[setup] error: no torch requirement in pyproject.toml" >&2; exit 2; }

if [ -n "${TORCH_INDEX:-}" ]; then
    index=$TORCH_INDEX
    why="TORCH_INDEX=$TORCH_INDEX"
elif has_nvidia_driver; then
    index=pypi
    why="an NVIDIA driver is here"
else
    index=$CPU_INDEX
    why="no NVIDIA driver here"
fi

if [ "$index" = pypi ]; then
    say "torch: PyPI's build (the CUDA one): $why"
    exit 0  # (installed with the other dependencies)
fi
cmd=("$py" -m pip install --quiet --retries 1 --timeout 20 "$spec" --index-url "$index")
note=""
[ "$index" != "$CPU_INDEX" ] || note=" (the CPU-only build; TORCH_INDEX=pypi installs PyPI's CUDA build)"
say "torch: from $index: $why$note"
if [ $dry_run = 1 ]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi
if ! "${cmd[@]}"; then
    say "warning: the torch index $index did not answer: installing PyPI's torch (the CUDA build, several GB; it runs on a CPU too); for the CPU-only build, rerun with TORCH_INDEX=<a reachable copy of $CPU_INDEX> make setup" >&2
fi
