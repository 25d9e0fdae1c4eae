"""The checkpoint's content has one owner (atom_train.trainer.train_state): a checkpoint written by the
trainer is read back, field by field, through that module, and chat's and export's readers
see the same things."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.loader_state import header, same_state
from helpers.trainer_kit import args, run

from atom_train import train
from atom_train.trainer.checkpoint_file import FINAL, ROLLING, CheckpointError
from atom_train.trainer.plan import resolve_command
from atom_train.trainer.train_state import (
    LOADER_POSITIONS,
    MODEL,
    OPTIM,
    RNG_CPU,
    RNG_DROPOUT,
    RUNTIME,
    build_model,
    load_model,
    open_checkpoint,
    optimizer_moments,
    param_names,
    run_config_of,
    saved_loader_state,
    saved_lr_schedule,
)


@pytest.fixture(scope="module")
def done(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    assert run(corpus, out, 48, "--ckpt-every", "32", "--lr-schedule", "cosine") == 0
    return out


def test_every_field_of_a_trainer_checkpoint_reads_back(corpus, done):
    ck = open_checkpoint(done / FINAL)
    m = ck.meta
    assert set(m) == {
        "kind", "created", "model_config", "provenance", "training", "optimizer",
        "lr_schedule", "loader_state", "corpus", "origin", "config", "versions",
        "guard",
    }  # fmt: skip
    assert m["kind"] == "final" and m["origin"] == {"mode": "new"}
    # The divergence guard's detector, with the run's health when it was written.
    assert m["guard"]["version"] == 1 and m["guard"]["health"]["state"] == "healthy"
    tr = m["training"]
    assert (tr["tick"], tr["step"], tr["bytes_seen"], tr["B"]) == (48, 3, 192, 4)
    assert tr["total_ticks"] == 48 and tr["device"] == "cpu" and tr["world_size"] == 1
    assert tr["recurrence"] == "native" and tr["transport"] == "dense"  # resolved from auto
    assert m["provenance"] == {"pack_mode": "utf8", "feature_version": 1}
    assert m["model_config"]["n_modes"] == 8 and m["config"]["optimizer"]["lr_schedule"] == "cosine"
    # The loader state: its header here, its positions a tensor of the payload (format 2).
    assert m["loader_state"]["B"] == 4 and m["loader_state"]["version"] == 2
    assert "positions" not in m["loader_state"] and "contexts" not in m["loader_state"]
    assert m["corpus"]["signature"] == m["loader_state"]["corpus_signature"]
    positions = ck.tensors[LOADER_POSITIONS]
    assert positions.dtype == torch.int64 and positions.tolist() == [
        48 + 6000 * i for i in range(4)
    ]
    lr = saved_lr_schedule(m)
    assert lr is not None and lr.kind == "cosine" and (lr.start_step, lr.end_step) == (0, 3)
    # Tensors: the model, AdamW per parameter, the runtime of all B streams, the RNGs.
    model = build_model(ck)
    for k, v in model.state_dict().items():
        assert torch.equal(v, ck.tensors[f"{MODEL}/{k}"]), k
    names = param_names(ck)
    assert names == [n for n, _ in model.named_parameters()]
    moments = optimizer_moments(ck)
    assert list(moments) == names and all(int(x["step"]) == 3 for x in moments.values())
    runtime = ck.group(RUNTIME)
    assert set(runtime) == {"z", "P", "E", "g", "n_atoms", "e_buf", "h_buf"}
    assert runtime["z"].shape == (4, 16) and runtime["n_atoms"].tolist() == [16] * 4
    assert RNG_DROPOUT in ck.tensors and RNG_CPU in ck.tensors
    assert set(ck.tensors) == {
        *(f"{MODEL}/{k}" for k in model.state_dict()),
        *(f"{OPTIM}/{n}/{x}" for n in names for x in ("exp_avg", "exp_avg_sq", "step")),
        *(f"{RUNTIME}/{k}" for k in runtime),
        LOADER_POSITIONS, RNG_DROPOUT, RNG_CPU,
    }  # fmt: skip


def test_a_checkpoint_holds_its_runs_config_and_older_ones_read_as_one(corpus, done):
    """``meta["config"]`` is the run's RunConfig (its model section the model's own config);
    a checkpoint written before it (the fixture of the flat package, only ``args``) reads as a
    RunConfig too, by the one reader, with the same model section as its model_config."""
    from helpers import REPO

    from atom_train.model.config import ModelConfig
    from atom_train.trainer.run_config import RunConfig

    m = open_checkpoint(done / FINAL).meta
    config = run_config_of(m)
    assert config == RunConfig.from_dict(json.loads(json.dumps(m["config"])))
    assert config.value("lr_schedule") == "cosine" and config.value("B") == 4
    assert config.model == ModelConfig.from_dict(m["model_config"])
    assert "args" not in m  # (the config is the one record of the flags)
    old = open_checkpoint(REPO / "tests/fixtures/checkpoint-before-layers/ckpt-final.safetensors")
    assert "config" not in old.meta
    was = run_config_of(old.meta)
    assert was.model == ModelConfig.from_dict(old.meta["model_config"]) and was.model.n_modes == 8
    assert was.value("B") == old.meta["args"]["B"]


def test_restore_gives_back_what_was_packed(corpus, done):
    """A resume's TrainState holds exactly the checkpoint's content before any step."""
    argv = args(corpus, done, 48, "--ckpt-every", "32", "--lr-schedule", "cosine")
    plan = resolve_command(argv, warn=lambda m: None, every_flag_given=True)
    trainer = train.Trainer(plan, train.Signals())
    try:
        st = trainer.state
        tensors = st.tensors()
        meta = st.meta(
            "final",
            config=plan.run_config,
            corpus=plan.corpus,
            total=plan.total,
            recurrence=plan.recurrence,
            transport=plan.transport,
        )
    finally:
        trainer.close()
    ck = open_checkpoint(done / FINAL)
    assert set(tensors) == set(ck.tensors)
    for k, v in ck.tensors.items():
        assert torch.equal(tensors[k].cpu(), v), k
    for key in ("model_config", "provenance", "training", "optimizer", "lr_schedule",
                "loader_state", "corpus", "origin"):  # fmt: skip
        assert json.loads(json.dumps(meta[key])) == ck.meta[key], key  # as JSON stores it


def test_a_loader_snapshot_is_written_in_the_checkpoints_form(corpus, done):
    """The prefetcher hands over a compact snapshot per window; the checkpoint records the
    loader state made from it when written: its header in the metadata, its positions as a
    tensor."""
    argv = args(corpus, done, 48, "--ckpt-every", "32", "--lr-schedule", "cosine")
    plan = resolve_command(argv, warn=lambda m: None, every_flag_given=True)
    trainer = train.Trainer(plan, train.Signals())
    try:
        st, stream = trainer.state, trainer.stream
        saved = saved_loader_state(open_checkpoint(done / FINAL))
        assert same_state(st.loader_state_dict(), saved)
        want = stream.state_dict()
        st.loader_state = stream.snapshot()
        stream.next_window(8)  # the stream moves on; the snapshot does not
        meta = st.meta("final", config=plan.run_config, corpus=plan.corpus, total=plan.total)
        assert meta["loader_state"] == header(want) == header(st.loader_state_dict())
        assert torch.equal(st.tensors()[LOADER_POSITIONS], torch.from_numpy(want["positions"]))
        assert not same_state(want, stream.state_dict())
        joined = {**want, "B": 8, "positions": np.arange(8)}  # (all ranks' streams)
        meta = st.meta(
            "final",
            config=plan.run_config,
            corpus=plan.corpus,
            total=plan.total,
            loader_state=joined,
        )
        assert meta["loader_state"] == header(joined)
        assert st.tensors(loader_state=joined)[LOADER_POSITIONS].tolist() == list(range(8))
    finally:
        trainer.close()


def test_chat_reads_the_newest_valid_checkpoint_through_the_one_owner(done, tmp_path):
    from atom_train import chat

    assert chat.load_model is load_model  # chat has no reader of its own
    model, meta = load_model(done)
    final = open_checkpoint(done / FINAL)
    assert meta["path"] == str(done / FINAL) and meta["training"]["tick"] == 48
    assert not model.training
    for k, v in model.state_dict().items():
        assert v.device.type == "cpu" and torch.equal(v, final.tensors[f"{MODEL}/{k}"]), k
    # A damaged newest checkpoint is skipped, with a warning, for the next valid one.
    run = tmp_path / "run"
    shutil.copytree(done, run)
    data = bytearray((run / FINAL).read_bytes())
    data[-5] ^= 0xFF  # inside the payload: the checksum no longer matches
    (run / FINAL).write_bytes(bytes(data))
    warnings: list[str] = []
    model, meta = load_model(run, warn=warnings.append)
    assert meta["path"] == str(run / ROLLING) and meta["training"]["tick"] == 32
    assert len(warnings) == 1 and FINAL in warnings[0]
    rolling = open_checkpoint(run / ROLLING)
    changed = 0
    for k, v in model.state_dict().items():
        assert torch.equal(v, rolling.tensors[f"{MODEL}/{k}"]), k
        changed += not torch.equal(v, final.tensors[f"{MODEL}/{k}"])
    assert changed  # the weights are tick 32's, not the final's


def test_open_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint file or run folder"):
        open_checkpoint(tmp_path / "missing.safetensors")
    with pytest.raises(CheckpointError, match="holds no valid checkpoint"):
        open_checkpoint(tmp_path)


# ---- what the mutation check found unheld (make mutants, docs/testing.md) ------------------


def _prov(**fields) -> dict:
    return {"provenance": fields, "model_config": {"pack_mode": "utf8", "feature_version": 1}}


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({}, "the checkpoint does not record which features it was trained on (provenance "
             "pack_mode, feature_version): refusing to guess"),
        ({"provenance": "utf8"}, "does not record which features"),
        (_prov(feature_version=1), "does not record which features"),
        (_prov(pack_mode="utf8"), "does not record which features"),
        (_prov(pack_mode="bytes", feature_version=1),
         "the checkpoint was trained with pack mode 'bytes'; this atom knows utf8, plain: chat "
         "with the atom version that trained it"),
        (_prov(pack_mode="utf8", feature_version=2),
         "trained on features version 2; this atom computes version 1: upgrade atom"),
        (_prov(pack_mode="utf8", feature_version=0),
         "trained on features version 0; this atom computes version 1: chat with the atom "
         "version that trained it"),
        (_prov(pack_mode="utf8", feature_version="1"),
         "trained on features version '1'; this atom computes version 1: chat with"),
        (_prov(pack_mode="utf8", feature_version=True),
         "trained on features version True; this atom computes version 1: chat with"),
        ({**_prov(pack_mode="plain", feature_version=1)},
         "inconsistent checkpoint: provenance pack_mode is 'plain' but its model config says "
         "'utf8'"),
    ],
)  # fmt: skip
def test_a_checkpoint_of_other_features_is_refused_with_the_reason(meta, message):
    from atom_train.trainer.train_state import check_provenance

    with pytest.raises(CheckpointError) as e:
        check_provenance(meta, "/runs/x.safetensors")
    assert str(e.value).startswith("/runs/x.safetensors: ") and message in str(e.value)


def test_a_checkpoint_of_these_features_passes(tmp_path):
    from atom_train.trainer.train_state import check_provenance

    check_provenance(_prov(pack_mode="utf8", feature_version=1), "x")
    check_provenance({"provenance": {"pack_mode": "plain", "feature_version": 1}}, "x")


def test_a_resume_restores_the_counters_and_origin_it_was_saved_with(corpus, done, tmp_path):
    """Fields a checkpoint may lack (written before they existed) take their defaults:
    elapsed 0, no val score, origin "new"."""
    out = tmp_path / "run"
    shutil.copytree(done, out)
    from atom_train.trainer.checkpoint_file import load_checkpoint, save_checkpoint

    ck = load_checkpoint(out / FINAL)
    ck.meta["training"]["elapsed_s"] = 123.5
    del ck.meta["training"]["val_bpb"]
    ck.meta["training"]["val_ce_bpb"] = 2.25  # (the name before the metric names were settled)
    ck.meta["origin"] = {"mode": "fork", "source": "elsewhere"}
    save_checkpoint(out / FINAL, ck.tensors, ck.meta)
    t = _built(args(corpus, out, 96, "--ckpt-every", "32", "--lr-schedule", "cosine"))
    try:
        c = t.state.counters
        assert (c.tick, c.elapsed_s, c.val_bpb) == (48, 123.5, 2.25)
        assert t.state.origin == {"mode": "fork", "source": "elsewhere"}
    finally:
        t.close()
    for key in ("elapsed_s", "val_ce_bpb"):
        del ck.meta["training"][key]
    del ck.meta["origin"]
    save_checkpoint(out / FINAL, ck.tensors, ck.meta)
    t = _built(args(corpus, out, 96, "--ckpt-every", "32", "--lr-schedule", "cosine"))
    try:
        c = t.state.counters
        assert (c.elapsed_s, c.val_bpb) == (0.0, None) and t.state.origin == {"mode": "new"}
    finally:
        t.close()


def _built(argv: list[str]) -> train.Trainer:
    plan = resolve_command(argv, warn=lambda m: None, every_flag_given=True)
    return train.Trainer(plan, train.Signals())


def test_the_recorded_fields_have_their_documented_names_and_values(corpus, done):
    import platform
    import re

    import numpy as np

    import atom_train

    m = open_checkpoint(done / FINAL).meta
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", m["created"]), m["created"]
    assert m["versions"] == {
        "atom": atom_train.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    assert m["corpus"] == {
        "signature": [
            {"name": "train-0.txt", "size": 12000},
            {"name": "train-1.txt", "size": 12000},
        ],
        "size": 24000,
    }
    assert set(m["training"]) == {
        "tick", "step", "bytes_seen", "B", "total_ticks", "elapsed_s", "val_bpb", "noise_scale",
        "device", "world_size", "recurrence", "transport", "launch",
    }  # fmt: skip
    assert m["training"]["val_bpb"] is None  # --val-every 0: never scored
    assert m["training"]["launch"] is None  # not launched by the supervisor
    opt = m["optimizer"]
    assert opt["name"] == "AdamW" and opt["param_names"] == param_names(
        open_checkpoint(done / FINAL)
    )
    (group,) = opt["param_groups"]
    assert (
        "params" not in group and group["weight_decay"] == 0.01 and group["betas"] == [0.9, 0.999]
    )
