"""The pre-flight command's own parts, called directly (`atom_train.preflight.command`): its
command line (`parse`: each refusal word for word, and what it accepts), the planned run's
shape for a resume, and the scratch folder (`open_scratch`: made fresh, a previous
pre-flight's replaced, anything else refused)."""

from __future__ import annotations

import pytest
from helpers.trainer_kit import TINY

from atom_train import train
from atom_train.common.cli import UserError
from atom_train.preflight import checks as pc
from atom_train.preflight import command as preflight
from atom_train.trainer.plan import resolve_command
from atom_train.trainer.rundir import FINAL

RUN = ["--data", "d/*.txt", "--output-dir", "runs/x"]


def refusal(argv: list[str]) -> str:
    with pytest.raises(UserError) as e:
        preflight.parse(argv)
    return str(e.value)


def test_the_command_lines_refusals_word_for_word(tmp_path):
    assert refusal(RUN) == (
        "missing `--` before the trainer's flags: python -m atom_train.preflight [options] -- "
        "--data 'data/*.txt' ... --output-dir runs/x"
    )
    assert refusal(["--minutes", "2", "--"]) == (
        "no trainer flags after `--` (the planned command's, e.g. --corpus DIR -B 128 ...)"
    )
    for m in ("0", "-1", "inf", "nan"):
        assert refusal(["--minutes", m, "--", *RUN]) == (
            f"--minutes must be a positive number, got {float(m)}"
        )
    for r in ("0", "-5"):
        assert refusal(["--assume-bytes-per-s", r, "--", *RUN]) == (
            f"--assume-bytes-per-s must be positive, got {float(r)}"
        )
    missing = str(tmp_path / "no" / "x.json")
    assert (
        refusal(["--json", missing, "--", *RUN]) == f"--json {missing}: its folder does not exist"
    )


def test_help_is_printed_from_the_command_line_given(capsys):
    with pytest.raises(SystemExit) as e:
        preflight.parse(["--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m atom_train.preflight [options]")


def test_a_good_command_line_splits_at_the_first_double_dash(tmp_path):
    argv = ["--minutes", "0.01", "--assume-bytes-per-s", "1e-3", "--json",
            str(tmp_path / "r.json"), "--keep-scratch", "--on-complete", "sudo poweroff",
            "--", *RUN, "--", "x"]  # fmt: skip
    ns, train_args = preflight.parse(argv)
    assert (ns.minutes, ns.assume_bytes_per_s, ns.json) == (0.01, 1e-3, str(tmp_path / "r.json"))
    assert ns.keep_scratch and ns.on_complete == "sudo poweroff"
    assert train_args == [*RUN, "--", "x"]
    ns, train_args = preflight.parse(["--", *RUN])  # the defaults
    assert (ns.minutes, ns.assume_bytes_per_s, ns.json, ns.keep_scratch) == (5.0, None, None, False)
    assert train_args == RUN


def test_a_resumes_shape_starts_at_its_checkpoints_tick(corpus, tmp_path):
    out = tmp_path / "run"
    base = ["--data", str(corpus / "train-*.txt"), "--val", "", *TINY, "--output-dir", str(out)]
    assert train.main([*base, "--total-ticks", "32"]) == 0
    argv = [*base, "--total-ticks", "96"]
    plan = resolve_command(argv, warn=lambda m: None)
    assert plan.mode == "resume"
    size = sum(p.stat().st_size for p in corpus.glob("train-*.txt"))
    assert preflight.shape_of(plan) == pc.RunShape(
        B=4, K=16, tick=32, total=96, steps=4, corpus_bytes=size, ckpt_every=plan.periods.ckpt,
        snapshot_every=0, val_every=0, sample_every=plan.periods.sample, log_every=16,
        val=False, tensorboard=False, loss_log_rate=0.0, resident=False,
    )  # fmt: skip
    # A fork starts at its checkpoint's tick too; --resident is carried.
    argv = [*base[:-1], str(tmp_path / "fork"), "--total-ticks", "96", "--resident",
            "--fork", str(out / FINAL)]  # fmt: skip
    plan = resolve_command(argv, warn=lambda m: None)
    assert plan.mode == "fork"
    shape = preflight.shape_of(plan)
    assert (shape.tick, shape.steps, shape.resident) == (32, 4, True)


def test_the_scratch_folder_is_made_fresh_beside_the_run(tmp_path):
    out = tmp_path / "deep" / "run"  # (its parent made too)
    scratch = preflight.open_scratch(out, keep=False)
    assert scratch == tmp_path / "deep" / "run.preflight" and scratch.is_dir()
    marker = scratch / preflight.SCRATCH_MARKER
    assert marker.read_text() == "the pre-flight's scratch folder: safe to delete\n"
    (scratch / "old.log").write_text("a previous pre-flight's")
    again = preflight.open_scratch(out, keep=True)
    assert again == scratch and sorted(p.name for p in again.iterdir()) == [marker.name]


def test_a_scratch_folder_that_is_not_the_pre_flights_or_cannot_be_made_is_refused(tmp_path):
    theirs = tmp_path / "run.preflight"
    theirs.mkdir()
    (theirs / "data.txt").write_text("someone's")
    with pytest.raises(UserError) as e:
        preflight.open_scratch(tmp_path / "run", keep=False)
    assert str(e.value) == (
        f"{theirs} exists and is not a pre-flight's scratch folder: move it, or choose another "
        "--output-dir"
    )
    assert (theirs / "data.txt").read_text() == "someone's"  # untouched
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError) as e:
        preflight.open_scratch(tmp_path / "file" / "run", keep=False)
    assert str(e.value) == (
        f"cannot create {tmp_path / 'file' / 'run.preflight'} (Not a directory): the output "
        "folder's parent must be writable"
    )
    assert e.value.__cause__ is None and e.value.__suppress_context__
