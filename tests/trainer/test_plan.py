"""resolve_run(config, lifecycle, given) -> RunPlan: what a command line means in its run folder, decided before
any work, and every refusal, without a subprocess (and without touching the folder)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from helpers.trainer_kit import args, snapshot_of

from atom_train import train
from atom_train.common.cli import UserError
from atom_train.trainer.checkpoint_file import FINAL, load_checkpoint
from atom_train.trainer.plan import resolve_command


def plan_of(argv: list[str], warnings: list[str] | None = None):
    warn = (warnings if warnings is not None else []).append
    return resolve_command(argv, warn=warn, every_flag_given=True)


def test_new_run(corpus, tmp_path):
    p = plan_of(args(corpus, tmp_path / "new", 32))
    assert p.mode == "new" and p.source is None and not p.changes and not p.pivot
    assert p.total == 32 and p.B == 4 and p.recurrence == "native" and p.transport == "dense"
    assert not (tmp_path / "new").exists(), "planning writes nothing"


def test_resume_with_the_same_command(corpus, done):
    before = snapshot_of(done)
    p = plan_of(args(corpus, done, 32, "--ckpt-every", "16"))
    assert p.mode == "resume" and p.source.path == done / FINAL
    assert p.changes == {} and p.extended is None and not p.pivot
    assert snapshot_of(done) == before


def test_longer_run_under_a_constant_rate_is_a_resume_not_a_pivot(corpus, done):
    p = plan_of(args(corpus, done, 64, "--ckpt-every", "16"))
    assert p.mode == "resume" and not p.pivot and p.extended == [32, 64]


def test_changed_policy_is_a_pivot(corpus, done):
    p = plan_of(args(corpus, done, 32, "--ckpt-every", "16", "--lr", "1e-3", "--grad-clip", "0.5"))
    assert p.pivot and p.changes == {"lr": [2e-3, 1e-3], "grad_clip": [1.0, 0.5]}
    # A new learning-rate segment from the pivot's step (no warm-up: m and v are intact).
    assert p.lr_schedule.lr == 1e-3 and p.lr_schedule.start_step == 2
    assert p.lr_schedule.warmup_steps == 0


def test_free_flags_are_recorded_but_are_not_a_pivot(corpus, done):
    argv = args(corpus, done, 32, "--ckpt-every", "16")
    argv[argv.index("--loader-threads") + 1] = "2"
    p = plan_of(argv)
    assert not p.pivot and p.other_changes == {"loader_threads": [1, 2]}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-B", "8"], "was trained with -B 4, not -B 8"),
        (["--atom-dim", "4"], "model flags differ"),
        (["--pack-mode", "plain"], "model flags differ"),
        (["--n-modes", "16"], "--init"),
    ],
)
def test_resume_refusals(corpus, done, extra, message):
    before = snapshot_of(done)
    with pytest.raises(UserError, match=message):
        plan_of(args(corpus, done, 64, *extra))
    assert snapshot_of(done) == before


def test_resume_on_another_corpus_is_refused(corpus, done, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("un autre texte, tout à fait différent.\n" * 50)
    argv = args(corpus, done, 64)
    argv[argv.index("--data") + 1] = str(other)
    with pytest.raises(UserError, match=r"cannot resume .*--init"):
        plan_of(argv)


def test_fork(corpus, done, tmp_path):
    src = done / FINAL
    argv = args(corpus, tmp_path / "branch", 64, "--ckpt-every", "16", "--fork", str(src))
    p = plan_of([*argv, "--lr", "5e-4"])
    assert p.mode == "fork" and p.source.path == src
    assert p.changes == {"lr": [2e-3, 5e-4], "total_ticks": [32, 64]}


def test_fork_into_a_folder_that_holds_a_run_is_refused(corpus, done, tmp_path):
    target = tmp_path / "taken"
    shutil.copytree(done, target)
    before = snapshot_of(target)
    with pytest.raises(UserError, match="already holds a run"):
        plan_of(args(corpus, target, 64, "--fork", str(done / FINAL)))
    assert snapshot_of(target) == before
    # A folder with only another run's loss.jsonl (killed before its first checkpoint) too.
    logs_only = tmp_path / "logs-only"
    logs_only.mkdir()
    (logs_only / "loss.jsonl").write_text(json.dumps({"event": "start", "tick": 0}) + "\n")
    with pytest.raises(UserError, match="already holds a run"):
        plan_of(args(corpus, logs_only, 64, "--fork", str(done / FINAL)))


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--n-modes", "16"], "model flags differ"), (["-B", "8"], "not -B 8")],
)
def test_fork_refuses_another_model_or_B(corpus, done, tmp_path, extra, message):
    with pytest.raises(UserError, match=message):
        plan_of(args(corpus, tmp_path / "b", 64, "--fork", str(done / FINAL), *extra))
    assert not (tmp_path / "b").exists()


def test_init_and_keep_optimizer(corpus, done, tmp_path):
    p = plan_of(args(corpus, tmp_path / "i", 16, "--init", str(done / FINAL), "--keep-optimizer"))
    assert p.mode == "init" and p.keep_optimizer and p.lr_schedule.start_step == 0
    with pytest.raises(UserError, match="--keep-optimizer needs --init"):
        plan_of(args(corpus, tmp_path / "k", 16, "--keep-optimizer"))
    with pytest.raises(UserError, match="not both"):
        plan_of(args(corpus, tmp_path / "k", 16, "--init", "x", "--fork", "y"))
    assert not (tmp_path / "k").exists()


def test_init_from_a_file_with_a_malformed_format_version(corpus, done, tmp_path):
    from safetensors.torch import save

    ck = load_checkpoint(done / FINAL)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(
        save(ck.tensors, metadata={"format": "atom.checkpoint", "format_version": "1a"})
    )
    with pytest.raises(UserError, match="malformed format_version '1a'"):
        plan_of(args(corpus, tmp_path / "i", 16, "--init", str(bad)))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lr", "-1"], "--lr must be a positive number"),
        (["--lr", "nan"], "--lr must be a positive number"),
        (["--grad-clip", "-0.5"], "--grad-clip must be >= 0"),
        (["--min-lr-ratio", "2"], "--min-lr-ratio must be in"),
        (["--recurrence", "nope"], "invalid choice"),
    ],
)
def test_bad_policy_values(corpus, tmp_path, extra, message):
    # (argparse's own refusals are UserErrors too: one line, exit 2, like every other)
    with pytest.raises(UserError, match=message):
        plan_of(args(corpus, tmp_path / "o", 16, *extra))


def test_triton_without_cuda_or_the_interpreter_is_a_user_error(corpus, tmp_path, monkeypatch):
    import atom_train.model.field_loops as fl

    real = fl.available
    monkeypatch.setattr(fl, "available", lambda loop, dev: loop != "triton" and real(loop, dev))
    with pytest.raises(UserError, match="--recurrence triton needs Triton and a CUDA device"):
        plan_of(args(corpus, tmp_path / "o", 16, "--recurrence", "triton"))
    assert plan_of(args(corpus, tmp_path / "o", 16)).recurrence == "native"  # auto on a CPU


def test_a_val_glob_matching_nothing_names_val(corpus, tmp_path):
    with pytest.raises(UserError, match=r"no file matches .*check --val$"):
        plan_of(args(corpus, tmp_path / "o", 16, "--val", str(tmp_path / "none-*.txt")))


def test_more_streams_than_corpus_bytes_warns(tmp_path):
    small = tmp_path / "small.txt"
    small.write_bytes(b"abc def. " * 10)  # 90 bytes
    warnings: list[str] = []
    argv = [*args(tmp_path, tmp_path / "o", 16), "-B", "128"]
    argv[argv.index("--data") + 1] = str(small)
    plan_of(argv, warnings)
    assert any("-B 128 is larger than the corpus (90 bytes)" in w for w in warnings), warnings


def test_trainer_exit_code_2_and_one_line_for_a_plan_refusal(corpus, done, capsys):
    assert train.main(args(corpus, done, 64, "-B", "8")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 1
    assert os.path.exists(done / FINAL)


def test_seeds_on_resume_are_ignored_and_recorded(corpus, done):
    """--seed and --offset-seed take effect when a run begins: a resume keeps the run's."""
    argv = args(corpus, done, 32, "--ckpt-every", "16", "--seed", "5", "--offset-seed", "3")
    p = plan_of(argv)
    assert p.mode == "resume" and not p.pivot and not p.changes
    assert p.ignored == {"seed": [0, 5], "offset_seed": [None, 3]}
    assert (p.seed, p.offset_seed) == (0, None)
    c = p.run_config  # what checkpoints save
    assert (c.value("seed"), c.value("offset_seed")) == (0, None)
    assert any(n.startswith("--seed 5 ignored") for n in p.notes), p.notes


def test_dist_timeout_is_a_free_flag(corpus, done):
    p = plan_of(args(corpus, done, 32, "--ckpt-every", "16", "--dist-timeout", "60"))
    assert not p.pivot and p.other_changes == {"dist_timeout": [600.0, 60.0]}
    assert p.hardware.dist_timeout == 60.0


def test_auto_passes_over_triton_for_a_model_its_kernels_do_not_fit(monkeypatch):
    """On CUDA, `auto` picks Triton unless the kernel report's spill table says the model is
    too big for it; then fused, with the reason. An explicit `triton` still runs, warned."""
    import torch

    import atom_train.model.field_loops as fl
    from atom_train.model.backend import resolve_recurrence
    from atom_train.model.config import ModelConfig

    real = fl.available
    monkeypatch.setattr(fl, "available", lambda loop, dev: loop == "triton" or real(loop, dev))
    cuda = torch.device("cuda", 0)  # (only its type is read)
    said: list[str] = []
    assert resolve_recurrence("auto", cuda, ModelConfig(n_modes=32), said.append) == "triton"
    assert said == []
    assert resolve_recurrence("auto", cuda, ModelConfig(n_modes=300), said.append) == "fused"
    assert said[-1].startswith("--recurrence auto: the fused loop, not Triton: n = 300")
    assert resolve_recurrence("triton", cuda, ModelConfig(n_modes=300), said.append) == "triton"
    assert said[-1].startswith("warning: --recurrence triton: n = 300")
    assert resolve_recurrence("auto", torch.device("cpu"), ModelConfig(), said.append) == "native"


def test_auto_picks_the_native_loop_on_a_cpu_and_says_so_when_it_cannot(monkeypatch):
    """On a CPU `auto` is the native loop when the extension has it; an extension built
    without it gives fused, said with the fix; an explicit `native` it cannot run is a user
    error naming the fix, and so is `native` on another device."""
    import torch

    import atom_train.model.field_loops as fl
    from atom_train.model.backend import resolve_recurrence

    cpu = torch.device("cpu")
    said: list[str] = []
    assert resolve_recurrence("auto", cpu, None, said.append) == "native" and said == []
    assert resolve_recurrence("fused", cpu, None, said.append) == "fused"
    with pytest.raises(UserError, match="--recurrence native runs on the CPU, not cuda"):
        resolve_recurrence("native", torch.device("cuda", 0), None, said.append)
    real = fl.available
    monkeypatch.setattr(fl, "available", lambda loop, dev: loop != "native" and real(loop, dev))
    assert resolve_recurrence("auto", cpu, None, said.append) == "fused"
    assert said == [
        "--recurrence auto: the fused loop, not the native one: this build of the extension "
        "has none (rebuild it: make setup)"
    ]
    with pytest.raises(UserError, match=r"lacks: rebuild it \(make setup\), or use --recurrence"):
        resolve_recurrence("native", cpu, None, said.append)
