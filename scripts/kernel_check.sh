#!/usr/bin/env bash
# kernel_check.sh [--full] PYTHON...: the kernel report (python -m atom_train.kernel_report)
# with each PYTHON's Triton, for sm_90 and 132 SMs, without a GPU. Fails if any kernel
# variant does not compile. Each report is kept as build/kernel-report/triton-VERSION.json
# and printed as a table.
#
#   scripts/kernel_check.sh .venv-triton-3.6.0/bin/python      # what `make test` runs
#   scripts/kernel_check.sh --full .venv-triton-3.6.0/bin/python .venv/bin/python
#
# Default: the quick set (every variant a training run launches at n = 16, 32, 64, 128, and
# three of the tests' float64 and reset-table variants at n = 32) with the launches at
# B = 1024 and 4096, about a minute on 2 free cores. --full: every variant at every n,
# B = 256 ... 16384 (about 10 minutes a Triton).
# The PYTHONs need only Triton and numpy (no torch): the kernels compile from this
# checkout's sources.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ARGS=(--variants quick -B "1024,4096")
if [ "${1:-}" = "--full" ]; then
    ARGS=(--variants all)
    shift
fi
[ $# -ge 1 ] || { echo "usage: scripts/kernel_check.sh [--full] PYTHON..." >&2; exit 2; }
mkdir -p build/kernel-report
status=0
for py in "$@"; do
    version=$("$py" -c 'import triton; print(triton.__version__)' 2>/dev/null) \
        || { echo "kernel_check: $py has no Triton" >&2; exit 2; }
    out=build/kernel-report/triton-$version.json
    echo "kernel_check: Triton $version ($py): ${ARGS[*]}"
    PYTHONPATH=$PWD "$py" -m atom_train.kernel_report "${ARGS[@]}" --json >"$out.tmp"
    rc=$?
    if [ "$rc" -gt 1 ] || ! [ -s "$out.tmp" ]; then
        echo "kernel_check: the report itself failed with Triton $version (exit $rc)" >&2
        status=1
        continue
    fi
    mv "$out.tmp" "$out"
    PYTHONPATH=$PWD "$py" -c 'import json, sys
from atom_train.kernel_report import format_report
print(format_report(json.load(open(sys.argv[1]))))' "$out"
    if [ "$rc" -ne 0 ]; then
        echo "kernel_check: compile errors with Triton $version: see $out" >&2
        status=1
    fi
done
exit $status
