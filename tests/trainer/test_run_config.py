"""RunConfig: built from the flag table, round trips through argv and dict exactly."""

import dataclasses
import json

import pytest

from atom_train.common.cli import UserError
from atom_train.trainer import flags as F
from atom_train.trainer.run_config import SECTION_TYPES, RunConfig, parse


def test_every_flag_lands_in_exactly_one_section_field_and_every_field_is_a_flag():
    seen: dict[str, str] = {}
    for section, typ in SECTION_TYPES.items():
        names = {f.name for f in dataclasses.fields(typ)}
        if section == "model":
            names = {f.name for f in F.model_flag_fields()}
        for n in names:
            assert n not in seen, f"{n} in {seen.get(n)} and {section}"
            seen[n] = section
            assert F.BY_DEST[n].section == section
    run_flags = {f.dest for f in F.FLAGS if f.section != "lifecycle"}
    assert set(seen) == run_flags
    assert all(f.section in F.SECTIONS for f in F.FLAGS)


ARGV = [
    "--data", "a.txt", "--data", "b/*", "--val", "", "-B", "8", "-K", "16", "--lr", "0.01",
    "--lr-schedule", "cosine", "--ckpt-every", "128", "--val-bytes", "4096", "--tf32",
    "--tensorboard", "--on-divergence", "warn", "--n-modes", "7", "--output-dir", "run",
]  # fmt: skip


def test_argv_config_argv_config_round_trip():
    c, life, given = parse(ARGV)
    assert life.output_dir == "run" and "output_dir" in given
    assert c.value("B") == 8 and c.schedule.bptt == 16 and c.model.n_modes == 7
    argv = c.to_argv()
    c2, _, _ = parse(argv)
    assert c2 == c
    assert c2.to_argv() == argv
    assert parse([])[0] == RunConfig() and RunConfig().to_argv() == []
    # Every flag spelled out (defaults too, booleans either way): the same config again.
    every = c.to_argv(every=True)
    assert parse(every)[0] == c and "--no-learnable-leak" in every and "--lr" in every
    assert parse(c.replace(tf32=False).to_argv(every=True))[0].hardware.tf32 is False


def test_dict_round_trip_is_json_safe_and_versioned():
    c = parse(ARGV)[0]
    d = json.loads(json.dumps(c.to_dict()))
    assert RunConfig.from_dict(d) == c
    with pytest.raises(UserError, match="format"):
        RunConfig.from_dict({**d, "format": 99})


def test_from_args_reads_an_old_checkpoints_args():
    c = parse(ARGV)[0]
    old = {**c.flat(), "n_modes": None, "output_dir": "x", "removed_flag": 1}
    r = RunConfig.from_args(old)
    assert r == c.replace(**{"model.n_modes": RunConfig().model.n_modes})


def test_replace_and_classes():
    c = RunConfig()
    assert c.replace(lr=0.5).optimizer.lr == 0.5
    assert c.replace(**{"optimizer.lr": 0.5}) == c.replace(lr=0.5)
    assert set(c.policy()) == set(F.dests("policy"))
    assert c.of_class("free") == c.free()
    with pytest.raises(ValueError):
        c.replace(output_dir="x")


def test_replace_tells_the_data_section_from_the_data_flag():
    """``data`` names a section and a flag (--data): a DataConfig replaces the section, a
    list of globs the flag."""
    c = RunConfig().replace(data=["a/*.txt"], B=8)
    assert c.data.data == ["a/*.txt"] and c.value("B") == 8
    d = c.replace(data=dataclasses.replace(c.data, resident=True))
    assert d.data.resident and d.data.data == ["a/*.txt"]
    with pytest.raises(TypeError, match="must be a OptimizerConfig"):
        c.replace(optimizer={"lr": 1.0})
