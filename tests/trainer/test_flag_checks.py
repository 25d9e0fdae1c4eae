"""The flag table's own functions (`atom_train.trainer.flags`) word for word: the value
checks on both sides of their bounds, the classes' destinations, a shared flag's one
spelling, the model's flags and their kinds, what a command line gives, and the defaults the
reference shows."""

from __future__ import annotations

import argparse
import math

import pytest

from atom_train.common.cli import UserError
from atom_train.trainer import flags


def test_a_lower_bound_and_its_message():
    at_least_1 = flags._at_least(1)
    assert [at_least_1(v) for v in (None, 1, 2.5)] == [None, None, None]
    assert at_least_1(0) == "must be >= 1 (got 0)"
    assert flags._at_least(0.5)(0.4) == "must be >= 0.5 (got 0.4)"
    assert flags._at_least(1, "a whole count")(0) == "must be a whole count (got 0)"


def test_positive_and_non_negative_numbers_are_finite():
    pos = flags._finite("a positive number", lambda v: v > 0)  # (as the table makes them)
    nonneg = flags._finite(">= 0", lambda v: v >= 0)
    assert [pos(v) for v in (None, 1e-9, 3)] == [None, None, None]
    for v in (0, -1.5, math.inf, math.nan):
        assert pos(v) == f"must be a positive number (got {v})"
    assert [nonneg(v) for v in (None, 0, 0.0, 7)] == [None, None, None, None]
    for v in (-0.1, math.inf, -math.inf, math.nan):
        assert nonneg(v) == f"must be >= 0 (got {v})"


def test_the_destinations_of_a_class_in_table_order():
    assert flags.dests("lifecycle") == ("output_dir", "fork", "init", "keep_optimizer",
                                        "revert_ok")  # fmt: skip
    with pytest.raises(ValueError) as e:
        flags.dests("sometimes")
    assert str(e.value) == "unknown flag class 'sometimes'"


def test_a_shared_flag_takes_its_names_from_the_shared_table():
    check = flags._at_least(1)
    f = flags._f("B", cls="run", group=flags._DATA, help="streams", check=check, type=int)
    assert f == flags.Flag("B", ("-B", "--streams"), "run", flags._DATA, "streams",
                           {"type": int}, check, "data")  # fmt: skip
    assert f.flag == "-B"
    with pytest.raises(ValueError) as e:
        flags._f("B", "-b", cls="run", group=flags._DATA, help="streams")
    assert str(e.value) == "B is a shared flag: its names are cli.SHARED_FLAGS'"
    life = flags._f("x", "--x", cls="lifecycle", group=flags._LOGS, help="x")
    assert life.section == "lifecycle"  # (whatever its --help group)
    own = flags._f("x", "--x", cls="free", group=flags._LOGS, help="x", section="guard")
    assert own.section == "guard"
    assert flags._f("x", "--x", cls="free", group=flags._HW, help="x").section == "hardware"


def test_the_model_flags_are_the_configs_fields_with_their_kinds():
    names = [f.name for f in flags.model_flag_fields()]
    assert "feature_version" not in names and names[:3] == ["n_modes", "jl_dim", "mlp_hidden"]
    by = {f.dest: f for f in flags._model_flags()}
    assert list(by) == names
    assert by["n_modes"].kwargs == {"type": int, "default": None}
    assert by["dt"].kwargs == {"type": float, "default": None}
    assert by["pack_mode"].kwargs == {"type": str, "default": None}
    assert by["learnable_leak"].kwargs == {"action": argparse.BooleanOptionalAction,
                                           "default": None}  # fmt: skip
    n = by["n_modes"]
    assert (n.names, n.cls, n.group, n.help, n.section) == (
        ("--n-modes",), "model", "model", "model: n_modes (default 32)", "model",
    )  # fmt: skip


def test_what_a_command_line_gives_and_the_parser_without_defaults():
    argv = ["--data", "x", "--lr", "1e-3", "--output-dir", "r"]
    assert flags.given_flags(argv) == frozenset({"data", "lr", "output_dir"})
    ns = flags.build_parser(suppress_defaults=True).parse_args(["--data", "x"])
    assert vars(ns) == {"data": ["x"]}
    ns = flags.build_parser().parse_args(["--data", "x"])
    assert ns.output_dir is None and ns.lr == 0.002 and ns.n_modes is None


def test_the_defaults_the_reference_shows():
    text = {d: flags._default_text(flags.BY_DEST[d])
            for d in ("output_dir", "resident", "n_modes", "init", "lr")}  # fmt: skip
    assert text == {"output_dir": "required", "resident": "off", "n_modes": "`32`",
                    "init": "-", "lr": "`0.002`"}  # fmt: skip
    table = flags.markdown_table().splitlines()
    assert table[:2] == ["| flag | class | default | what |", "|---|---|---|---|"]
    assert len(table) == 2 + len(flags.FLAGS)
    assert table[2 + list(flags.BY_DEST).index("B")].startswith("| `-B`, `--streams` | run |")


def test_help_gives_a_default_only_where_there_is_one_to_give():
    help_of = {a.dest: a.help for a in flags.build_parser()._actions}
    assert help_of["lr"] == flags.BY_DEST["lr"].help + " (default: %(default)s)"
    assert not help_of["init"].endswith("(default: %(default)s)")  # (no default)
    assert not help_of["resident"].endswith("(default: %(default)s)")  # (a switch)
    assert help_of["n_modes"] == "model: n_modes (default 32)"  # (a model flag's own)


def test_the_trainers_help_names_the_command_its_groups_and_the_shared_output_dir():
    """`python -m atom_train.train --help` as a user reads it: the command, its description
    (or the one a caller gives, with an epilog), every group's title and what it says, and
    --output-dir declared as the supervisor declares it."""
    text = flags.build_parser().format_help()
    assert text.startswith("usage: python -m atom_train.train [-h] [--data GLOB]")
    assert text.endswith(f"  {flags.FLAGS[-1].help}\n")  # (no epilog of its own)
    assert "\n\n" + flags._DOC + "\n\n" in text
    for group, said in flags.GROUP_HELP.items():
        assert f"\n\n{group}:\n  {said}\n\n" in text, group
    titles = [g.title for g in flags.build_parser()._action_groups]
    assert set(titles) >= {f.group for f in flags.FLAGS}
    assert "  --output-dir DIR      the run's folder (required: a new folder starts" in text
    other = flags.build_parser("a caller's own description", "and its epilog").format_help()
    assert "\n\na caller's own description\n\n" in other and flags._DOC not in other
    assert other.endswith("\n\nand its epilog\n")


def test_the_trainer_takes_no_abbreviated_flag():
    """--ckpt-ev for --ckpt-every would be a guess: refused, as the supervisor refuses it."""
    p = flags.build_parser()
    with pytest.raises(UserError) as e:
        p.parse_args(["--data", "x", "--ckpt-ev", "5"])
    assert "unrecognized arguments: --ckpt-ev 5" in str(e.value)
