"""The planner's refusals, in process and word for word: each message a user reads (the
fix it names), each threshold on both of its sides, and that a refused plan writes nothing.
(tests/trainer/test_plan.py checks the plans themselves; this file pins down what
`check_config`, `resolve_total`, the revert, fork and model-config checks say and where
their limits are.)"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.trainer_kit import args, run, snapshot_of

from atom_train.common.cli import UserError, quote
from atom_train.trainer.checkpoint_file import FINAL, ROLLING, load_checkpoint, save_checkpoint
from atom_train.trainer.plan import check_config, resolve_command, resolve_total
from atom_train.trainer.run_config import parse

# The fix a refused fork names (both fork refusals end with it).
FORK_FIX = "fork into a new --output-dir, or rerun without --fork to resume the run that is there"


@pytest.fixture(scope="module")
def pivoted(corpus, done, tmp_path_factory) -> Path:
    """`done` continued to tick 48 under --lr 1e-3 --grad-clip 0.5: one pivot, at tick 32
    (lr 0.002 -> 0.001, grad_clip 1.0 -> 0.5, total_ticks 32 -> 48)."""
    out = tmp_path_factory.mktemp("pivoted") / "run"
    shutil.copytree(done, out)
    assert run(corpus, out, 48, "--ckpt-every", "16", "--lr", "1e-3", "--grad-clip", "0.5") == 0
    return out


@pytest.fixture(scope="module")
def forked(corpus, done, tmp_path_factory) -> Path:
    """A fork of `done`'s final checkpoint, run to tick 48."""
    out = tmp_path_factory.mktemp("forked") / "run"
    assert run(corpus, out, 48, "--ckpt-every", "16", "--fork", str(done / FINAL)) == 0
    return out


def plan_of(argv: list[str], *, every_flag_given: bool = True):
    """The plan of a command line (`every_flag_given=False`: only the flags it names count
    as given, as on a real command line)."""
    return resolve_command(argv, warn=lambda _: None, every_flag_given=every_flag_given)


def refusal(argv: list[str], *, every_flag_given: bool = True) -> str:
    with pytest.raises(UserError) as e:
        plan_of(argv, every_flag_given=every_flag_given)
    return str(e.value)


def with_length(argv: list[str], *length: str) -> list[str]:
    """`argv` with its --total-ticks N replaced by `length`."""
    i = argv.index("--total-ticks")
    return [*argv[:i], *length, *argv[i + 2 :]]


# ---- check_config ------------------------------------------------------------------------


def test_no_training_data(corpus, tmp_path):
    argv = args(corpus, tmp_path / "o", 16)
    i = argv.index("--data")
    del argv[i : i + 2]
    assert refusal(argv) == "no training data: pass --data GLOB (a file, folder/*.txt, ...)"
    assert not (tmp_path / "o").exists()


def test_val_bytes_equal_to_val_streams_is_accepted_one_less_is_refused(corpus, tmp_path):
    val = ["--val", str(corpus / "val.txt"), "--val-streams", "4"]
    p = plan_of(args(corpus, tmp_path / "o", 16, *val, "--val-bytes", "4"))
    assert (p.val.bytes, p.val.streams) == (4, 4)
    assert refusal(args(corpus, tmp_path / "o", 16, *val, "--val-bytes", "3")) == (
        "--val-bytes must be at least --val-streams, which must be >= 1"
    )
    assert not (tmp_path / "o").exists()


def test_keep_optimizer_without_init(corpus, tmp_path):
    assert refusal(args(corpus, tmp_path / "o", 16, "--keep-optimizer")) == (
        "--keep-optimizer needs --init CKPT (it keeps that checkpoint's m and v); to continue "
        "a run with its optimizer, resume it or --fork it"
    )


def test_init_and_fork_together(corpus, tmp_path):
    argv = args(corpus, tmp_path / "o", 16, "--init", "a", "--fork", "b")
    assert refusal(argv) == "give --init or --fork, not both"
    # check_config says the same on its own (resolve_run asks before it reads either file).
    config, life, _ = parse(argv)
    with pytest.raises(UserError) as e:
        check_config(config, life)
    assert str(e.value) == "give --init or --fork, not both"


def test_an_unknown_recurrence(corpus, tmp_path):
    # (argparse refuses it on a command line; check_config guards the config itself)
    config, life, _ = parse(args(corpus, tmp_path / "o", 16))
    check_config(config.replace(recurrence="auto"), life)
    check_config(config.replace(recurrence="native"), life)
    with pytest.raises(UserError) as e:
        check_config(config.replace(recurrence="nope"), life)
    assert str(e.value) == (
        "--recurrence must be auto or one of fused, autograd, compiled, triton, native"
    )


# ---- resolve_total -----------------------------------------------------------------------


def length(ticks=None, nbytes=None) -> SimpleNamespace:
    return SimpleNamespace(total_ticks=ticks, total_bytes=nbytes)


def total_refusal(s: SimpleNamespace, B: int = 4) -> str:
    with pytest.raises(UserError) as e:
        resolve_total(s, B)
    return str(e.value)


def test_total_bytes_rounds_up_to_whole_ticks():
    assert resolve_total(length(nbytes=130), 4) == 33  # 32.5 ticks of 4 streams -> 33
    assert resolve_total(length(nbytes=128), 4) == 32
    assert resolve_total(length(nbytes=1), 4) == 1
    assert resolve_total(length(nbytes=130.0), 4) == 33  # (a float from 1.3e2)


def test_total_bytes_on_the_command_line(corpus, tmp_path):
    p = plan_of(with_length(args(corpus, tmp_path / "o", 16), "--total-bytes", "130"))
    assert p.total == 33 and p.B == 4


def test_total_ticks_is_taken_as_given():
    assert resolve_total(length(ticks=7), 4) == 7


def test_a_total_of_one_is_accepted_zero_is_refused():
    assert resolve_total(length(ticks=1), 4) == 1
    positive = "--total-ticks / --total-bytes must be positive"
    assert total_refusal(length(ticks=0)) == positive
    assert total_refusal(length(ticks=-3)) == positive
    assert total_refusal(length(nbytes=0)) == positive


def test_both_lengths_or_none():
    assert total_refusal(length(ticks=8, nbytes=32)) == (
        "give --total-ticks or --total-bytes, not both"
    )
    assert total_refusal(length()) == ("say how long to train: --total-ticks N or --total-bytes N")


@pytest.mark.parametrize("nbytes", [math.inf, math.nan])
def test_total_bytes_must_be_finite(nbytes):
    assert total_refusal(length(nbytes=nbytes)) == (
        f"--total-bytes must be a finite number (got {nbytes})"
    )


# ---- _check_no_revert: a rerun that would undo a pivot ----------------------------------------


def rerun(corpus: Path, out: Path, *extra: str) -> list[str]:
    """A later command for the pivoted run (its length, 48, as in force)."""
    return args(corpus, out, 48, "--ckpt-every", "16", *extra)


def test_going_back_across_a_pivot_is_refused(corpus, pivoted):
    before = snapshot_of(pivoted)
    argv = rerun(corpus, pivoted, "--lr", "2e-3", "--grad-clip", "1.0")
    assert refusal(argv, every_flag_given=False) == (
        f"this command would undo an earlier pivot of the run in {pivoted}: "
        "grad_clip 0.5 -> 1.0 (undoes the pivot at tick 32); "
        "lr 0.001 -> 0.002 (undoes the pivot at tick 32). "
        f"To resume with what is in force, rerun with only --output-dir {quote(pivoted)} "
        "(or leave those flags out); to undo it, add --revert-ok"
    )
    assert snapshot_of(pivoted) == before


def test_revert_ok_lets_it_through(corpus, pivoted):
    p = plan_of(
        rerun(corpus, pivoted, "--lr", "2e-3", "--grad-clip", "1.0", "--revert-ok"),
        every_flag_given=False,
    )
    assert p.mode == "resume" and p.pivot
    assert p.changes == {"lr": [0.001, 0.002], "grad_clip": [0.5, 1.0]}
    assert p.lr == 2e-3 and p.grad_clip == 1.0


def test_the_command_in_force_is_a_plain_resume(corpus, pivoted):
    p = plan_of(rerun(corpus, pivoted, "--lr", "1e-3"), every_flag_given=False)
    assert p.mode == "resume" and not p.pivot and p.changes == {} and p.notes == []


def test_values_no_pivot_moved_away_from_are_not_refused(corpus, pivoted):
    # A flag no pivot touched.
    p = plan_of(rerun(corpus, pivoted, "--weight-decay", "0.02"), every_flag_given=False)
    assert p.pivot and p.changes == {"weight_decay": [0.01, 0.02]}
    # A pivoted flag, onward to a value no pivot came from.
    p = plan_of(rerun(corpus, pivoted, "--lr", "5e-4"), every_flag_given=False)
    assert p.pivot and p.changes == {"lr": [0.001, 0.0005]} and p.lr == 5e-4


def rewrite_events(out: Path, edit) -> None:
    path = out / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(e) + "\n" for e in edit(events)))


def test_a_pivot_line_without_changes_is_skipped(corpus, pivoted, tmp_path):
    """The events are read leniently (a hand-edited or cut log): a pivot line that says
    nothing of what it changed neither undoes the check nor stops it."""
    out = tmp_path / "run"
    shutil.copytree(pivoted, out)
    rewrite_events(out, lambda ev: [*ev, {"event": "pivot", "tick": 40}])
    argv = rerun(corpus, out, "--lr", "2e-3")
    assert refusal(argv, every_flag_given=False) == (
        f"this command would undo an earlier pivot of the run in {out}: "
        "lr 0.001 -> 0.002 (undoes the pivot at tick 32). "
        f"To resume with what is in force, rerun with only --output-dir {quote(out)} "
        "(or leave those flags out); to undo it, add --revert-ok"
    )


def test_what_an_automatic_pivot_set_stays_in_force(corpus, pivoted, tmp_path):
    """A rerun of the command that diverged, after the divergence guard's rewind (an
    automatic pivot): the values the guard set stay, said in the notes; not refused."""
    out = tmp_path / "run"
    shutil.copytree(pivoted, out)

    def automatic(events):
        return [
            {**e, "auto": "rewind", "skip_ticks": 16} if e["event"] == "pivot" else e
            for e in events
        ]

    rewrite_events(out, automatic)
    p = plan_of(rerun(corpus, out, "--lr", "2e-3", "--grad-clip", "1.0"), every_flag_given=False)
    assert p.mode == "resume" and not p.pivot and p.changes == {}
    assert p.lr == 1e-3 and p.grad_clip == 0.5
    assert p.run_config.value("lr") == 1e-3 and p.run_config.value("grad_clip") == 0.5
    assert p.notes == [
        "--grad-clip 1.0 not applied: the divergence guard's rewind at tick 32 set 0.5, "
        "which stays in force (--revert-ok applies it)",
        "--lr 0.002 not applied: the divergence guard's rewind at tick 32 set 0.001, "
        "which stays in force (--revert-ok applies it)",
    ]
    # --revert-ok applies them.
    p = plan_of(
        rerun(corpus, out, "--lr", "2e-3", "--grad-clip", "1.0", "--revert-ok"),
        every_flag_given=False,
    )
    assert p.lr == 2e-3 and p.grad_clip == 1.0 and p.notes == []


# ---- _check_refork: --fork into a folder that holds a run -------------------------------------


def test_fork_into_a_folder_with_another_run_is_refused(corpus, done, forked):
    before = snapshot_of(done)
    assert refusal(args(corpus, done, 48, "--fork", str(forked / FINAL))) == (
        f"--fork: {done} already holds a run (newest checkpoint {FINAL}): {FORK_FIX}"
    )
    assert snapshot_of(done) == before


def test_rerunning_a_forks_command_resumes_the_fork(corpus, done, forked):
    p = plan_of(args(corpus, forked, 48, "--ckpt-every", "16", "--fork", str(done / FINAL)))
    assert p.mode == "resume" and p.source.path == forked / FINAL and not p.pivot
    assert p.notes == [f"--fork ignored: resuming the fork in {forked} from {FINAL}"]


def test_a_fork_rerun_from_a_source_that_is_gone_resumes_the_fork(corpus, forked, tmp_path):
    gone = tmp_path / "moved-away.safetensors"
    p = plan_of(args(corpus, forked, 48, "--ckpt-every", "16", "--fork", str(gone)))
    assert p.mode == "resume" and p.source.path == forked / FINAL


def test_a_fork_folder_forked_again_from_another_checkpoint_is_refused(corpus, done, forked):
    other = done / ROLLING
    assert load_checkpoint(other).sha256 != load_checkpoint(done / FINAL).sha256
    assert refusal(args(corpus, forked, 48, "--fork", str(other))) == (
        f"--fork: {forked} already holds a run (newest checkpoint {FINAL}): {FORK_FIX}"
    )


# ---- _check_fork_target: --fork into a folder without checkpoints ------------------------------


def killed_fork(forked: Path, target: Path) -> Path:
    """A fork's folder killed before its first checkpoint: its logs, no checkpoint."""
    target.mkdir()
    for name in ("events.jsonl", "loss.jsonl"):
        shutil.copy(forked / name, target / name)
    return target


def test_a_fork_killed_before_its_first_checkpoint_starts_again(corpus, done, forked, tmp_path):
    target = killed_fork(forked, tmp_path / "branch")
    before = snapshot_of(target)
    p = plan_of(args(corpus, target, 48, "--ckpt-every", "16", "--fork", str(done / FINAL)))
    assert p.mode == "fork" and p.source.path == done / FINAL
    assert snapshot_of(target) == before


def test_a_killed_fork_of_another_checkpoint_is_refused(corpus, done, forked, tmp_path):
    target = killed_fork(forked, tmp_path / "branch")
    assert refusal(args(corpus, target, 48, "--fork", str(done / ROLLING))) == (
        f"--fork: {target} already holds a run (checkpoints or loss.jsonl): {FORK_FIX}"
    )


def test_a_folder_with_another_runs_logs_is_refused(corpus, done, tmp_path):
    target = tmp_path / "logs"
    target.mkdir()
    shutil.copy(done / "events.jsonl", target / "events.jsonl")  # (begins with "start")
    assert refusal(args(corpus, target, 48, "--fork", str(done / FINAL))) == (
        f"--fork: {target} already holds a run (checkpoints or loss.jsonl): {FORK_FIX}"
    )


def test_empty_logs_hold_no_run_a_single_byte_does(corpus, done, tmp_path):
    target = tmp_path / "empty-logs"
    target.mkdir()
    (target / "events.jsonl").write_bytes(b"")
    (target / "loss.jsonl").write_bytes(b"")
    argv = args(corpus, target, 48, "--fork", str(done / FINAL))
    assert plan_of(argv).mode == "fork"
    (target / "loss.jsonl").write_bytes(b"\n")
    assert refusal(argv) == (
        f"--fork: {target} already holds a run (checkpoints or loss.jsonl): {FORK_FIX}"
    )


# ---- _model_config and _check_init_shape -------------------------------------------------------

MODEL_FIX = (
    "the model never changes inside a run; rerun without them (a resume keeps the run's "
    "model), or start a new run from these weights with --init {ck} --output-dir NEW (the "
    "same model shape; other values of the shape-free fields like the leak or the episode "
    "length)"
)


def test_resume_with_other_model_flags(corpus, done):
    before = snapshot_of(done)
    message = refusal(args(corpus, done, 48, "--n-modes", "16", "--atom-dim", "4"))
    assert message == (
        f"model flags differ from the run in {done} (n_modes: checkpoint 8 vs flag 16, "
        "atom_dim: checkpoint 8 vs flag 4): " + MODEL_FIX.format(ck=quote(done / FINAL))
    )
    assert snapshot_of(done) == before


def test_fork_with_other_model_flags(corpus, done, tmp_path):
    source = done / FINAL
    message = refusal(args(corpus, tmp_path / "b", 48, "--fork", str(source), "--n-modes", "16"))
    assert message == (
        f"model flags differ from --fork {source} (n_modes: checkpoint 8 vs flag 16): "
        + MODEL_FIX.format(ck=quote(source))
    )
    assert not (tmp_path / "b").exists()


def with_model_config(done: Path, path: Path, **fields) -> Path:
    """A copy of `done`'s final checkpoint whose saved model config has `fields`."""
    ck = load_checkpoint(done / FINAL)
    meta = {**ck.meta, "model_config": {**ck.meta["model_config"], **fields}}
    return save_checkpoint(path, ck.tensors, meta)


def test_a_checkpoint_whose_model_config_does_not_fit(corpus, done, tmp_path):
    odd = with_model_config(done, tmp_path / "odd.safetensors", dt="fast")
    fits_not = (
        f"{odd}: its model config does not fit this atom (model config 'dt' must be float, "
        "got 'fast' (str))"
    )
    assert refusal(args(corpus, tmp_path / "f", 48, "--fork", str(odd))) == fits_not
    assert refusal(args(corpus, tmp_path / "i", 16, "--init", str(odd))) == fits_not
    # (the checkpoint's own config is read even where the flags would replace the field)
    assert refusal(args(corpus, tmp_path / "i", 16, "--init", str(odd), "--dt", "0.5")) == (
        fits_not
    )
    assert not (tmp_path / "f").exists() and not (tmp_path / "i").exists()


def test_a_checkpoint_with_an_option_the_batched_tick_lacks(corpus, done, tmp_path):
    odd = with_model_config(done, tmp_path / "odd.safetensors", max_span_bytes=2)
    assert refusal(args(corpus, tmp_path / "f", 48, "--fork", str(odd))) == (
        "model config: the batched tick does not implement: max_span_bytes=2 (atoms spanning "
        "several bytes (every tick is one byte here); only 1 is implemented)"
    )


def test_a_new_run_with_a_model_value_out_of_range(corpus, tmp_path):
    assert refusal(args(corpus, tmp_path / "o", 16, "--persist-rate", "2")) == (
        "bad model config: model config persist_rate must be in [0, 1], got 2.0"
    )
    assert not (tmp_path / "o").exists()


def test_init_with_another_pack_mode(corpus, done, tmp_path):
    source = done / FINAL
    assert refusal(
        args(corpus, tmp_path / "i", 16, "--init", str(source), "--pack-mode", "plain")
    ) == (
        "--init checkpoint was trained with pack_mode='utf8', not 'plain': features of another "
        "pack_mode would turn its weights into noise"
    )
    assert not (tmp_path / "i").exists()
    # The checkpoint's own pack mode, named on the command line, is accepted.
    argv = args(corpus, tmp_path / "i", 16, "--init", str(source), "--pack-mode", "utf8")
    p = plan_of(argv, every_flag_given=False)
    assert p.mode == "init" and p.config.pack_mode == "utf8"


def test_init_may_change_only_what_keeps_every_weights_shape(corpus, done, tmp_path):
    source = done / FINAL
    init = ["--init", str(source)]
    p = plan_of(args(corpus, tmp_path / "i", 16, *init, "--episode-length", "32"))
    assert p.mode == "init" and p.config.episode_length == 32 and p.config.n_modes == 8
    p = plan_of(args(corpus, tmp_path / "i", 16, *init))
    assert p.mode == "init" and p.config.episode_length == 64
    argv = args(corpus, tmp_path / "i", 16, *init, "--n-modes", "16", "--atom-dim", "4")
    message = refusal([*argv, "--episode-length", "32"])
    assert message == (
        f"--init {source}: the weights need the same model shape, and these flags change it: "
        "n_modes 8 (checkpoint) vs 16 (--n-modes), atom_dim 8 (checkpoint) vs 4 (--atom-dim); "
        "drop them (fields that keep the shape, like the leak or the episode length, may "
        "change)"
    )
    assert not (tmp_path / "i").exists()


def test_init_names_no_field_where_only_several_together_change_the_shape(monkeypatch):
    """Where no changed field alone changes a weight's shape but the fields together do (no
    such pair in today's model: a stand-in shape rule here), the refusal says so."""
    from atom_train.model.config import ModelConfig
    from atom_train.trainer import plan

    monkeypatch.setattr(
        plan, "_param_shapes", lambda c: {"w": (int(c.n_modes > 32 and c.atom_dim > 16),)}
    )
    saved, config = ModelConfig(), ModelConfig(n_modes=64, atom_dim=32)
    with pytest.raises(UserError) as e:
        plan._check_init_shape(saved, config, SimpleNamespace(path=Path("a.safetensors")))
    assert str(e.value) == (
        "--init a.safetensors: the weights need the same model shape, and these flags change "
        "it: several fields together; drop them (fields that keep the shape, like the leak or "
        "the episode length, may change)"
    )
