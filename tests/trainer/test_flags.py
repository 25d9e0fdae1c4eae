"""The flag table (`atom_train.trainer.flags`): every trainer flag declared once, with a class, and
everything else (the parser, the planner's comparisons, the docs) derived from it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch
from helpers import REPO, trainer_kit
from helpers.trainer_kit import make_corpus

from atom_train.common.cli import UserError
from atom_train.train import build_parser
from atom_train.trainer import flags
from atom_train.trainer import plan as run_plan
from atom_train.trainer.checkpoint_file import FINAL, load_checkpoint
from atom_train.trainer.train_state import run_config_of


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
    # The table as the code sees it everywhere (the parser is built from FLAGS at each call),
    # so the class check is the one that must fail.
    bad = flags.Flag("x", ("--x",), "sometimes", "data", "a flag nobody classified")
    monkeypatch.setattr(flags, "FLAGS", (*flags.FLAGS, bad))
    monkeypatch.setattr(flags, "BY_DEST", {**flags.BY_DEST, "x": bad})
    with pytest.raises(AssertionError, match="cls='sometimes'"):
        test_every_flag_of_the_parser_has_exactly_one_class()


def test_a_flag_declared_twice_is_caught(monkeypatch):
    twice = flags.Flag("lr", ("--learning-rate",), "policy", "policy", "the same dest again")
    monkeypatch.setattr(flags, "FLAGS", (*flags.FLAGS, twice))
    with pytest.raises(AssertionError, match="a flag is declared twice"):
        test_every_flag_of_the_parser_has_exactly_one_class()


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> tuple[Path, Path]:
    """(corpus, run folder) of a finished 32-tick run: what each flag is compared against."""
    corpus = make_corpus(tmp_path_factory.mktemp("flags-corpus"))
    out = tmp_path_factory.mktemp("flags") / "run"
    assert trainer_kit.run(corpus, out, 32, "--ckpt-every", "32") == 0
    return corpus, out


def _another_value(f: flags.Flag, old, corpus: Path) -> list[str]:
    """Command-line words that give flag `f` a value other than the run's `old`."""
    kw = f.kwargs
    if kw.get("action") == "store_true":
        return [f.flag]
    if kw.get("action") is argparse.BooleanOptionalAction:
        return [f.flag if not old else "--no-" + f.flag[2:]]
    if "choices" in kw:
        return [f.flag, next(c for c in kw["choices"] if c != old)]
    if kw.get("type") is int:
        return [f.flag, str(old * 2 if old else 3)]
    if kw.get("type") is float:
        return [f.flag, str(old / 2 if old else 0.25)]
    return [f.flag, f"{old}-other" if isinstance(old, str) else str(corpus / "val.txt")]


def _plan_outcome(plan: run_plan.RunPlan) -> str:
    return (
        f"{plan.mode}, changes {plan.changes}, other changes {plan.other_changes}, "
        f"ignored {plan.ignored}, extended {plan.extended}"
    )


def test_every_flag_changed_on_a_resume_gets_the_rule_of_its_class(saved_run):
    """Each flag of the table, changed alone on a resume, as the planner takes it: a policy
    flag is a pivot (the change recorded), a free flag a plain resume that records it, a
    begin-only run flag is ignored (recorded), the other run flags and model flags are
    refused. Every flag is tried, so a flag in the wrong class, or a class the planner
    forgets, fails here."""
    corpus, out = saved_run
    saved = run_config_of(load_checkpoint(out / FINAL).meta).flat()
    base = trainer_kit.args(corpus, out, 32, "--ckpt-every", "32")
    tried = set()
    for f in flags.FLAGS:
        if f.cls == "lifecycle":  # read by the plan, never compared
            continue
        argv = [*base, *_another_value(f, saved.get(f.dest), corpus)]
        if f.dest == "total_bytes":  # instead of --total-ticks: twice the bytes
            i = argv.index("--total-ticks")
            argv[i : i + 2] = []
            argv[argv.index("--total-bytes") + 1] = str(2 * 32 * saved["B"])
        try:
            plan = run_plan.resolve_command(argv, warn=lambda m: None)
        except UserError as e:
            outcome = ("refused", str(e))
        else:
            outcome = ("planned", plan)
        tried.add(f.dest)
        seen = outcome[1] if outcome[0] == "refused" else _plan_outcome(outcome[1])
        where = f"{f.flag} ({f.cls}) {outcome[0]}: {seen}"
        if f.cls == "model":
            assert outcome[0] == "refused" and "model flags differ" in outcome[1], where
            assert f.dest in outcome[1], where
        elif f.cls == "run" and f.dest in run_plan.BEGIN_ONLY_FLAGS:
            plan = outcome[1]
            assert outcome[0] == "planned" and set(plan.ignored) == {f.dest}, where
            assert not plan.changes and not plan.other_changes, where
        elif f.cls == "run":
            assert outcome[0] == "refused", where
        elif f.cls == "policy":
            plan = outcome[1]
            assert outcome[0] == "planned" and plan.mode == "resume" and not plan.other_changes
            key = "total_ticks" if f.dest == "total_bytes" else f.dest
            if key == "total_ticks":  # a longer run at a constant rate: an extension
                assert plan.extended == [32, 64] and not plan.changes, where
            else:
                assert set(plan.changes) == {key} and plan.pivot, where
        elif f.dest == "device" and not torch.cuda.is_available():
            assert outcome[0] == "refused" and "--device cuda" in outcome[1], where
        else:
            assert f.cls == "free", where
            plan = outcome[1]
            assert outcome[0] == "planned" and set(plan.other_changes) == {f.dest}, where
            assert not plan.changes and not plan.ignored, where
    assert tried == {f.dest for f in flags.FLAGS if f.cls != "lifecycle"}


def test_the_planner_compares_what_the_table_classifies():
    # (What the planner does with each class is tried flag by flag in
    # test_every_flag_changed_on_a_resume_gets_the_rule_of_its_class.)
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
