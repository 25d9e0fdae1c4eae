"""`atom_train.train_run(RunConfig, output_dir=...)`: training from a notebook or a script is
the command, not a second way to train. Both runs below write bit-identical checkpoints and
log the same losses (exact: no tolerance)."""

from __future__ import annotations

import pytest
from helpers.trainer_kit import TINY, run, sigint_stays_pytests, steps

import atom_train as atom
from atom_train.trainer.checkpoint_file import load_checkpoint
from atom_train.trainer.run_config import parse
from atom_train.trainer.rundir import FINAL


def test_train_run_writes_what_the_command_writes(corpus, tmp_path):
    cli, py = tmp_path / "cli", tmp_path / "py"
    assert run(corpus, cli, 48) == 0  # train.main with the command line

    # The same run, typed: the flags parsed into a RunConfig, then changed by name in Python.
    config, _, _ = parse(["--data", str(corpus / "train-*.txt"), *TINY])
    config = config.replace(total_ticks=48)
    assert config.value("B") == 4 and config.model.n_modes == 8
    with sigint_stays_pytests():
        assert atom.train_run(config, output_dir=py) == 0

    a, b = load_checkpoint(cli / FINAL), load_checkpoint(py / FINAL)
    assert sorted(a.tensors) == sorted(b.tensors)
    for k in a.tensors:
        assert a.tensors[k].equal(b.tensors[k]), k
    assert [s["loss"] for s in steps(cli)] == [s["loss"] for s in steps(py)]
    assert a.meta["training"]["tick"] == b.meta["training"]["tick"] == 48


def test_train_run_resumes_and_forks_as_the_command_does(corpus, tmp_path):
    """A second call on the same folder resumes the run (as the command does); `fork=` starts
    a new run from a checkpoint of another."""
    config, _, _ = parse(["--data", str(corpus / "train-*.txt"), *TINY])
    with sigint_stays_pytests():
        assert atom.train_run(config.replace(total_ticks=32), output_dir=tmp_path / "a") == 0
        assert atom.train_run(config.replace(total_ticks=48), output_dir=tmp_path / "a") == 0
        src = tmp_path / "a" / FINAL
        assert atom.train_run(config.replace(total_ticks=64), tmp_path / "b", fork=src) == 0
    assert load_checkpoint(tmp_path / "a" / FINAL).meta["training"]["tick"] == 48
    forked = load_checkpoint(tmp_path / "b" / FINAL).meta
    assert forked["training"]["tick"] == 64 and forked["origin"]["mode"] == "fork"


def test_train_run_refuses_what_is_not_a_run_config(tmp_path):
    with pytest.raises(TypeError, match="takes a RunConfig"):
        atom.train_run({"lr": 1e-3}, output_dir=tmp_path)
