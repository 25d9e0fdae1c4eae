"""A checkpoint that does not fit is refused in one line that names the mismatch, by each
reader of atom_train.trainer.train_state (the trainer's restore, chat's and export's
readers); and what `TrainState` packs is exactly what its readers give back, field by field.

Checkpoints are built here with the train_state API itself (a tiny model, no training run):
each test takes milliseconds."""

from __future__ import annotations

import dataclasses
import json
import platform
from pathlib import Path

import numpy as np
import pytest
import torch

import atom_train
from atom_train.common.cli import LAUNCH_ID_ENV
from atom_train.model.config import ModelConfig
from atom_train.model.reference import ReferenceModel
from atom_train.trainer.checkpoint_file import (
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from atom_train.trainer.lr_schedule import LRSchedule
from atom_train.trainer.noise_scale import NoiseEMA
from atom_train.trainer.run_config import RunConfig
from atom_train.trainer.train_state import (
    LOADER_POSITIONS,
    MODEL,
    OPTIM,
    RNG_CPU,
    RNG_CUDA,
    RNG_DROPOUT,
    RUNTIME,
    Counters,
    TrainState,
    build_model,
    cuda_rng_states,
    load_model,
    loader_header,
    model_config,
    moved_loader_state,
    open_checkpoint,
    optimizer_moments,
    origin_of,
    param_names,
    run_config_of,
    saved_loader_state,
    saved_lr_schedule,
)

TINY = ModelConfig(n_modes=8, jl_dim=16, mlp_hidden=32, atom_dim=8, learnable_leak=True)
WIDER = dataclasses.replace(TINY, n_modes=16)  # every field tensor another shape
NO_LEAK = dataclasses.replace(TINY, learnable_leak=False)  # one parameter fewer, same shapes
PATH = Path("/runs/x/ckpt-final.safetensors")


class _Runtime:
    """The runtime's part of the contract: state_dict / load_state_dict."""

    def __init__(self) -> None:
        self.state = {"z": torch.arange(8.0).reshape(4, 2), "n_atoms": torch.tensor([1, 2, 3, 4])}
        self.loaded: dict | None = None

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, d: dict) -> None:
        self.loaded = dict(d)


@dataclasses.dataclass
class _Corpus:
    signature: list = dataclasses.field(default_factory=lambda: [{"name": "a.txt", "size": 9}])
    size: int = 9


def _loader() -> dict:
    return {"format": "atom-loader", "version": 2, "B": 4, "positions": np.array([0, 5, 7, 8])}


def _state(config: ModelConfig = TINY, *, steps: int = 0, seed: int = 0) -> TrainState:
    torch.manual_seed(seed)
    model = ReferenceModel(config)
    with torch.no_grad():  # weights that differ from a fresh model's
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.8, 0.99))
    for _ in range(steps):
        opt.zero_grad()
        sum((p * p).sum() for p in model.parameters()).backward()
        opt.step()
    return TrainState(
        config=config,
        model=model,
        optimizer=opt,
        runtime=_Runtime(),
        dropout_gen=torch.Generator().manual_seed(7),
        device=torch.device("cpu"),
        B=4,
        lr_schedule=LRSchedule(lr=1e-3, kind="cosine", warmup_steps=2, end_step=10),
        loader_state=_loader(),
    )


def _ck(st: TrainState, path: Path = PATH, **meta) -> Checkpoint:
    m = st.meta("rolling", config=RunConfig(), corpus=_Corpus(), total=64)
    m = json.loads(json.dumps({**m, **meta}))  # as a file stores it
    return Checkpoint(path=path, meta=m, tensors=st.tensors(), sha256="ab" * 32)


def _refusal(fn, *a) -> str:
    with pytest.raises(CheckpointError) as e:
        fn(*a)
    text = str(e.value)
    assert "\n" not in text, text  # one line
    return text


# ---- weights that do not fit: restore_weights (--init, a resume, a fork) -----------------


def test_restore_weights_loads_every_weight_of_a_fitting_checkpoint():
    source = _state(seed=1)
    st = _state(seed=2)
    st.restore_weights(_ck(source))
    for k, v in source.model.state_dict().items():
        assert torch.equal(st.model.state_dict()[k], v), k


def test_restore_weights_refuses_weights_of_another_shape_naming_the_tensor():
    text = _refusal(_state(WIDER).restore_weights, _ck(_state(TINY)))
    assert text == (
        f"{PATH}: the weights do not fit this model (size mismatch for compile.bias: copying a "
        "param with shape torch.Size([16]) from checkpoint, the shape in current model is "
        "torch.Size([32]).)"
    )


def test_restore_weights_refuses_a_missing_or_an_unexpected_weight():
    # Same shapes everywhere: only a strict load notices the parameter that is not there.
    text = _refusal(_state(TINY).restore_weights, _ck(_state(NO_LEAK)))
    assert text == (
        f"{PATH}: the weights do not fit this model "
        '(Missing key(s) in state_dict: "field_leak_logit".)'
    )
    text = _refusal(_state(NO_LEAK).restore_weights, _ck(_state(TINY)))
    assert text == (
        f"{PATH}: the weights do not fit this model "
        '(Unexpected key(s) in state_dict: "field_leak_logit".)'
    )


# ---- build_model / load_model (chat, export) -----------------------------------------------


def _saved(tmp_path: Path, st: TrainState, name: str = "ckpt-final.safetensors", **meta) -> Path:
    ck = _ck(st, **meta)
    p = tmp_path / name
    save_checkpoint(p, ck.tensors, ck.meta)
    return p


def test_load_model_gives_the_checkpoints_model_in_eval_mode(tmp_path):
    st = _state()
    p = _saved(tmp_path, st)
    model, meta = load_model(p)
    assert not model.training and model.config == TINY
    assert meta["path"] == str(p) and meta["kind"] == "rolling"
    for k, v in st.model.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    # A folder: its newest valid checkpoint, the same.
    model, meta = load_model(tmp_path)
    assert meta["path"] == str(p)


def test_chat_refuses_a_checkpoint_whose_weights_are_another_models(tmp_path):
    """The file says TINY but holds WIDER's weights: refused, naming the tensor."""
    p = _saved(tmp_path, _state(WIDER), model_config=TINY.to_dict())
    text = _refusal(load_model, p)
    assert text == (
        f"{p}: the weights do not fit the model config: size mismatch for compile.bias: copying a "
        "param with shape torch.Size([32]) from checkpoint, the shape in current model is "
        "torch.Size([16])."
    )


def test_build_model_refuses_missing_and_unexpected_weights_by_name(tmp_path):
    ck = _ck(_state(NO_LEAK), model_config=TINY.to_dict())
    assert _refusal(build_model, ck) == (
        f"{PATH}: the weights do not fit the model config: missing ['field_leak_logit'], "
        "unexpected []"
    )
    ck = _ck(_state(TINY), model_config=NO_LEAK.to_dict())
    assert _refusal(build_model, ck) == (
        f"{PATH}: the weights do not fit the model config: missing [], "
        "unexpected ['field_leak_logit']"
    )
    # Given a config, it is that config's model that the weights must fit.
    assert _refusal(build_model, _ck(_state(TINY)), NO_LEAK).endswith(
        "missing [], unexpected ['field_leak_logit']"
    )
    assert build_model(_ck(_state(NO_LEAK)), NO_LEAK).config == NO_LEAK


def test_build_model_refuses_a_checkpoint_without_weights_or_model():
    ck = _ck(_state())
    ck.tensors = {k: v for k, v in ck.tensors.items() if not k.startswith(MODEL + "/")}
    assert _refusal(build_model, ck) == (f"{PATH}: the checkpoint holds no model weights (model/*)")
    for bad in (None, "TINY", [1]):
        ck.meta["model_config"] = bad
        assert _refusal(build_model, ck) == (
            f"{PATH}: the checkpoint has no model config: not a model checkpoint"
        )
    del ck.meta["model_config"]
    assert _refusal(model_config, ck) == (
        f"{PATH}: the checkpoint has no model config: not a model checkpoint"
    )


def test_a_model_this_atom_cannot_build_is_refused_with_the_reason():
    ck = _ck(_state(), model_config={**TINY.to_dict(), "n_heads": 4})
    assert _refusal(model_config, ck).startswith(
        f"{PATH}: this atom cannot build the checkpoint's model: unknown model config key(s) "
        "['n_heads']"
    )
    ck.meta["model_config"] = {**TINY.to_dict(), "n_modes": "8"}
    assert _refusal(build_model, ck) == (
        f"{PATH}: this atom cannot build the checkpoint's model: model config 'n_modes' must "
        "be int, got '8' (str)"
    )
    # Valid as a config, but an option this model does not implement (the model says so).
    ck.meta["model_config"] = {**TINY.to_dict(), "readout": "soft"}
    assert model_config(ck).readout == "soft"
    text = _refusal(build_model, ck)
    assert text.startswith(
        f"{PATH}: this atom cannot build the checkpoint's model: the field model does not "
        "implement: "
    ), text
    assert model_config(_ck(_state())) == TINY


# ---- open_checkpoint -----------------------------------------------------------------------


def test_open_checkpoint_refusals_word_for_word(tmp_path):
    missing = tmp_path / "nope.safetensors"
    assert _refusal(open_checkpoint, missing) == (
        f"{missing}: no such checkpoint file or run folder"
    )
    assert _refusal(open_checkpoint, tmp_path) == (
        f"{tmp_path} holds no valid checkpoint (*.safetensors): give a checkpoint file or the "
        "output folder of a training run"
    )
    # A file whose metadata is JSON but not an object.
    p = tmp_path / "list.safetensors"
    save_checkpoint(p, {"model/x": torch.zeros(1)}, [1, 2])  # type: ignore[arg-type]
    assert _refusal(open_checkpoint, p) == (f"{p}: the checkpoint's metadata is not a JSON object")


def test_open_checkpoint_tells_warn_of_each_damaged_file_it_skips(tmp_path):
    good = _saved(tmp_path, _state(), "ckpt-rolling.safetensors")
    bad = tmp_path / "ckpt-final.safetensors"
    data = bytearray(good.read_bytes())
    data[-3] ^= 0xFF
    bad.write_bytes(bytes(data))
    # (the damaged file has a newer tick: it would be chosen if it verified)
    heard: list[str] = []
    assert open_checkpoint(tmp_path, warn=heard.append).path == good
    assert len(heard) == 1 and str(bad) in heard[0]
    assert open_checkpoint(good).path == good and open_checkpoint(str(good)).path == good


# ---- the optimizer: restore_optimizer, optimizer_moments ----------------------------------


def test_restore_optimizer_gives_back_every_moment_and_group():
    source = _state(steps=2, seed=1)
    st = _state(seed=2)
    st.optimizer.param_groups[0]["lr"] = 5.0
    st.restore_optimizer(_ck(source))
    (group,) = st.optimizer.param_groups
    assert group["lr"] == 1e-3 and group["betas"] == (0.8, 0.99)
    assert group["weight_decay"] == 0.01
    assert [id(p) for p in group["params"]] == [id(p) for p in st.model.parameters()]
    for (name, p), q in zip(st.model.named_parameters(), source.model.parameters(), strict=True):
        mine, theirs = st.optimizer.state[p], source.optimizer.state[q]
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(mine[k], theirs[k]), (name, k)
        assert float(mine["step"]) == 2.0 and mine["step"].device.type == "cpu"


def test_restore_optimizer_refuses_another_models_parameters():
    want = f"{PATH}: optimizer parameters differ from this model's"
    assert _refusal(_state(TINY).restore_optimizer, _ck(_state(NO_LEAK, steps=1))) == want
    ck = _ck(_state(TINY, steps=1))
    ck.meta["optimizer"]["param_names"] = list(reversed(ck.meta["optimizer"]["param_names"]))
    assert _refusal(_state(TINY).restore_optimizer, ck) == want
    del ck.meta["optimizer"]
    assert _refusal(_state(TINY).restore_optimizer, ck) == want


def test_a_checkpoint_before_the_first_step_restores_no_moments():
    ck = _ck(_state(steps=0))
    assert not ck.group(OPTIM) and optimizer_moments(ck) == {}
    st = _state(seed=3)
    st.restore_optimizer(ck)
    assert st.optimizer.state == {} or all(not s for s in st.optimizer.state.values())


def test_optimizer_moments_leave_out_parameters_without_all_three():
    ck = _ck(_state(steps=1))
    names = param_names(ck)
    del ck.tensors[f"{OPTIM}/{names[0]}/exp_avg_sq"]
    moments = optimizer_moments(ck)
    assert list(moments) == names[1:]
    assert set(moments[names[1]]) == {"exp_avg", "exp_avg_sq", "step"}
    # A file without parameter names (not a trainer checkpoint): no moments, no error.
    del ck.meta["optimizer"]["param_names"]
    assert optimizer_moments(ck) == {}
    del ck.meta["optimizer"]
    assert optimizer_moments(ck) == {}


def test_param_names_is_a_copy_in_model_order():
    ck = _ck(_state())
    names = param_names(ck)
    assert names == [n for n, _ in ReferenceModel(TINY).named_parameters()]
    names.append("x")
    assert "x" not in param_names(ck)


# ---- what is packed: tensors and meta, exactly ---------------------------------------------


def test_tensors_are_the_model_moments_runtime_positions_and_rngs():
    st = _state(steps=1)
    torch.manual_seed(11)
    t = st.tensors()
    names = st.param_names()
    assert set(t) == {
        *(f"{MODEL}/{k}" for k in st.model.state_dict()),
        *(f"{OPTIM}/{n}/{x}" for n in names for x in ("exp_avg", "exp_avg_sq", "step")),
        f"{RUNTIME}/z", f"{RUNTIME}/n_atoms", LOADER_POSITIONS, RNG_DROPOUT, RNG_CPU,
    }  # fmt: skip
    assert torch.equal(t[f"{RUNTIME}/z"], st.runtime.state["z"])
    assert t[LOADER_POSITIONS].dtype == torch.int64
    assert t[LOADER_POSITIONS].tolist() == [0, 5, 7, 8]
    assert torch.equal(t[RNG_DROPOUT], st.dropout_gen.get_state())
    assert torch.equal(t[RNG_CPU], torch.get_rng_state())
    # A step held as a number (older torch) is written as a tensor.
    p = next(st.model.parameters())
    st.optimizer.state[p]["step"] = 3
    step = st.tensors()[f"{OPTIM}/{names[0]}/step"]
    assert torch.is_tensor(step) and step.item() == 3.0 and step.dtype == torch.float32
    # Given: all ranks' runtime and loader state, the mask generator's state of the window.
    joined = {**_loader(), "positions": np.array([1, 2], dtype=np.int32)}  # (as int64)
    saved_gen = torch.Generator().manual_seed(99).get_state()
    st.dropout_state = saved_gen
    t = st.tensors(runtime_state={"z": torch.ones(2)}, loader_state=joined)
    assert {k for k in t if k.startswith(RUNTIME)} == {f"{RUNTIME}/z"}
    assert t[LOADER_POSITIONS].tolist() == [1, 2] and t[LOADER_POSITIONS].dtype == torch.int64
    assert torch.equal(t[RNG_DROPOUT], saved_gen)
    assert not any(k.startswith(RNG_CUDA) for k in t)  # a CPU run


def test_meta_records_each_field_as_documented(monkeypatch):
    st = _state(steps=1)
    st.counters = Counters(tick=48, step=3, elapsed_s=12.5, val_bpb=2.5)
    st.origin = {"mode": "init", "source": "s"}
    monkeypatch.delenv(LAUNCH_ID_ENV, raising=False)
    config = RunConfig.from_args({"lr": 1e-3, "B": 4})
    m = st.meta(
        "final", config=config, corpus=_Corpus(), total=96, world_size=2,
        recurrence="native", transport="dense",
    )  # fmt: skip
    assert set(m) == {
        "kind", "created", "model_config", "provenance", "training", "optimizer",
        "lr_schedule", "loader_state", "corpus", "origin", "config", "versions",
    }  # fmt: skip
    assert m["kind"] == "final" and m["model_config"] == TINY.to_dict()
    assert m["provenance"] == {"pack_mode": "utf8", "feature_version": 1}
    assert m["training"] == {
        "tick": 48, "step": 3, "bytes_seen": 192, "B": 4, "total_ticks": 96,
        "elapsed_s": 12.5, "val_bpb": 2.5, "launch": None, "noise_scale": None,
        "device": "cpu", "world_size": 2, "recurrence": "native", "transport": "dense",
    }  # fmt: skip
    assert m["optimizer"]["name"] == "AdamW"
    assert m["optimizer"]["param_names"] == st.param_names()
    (group,) = m["optimizer"]["param_groups"]
    assert "params" not in group and group["lr"] == 1e-3 and group["betas"] == (0.8, 0.99)
    assert m["lr_schedule"] == {
        "lr": 1e-3, "kind": "cosine", "warmup_steps": 2, "min_lr_ratio": 0.1,
        "start_step": 0, "end_step": 10,
    }  # fmt: skip
    assert m["loader_state"] == {"format": "atom-loader", "version": 2, "B": 4}
    assert m["corpus"] == {"signature": [{"name": "a.txt", "size": 9}], "size": 9}
    assert m["origin"] == {"mode": "init", "source": "s"}
    assert m["config"] == config.replace(model=TINY).to_dict()
    assert RunConfig.from_dict(m["config"]).model == TINY
    assert m["versions"] == {
        "atom": atom_train.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    # Defaults: one process, the loop and transport unsaid; the supervisor's launch id.
    monkeypatch.setenv(LAUNCH_ID_ENV, "launch-7")
    st.counters.noise = NoiseEMA(grad_sq_sum=1.5, weight=1.0, last_scale=2.0, count=1)
    m = st.meta("rolling", config=RunConfig(), corpus=_Corpus(), total=96)
    tr = m["training"]
    assert (tr["world_size"], tr["recurrence"], tr["transport"]) == (1, None, None)
    assert tr["launch"] == "launch-7" and tr["noise_scale"] == st.counters.noise.to_dict()
    joined = {**_loader(), "B": 8, "positions": np.arange(8)}
    m = st.meta("rolling", config=RunConfig(), corpus=_Corpus(), total=96, loader_state=joined)
    assert m["loader_state"] == {"format": "atom-loader", "version": 2, "B": 8}


def test_the_device_is_named_as_tensors_name_it():
    st = _state()
    st.device = "cpu"
    st.__post_init__()
    assert st.device == torch.device("cpu")


def test_a_loader_snapshot_is_recorded_as_its_state_dict():
    class Snapshot:
        def state_dict(self) -> dict:
            return {"B": 4, "positions": np.array([3, 2, 1, 0])}

    st = _state()
    st.loader_state = Snapshot()
    assert st.loader_state_dict()["B"] == 4
    assert st.tensors()[LOADER_POSITIONS].tolist() == [3, 2, 1, 0]
    st.loader_state = {"B": 1, "positions": [5]}
    assert st.loader_state_dict() is st.loader_state


# ---- restore_run: everything a resume continues from ---------------------------------------


def test_restore_run_gives_back_counters_rngs_runtime_loader_and_origin():
    source = _state(steps=2, seed=1)
    source.counters = Counters(
        tick=48, step=3, elapsed_s=9.5, val_bpb=2.0, noise=NoiseEMA(weight=1.0, count=2)
    )
    source.origin = {"mode": "fork", "source": "a"}
    torch.manual_seed(5)
    cpu = torch.get_rng_state()
    ck = _ck(source)
    st = _state(seed=2)
    st.dropout_state = torch.Generator().manual_seed(1).get_state()
    torch.manual_seed(6)
    st.restore_run(ck)
    assert torch.equal(torch.get_rng_state(), cpu)
    assert torch.equal(st.dropout_gen.get_state(), source.dropout_gen.get_state())
    assert st.dropout_state is None
    assert st.runtime.loaded is not None and set(st.runtime.loaded) == {"z", "n_atoms"}
    assert torch.equal(st.runtime.loaded["z"], source.runtime.state["z"])
    c = st.counters
    assert (c.tick, c.step, c.elapsed_s, c.val_bpb) == (48, 3, 9.5, 2.0)
    assert type(c.tick) is int and type(c.step) is int and type(c.elapsed_s) is float
    assert c.noise == source.counters.noise
    assert st.origin == {"mode": "fork", "source": "a"}
    assert st.loader_state["B"] == 4 and st.loader_state["positions"].tolist() == [0, 5, 7, 8]
    for k, v in source.model.state_dict().items():
        assert torch.equal(st.model.state_dict()[k], v), k
    p = next(st.model.parameters())
    assert float(st.optimizer.state[p]["step"]) == 2.0
    # This rank's share of the runtime when given.
    st.restore_run(ck, runtime_state={"z": torch.ones(1)})
    assert set(st.runtime.loaded) == {"z"}


def test_restore_run_refuses_another_models_weights_before_touching_the_rest():
    st = _state(WIDER)
    before = st.counters
    text = _refusal(st.restore_run, _ck(_state(TINY, steps=1)))
    assert text.startswith(f"{PATH}: the weights do not fit this model (size mismatch for ")
    assert st.counters is before and st.runtime.loaded is None


# ---- the small readers ---------------------------------------------------------------------


def test_origin_of_names_the_source_its_checksum_and_tick():
    source = _state()
    source.counters.tick = 32
    ck = _ck(source)
    assert origin_of("fork", ck) == {
        "mode": "fork",
        "source": str(PATH),
        "source_sha256": "ab" * 32,
        "source_tick": 32,
    }
    assert origin_of("init", ck, keep_optimizer=True) == {
        "mode": "init",
        "source": str(PATH),
        "source_sha256": "ab" * 32,
        "source_tick": 32,
        "keep_optimizer": True,
    }


def test_cuda_rng_states_are_in_device_number_order():
    t = {f"{RNG_CUDA}/{i}": torch.tensor([i]) for i in (10, 2, 0, 1)}
    t[RNG_CPU] = torch.tensor([-1])
    assert [int(x) for x in cuda_rng_states(t)] == [0, 1, 2, 10]
    assert cuda_rng_states({RNG_CPU: torch.tensor([0])}) == []


def test_a_rewind_moves_every_stream_on_around_the_corpus():
    state = {"B": 3, "positions": np.array([0, 5, 9], dtype=np.int32)}
    moved = moved_loader_state(state, 3, 10)
    assert moved["positions"].tolist() == [3, 8, 2] and moved["B"] == 3
    assert moved["positions"].dtype == np.int64 and state["positions"].tolist() == [0, 5, 9]
    assert moved_loader_state(state, 4, 0)["positions"].tolist() == [0, 0, 0]


def test_the_loader_state_is_its_header_and_its_positions_tensor():
    assert loader_header({"B": 2, "positions": [1, 2], "version": 2}) == {"B": 2, "version": 2}
    ck = _ck(_state())
    state = saved_loader_state(ck)
    assert state["positions"].tolist() == [0, 5, 7, 8] and state["version"] == 2
    assert "positions" not in ck.meta["loader_state"]  # (a copy: the meta is left as read)
    # Format 1: the JSON state lists its positions itself.
    del ck.tensors[LOADER_POSITIONS]
    ck.meta["loader_state"] = {"version": 1, "positions": [4, 4]}
    assert saved_loader_state(ck) == {"version": 1, "positions": [4, 4]}


def test_a_saved_lr_schedule_reads_back_or_is_none():
    st = _state()
    m = _ck(st).meta
    assert saved_lr_schedule(m) == st.lr_schedule
    assert saved_lr_schedule({}) is None
    assert saved_lr_schedule({"lr_schedule": [1e-3]}) is None
    assert saved_lr_schedule({"lr_schedule": {"lr": 1e-3, "shape": "x"}}) is None


def test_run_config_of_reads_the_config_or_an_older_checkpoints_args():
    m = _ck(_state(NO_LEAK), args={"B": 4}).meta
    assert run_config_of(m) == RunConfig.from_dict(m["config"])
    assert run_config_of(m).model == NO_LEAK
    old = {"args": {"B": 4}, "model_config": NO_LEAK.to_dict()}
    assert run_config_of(old).model == NO_LEAK and run_config_of(old).value("B") == 4
    assert run_config_of({"args": None}) == RunConfig.from_args({})
    assert run_config_of({"config": "x", "args": {"B": 4}}).value("B") == 4


def test_a_checkpoint_file_round_trips_through_the_one_owner(tmp_path):
    st = _state(steps=1)
    p = _saved(tmp_path, st)
    ck = load_checkpoint(p)
    for k, v in st.tensors().items():
        if k != RNG_CPU:
            assert torch.equal(ck.tensors[k], v), k
    assert ck.meta["optimizer"]["param_groups"][0]["betas"] == [0.8, 0.99]


# ---- the whole command: --init of a checkpoint whose weights are another model's -----------


def test_init_from_another_models_weights_is_refused_in_one_line(corpus, tmp_path, capsys):
    """The file's model config is the run's (the plan lets it through), its weights a wider
    model's: the trainer refuses before training, in one line naming the tensor."""
    from helpers.trainer_kit import run

    src = _saved(tmp_path, _state(WIDER), model_config=TINY.to_dict())
    capsys.readouterr()
    assert run(corpus, tmp_path / "out", 16, "--init", str(src)) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1, err
    assert err[0].startswith(
        f"[train] error: {src}: the weights do not fit this model (size mismatch for "
        "compile.bias: copying a param with shape torch.Size([32]) from checkpoint"
    ), err  # (the file named once)
    assert not list((tmp_path / "out").glob("*.safetensors"))


def test_chat_refuses_a_checkpoint_of_other_features_naming_the_file(tmp_path):
    p = _saved(tmp_path, _state(), provenance={"pack_mode": "utf8", "feature_version": 2})
    assert _refusal(load_model, p) == (
        f"{p}: the checkpoint was trained on features version 2; this atom computes version 1: "
        "upgrade atom"
    )


def test_a_model_config_at_odds_with_the_provenance_is_refused():
    from atom_train.trainer.train_state import check_provenance

    meta = {
        "provenance": {"pack_mode": "utf8", "feature_version": 1},
        "model_config": {"pack_mode": "utf8", "feature_version": 2},
    }
    assert _refusal(check_provenance, meta, "/runs/x") == (
        "/runs/x: inconsistent checkpoint: provenance feature_version is 1 but its model "
        "config says 2"
    )
