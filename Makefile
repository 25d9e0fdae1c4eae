# atom: `make demo` (set-up, then the demo job) and `make test` (set-up, then every check CI runs).
# Each check is also its own target, so a person runs exactly what CI runs.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP_DEPS := $(VENV)/.deps-installed
STAMP_EXT  := $(VENV)/.ext-built
RUST_SRC   := $(shell find atomdata-rs/src -name '*.rs' 2>/dev/null) atomdata-rs/Cargo.toml Cargo.toml
export PYO3_PYTHON := $(abspath $(PY))

.PHONY: setup demo test lint fmt-check clippy ruff cargo-test pytest bench wheel clean

setup: $(STAMP_EXT)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-installs only when pyproject.toml changes (torch is a few GB: install it once).
$(STAMP_DEPS): pyproject.toml scripts/list_deps.py | $(PY)
	$(PY) scripts/list_deps.py pyproject.toml dev > $(VENV)/requirements.txt
	$(PY) -m pip install --quiet -r $(VENV)/requirements.txt
	touch $@

# Rebuilds the Rust extension (release, abi3) only when Rust sources change; installs the
# package editable into .venv, with the `atomdata-rs` console command.
$(STAMP_EXT): $(STAMP_DEPS) $(RUST_SRC) pyproject.toml
	$(VENV)/bin/maturin develop --release --quiet
	touch $@

demo: setup
	bash scripts/demo.sh

test: setup lint cargo-test pytest

lint: fmt-check clippy ruff

fmt-check:
	cargo fmt --all --check

clippy:
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --workspace --all-targets --features python -- -D warnings

ruff: $(STAMP_DEPS)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

cargo-test:
	cargo test --workspace

pytest: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) -m atom_train.bench

# A wheel for another machine (abi3: any CPython >= 3.11 on linux x86_64), e.g. a GPU box
# without a Rust toolchain.
wheel: $(STAMP_DEPS)
	$(VENV)/bin/maturin build --release --out dist

clean:
	cargo clean
	rm -rf $(VENV) dist atom_train/*.so
