#!/usr/bin/env bash
# gpu_check.sh [--long] [--rehearse] [--parts LIST] OUTDIR: the first contact with a GPU
# machine that has no network and no Rust toolchain, in one bounded run (a borrowed slot of a
# few minutes, start-up included, with room for one rerun): the kernels' parity on the device
# and the trainer on CUDA first, the full timing grid last.
#
# Prepare it on a machine with the toolchain (here):
#   make wheel                      # dist/atom_train-<v>-cp311-abi3-manylinux_2_34_x86_64.whl
# then copy the repository with dist/ to the GPU machine (the device tool: carry ["dist"]).
# The GPU machine brings Python, torch, Triton, numpy, safetensors, tqdm, matplotlib, pytest
# and hypothesis; only the wheels in dist/ are installed (pip --no-index --no-deps --target
# OUTDIR/site, a folder kept and put on PYTHONPATH for every part), and the machine's torch
# is used. A machine lacking one of those pure-Python packages gets it carried the same way:
# here, `pip download --no-deps -d dist safetensors` (any package, its pure-Python wheel),
# and carry dist/. Exactly one atom_train wheel may be in dist/ (two versions: refused).
#
# The time: BUDGET seconds in all (GPU_CHECK_BUDGET; 300 by default, 600 with --long), the
# install and the summaries included. Each part's bound is its need, from the stated costs
# below, capped by what is left of the budget; a part with too little left is skipped and
# says so. Costs, per item (stated; the kernel report's "compile_s" measures the compile
# on each box, for the next sizing):
#   START_S    15  a Python process importing torch and Triton, with its CUDA context
#   COMPILE_S   6  one Triton kernel (a forward or a backward) compiled for the GPU: ~5.5 s of
#                  one core each here (the kernel report, n = 32, sm_90); a test's first
#                  launch pays it, once per variant and process (Triton caches it on disk)
#   BUILD_S     2  one C launcher Triton builds with gcc on first use (Triton 3.6: the
#                  cuda_utils module and one per kernel, 3 in all, cached on disk after):
#                  0.5-1.1 s each measured here (AMD EPYC, 2 cores shared)
#   CONFIG_S   25  one bench configuration: its process, 2 warm-up windows, 5 s measured
#   ROW_S       4  one kernel timing row: warm-up, then up to 3 runs within 1 s (5 in 2 s: --long)
#
# A 5-minute run (the default), in this order, bound in seconds:
#   probe          20  the GPU (nvidia-smi), Python, torch, Triton, the device's SMs
#   install        20  the wheels of dist/, named; the native loader next to the sources
#   tests         116  the CUDA tests first contact must prove (marker first_contact): the
#                      Triton loop against the fused loop at the trainer's own launches
#                      (float32, n = 32, blocks 8 and 16, B = 1024 and 4096), one float64
#                      case, a CUDA training window against the CPU's, and the trainer on
#                      CUDA (auto's self-check, resume and fork bit for bit, chat on the CPU):
#                      START_S + 10 compiles x COMPILE_S + 3 launcher builds x BUILD_S + 35 s
#                      of running: the references of the parity tests on the device (< 1 s),
#                      the CUDA window's on the CPU (three windows at B = 64, K = 64: 2-7 s
#                      here), four trainer launches (5 s here for the first, on the CPU) and
#                      the chat subprocess (START_S) (docs/gpu_box.md)
#   bench          55  the trainer's real window (the loader feeding the step through the
#                      prefetcher) at B = 1024 and 4096, Triton: 2 x CONFIG_S + 5
#   kernel-report  30  what ptxas made of the trainer's kernels (n = 32) for this GPU:
#                      registers, spills, its launches; 8 compiles on all cores
#   timing         47  the loop's forward, backward and a whole window with CUDA events,
#                      Triton and fused, n = 32, B = 256 ... 16384: START_S + 8 x ROW_S
#   (and 5 s kept for the last summary, and ~0.5 s per summary after each part)
# The pre-flight of the runbook's command is a part of its own, for a second slot (it does
# not fit beside the others): `--parts preflight` (bound 240 s): B = 1024, K = 64, a week at
# the rate it measures, on 64 MB of synthetic text: the trainer's own window on CUDA, its
# reserved memory and the largest B, the checkpoint's cost at this B, kill -9 and resume,
# the supervisor (preflight.txt, preflight.json).
# A 10-minute run (--long): the same parts with the trainer's window also at B = 16384, the
# kernel report's quick set at n = 16 ... 128, then `tests-long`: every other CUDA test
# (the rest of tests/scenarios/test_cuda.py and tests/model/test_field_triton.py, the
# batched CUDA test, auto's fallback tests; ~35 compiles more: START_S + 35 x COMPILE_S +
# 3 x BUILD_S + 60 s), and last the timing grid at n = 32, 64 and 128 (24 rows, 8 more
# compiles) as far as the time left allows.
#
# Whatever cuts it, what ran is kept: pytest is stopped with SIGINT at its bound (so it
# writes tests.xml; each test is also in tests.jsonl as it finishes, for a pytest killed
# outright; a trainer a test runs in pytest's process leaves SIGINT to pytest, and the
# summary lists a test that failed as its part was cut as "cut", not judged); every
# command that could hang runs under a bound (the parts under theirs; nvidia-smi, the
# summaries, the wheel's checksum and the pre-flight's corpus under their own); the bench,
# the kernel report and the timing rewrite their JSON after every
# configuration, variant or row; summary.txt and summary.json (scripts/gpu_summary.py) are
# rewritten before the first part and after every part, atomically: a kill -9 of the whole
# script at any moment leaves a valid summary of every part that finished
# (`python3 scripts/gpu_summary.py OUTDIR` adds what the cut part wrote by then).
#
# If the install fails (or there is no wheel), only what needs the native loader is
# skipped, and said: the tests run the loader-free part of the selection (the kernels'
# parity), the bench is skipped; the kernel report and the timing run.
#
# --rehearse: the same script end to end on a CPU, to prove it before a GPU is lent: the
# same parts and install step (from the wheel `make wheel` built; `make gpu-rehearsal`
# does both), tiny shapes, the kernels under Triton's interpreter, CUDA hidden, a fake
# nvidia-smi (tests/helpers/fakebin), every bound x3 (interpreted kernels, compiles on a
# shared CPU). About 2 minutes on 2 cores. --parts LIST (comma-
# separated) runs only those parts (and the install, which they need); for tests.
#
# Files in OUTDIR: summary.txt, summary.json, log.txt (what the script said), info.tsv,
# plan.txt, parts.tsv, site/ (the installed wheels), pip.txt, tests.xml, tests.jsonl,
# tests.txt, bench.json, bench.png, kernel-report.json, kernel-report.txt, timing.json,
# timing.txt (and tests-long.* with --long, preflight.* with --parts preflight).
# Exit status: 0 if every part ran and passed, 1 otherwise, 2 for a usage error.
set -uo pipefail

LONG=0
REHEARSE=0
ONLY=""
OUT=""
while [ $# -gt 0 ]; do
    case $1 in
        --long) LONG=1 ;;
        --rehearse) REHEARSE=1 ;;
        --parts)
            ONLY=${2:?--parts needs a comma-separated list}
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        -*)
            echo "gpu_check.sh: unknown option $1 (--long, --rehearse, --parts LIST)" >&2
            exit 2
            ;;
        *)
            [ -z "$OUT" ] || {
                echo "gpu_check.sh: one OUTDIR only (got $OUT and $1)" >&2
                exit 2
            }
            OUT=$1
            ;;
    esac
    shift
done
[ -n "$OUT" ] || {
    echo "usage: scripts/gpu_check.sh [--long] [--rehearse] [--parts LIST] OUTDIR" >&2
    exit 2
}
# OUTDIR as the caller meant it (relative to where they are), before moving to the checkout.
if ! mkdir -p "$OUT" || ! OUT=$(cd "$OUT" && pwd); then
    echo "gpu_check.sh: cannot make $OUT" >&2
    exit 2
fi
cd "$(dirname "$0")/.." || exit 2
REPO=$(pwd)
PY=${PYTHON:-python3}

# The stated costs (see the header).
START_S=15
COMPILE_S=6
BUILD_S=2
CONFIG_S=25
ROW_S=4
RESERVE_S=5
# A rehearsal's CPU interprets the kernels and compiles on shared cores: every need x3.
SLOW=$((REHEARSE ? 3 : 1))
BUDGET=${GPU_CHECK_BUDGET:-$(((LONG ? 600 : 300) * SLOW))}

shopt -s nullglob
PROJECT_WHEELS=(dist/atom_train-*.whl)
ALL_WHEELS=(dist/*.whl)
shopt -u nullglob
if [ ${#PROJECT_WHEELS[@]} -gt 1 ]; then
    echo "gpu_check.sh: dist/ holds ${#PROJECT_WHEELS[@]} atom_train wheels (${PROJECT_WHEELS[*]}): keep the one to test (rm dist/atom_train-*.whl; make wheel)" >&2
    exit 2
fi

T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }
# (to the terminal even from inside a part whose output goes to its own file: fd 3)
exec 3>&1
say() { echo "[gpu_check +$(elapsed)s] $*" | tee -a "$OUT/log.txt" >&3; }
info() { printf '%s\t%s\n' "$1" "$2" >>"$OUT/info.tsv"; }
# (bounded: a command that can hang gets its own bound, so none outlives the budget)
bounded() { timeout -k 5 "$@"; }
summary() { bounded 30 "$PY" scripts/gpu_summary.py "$OUT" >/dev/null 2>>"$OUT/log.txt"; }
rm -f "$OUT"/{summary.txt,summary.json,log.txt,info.tsv,plan.txt,parts.tsv,running.tsv}
rm -f "$OUT"/{tests,tests-long}.{xml,jsonl,txt} "$OUT"/{bench,timing,kernel-report}.json

if [ "$REHEARSE" = 1 ]; then
    # The CPU stand-ins: CUDA hidden, the kernels interpreted, a fake nvidia-smi.
    export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=""
    export FAKE_DRIVER=${FAKE_DRIVER:-570.124.06} FAKE_CUDA=${FAKE_CUDA:-12.8}
    mkdir -p "$OUT/fakebin"
    ln -sf "$REPO/tests/helpers/fakebin/nvidia-smi" "$OUT/fakebin/nvidia-smi"
    export PATH="$OUT/fakebin:$PATH"
    DEVICE=cpu
else
    DEVICE=cuda
fi
SITE="$OUT/site"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

# The parts, in the order of what they tell (plan.txt: the summary lists each of them).
PARTS=(probe install tests bench kernel-report)
[ "$LONG" = 1 ] && PARTS+=(tests-long)
PARTS+=(timing)
[[ ",$ONLY," == *",preflight,"* ]] && PARTS+=(preflight)
printf '%s\n' "${PARTS[@]}" >"$OUT/plan.txt"
info mode "$([ "$REHEARSE" = 1 ] && echo "rehearsal on the CPU" || echo "GPU")$([ "$LONG" = 1 ] && echo ", --long"), budget $BUDGET s"
summary

# --parts: the install always runs (the parts need the loader), the probe when asked or when
# the kernel report needs the device's target.
wanted() {
    [ -z "$ONLY" ] || [ "$1" = install ] || [[ ",$ONLY," == *",$1,"* ]] ||
        { [ "$1" = probe ] && [[ ",$ONLY," == *",kernel-report,"* ]]; }
}
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$OUT/parts.tsv"; }
skip() {
    record "$1" skipped 0 0 "$2" "$(date +%s)"
    say "$1: skipped: $2"
    NOTE=""
    summary
}

PART_PID=""
on_signal() {
    # Stop the running part (timeout passes the signal to its whole process group), record
    # it, and leave a summary.
    [ -n "$PART_PID" ] && kill -TERM "$PART_PID" 2>/dev/null
    say "stopped by a signal"
    summary
    exit 1
}
trap on_signal INT TERM

# run_part NAME NEED SIGNAL CMD...: CMD bounded to min(NEED, what is left), stopped with
# SIGNAL at the bound (and killed 15 s later); its exit code and seconds are recorded and
# the summary rewritten. Returns the exit code (or 3 when skipped).
run_part() {
    local name=$1 need=$2 sig=$3 left bound t rc
    shift 3
    if ! wanted "$name"; then
        return 3
    fi
    need=$((need * SLOW))
    left=$((BUDGET - $(elapsed) - RESERVE_S))
    bound=$((need < left ? need : left))
    if [ "$bound" -lt 10 ]; then
        skip "$name" "no time left: $((left > 0 ? left : 0)) s of the $BUDGET s budget"
        return 3
    fi
    printf '%s\t%s\t%s\n' "$name" "$(date +%s)" "$bound" >"$OUT/running.tsv"
    summary
    say "$name: up to $bound s"
    t=$(date +%s)
    timeout -s "$sig" -k 15 "$bound" "$@" 3>&- &
    PART_PID=$!
    wait "$PART_PID"
    rc=$?
    PART_PID=""
    rm -f "$OUT/running.tsv"
    record "$name" "$rc" "$(($(date +%s) - t))" "$bound" "$NOTE" "$t"
    say "$name: exit $rc in $(($(date +%s) - t)) s (bound $bound s)${NOTE:+; $NOTE}"
    NOTE=""
    summary
    return "$rc"
}
NOTE=""

# ---- probe: the machine --------------------------------------------------------------------
info host "$(hostname)"
info gpu "$(bounded 15 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
PROBE='
import sys
out, device = sys.argv[1], sys.argv[2]
rows = {"python": sys.version.split()[0]}
target, sms = "sm_90", 132
try:
    import torch

    rows["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda}, sees a GPU: {torch.cuda.is_available()})"
    if device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        target, sms = f"sm_{p.major}{p.minor}", p.multi_processor_count
        rows["device"] = f"{p.name}, {target}, {sms} SMs, {p.total_memory / 2**30:.0f} GiB"
except Exception as e:  # (reported, and the parts say the rest)
    rows["torch"] = f"does not import: {type(e).__name__}: {e}"
try:
    import triton

    rows["triton"] = triton.__version__
except Exception as e:
    rows["triton"] = f"does not import: {type(e).__name__}: {e}"
from atom_train.kernel_report import TARGETS

if target not in TARGETS:
    rows["kernel report target"] = f"{target} is not in the kernel report table: sm_90 instead"
    target = "sm_90"
rows["target"] = f"{target} {sms}"
with open(out, "a") as f:
    f.writelines(f"{k}\t{v}\n" for k, v in rows.items())
'
run_part probe $((START_S + 5)) TERM "$PY" -c "$PROBE" "$OUT/info.tsv" "$DEVICE"
read -r TARGET SMS < <(sed -n 's/^target\t//p' "$OUT/info.tsv")
TARGET=${TARGET:-sm_90}
SMS=${SMS:-132}

# ---- install: the wheels, kept on PYTHONPATH; the native loader next to the sources -----------
# install_wheels PY SITE LOG WHEEL...: (run by `timeout`, so in its own bash) every wheel into
# SITE; the project's native loader next to the checkout's sources; then the loader imports.
install_wheels() {
    local py=$1 site=$2 log=$3 so
    shift 3
    rm -rf "$site" && mkdir -p "$site" || return 1
    if [ $# -gt 0 ]; then
        "$py" -m pip install --quiet --no-index --no-deps --target "$site" "$@" >"$log" 2>&1 || return 1
    fi
    so=$(find "$site/atom_train" -maxdepth 1 -name '_atomdata*.so' 2>/dev/null | head -1)
    if [ -n "$so" ]; then
        # Copied under a temporary name, then renamed: a process that has the old module
        # loaded keeps its copy.
        cp "$so" "atom_train/.$(basename "$so").tmp" || return 1
        mv -f "atom_train/.$(basename "$so").tmp" "atom_train/$(basename "$so")" || return 1
    fi
    "$py" -c 'import atom_train._atomdata' >>"$log" 2>&1
}
LOADER=0
if [ ${#PROJECT_WHEELS[@]} -eq 0 ]; then
    NOTE="no dist/atom_train-*.whl: run 'make wheel' on a machine with Rust and carry dist/"
fi
if run_part install 20 TERM bash -c "$(declare -f install_wheels); install_wheels \"\$@\"" _ \
    "$PY" "$SITE" "$OUT/pip.txt" "${ALL_WHEELS[@]}"; then
    LOADER=1
    shopt -s nullglob
    installed=("$SITE"/*.dist-info)
    shopt -u nullglob
    names=$(for d in "${installed[@]}"; do basename "$d" .dist-info; done | paste -sd, - | sed 's/,/, /g')
    info installed "${names:-nothing} from ${ALL_WHEELS[*]:-no wheel}"
    if [ ${#PROJECT_WHEELS[@]} -eq 1 ]; then
        info wheel "$(basename "${PROJECT_WHEELS[0]}") (sha256 $(bounded 30 sha256sum "${PROJECT_WHEELS[0]}" | cut -c1-16))"
    else
        info wheel "none: the checkout's own atom_train/_atomdata*.so"
    fi
    say "installed: ${names:-nothing}"
else
    info wheel "install failed: see pip.txt; the parts that need the native loader are skipped"
    say "the install failed (see $OUT/pip.txt): what needs the native loader is skipped"
fi
summary

# ---- the parts ------------------------------------------------------------------------------
# Shapes: the GPU's, or the rehearsal's tiny ones.
if [ "$REHEARSE" = 1 ]; then
    TEST_SEL=(-m first_contact -k 1024 tests/model/test_field_triton.py tests/scenarios/test_cuda.py)
    TEST_SEL_NOLOADER=(-m first_contact -k 1024 tests/model/test_field_triton.py)
    LONG_SEL=(-m "not first_contact" -k "trainer_launches or device" tests/model/test_field_triton.py tests/scenarios/test_cuda.py)
    # (the bench's plumbing on the fused loop: the interpreter takes seconds a window)
    BENCH=(-K 16 --threads 1 --loader-threads 1 --seconds 0.5 -B 8 --n-modes 8 --recurrence fused)
    REPORT=(--variants trainer --n-modes 8 -B 256 --jobs 2)
    TIMING=(-B 4 --n-modes 8 -K 2 --repeat 1 --seconds 0.2)
else
    TEST_SEL=(-m first_contact tests/model/test_field_triton.py tests/scenarios/test_cuda.py)
    TEST_SEL_NOLOADER=(-m first_contact tests/model/test_field_triton.py)
    LONG_SEL=(-m "not first_contact" tests/scenarios/test_cuda.py tests/model/test_field_triton.py
        "tests/model/test_batched.py::test_cuda_matches_cpu" tests/trainer/test_auto_fallback.py)
    if [ "$LONG" = 1 ]; then
        BENCH=(-K 64 --threads 1 --loader-threads 8 --seconds 5 -B "1024,4096,16384" --recurrence triton)
        REPORT=(--variants quick -B "1024,4096")
        TIMING=(-B "256,1024,4096,16384" --n-modes "32,64,128" -K 64 --repeat 5 --seconds 2)
    else
        BENCH=(-K 64 --threads 1 --loader-threads 8 --seconds 5 -B "1024,4096" --recurrence triton)
        REPORT=(--variants trainer --n-modes 32 -B "1024,4096")
        TIMING=(-B "256,1024,4096,16384" --n-modes 32 -K 64 --repeat 3 --seconds 1)
    fi
fi
count() { # the items of a comma-separated list
    local -a items
    IFS=, read -ra items <<<"$1"
    echo "${#items[@]}"
}
arg_of() { # the value after flag $1 in the rest of the arguments
    local flag=$1
    shift
    while [ $# -gt 1 ]; do
        [ "$1" = "$flag" ] && echo "$2" && return
        shift
    done
}

pytest_part() { # NAME NEED SELECTION...
    local name=$1 need=$2
    shift 2
    ATOM_TEST_LOG="$OUT/$name.jsonl" run_part "$name" "$need" INT \
        "$PY" -m pytest -q -p no:cacheprovider --junitxml "$OUT/$name.xml" "$@" >"$OUT/$name.txt" 2>&1
}

if [ "$LOADER" = 1 ]; then
    pytest_part tests $((START_S + 10 * COMPILE_S + 3 * BUILD_S + 35)) "${TEST_SEL[@]}"
else
    NOTE="the loader-free tests only (the install failed)"
    pytest_part tests $((START_S + 6 * COMPILE_S + 3 * BUILD_S + 15)) "${TEST_SEL_NOLOADER[@]}"
fi

if [ "$LOADER" = 0 ]; then
    wanted bench && skip bench "needs the native loader: the install failed"
elif wanted bench; then
    n_configs=$(count "$(arg_of -B "${BENCH[@]}")")
    need=$((n_configs * CONFIG_S + 5))
    left=$((BUDGET - $(elapsed) - RESERVE_S))
    # Each configuration's own bound (bench --timeout) fits inside the part's (run_part's).
    per=$((((need * SLOW < left ? need * SLOW : left) - 5) / n_configs))
    if [ "$per" -lt $((CONFIG_S / 2)) ]; then
        skip bench "no time left: $((left > 0 ? left : 0)) s of the $BUDGET s budget"
    else
        run_part bench "$need" TERM "$PY" -m atom_train.bench step --device "$DEVICE" \
            "${BENCH[@]}" --modes trainer --timeout "$per" \
            --out "$OUT/bench.json" --plot "$OUT/bench.png" >"$OUT/bench.txt" 2>&1
    fi
fi

# (compiled for the target by the real compiler: never under the interpreter)
run_part kernel-report $((LONG ? 60 : 30)) TERM env -u TRITON_INTERPRET \
    "$PY" -m atom_train.kernel_report "${REPORT[@]}" \
    --target "$TARGET" --sm "$SMS" --out "$OUT/kernel-report.json" \
    >"$OUT/kernel-report.txt" 2>&1

if [ "$LONG" = 1 ]; then
    if [ "$LOADER" = 1 ]; then
        pytest_part tests-long $((START_S + 35 * COMPILE_S + 3 * BUILD_S + 60)) "${LONG_SEL[@]}"
    else
        wanted tests-long && skip tests-long "needs the native loader: the install failed"
    fi
fi

rows=$(($(count "$(arg_of -B "${TIMING[@]}")") * $(count "$(arg_of --n-modes "${TIMING[@]}")") * 2))
run_part timing $((START_S + rows * ROW_S)) TERM "$PY" -m atom_train.bench.kernels "${TIMING[@]}" \
    --device "$DEVICE" --out "$OUT/timing.json" >"$OUT/timing.txt" 2>&1

if [[ ",$ONLY," == *",preflight,"* ]]; then
    bounded 120 "$PY" -c 'import sys
from atom_train.data.synthetic import write_synthetic_corpus
write_synthetic_corpus(sys.argv[1] + "/train.txt", 64 << 20, seed=0)
write_synthetic_corpus(sys.argv[1] + "/val.txt", 1 << 20, seed=1)' "$OUT"
    run_part preflight 240 TERM "$PY" -m atom_train.preflight --minutes 2 \
        --json "$OUT/preflight.json" --on-complete true -- --data "$OUT/train.txt" \
        --val "$OUT/val.txt" -B 1024 --bptt 64 --device "$DEVICE" --tf32 --total-bytes 1.2e13 \
        --ckpt-every 10000000 --val-every 10000000 --snapshot-every 200000000 \
        --sample-every 50000000 --log-every 200000 \
        --output-dir "$OUT/preflight-run" >"$OUT/preflight.txt" 2>&1
    grep -E "^  (PASS|WARN|FAIL) " "$OUT/preflight.txt" | tee -a "$OUT/log.txt"
    rm -f "$OUT/train.txt" "$OUT/val.txt"
fi

bounded 30 "$PY" scripts/gpu_summary.py "$OUT" | tee -a "$OUT/log.txt"
say "done in $(elapsed) s of the $BUDGET s budget; files in $OUT"
# Exit 0 only if every part ran and passed.
! cut -f2 "$OUT/parts.tsv" | grep -qv '^0$'
