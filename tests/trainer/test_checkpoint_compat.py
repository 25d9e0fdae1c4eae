"""A checkpoint written before a code change still loads and continues exactly.

`tests/fixtures/checkpoint-before-layers/` holds a final checkpoint written by the flat package
(before the layered one) with the tiny test config, and the losses that code logged when a
fork continued it to tick 96. The current code must read it (model, optimizer, loader, RNGs)
and log the same losses: the layout of the code moved, not the format or the arithmetic."""

from __future__ import annotations

import json

from helpers import REPO
from helpers.trainer_kit import run, steps

from atom_train.trainer.train_state import check_provenance, load_model, open_checkpoint

FIXTURE = REPO / "tests" / "fixtures" / "checkpoint-before-layers"


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
