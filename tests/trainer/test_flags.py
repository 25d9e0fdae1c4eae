"""The flag table (`atom_train.trainer.flags`): every trainer flag declared once, with a class, and
everything else (the parser, the planner's comparisons, the docs) derived from it."""

from __future__ import annotations

import argparse
import re

import pytest
from helpers import REPO

from atom_train.common.cli import UserError
from atom_train.train import build_parser
from atom_train.trainer import flags
from atom_train.trainer import plan as run_plan


def test_every_flag_of_the_parser_has_exactly_one_class():
    parser = build_parser()
    dests = {a.dest for a in parser._actions if not isinstance(a, argparse._HelpAction)}
    assert dests == set(flags.BY_DEST), dests ^ set(flags.BY_DEST)
    for f in flags.FLAGS:
        assert f.cls in flags.CLASSES, f
    assert len(flags.FLAGS) == len(flags.BY_DEST), "a flag is declared twice"
    by_class = [set(flags.dests(c)) for c in flags.CLASSES]
    assert sum(map(len, by_class)) == len(flags.FLAGS)


def test_a_flag_without_a_known_class_is_caught(monkeypatch):
    bad = flags.Flag("x", ("--x",), "sometimes", "data", "a flag nobody classified")
    monkeypatch.setattr(flags, "FLAGS", (*flags.FLAGS, bad))
    with pytest.raises(AssertionError):
        test_every_flag_of_the_parser_has_exactly_one_class()


def test_the_planner_compares_what_the_table_classifies():
    assert set(run_plan.POLICY_FLAGS) == set(flags.dests("policy")) - {"total_bytes"}
    assert set(run_plan.FREE_FLAGS) == set(flags.dests("free"))
    assert set(run_plan.BEGIN_ONLY_FLAGS) <= set(flags.dests("run"))
    # The three flags that were in no list before have a class and a rule now.
    assert flags.BY_DEST["seed"].cls == flags.BY_DEST["offset_seed"].cls == "run"
    assert flags.BY_DEST["dist_timeout"].cls == "free"
    assert {f.name for f in flags.model_flag_fields()} == set(flags.dests("model"))


def test_help_shows_every_default():
    text = build_parser().format_help()
    options = {"--lr": "0.002", "--ckpt-every": "2000", "--val-every": "2000", "-B": "64"}
    for flag, default in {**options, "--bptt": "64"}.items():
        entry = text[text.index(f"\n  {flag} ") + 1 :]
        entry = entry[: entry.index("\n  -")]  # up to the next option's entry
        assert f"(default: {default})" in " ".join(entry.split()), entry
    assert "model: n_modes (default 32)" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--threads", "-2"], "--threads must be >= 1 (got -2)"),
        (["--loader-threads", "0"], "--loader-threads must be >= 1"),
        (["-B", "0"], "-B must be >= 1"),
        (["--dist-timeout", "0"], "--dist-timeout must be a positive number"),
        (["--log-every", "-1"], "--log-every must be >= 0"),
    ],
)
def test_each_flag_checks_its_own_value(argv, message):
    ns = build_parser().parse_args(["--data", "x", *argv])
    with pytest.raises(UserError, match=re.escape(message)):
        flags.check_values(ns)


def test_the_docs_flag_reference_is_the_table():
    """docs/flags.md is generated: `python -m atom_train.trainer.flags > docs/flags.md`'s table."""
    doc = (REPO / "docs" / "flags.md").read_text()
    assert flags.markdown_table() in doc, (
        "regenerate docs/flags.md: python -m atom_train.trainer.flags"
    )
