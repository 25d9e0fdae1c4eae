"""A run's lifecycle (docs/design.md#a-runs-lifecycle): pivot, fork, init keeping the optimizer.

Bit-identity is claimed where the same computation runs (the same weights, optimizer state,
data and policy), as for a plain resume; runs with another policy are only checked for what
they must keep (m, v, loader state) and record (the events in loss.jsonl).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.trainer_kit import args, assert_same_state, last_by_step, run, steps

from atom_train import train
from atom_train.trainer.checkpoint_file import FINAL, list_checkpoints, load_checkpoint
from atom_train.trainer.plan import resolve_command
from atom_train.trainer.train_state import optimizer_moments, run_config_of


@pytest.fixture(scope="module")
def half(corpus, tmp_path_factory) -> Path:
    """A run stopped at tick 48 (16 ticks after a flush: live atoms), final checkpoint."""
    out = tmp_path_factory.mktemp("half")
    assert run(corpus, out, 48, "--ckpt-every", "48") == 0
    return out


@pytest.fixture(scope="module")
def straight(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("straight")
    assert run(corpus, out, 96, "--ckpt-every", "48") == 0
    return out


def events(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "loss.jsonl").read_text().splitlines() if '"event"' in x]


def built_trainer(argv: list[str]) -> train.Trainer:
    """The trainer a command line builds, before its first step (nothing trained)."""
    plan = resolve_command(argv, warn=lambda m: None, every_flag_given=True)
    plan.out.mkdir(parents=True, exist_ok=True)  # as train() does before building
    return train.Trainer(plan, train.Signals())


def assert_optimizer_is_the_checkpoints(trainer: train.Trainer, ck_path: Path) -> None:
    ck = load_checkpoint(ck_path)
    saved = optimizer_moments(ck)
    opt = trainer.state.optimizer
    names = trainer.state.param_names()
    assert set(saved) == set(names)
    for name, p in trainer.state.model.named_parameters():
        st = opt.state[p]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(st[key].cpu(), saved[name][key]), (name, key)


# ---- pivot ---------------------------------------------------------------------------------


def test_pivot_keeps_m_and_v_and_records_one_event(corpus, half, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(half, out)
    before = (out / "loss.jsonl").read_bytes()
    argv = args(corpus, out, 96, "--ckpt-every", "48", "--lr", "1e-3")
    t = built_trainer(argv)
    try:
        assert_optimizer_is_the_checkpoints(t, out / FINAL)
        assert t.state.counters.tick == 48
    finally:
        t.close()
    assert train.main(argv) == 0
    after = (out / "loss.jsonl").read_bytes()
    assert after.startswith(before), "the lines before the pivot are untouched"
    pivots = [e for e in events(out) if e["event"] == "pivot"]
    assert len(pivots) == 1
    assert pivots[0]["changes"]["lr"] == [2e-3, 1e-3] and pivots[0]["tick"] == 48
    assert pivots[0]["policy"]["lr"] == 1e-3
    later = [s for s in steps(out) if s["tick"] > 48]
    assert later and all(s["lr"] == 1e-3 for s in later)
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "completed" and status["policy"]["lr"] == 1e-3
    # The history before the pivot is the straight run's; after it, the run goes on from the
    # same weights (step 4 onward differ: another learning rate).
    assert last_by_step(out)[3] == last_by_step(half)[3]


def _model_step(before: Path, after: Path) -> dict[str, torch.Tensor]:
    """The change of every model tensor from one checkpoint to the next."""
    a, b = load_checkpoint(before).tensors, load_checkpoint(after).tensors
    return {k: b[k] - a[k] for k in a if k.startswith("model/")}


@pytest.fixture(scope="module")
def continued(corpus, half, tmp_path_factory) -> Path:
    """`half` resumed at its own learning rate (2e-3) for one window, to tick 64."""
    out = tmp_path_factory.mktemp("continued") / "run"
    shutil.copytree(half, out)
    assert run(corpus, out, 64, "--ckpt-every", "48") == 0
    return out


def assert_first_step_scaled(half: Path, run_dir: Path, continued: Path, ratio: float) -> None:
    """The first window after tick 48 moved every model tensor `ratio` times as far as the
    same window at 2e-3 did: AdamW's step (decay included) is lr times a function of the
    gradient and the moments, the same here (same weights, data and m, v)."""
    d_run, d_ref = _model_step(half / FINAL, run_dir), _model_step(half / FINAL, continued / FINAL)
    assert d_run.keys() == d_ref.keys()
    moved = [k for k in d_ref if d_ref[k].abs().max().item() > 0]  # buffers do not move
    assert len(moved) >= 3, moved
    for k in d_run:
        scale = d_ref[k].abs().max().item()
        err = (d_run[k] - ratio * d_ref[k]).abs().max().item()
        assert err <= 1e-3 * scale, f"{k}: not {ratio} x the step at 2e-3 (off by {err:.3g})"


def test_the_pivots_learning_rate_is_the_optimizers(corpus, half, continued, tmp_path):
    """A pivot to --lr 1e-3 steps at 1e-3: what is logged is not enough, the optimizer
    itself must take the new rate (its saved param groups hold the old one)."""
    out = tmp_path / "pivot"
    shutil.copytree(half, out)
    assert run(corpus, out, 64, "--ckpt-every", "48", "--lr", "1e-3") == 0
    assert_first_step_scaled(half, out / FINAL, continued, 0.5)


def test_a_rerun_that_changes_no_policy_flag_is_a_plain_resume(corpus, half, straight, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(half, out)
    assert run(corpus, out, 96, "--ckpt-every", "48") == 0
    assert [e["event"] for e in events(out)] == ["start", "resume"]
    assert events(out)[1]["total_ticks"] == [48, 96]  # the longer run is recorded
    assert_same_state(out / FINAL, straight / FINAL)


@pytest.mark.parametrize(
    ("extra", "message"), [(["--n-modes", "16"], "model flags differ"), (["-B", "8"], "not -B 8")]
)
def test_a_pivot_cannot_change_the_model_or_B(corpus, half, tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    shutil.copytree(half, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert run(corpus, out, 96, "--ckpt-every", "48", *extra) == 2
    err = capsys.readouterr().err
    assert message in err and "--init" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_pivot_to_another_bptt_cuts_on_the_global_grid(corpus, half, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(half, out)
    assert run(corpus, out, 96, "--ckpt-every", "48", "--bptt", "24") == 0
    ticks = [s["tick"] for s in steps(out) if s["tick"] > 48]
    # Windows close at multiples of 24 (and of 48, 64: ckpt and episode) from tick 0.
    assert ticks == [64, 72, 96]
    pivot = next(e for e in events(out) if e["event"] == "pivot")
    assert pivot["changes"] == {"bptt": [16, 24], "total_ticks": [48, 96]}


# ---- fork ----------------------------------------------------------------------------------


def test_a_fork_with_the_sources_flags_is_the_sources_continuation(
    corpus, half, straight, tmp_path
):
    src = half / FINAL
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert run(corpus, out, 96, "--ckpt-every", "48", "--fork", str(src)) == 0
    assert_same_state(a / FINAL, b / FINAL)  # two forks of one checkpoint agree
    assert_same_state(a / FINAL, straight / FINAL)  # and continue it exactly
    first = json.loads((a / "loss.jsonl").read_text().splitlines()[0])
    ck = load_checkpoint(src)
    assert first["event"] == "fork" and first["source"] == str(src)
    assert first["source_tick"] == 48 and first["source_sha256"] == ck.sha256
    assert load_checkpoint(a / FINAL).meta["origin"]["source_sha256"] == ck.sha256
    # The source run is untouched by its forks.
    assert [e["event"] for e in events(half)] == ["start"]


def test_an_audit_branch_with_another_lr_diverges_from_the_same_state(corpus, half, tmp_path):
    src = half / FINAL
    out = tmp_path / "audit"
    argv = args(corpus, out, 96, "--ckpt-every", "48", "--fork", str(src), "--lr", "5e-4")
    t = built_trainer(argv)
    try:
        assert_optimizer_is_the_checkpoints(t, src)
        assert t.state.counters.tick == 48 and t.state.counters.step == 3
    finally:
        t.close()
    assert train.main(argv) == 0
    first = json.loads((out / "loss.jsonl").read_text().splitlines()[0])
    assert first["changes"]["lr"] == [2e-3, 5e-4]
    assert all(s["lr"] == 5e-4 for s in steps(out))
    # Rerunning the fork's command resumes the fork (it does not fork again): finished, it
    # appends nothing; with a longer length, it goes on as a resume of the fork.
    assert train.main(argv) == 0
    assert [e["event"] for e in events(out)] == ["fork"]
    longer = args(corpus, out, 144, "--ckpt-every", "48", "--fork", str(src), "--lr", "5e-4")
    assert train.main(longer) == 0
    assert [e["event"] for e in events(out)] == ["fork", "resume"]


def test_an_audit_branch_steps_at_its_own_learning_rate(corpus, half, continued, tmp_path):
    """A fork with --lr 5e-4 from tick 48 moves the weights a quarter as far as the source's
    own next window: it diverges from the source because its optimizer runs at 5e-4."""
    out = tmp_path / "audit"
    assert (
        run(corpus, out, 64, "--ckpt-every", "48", "--fork", str(half / FINAL), "--lr", "5e-4") == 0
    )
    assert_first_step_scaled(half, out / FINAL, continued, 0.25)


def test_a_fork_into_a_folder_with_a_run_is_refused(corpus, half, straight, tmp_path, capsys):
    target = tmp_path / "taken"
    shutil.copytree(straight, target)
    before = {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()}
    assert run(corpus, target, 96, "--fork", str(half / FINAL)) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()} == before


# ---- init ----------------------------------------------------------------------------------


def test_init_keep_optimizer_on_another_corpus(corpus, half, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "train-0.txt").write_text("Tout autre texte : des chiffres 0123456789.\n" * 400)
    src = half / FINAL
    new = tmp_path / "new"

    def argv(total: int) -> list[str]:
        a = args(other, new, total, "--ckpt-every", "32", "--init", str(src), "--keep-optimizer")
        return [*a, "-B", "6"]  # another B is fine for a new run

    t = built_trainer(argv(32))
    try:
        assert_optimizer_is_the_checkpoints(t, src)
        assert t.state.counters.tick == 0
    finally:
        t.close()
    assert train.main(argv(32)) == 0
    start = events(new)[0]
    assert start["event"] == "start" and start["init"] == str(src) and start["keep_optimizer"]
    ck = load_checkpoint(new / FINAL)
    assert ck.meta["origin"]["mode"] == "init" and ck.meta["origin"]["keep_optimizer"]
    # AdamW's step counter went on from the source's (3 steps) by this run's 2.
    assert all(int(m["step"]) == 5 for m in optimizer_moments(ck).values())
    # It resumes exactly: 32 + 32 == 64 straight.
    assert train.main(argv(64)) == 0
    straight_new = tmp_path / "straight-new"
    a = [x if x != str(new) else str(straight_new) for x in argv(64)]
    assert train.main(a) == 0
    assert_same_state(new / FINAL, straight_new / FINAL)


def test_init_without_keep_optimizer_starts_adam_afresh(corpus, half, tmp_path):
    new = tmp_path / "fresh"
    assert run(corpus, new, 16, "--init", str(half / FINAL), "--ckpt-every", "0") == 0
    ck = load_checkpoint(new / FINAL)
    assert all(int(m["step"]) == 1 for m in optimizer_moments(ck).values())
    assert events(new)[0]["keep_optimizer"] is False


def test_keep_optimizer_without_init_is_refused(corpus, tmp_path, capsys):
    out = tmp_path / "x"
    assert run(corpus, out, 16, "--keep-optimizer") == 2
    assert "--keep-optimizer needs --init" in capsys.readouterr().err
    assert not out.exists() and not list_checkpoints(out)


def test_a_resume_with_other_seeds_keeps_the_runs_and_records_them(
    corpus, half, straight, tmp_path
):
    """--seed / --offset-seed take effect when a run begins: resuming with others continues
    the run exactly (the straight run's weights), says so, and records the ignored values."""
    out = tmp_path / "run"
    shutil.copytree(half, out)
    assert run(corpus, out, 96, "--ckpt-every", "48", "--seed", "7", "--offset-seed", "3") == 0
    resume = [e for e in events(out) if e["event"] == "resume"][-1]
    assert resume["ignored"] == {"seed": [0, 7], "offset_seed": [None, 3]}
    assert not [e for e in events(out) if e["event"] == "pivot"]
    assert_same_state(out / FINAL, straight / FINAL)
    saved = run_config_of(load_checkpoint(out / FINAL).meta).flat()
    assert (saved["seed"], saved["offset_seed"]) == (0, None)
