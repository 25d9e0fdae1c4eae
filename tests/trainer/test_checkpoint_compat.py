"""A checkpoint written before a code change still loads and continues exactly.

`tests/fixtures/checkpoint-before-layers/` holds a final checkpoint written by the flat package
(before the layered one) with the tiny test config, and the losses that code logged when a
fork continued it to tick 96. The current code must read it (model, optimizer, loader, RNGs)
and log the same losses: the layout of the code moved, not the format or the arithmetic.

`tests/fixtures/checkpoint-format-1/` holds the same run's tick-48 checkpoint as the last code
of checkpoint format 1 wrote it (the loader state as JSON, with the B contexts), what that
code logged resuming it to tick 96, and a digest of the checkpoint it wrote there. A resume
with today's code (format 2: the positions as a tensor, the contexts from them) must log
the same losses, and write bit for bit what the resume of the same state in format 2 writes."""

from __future__ import annotations

import json
import shutil

from helpers import REPO
from helpers.trainer_kit import run, steps

from atom_train.trainer.checkpoint_file import FORMAT_VERSION, load_checkpoint, save_checkpoint
from atom_train.trainer.rundir import FINAL
from atom_train.trainer.train_state import (
    LOADER_POSITIONS,
    check_provenance,
    load_model,
    open_checkpoint,
    saved_loader_state,
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
    # Bit for bit the same resume of a format-2 checkpoint of that state. The reference is
    # today's own run to tick 48 (its loader state written in format 2) with the fixture's
    # weights, moments, runtime state and RNGs put in: whether a run from tick 0 gives the
    # fixture's floats again depends on the machine's kernels (torch's build, the CPU's
    # instruction set), the loader's state does not: it is asserted equal first.
    fresh = tmp_path / "fresh"
    assert run(corpus, fresh, src.meta["training"]["tick"]) == 0
    f2 = load_checkpoint(fresh / FINAL)
    old, new = saved_loader_state(src), saved_loader_state(f2)
    assert [int(p) for p in new["positions"]] == old["positions"]  # (format 1: a list)
    drop = {"positions", "version", "contexts"}  # (format 2 derives the contexts)
    assert {k: v for k, v in new.items() if k not in drop} == {
        k: v for k, v in old.items() if k not in drop
    }
    torch_side = ("model/", "optim/", "runtime/", "rng/")
    assert sorted(k for k in src.tensors if k.startswith(torch_side)) == sorted(
        k for k in f2.tensors if k.startswith(torch_side)
    )
    swapped = {k: src.tensors.get(k, v) if k.startswith(torch_side) else v
               for k, v in f2.tensors.items()}  # fmt: skip
    reference = tmp_path / "reference"
    reference.mkdir()
    save_checkpoint(reference / FINAL, swapped, f2.meta)
    assert run(corpus, reference, expected["resume_to_tick"]) == 0
    assert [[s["step"], s["loss"]] for s in steps(reference)] == got
    ref = load_checkpoint(reference / FINAL)
    state = (*torch_side, "loader/")
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
