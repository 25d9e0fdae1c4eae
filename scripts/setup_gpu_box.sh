#!/usr/bin/env bash
# setup_gpu_box.sh: set up atom on a GPU box that has network access: a torch build the box's
# NVIDIA driver can run, the project, then the GPU check.
#
#   scripts/setup_gpu_box.sh [--extras LIST] [--no-check] [--dry-run] [OUTDIR]
#
#   OUTDIR         where scripts/gpu_check.sh writes its figures (default runs/gpu-setup)
#   --extras LIST  also install these optional dependency groups of pyproject.toml
#                  (comma-separated, e.g. tensorboard,zstd)
#   --no-check     stop once torch sees the GPU and Triton imports: skip scripts/gpu_check.sh
#   --dry-run      decide everything, then print each command that would change the box
#                  instead of running it
#
# It decides everything before it changes anything:
#   1. finds Python >= 3.11 and reads the driver version from nvidia-smi;
#   2. picks the torch build this driver runs (the table below), unless TORCH_INDEX or
#      TORCH_SPEC say otherwise; a torch already in .venv that sees the GPU is kept;
#   3. installs only what changed since the last run: .venv, torch, the dependencies that
#      pyproject.toml lists (with dev and the extras asked for), the project (the wheel in
#      dist/, else a wheel built here by maturin when cargo is present);
#   4. asserts that torch sees the GPU and Triton imports, then runs scripts/gpu_check.sh.
# A second run with nothing changed installs nothing. Every refusal is one line naming the
# fix. docs/gpu_box.md says what happens on each kind of box.
#
# Environment:
#   PYTHON       the Python to make .venv with (default: the first python3 >= 3.11 on PATH)
#   TORCH_INDEX  pip index to take torch from, e.g. https://download.pytorch.org/whl/cu126
#   TORCH_SPEC   pip requirement for torch (default: pyproject.toml's, e.g. 'torch>=2.1')
#   MIN_FREE_GB  free disk needed before installing torch (default 10)
#   NVIDIA_SMI, CARGO  the tools to use (default: nvidia-smi and cargo from PATH)
set -euo pipefail

# The torch builds to choose from, newest CUDA first. PyTorch publishes one pip index per CUDA
# version (PyPI's own torch is the newest one's build); its wheels bring their own CUDA
# libraries, so all they need of the box is a driver: `native` is the driver NVIDIA pairs with
# that CUDA release (CUDA Toolkit release notes, "Toolkit Driver Version", Linux x86_64),
# `floor` the oldest driver of that CUDA major version, which runs it by CUDA minor-version
# compatibility. No CUDA 11 row: torch 2.7 was the last release with such a build, and its
# Triton (3.3) is older than the project's kernels need (3.6).
#   name   index (- = PyPI)                        CUDA  native     floor
readonly TORCH_BUILDS="\
pypi     -                                       13.2  595.45.04  580.65.06
cu130    https://download.pytorch.org/whl/cu130  13.0  580.65.06  580.65.06
cu126    https://download.pytorch.org/whl/cu126  12.6  560.28.03  525.60.13"

VENV_PY=.venv/bin/python
STAMPS=.venv/.gpu-box   # what the last run installed, to install nothing on the next one

say() { echo "setup_gpu_box: $*"; }
die() {
    echo "setup_gpu_box: $*" >&2
    exit 2
}
usage() { sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "${BASH_SOURCE[0]}"; }

# A command that changes the box: printed under --dry-run (quoted where the shell needs it),
# run otherwise.
run() {
    if ((DRY_RUN)); then
        local arg line=+
        for arg; do
            if [[ $arg =~ ^[A-Za-z0-9_./:=+,@%-]+$ ]]; then line+=" $arg"; else line+=" ${arg@Q}"; fi
        done
        echo "$line"
    else
        "$@"
    fi
}

# Is version $1 >= version $2 (dotted numbers, e.g. 550.54.15)?
version_ge() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$2" ]; }

parse_args() {
    OUT=runs/gpu-setup
    EXTRAS=()
    CHECK=1
    DRY_RUN=0
    while (($#)); do
        case $1 in
            --extras)
                (($# >= 2)) || die "--extras needs a list, e.g. --extras tensorboard,zstd"
                IFS=, read -ra EXTRAS <<<"$2"
                shift 2
                ;;
            --extras=*) IFS=, read -ra EXTRAS <<<"${1#*=}" && shift ;;
            --no-check) CHECK=0 && shift ;;
            --dry-run) DRY_RUN=1 && shift ;;
            -h | --help) usage && exit 0 ;;
            -*) die "unknown option $1: see scripts/setup_gpu_box.sh --help" ;;
            *) OUT=$1 && shift ;;
        esac
    done
}

# PY: the interpreter that makes .venv (PYTHON, else the first python3 >= 3.11 on PATH).
find_python() {
    local candidates=(python3 python3.14 python3.13 python3.12 python3.11) c v seen=()
    if [ -n "${PYTHON:-}" ]; then
        command -v "$PYTHON" >/dev/null || die "PYTHON=$PYTHON: no such command: set PYTHON to a Python >= 3.11"
        candidates=("$PYTHON")
    fi
    for c in "${candidates[@]}"; do
        v=$("$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
        if version_ge "$v" 3.11; then
            PY=$c
            return
        fi
        seen+=("$c is $v")
    done
    local found=${seen[*]:-none found}
    die "no Python >= 3.11 (${found}): install one (e.g. apt install python3.12-venv, or uv python install 3.12) and set PYTHON=python3.12"
}

# DRIVER (e.g. 550.54.15) and DRIVER_CUDA (the newest CUDA it supports, as nvidia-smi says) of
# the first GPU; every GPU is listed. A box without a usable GPU stops here, before any install.
read_gpu() {
    local smi=${NVIDIA_SMI:-nvidia-smi} out rc=0 dev line
    if ! command -v "$smi" >/dev/null; then
        dev=$(compgen -G '/dev/nvidia[0-9]*' | head -n1) || true
        [ -z "$dev" ] || die "nvidia-smi not found, though $dev exists: install the driver's utilities (e.g. apt install nvidia-utils-550), or in a container start it with --gpus all"
        die "nvidia-smi not found and no /dev/nvidia* device: no GPU is visible here: on a host, install the NVIDIA driver and reboot; in a container, start it with --gpus all (NVIDIA Container Toolkit)"
    fi
    out=$("$smi" --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1) || rc=$?
    if ((rc)) || [ -z "$out" ] || [[ $out == *"No devices were found"* ]]; then
        case $out in
            "" | *"No devices were found"*)
                die "nvidia-smi sees no GPU: in a container, start it with --gpus all (NVIDIA Container Toolkit); on a host, check that the GPU is there and the driver bound to it (lspci | grep -i nvidia; dmesg | grep -i nvrm)" ;;
            *"version mismatch"*)
                die "nvidia-smi fails: the NVIDIA driver was updated but the old one is still loaded: reboot" ;;
            *)
                die "nvidia-smi fails (exit $rc: $(head -n1 <<<"$out")): the NVIDIA driver is not loaded: install it, or reboot after installing it (dmesg | grep -i nvrm says why)" ;;
        esac
    fi
    while IFS= read -r line; do say "GPU: $line"; done <<<"$out"
    DRIVER=$(head -n1 <<<"$out" | awk -F', *' '{ print $NF }')
    [[ $DRIVER =~ ^[0-9]+(\.[0-9]+)+$ ]] || die "cannot read the driver version from nvidia-smi ('$(head -n1 <<<"$out")'): set TORCH_INDEX yourself"
    DRIVER_CUDA=$("$smi" 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n1) || true
    say "driver $DRIVER${DRIVER_CUDA:+, CUDA $DRIVER_CUDA}"
}

# BUILD_NAME, BUILD_LABEL, BUILD_INDEX ('' = PyPI), BUILD_CUDA and BUILD_WHY for driver $DRIVER, from
# TORCH_BUILDS. The rule: within the CUDA major version the driver belongs to (the newest
# whose floor it reaches), the newest build it runs natively; else the oldest of that major,
# by minor-version compatibility. Fails when the driver is older than every floor.
choose_build() {
    local name index cuda native floor family='' newer=''
    while read -r name index cuda native floor; do
        if version_ge "$DRIVER" "$floor"; then family=${cuda%%.*} && break; fi
    done <<<"$TORCH_BUILDS"
    [ -n "$family" ] || return 1
    BUILD_NAME=''
    while read -r name index cuda native floor; do
        if [ "${cuda%%.*}" != "$family" ]; then
            [ -n "$BUILD_NAME" ] || newer="; $name needs driver >= $native"
            continue
        fi
        BUILD_NAME=$name BUILD_CUDA=$cuda BUILD_INDEX=${index#-}
        BUILD_LABEL="the $name build ($index)"
        [ -n "$BUILD_INDEX" ] || BUILD_LABEL="PyPI's own build"
        if version_ge "$DRIVER" "$native"; then
            BUILD_WHY="CUDA $cuda runs natively on driver $DRIVER (>= $native)$newer"
            return 0
        fi
        BUILD_WHY="CUDA $cuda runs on driver $DRIVER by CUDA minor-version compatibility (>= $floor; natively from $native)$newer"
        newer="; $name needs driver >= $native"
    done <<<"$TORCH_BUILDS"
    [ -n "$BUILD_NAME" ]
}

# TORCH_REQ, TORCH_URL ('' = PyPI), TORCH_CUDA ('' = unknown): the torch to install if one is
# needed, and why, printed.
choose_torch() {
    TORCH_REQ=${TORCH_SPEC:-$TORCH_DEFAULT_REQ}
    if [ -n "${TORCH_INDEX:-}" ]; then
        TORCH_URL=$TORCH_INDEX TORCH_CUDA=''
        # PyTorch's indexes end in cuXYZ for CUDA X.Y (cu126: 12.6, cu130: 13.0).
        if [[ $TORCH_INDEX =~ /cu([0-9]+)([0-9])/?$ ]]; then
            TORCH_CUDA=${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
        fi
        say "torch: $TORCH_REQ from TORCH_INDEX=$TORCH_INDEX (set in the environment)"
    elif choose_build; then
        TORCH_URL=$BUILD_INDEX TORCH_CUDA=$BUILD_CUDA
        say "torch: $TORCH_REQ, $BUILD_LABEL: $BUILD_WHY"
    elif [ -n "${TORCH_SPEC:-}" ]; then
        TORCH_URL='' TORCH_CUDA=''
        say "torch: $TORCH_REQ from PyPI (TORCH_SPEC), though driver $DRIVER is older than every build this script knows"
    else
        local oldest
        oldest=$(tail -n1 <<<"$TORCH_BUILDS" | awk '{ print $1 ", needs driver >= " $5 }')
        die "driver $DRIVER is too old for every torch build (the oldest, $oldest): update the NVIDIA driver (the 550 branch or newer), or name a build with TORCH_INDEX / TORCH_SPEC"
    fi
}

# TORCH_STATE of the torch in .venv: absent | cpu (a CPU-only build) | gpu (sees the GPU) |
# nogpu (a CUDA build that does not); HAVE_TORCH and HAVE_CUDA are its version and CUDA.
probe_torch() {
    local out seen
    TORCH_STATE=absent
    [ -x "$VENV_PY" ] || return 0
    # Without CUDA_VISIBLE_DEVICES: whether this build runs on this driver, not what the
    # caller chose to show it (check_torch, at the end, looks with the caller's setting).
    out=$(env -u CUDA_VISIBLE_DEVICES "$VENV_PY" -c 'import torch; print(torch.__version__, torch.version.cuda or "-", int(torch.cuda.is_available()))' 2>/dev/null | tail -n1) || return 0
    read -r HAVE_TORCH HAVE_CUDA seen <<<"$out"
    if [ "$HAVE_CUDA" = - ]; then
        TORCH_STATE=cpu
    elif [ "$seen" = 1 ]; then
        TORCH_STATE=gpu
    else
        TORCH_STATE=nogpu
    fi
}

die_cpu_torch() {
    die "the torch in .venv ($1) is a CPU-only build: remove it ($VENV_PY -m pip uninstall -y torch) and rerun, which installs the CUDA build above"
}

# TORCH_ACTION: keep | install | replace.
plan_torch() {
    probe_torch
    case $TORCH_STATE in
        absent) TORCH_ACTION=install ;;
        cpu) die_cpu_torch "$HAVE_TORCH" ;;
        gpu)
            TORCH_ACTION=keep
            local note=''
            [ -z "${TORCH_INDEX:-}${TORCH_SPEC:-}" ] || note=" (to replace it, uninstall it first: $VENV_PY -m pip uninstall -y torch)"
            say "torch $HAVE_TORCH (CUDA $HAVE_CUDA) in .venv sees the GPU: kept$note"
            ;;
        nogpu)
            # A build other than the one chosen (the case of a torch too new for the driver) is
            # replaced; reinstalling the same build cannot help: the check at the end says what to try.
            if [ -n "${TORCH_INDEX:-}${TORCH_SPEC:-}" ] || [ "$HAVE_CUDA" != "$TORCH_CUDA" ]; then
                TORCH_ACTION=replace
                say "torch $HAVE_TORCH (CUDA $HAVE_CUDA) in .venv does not see the GPU: it is replaced by the build above"
            else
                TORCH_ACTION=keep
            fi
            ;;
    esac
}

# REQS (one requirement a line, torch apart) and TORCH_DEFAULT_REQ from pyproject.toml;
# DEPS_ACTION: keep when the last run installed exactly this list.
plan_deps() {
    local known e all torch_line='^torch([^A-Za-z0-9_.-]|$)'
    known=$("$PY" -c 'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["project"].get("optional-dependencies", {})))' pyproject.toml)
    for e in "${EXTRAS[@]}"; do
        [[ " $known " == *" $e "* ]] || die "--extras $e: pyproject.toml has no such extra (it has: $known)"
    done
    all=$("$PY" scripts/list_deps.py pyproject.toml dev "${EXTRAS[@]}")
    TORCH_DEFAULT_REQ=$(grep -E "$torch_line" <<<"$all" | head -n1) || true
    [ -n "$TORCH_DEFAULT_REQ" ] || TORCH_DEFAULT_REQ=torch
    REQS=$(grep -vE "$torch_line" <<<"$all") || true
    DEPS_ACTION=install
    if [ -f "$STAMPS/requirements.txt" ] && [ "$(cat "$STAMPS/requirements.txt")" = "$REQS" ]; then
        DEPS_ACTION=keep
    fi
}

# The newest dist/atom_train-*.whl, or nothing.
newest_wheel() {
    local w newest=''
    for w in dist/atom_train-*.whl; do
        [ -e "$w" ] || continue
        if [ -z "$newest" ] || [ "$w" -nt "$newest" ]; then newest=$w; fi
    done
    printf '%s' "$newest"
}

wheel_key() { echo "$(basename "$1") $(sha256sum <"$1" | cut -d' ' -f1)"; }

# PROJECT_ACTION: keep | wheel (install WHEEL) | build (with maturin, then install it).
plan_project() {
    WHEEL=$(newest_wheel)
    if [ -n "$WHEEL" ]; then
        PROJECT_ACTION=wheel
        if [ "$(cat "$STAMPS/project" 2>/dev/null)" = "$(wheel_key "$WHEEL")" ] \
            && compgen -G 'atom_train/_atomdata*.so' >/dev/null; then
            PROJECT_ACTION=keep
        fi
        say "project: $WHEEL"
    elif command -v "${CARGO:-cargo}" >/dev/null; then
        PROJECT_ACTION=build
        say "project: no wheel in dist/; cargo is here: maturin builds one"
    else
        die "no dist/atom_train-*.whl and no cargo here: run 'make wheel' on a machine with Rust and copy dist/ to this checkout (or install Rust: https://rustup.rs)"
    fi
}

check_disk() {
    local need=${MIN_FREE_GB:-10} free
    free=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
    [ "$free" -ge "$need" ] || die "only $free GB free in $PWD, $need needed: torch and its CUDA libraries take ~6 GB, checkpoints more: free some space (or set MIN_FREE_GB)"
}

# Remembers what was installed (stamp $1 = $2), for the next run.
record() { ((DRY_RUN)) || { mkdir -p "$STAMPS" && printf '%s\n' "$2" >"$STAMPS/$1"; }; }

install_wheel() {
    run "$VENV_PY" -m pip install --quiet --no-deps --force-reinstall "$1"
    # `python -m atom_train...` from the checkout imports the checkout's atom_train/, not the
    # installed one: give it the wheel's native module.
    run "$VENV_PY" -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); z.extractall(".", [n for n in z.namelist() if n.startswith("atom_train/_atomdata")])' "$1"
}

install() {
    if [ ! -x "$VENV_PY" ]; then
        "$PY" -c 'import ensurepip, venv' 2>/dev/null || die "$PY cannot make a venv (no ensurepip): apt install python3-venv (or python3.X-venv for your X), then rerun"
        run "$PY" -m venv .venv
        run "$VENV_PY" -m pip install --quiet --upgrade pip
    fi
    [ "$TORCH_ACTION" != replace ] || run "$VENV_PY" -m pip uninstall --yes torch
    if [ "$TORCH_ACTION" != keep ]; then
        run "$VENV_PY" -m pip install "$TORCH_REQ" ${TORCH_URL:+--index-url "$TORCH_URL"}
    fi
    if [ "$DEPS_ACTION" = install ]; then
        local reqs
        mapfile -t reqs <<<"$REQS"
        run "$VENV_PY" -m pip install --quiet "${reqs[@]}"
        record requirements.txt "$REQS"
    fi
    if [ "$PROJECT_ACTION" = build ]; then
        run env PYO3_PYTHON="$PWD/$VENV_PY" .venv/bin/maturin build --release --out dist
        WHEEL=$(newest_wheel)
        [ -n "$WHEEL" ] || ((DRY_RUN)) || die "maturin built no dist/atom_train-*.whl: see its output above"
        PROJECT_ACTION=wheel
    fi
    if [ "$PROJECT_ACTION" = wheel ]; then
        install_wheel "${WHEEL:-dist/atom_train-<built>.whl}"
        ((DRY_RUN)) || record project "$(wheel_key "$WHEEL")"
    fi
}

# Dies with the fix unless .venv's torch sees the GPU and Triton imports.
check_torch() {
    local out rc=0 older
    out=$("$VENV_PY" - <<'EOF' 2>&1
import sys
try:
    import torch
except Exception as e:
    sys.exit(f"torch does not import: {e}")
if torch.version.cuda is None:
    print(torch.__version__)
    sys.exit(3)
if not torch.cuda.is_available():
    print(torch.__version__, torch.version.cuda)
    sys.exit(4)
try:
    import triton
except Exception as e:
    sys.exit(f"triton does not import: {e}")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, "
      f"{torch.cuda.get_device_name(0)}")
EOF
    ) || rc=$?
    case $rc in
        0) say "$out" ;;
        3) die_cpu_torch "$(tail -n1 <<<"$out")" ;;
        4)
            read -r HAVE_TORCH HAVE_CUDA <<<"$(tail -n1 <<<"$out")"
            if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
                die "torch $HAVE_TORCH does not see the GPU: CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES' hides it: unset it and rerun"
            fi
            older=$(awk -v c="$HAVE_CUDA" '$2 != "-" && $3 + 0 < c + 0 { print $2; exit }' <<<"$TORCH_BUILDS")
            [ -n "$older" ] || die "torch $HAVE_TORCH (CUDA $HAVE_CUDA) does not see the GPU with driver $DRIVER: update the NVIDIA driver"
            die "torch $HAVE_TORCH (CUDA $HAVE_CUDA) does not see the GPU with driver $DRIVER: try an older build: $VENV_PY -m pip uninstall -y torch && TORCH_INDEX=$older scripts/setup_gpu_box.sh"
            ;;
        *) die "$(tail -n1 <<<"$out"): see $VENV_PY -c 'import torch, triton'" ;;
    esac
}

main() {
    parse_args "$@"
    cd "$(dirname "${BASH_SOURCE[0]}")/.."

    # Decide.
    find_python
    read_gpu
    plan_deps
    choose_torch
    if [ -e "$VENV_PY" ]; then
        local v
        v=$("$VENV_PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
            || die "$VENV_PY does not run (its Python moved or was removed?): remove .venv and rerun"
        version_ge "$v" 3.11 || die ".venv has Python $v, the project needs >= 3.11: remove .venv and rerun"
    fi
    plan_torch
    plan_project

    # Act.
    if [ -x "$VENV_PY" ] && [ "$TORCH_ACTION$DEPS_ACTION$PROJECT_ACTION" = keepkeepkeep ]; then
        say "nothing to install: .venv, torch, the dependencies and the project are as the last run left them"
    else
        [ "$TORCH_ACTION" = keep ] || check_disk
        install
    fi

    # Check.
    if ((DRY_RUN)); then
        say "dry run: would check that torch sees the GPU and Triton imports"
    else
        check_torch
    fi
    if ((CHECK)); then
        run env PYTHON="$VENV_PY" bash scripts/gpu_check.sh "$OUT"
        ((DRY_RUN)) || say "figures in $OUT/summary.txt, $OUT/bench.json, $OUT/bench.png"
    else
        say "--no-check: scripts/gpu_check.sh not run"
    fi
}

main "$@"
