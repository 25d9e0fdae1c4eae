"""A checkpoint written before a code change still loads and continues exactly.

`tests/fixtures/checkpoint-before-layers/` holds a final checkpoint written by the flat package
(before the layered one) with the tiny test config, and the losses that code logged when a
fork continued it to tick 96. The current code must read it (model, optimizer, loader, RNGs)
and log the same losses: the layout of the code moved, not the format or the arithmetic.

`tests/fixtures/checkpoint-format-1/` holds the same run's tick-48 checkpoint as the last code
of checkpoint format 1 wrote it (the loader state as JSON, with the B contexts), what that
code logged resuming it to tick 96, and a digest of the checkpoint it wrote there. A resume
with today's code (format 2: the positions as a tensor, the contexts from them) must log
the same losses and write the same weights, moments and runtime state, bit for bit."""

from __future__ import annotations

import json
import shutil

from helpers import REPO
from helpers.trainer_kit import run, steps

from atom_train.trainer.checkpoint_file import FORMAT_VERSION, load_checkpoint
from atom_train.trainer.rundir import FINAL
from atom_train.trainer.train_state import (
    LOADER_POSITIONS,
    check_provenance,
    load_model,
    open_checkpoint,
)

FIXTURE = REPO / "tests" / "fixtures" / "checkpoint-before-layers"
FORMAT_1 = REPO / "tests" / "fixtures" / "checkpoint-format-1"


def test_an_old_checkpoint_loads_for_chat():
    path = FIXTURE / "ckpt-final.safetensors"
    ckpt = open_checkpoint(path)
    check_provenance(ckpt.meta, path)
    model, meta = load_model(path)
    assert model.config.n_modes == 8 and model.config.learnable_leak
    assert meta["training"]["tick"] == 48
    for name, tensor in model.state_dict().items():  # the weights are the file's, unchanged
        assert tensor.equal(ckpt.tensors[f"model/{name}"]), name


def test_an_old_checkpoint_continues_exactly(corpus, tmp_path):
    expected = json.loads((FIXTURE / "expected.json").read_text())
    out = tmp_path / "fork"
    src = FIXTURE / "ckpt-final.safetensors"
    assert run(corpus, out, expected["fork_to_tick"], "--fork", str(src)) == 0
    got = [[s["step"], s["loss"]] for s in steps(out)]
    assert got == expected["fork_step_losses"]  # exact: the same floats, as logged


def test_a_format_1_checkpoint_resumes_bit_identically(corpus, tmp_path):
    expected = json.loads((FORMAT_1 / "expected.json").read_text())
    src = load_checkpoint(FORMAT_1 / FINAL)
    assert src.meta["loader_state"]["version"] == 1 and "contexts" in src.meta["loader_state"]
    assert LOADER_POSITIONS not in src.tensors
    out = tmp_path / "run"
    out.mkdir()
    shutil.copy(FORMAT_1 / FINAL, out / FINAL)
    assert run(corpus, out, expected["resume_to_tick"]) == 0
    got = [[s["step"], s["loss"]] for s in steps(out)]
    assert got == expected["resume_step_losses"]  # exact: the same floats, as logged
    done = load_checkpoint(out / FINAL)
    assert done.meta["training"]["tick"] == expected["resume_to_tick"]
    # Bit for bit the run that never stopped (tick 0 to 96 in one go, the same seeds).
    straight = tmp_path / "straight"
    assert run(corpus, straight, expected["resume_to_tick"]) == 0
    ref = load_checkpoint(straight / FINAL)
    state = ("model/", "optim/", "runtime/", "rng/", "loader/")
    names = sorted(k for k in ref.tensors if k.startswith(state))
    assert names == sorted(k for k in done.tensors if k.startswith(state))
    for k in names:
        assert done.tensors[k].dtype == ref.tensors[k].dtype, k
        assert done.tensors[k].equal(ref.tensors[k]), k  # exact: no tolerance
    # Written in today's format: the positions a tensor, the loader's metadata without them.
    assert done.meta["loader_state"]["version"] == 2
    assert not {"positions", "contexts"} & set(done.meta["loader_state"])
    assert done.tensors[LOADER_POSITIONS].tolist() == expected["positions_at_96"]
    assert FORMAT_VERSION == 2


def test_a_format_1_checkpoint_loads_for_chat():
    model, meta = load_model(FORMAT_1 / FINAL)
    assert meta["training"]["tick"] == 48 and model.config.n_modes == 8
