# atom: `make demo` (set-up, then the demo job) and `make test` (set-up, then every check CI runs).
# Each check is also its own target, so a person runs exactly what CI runs.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP_DEPS := $(VENV)/.deps-installed
STAMP_EXT  := $(VENV)/.ext-built
RUST_CRATES := atomdata-rs atomfield-rs atom-py
RUST_SRC   := $(shell find $(RUST_CRATES:%=%/src) -name '*.rs' 2>/dev/null) $(RUST_CRATES:%=%/Cargo.toml) Cargo.toml
export PYO3_PYTHON := $(abspath $(PY))

.PHONY: setup demo test lint fmt-check clippy ruff shellcheck cargo-test kernel-check kernel-check-oldest kernel-report-full pytest bench wheel gpu-rehearsal mutants clean

setup: $(STAMP_EXT)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-installs only when pyproject.toml changes (torch is large: install it once). torch comes
# first, its build chosen for the machine (scripts/setup_torch.sh): PyPI's CUDA build where an
# NVIDIA driver is, the CPU-only build elsewhere; TORCH_INDEX=<pip index> (or pypi) chooses.
$(STAMP_DEPS): pyproject.toml scripts/list_deps.py scripts/setup_torch.sh | $(PY)
	bash scripts/setup_torch.sh $(PY)
	$(PY) scripts/list_deps.py pyproject.toml dev > $(VENV)/requirements.txt
	$(PY) -m pip install --quiet -r $(VENV)/requirements.txt
	touch $@

# Rebuilds the Rust extension (release, abi3) only when Rust sources change; installs the
# package editable into .venv, with the `atomdata-rs` console command.
$(STAMP_EXT): $(STAMP_DEPS) $(RUST_SRC) pyproject.toml
	PIP_QUIET=1 $(VENV)/bin/maturin develop --release --quiet  # (maturin runs pip: quiet it too)
	touch $@

demo: setup
	bash scripts/demo.sh

test: setup lint cargo-test pytest kernel-check-oldest

lint: fmt-check clippy ruff shellcheck

fmt-check:
	cargo fmt --all --check

clippy:
	cargo clippy --workspace --all-targets -- -D warnings

ruff: $(STAMP_DEPS)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Every script in scripts/: bash parses it, and shellcheck (from the dev dependencies) finds nothing.
shellcheck: $(STAMP_DEPS)
	for f in scripts/*.sh; do bash -n "$$f" || exit 1; done
	$(VENV)/bin/shellcheck scripts/*.sh

cargo-test:
	cargo test --workspace

# The Triton kernels as the GPU compiler builds them (no GPU needed): the kernel report with
# the oldest Triton the project supports, in a small cached side venv of Triton and numpy (the
# kernels compile from their source without torch), and with the .venv's Triton; any compile
# error fails. `make test` runs the oldest here and the .venv's in pytest
# (tests/commands/test_kernel_report.py, with the spill budgets); kernel-report-full is every variant
# at every n with both, for the tables in docs/performance.md (~20 min on 2 cores).
TRITON_OLDEST := 3.6.0
VENV_OLDEST   := .venv-triton-$(TRITON_OLDEST)
KERNEL_CHECK  := scripts/kernel_check.sh

$(VENV_OLDEST)/.installed-v2:
	$(PYTHON) -m venv $(VENV_OLDEST)
	$(VENV_OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_OLDEST)/bin/python -m pip install --quiet triton==$(TRITON_OLDEST) numpy
	touch $@

kernel-check-oldest: $(VENV_OLDEST)/.installed-v2
	bash $(KERNEL_CHECK) $(VENV_OLDEST)/bin/python

kernel-check: kernel-check-oldest setup
	bash $(KERNEL_CHECK) $(PY)

kernel-report-full: $(VENV_OLDEST)/.installed-v2 setup
	bash $(KERNEL_CHECK) --full $(VENV_OLDEST)/bin/python $(PY)

pytest: setup
	$(PY) -m pytest -q --durations=15  # (the 15 slowest tests listed at the end)

bench: setup
	$(PY) -m atom_train.bench

# Mutation testing (not part of `make test`): cargo-mutants on the two crates, then mutmut
# on each Python module that holds a guarantee, against that module's own tests
# (scripts/mutants.py has the list). Report: build/mutants/report.md; docs/testing.md
# explains every surviving mutant. About 2 h 40 min here (2 cores, busy with other jobs):
# the loader's crate 78 min, the Python modules ~80 min together (docs/testing.md has each
# part's time). MUTANTS_ARGS="--since main" mutates only what changed since main (a
# developer's loop; report: build/mutants/since/report.md).
# The tools are pinned and installed on first use: mutmut into .venv, cargo-mutants with
# cargo (into ~/.cargo/bin).
MUTMUT_VERSION        := 3.8.1
CARGO_MUTANTS_VERSION := 27.1.0
STAMP_MUTMUT          := $(VENV)/.mutmut-$(MUTMUT_VERSION)

$(STAMP_MUTMUT): $(STAMP_DEPS)
	$(PY) -m pip install --quiet mutmut==$(MUTMUT_VERSION)
	touch $@

mutants: setup $(STAMP_MUTMUT)
	cargo mutants --version 2>/dev/null | grep -qx 'cargo-mutants $(CARGO_MUTANTS_VERSION)' \
		|| cargo install --locked --quiet cargo-mutants --version $(CARGO_MUTANTS_VERSION)
	$(PY) scripts/mutants.py $(MUTANTS_ARGS)

# A wheel for another machine (abi3: any CPython >= 3.11 on linux x86_64), e.g. a GPU box
# without a Rust toolchain.
wheel: $(STAMP_DEPS)
	$(VENV)/bin/maturin build --release --out dist

# The GPU check (scripts/gpu_check.sh) end to end on this CPU, from the wheel: what a GPU's
# first 5 minutes will run, rehearsed (about 2 minutes on 2 cores; make test runs it too).
gpu-rehearsal: wheel
	PYTHON=$(abspath $(PY)) bash scripts/gpu_check.sh --rehearse runs/gpu-rehearsal

clean:
	cargo clean
	rm -rf $(VENV) $(VENV_OLDEST) dist build/kernel-report build/mutants atom_train/*.so
