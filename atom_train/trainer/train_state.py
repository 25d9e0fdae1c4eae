"""What a training checkpoint holds, and how it is packed, restored and read back: the one
owner of the checkpoint's content. (The container, safetensors + checksum + atomic write +
format version, is `atom_train.trainer.checkpoint_file`'s.)

Tensors, by name:

- ``model/<key>``: the model's ``state_dict()`` (parameters and the frozen buffers R, W0);
- ``optim/<param>/{exp_avg,exp_avg_sq,step}``: AdamW's m, v and step per parameter;
- ``runtime/<key>``: the batched runtime state of all B streams (`BatchedByteTick.state_dict`);
- ``loader/positions``: int64 [B], each stream's corpus offset (the loader state's positions;
  the rest of the loader state is in the metadata);
- ``rng/dropout`` (the last-atom mask generator), ``rng/torch_cpu``, ``rng/torch_cuda/<i>``.

Metadata (JSON): ``kind``, ``created``, ``model_config``, ``provenance`` (pack mode, feature
version), ``training`` (tick, step, bytes_seen, B, total_ticks, elapsed_s, val_bpb,
noise_scale (the noise scale's moving averages, `NoiseEMA`; null before a measurement),
device, world_size, recurrence, transport), ``optimizer`` (name, parameter order, param
groups), ``lr_schedule``, ``loader_state`` (the loader's `state_dict()` of all B streams but
its positions: format, version, corpus signature, pack mode, feature version, B), ``corpus``, ``origin`` (how the run began: new, init or fork, and from which file),
``config`` (the run's `RunConfig`, `RunConfig.to_dict`: every flag's value in force, the
model section the model's own config; checkpoints written before it hold the flat
``dest -> value`` record ``args`` instead, which `run_config_of` reads too), ``versions``.

The trainer packs and restores through `TrainState`; chat and export read through
`open_checkpoint`, `load_model` and `optimizer_moments`; so all three agree by construction.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from atom_train import __version__
from atom_train.common.cli import LAUNCH_ID_ENV
from atom_train.data.atomizer import FEATURE_VERSION, PACK_MODES
from atom_train.model.config import ModelConfig
from atom_train.model.devices import normalize_device
from atom_train.model.reference import ReferenceModel
from atom_train.trainer.checkpoint_file import (
    Checkpoint,
    CheckpointError,
    latest_valid_checkpoint,
    load_checkpoint,
)
from atom_train.trainer.lr_schedule import LRSchedule
from atom_train.trainer.noise_scale import NoiseEMA
from atom_train.trainer.run_config import RunConfig

if TYPE_CHECKING:
    from atom_train.data.loader import StreamSnapshot

MODEL, OPTIM, RUNTIME = "model", "optim", "runtime"
LOADER_POSITIONS = "loader/positions"
RNG_DROPOUT, RNG_CPU, RNG_CUDA = "rng/dropout", "rng/torch_cpu", "rng/torch_cuda"
_MOMENTS = ("exp_avg", "exp_avg_sq", "step")


@dataclass
class Counters:
    """Where a run is: restored on resume and fork, zero for a new run."""

    tick: int = 0
    step: int = 0
    elapsed_s: float = 0.0  # training wall time of earlier launches
    val_bpb: float | None = None  # the newest validation (status.json shows it)
    # The noise scale's moving averages (--noise-scale-every): continued by a resume or fork.
    noise: NoiseEMA = field(default_factory=NoiseEMA)


@dataclass
class TrainState:
    """The live objects whose content a training checkpoint records.

    `runtime` is anything with `state_dict()` / `load_state_dict()` of the runtime tensors
    (a `BatchedByteTick`, or the distributed view of all ranks' streams); `loader_state` is
    the loader state after the last trained window: the loader's `state_dict()` (a dict), or
    a `StreamSnapshot` (what the prefetcher hands over with each window; made into the dict
    by `loader_state_dict()` when a checkpoint is written)."""

    config: ModelConfig
    model: ReferenceModel
    optimizer: torch.optim.Optimizer
    runtime: Any
    dropout_gen: torch.Generator
    device: torch.device
    B: int
    lr_schedule: LRSchedule
    loader_state: dict | StreamSnapshot = field(default_factory=dict)
    # The mask generator's state after the last trained window (the prefetcher draws ahead,
    # so the live generator is further on); None = the generator's own state.
    dropout_state: torch.Tensor | None = None
    counters: Counters = field(default_factory=Counters)
    origin: dict = field(default_factory=lambda: {"mode": "new"})

    def __post_init__(self) -> None:
        self.device = normalize_device(self.device)  # "cuda" -> "cuda:<index>", as tensors say

    # ---- packing ----

    def loader_state_dict(self) -> dict:
        """The loader state as the loader's `state_dict()` (what a checkpoint records)."""
        s = self.loader_state
        return s if isinstance(s, dict) else s.state_dict()

    def param_names(self) -> list[str]:
        return [n for n, _ in self.model.named_parameters()]

    def tensors(
        self,
        runtime_state: dict[str, torch.Tensor] | None = None,
        loader_state: dict | None = None,
    ) -> dict:
        """Every tensor of a checkpoint (runtime_state: the runtime tensors of all B streams,
        when they are not this process's `runtime.state_dict()`; loader_state: the loader
        state of all B streams, when it is not this process's `loader_state_dict()`)."""
        t: dict[str, torch.Tensor] = {}
        for k, v in self.model.state_dict().items():
            t[f"{MODEL}/{k}"] = v
        for name, p in self.model.named_parameters():
            st = self.optimizer.state.get(p)
            for key in _MOMENTS if st else ():
                v = st[key]
                t[f"{OPTIM}/{name}/{key}"] = v if torch.is_tensor(v) else torch.tensor(float(v))
        state = self.runtime.state_dict() if runtime_state is None else runtime_state
        for k, v in state.items():
            t[f"{RUNTIME}/{k}"] = v
        loader = self.loader_state_dict() if loader_state is None else loader_state
        t[LOADER_POSITIONS] = torch.from_numpy(np.asarray(loader["positions"], dtype=np.int64))
        t[RNG_DROPOUT] = (
            self.dropout_gen.get_state() if self.dropout_state is None else self.dropout_state
        )
        t[RNG_CPU] = torch.get_rng_state()
        if self.device.type == "cuda":
            for i, s in enumerate(torch.cuda.get_rng_state_all()):
                t[f"{RNG_CUDA}/{i}"] = s
        return t

    def meta(
        self,
        kind: str,
        *,
        config: RunConfig,
        corpus,
        total: int,
        world_size: int = 1,
        recurrence: str | None = None,
        transport: str | None = None,
        loader_state: dict | None = None,
    ) -> dict:
        """The checkpoint's metadata (`recurrence`, `transport`: the field loop and feature
        transport actually used, where the config may say "auto"; `loader_state`: the loader state
        of all B streams, when it is not this process's `loader_state_dict()`)."""
        c = self.counters
        return {
            "kind": kind,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "model_config": self.config.to_dict(),
            "provenance": {
                "pack_mode": self.config.pack_mode,
                "feature_version": self.config.feature_version,
            },
            "training": {
                "tick": c.tick,
                "step": c.step,
                "bytes_seen": c.tick * self.B,
                "B": self.B,
                "total_ticks": total,
                "elapsed_s": c.elapsed_s,
                "val_bpb": c.val_bpb,
                # the supervisor's id of the launch that wrote it (None: not supervised)
                "launch": os.environ.get(LAUNCH_ID_ENV),
                "noise_scale": c.noise.to_dict() if c.noise.count else None,
                "device": str(self.device),
                "world_size": world_size,
                "recurrence": recurrence,
                "transport": transport,
            },
            "optimizer": {
                "name": "AdamW",
                "param_names": self.param_names(),
                "param_groups": [
                    {k: v for k, v in g.items() if k != "params"}
                    for g in self.optimizer.param_groups
                ],
            },
            "lr_schedule": dataclasses.asdict(self.lr_schedule),
            "loader_state": loader_header(
                self.loader_state_dict() if loader_state is None else loader_state
            ),
            "corpus": {"signature": corpus.signature, "size": corpus.size},
            "origin": self.origin,
            "config": config.replace(model=self.config).to_dict(),
            "versions": {
                "atom": __version__,
                "torch": torch.__version__,
                "numpy": np.__version__,
                "python": platform.python_version(),
            },
        }

    # ---- restoring ----

    def restore_weights(self, ck: Checkpoint) -> None:
        """The model's weights (shapes must fit: CheckpointError names the mismatch)."""
        try:
            self.model.load_state_dict(ck.group(MODEL), strict=True)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[-1].strip()
            raise CheckpointError(
                f"{ck.path}: the weights do not fit this model ({first})"
            ) from None

    def restore_optimizer(self, ck: Checkpoint) -> None:
        """AdamW's m, v and step for every parameter, and the saved param groups."""
        names = self.param_names()
        if ck.meta.get("optimizer", {}).get("param_names") != names:
            raise CheckpointError(f"{ck.path}: optimizer parameters differ from this model's")
        saved = optimizer_moments(ck)
        state = {}
        for i, name in enumerate(names):
            if name in saved:
                state[i] = {
                    k: v if k == "step" else v.to(self.device) for k, v in saved[name].items()
                }
        groups = [dict(g) for g in ck.meta["optimizer"]["param_groups"]]
        for g in groups:
            g["params"] = list(range(len(names)))
            g["betas"] = tuple(g["betas"])
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})

    def restore_run(self, ck: Checkpoint, runtime_state: dict | None = None) -> None:
        """Everything a resume or a fork continues from: weights, optimizer, runtime state
        (this process's streams: `runtime_state` when given), RNGs, counters, loader state
        and origin. (The LR schedule is the run plan's: the saved one, or a pivot's.)"""
        self.restore_weights(ck)
        self.restore_optimizer(ck)
        # As read (CPU tensors): the runtime moves them to its device itself, and keeps the
        # atom counts on the host, where a copy on the device could not be read without a
        # sync (or, on CUDA, handed to numpy at all).
        self.runtime.load_state_dict(ck.group(RUNTIME) if runtime_state is None else runtime_state)
        self.dropout_gen.set_state(ck.tensors[RNG_DROPOUT])
        self.dropout_state = None
        torch.set_rng_state(ck.tensors[RNG_CPU])
        if self.device.type == "cuda":
            cuda = cuda_rng_states(ck.tensors)
            if len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda)
        tr = ck.meta["training"]
        self.counters = Counters(
            tick=int(tr["tick"]),
            step=int(tr["step"]),
            elapsed_s=float(tr.get("elapsed_s", 0.0)),
            # (checkpoints written before the metric names were settled: val_ce_bpb)
            val_bpb=tr.get("val_bpb", tr.get("val_ce_bpb")),
            noise=NoiseEMA.from_dict(tr.get("noise_scale")),
        )
        self.loader_state = saved_loader_state(ck)
        self.origin = ck.meta.get("origin", {"mode": "new"})


def loader_header(state: dict) -> dict:
    """What the metadata records of a loader state: all of it but the positions (a tensor of
    the payload, `LOADER_POSITIONS`)."""
    return {k: v for k, v in state.items() if k != "positions"}


def saved_loader_state(ck: Checkpoint) -> dict:
    """The loader state a checkpoint holds, as `BatchedByteStream.load_state_dict` reads it:
    the metadata's with the positions tensor (checkpoint format 2); a format-1 checkpoint's
    JSON state, which lists the positions and contexts itself, as it is (the loader converts
    it)."""
    state = dict(ck.meta["loader_state"])
    if LOADER_POSITIONS in ck.tensors:
        state["positions"] = ck.tensors[LOADER_POSITIONS].numpy()
    return state


def moved_loader_state(state: dict, ticks: int, size: int) -> dict:
    """A loader state with every stream `ticks` bytes further on (a rewind's skip past the
    bytes read when the run diverged), around the corpus of `size` bytes: the loader warms
    each stream up on the bytes before its new position, as on any load."""
    positions = (np.asarray(state["positions"], dtype=np.int64) + ticks) % max(size, 1)
    return {**state, "positions": positions}


def cuda_rng_states(tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The saved CUDA generator states ``rng/torch_cuda/<i>``, in device order (by the
    number i: as strings, device 10 would sort before device 2)."""
    prefix = RNG_CUDA + "/"
    found = {int(k[len(prefix) :]): v for k, v in tensors.items() if k.startswith(prefix)}
    return [found[i] for i in sorted(found)]


def origin_of(mode: str, ck: Checkpoint, **extra) -> dict:
    """The `origin` of a run that began from `ck` ("fork" or "init"): the source file, its
    payload checksum and tick, and `extra` (init: keep_optimizer)."""
    return {
        "mode": mode,
        "source": str(ck.path),
        "source_sha256": ck.sha256,
        "source_tick": ck.meta["training"]["tick"],
        **extra,
    }


def saved_lr_schedule(meta: dict) -> LRSchedule | None:
    """The LR schedule a checkpoint was training under (None for a file without one)."""
    d = meta.get("lr_schedule")
    if not isinstance(d, dict):
        return None
    try:
        return LRSchedule(**d)
    except TypeError:
        return None


# ---- reading checkpoints (chat, export, the run plan) ---------------------------------------


def open_checkpoint(
    path: str | os.PathLike, warn: Callable[[str], None] | None = None
) -> Checkpoint:
    """A checkpoint file, or the newest valid checkpoint of a run folder (`warn` hears about
    the damaged ones skipped). CheckpointError names what is wrong."""
    p = Path(path)
    if p.is_dir():
        ck = latest_valid_checkpoint(p, warn=warn)
        if ck is None:
            raise CheckpointError(
                f"{p} holds no valid checkpoint (*.safetensors): give a checkpoint file "
                "or the output folder of a training run"
            )
        return ck
    if not p.exists():
        raise CheckpointError(f"{p}: no such checkpoint file or run folder")
    ck = load_checkpoint(p)
    if not isinstance(ck.meta, dict):
        raise CheckpointError(f"{ck.path}: the checkpoint's metadata is not a JSON object")
    return ck


def check_provenance(meta: dict, path: str | os.PathLike) -> None:
    """Refuse a checkpoint whose features this code does not compute exactly.

    The pack mode and feature version are read from the checkpoint, never inferred: weights
    fed other features than they were trained on produce noise, not an error.
    """
    prov = meta.get("provenance")
    if not isinstance(prov, dict) or "pack_mode" not in prov or "feature_version" not in prov:
        raise CheckpointError(
            f"{path}: the checkpoint does not record which features it was trained on "
            "(provenance pack_mode, feature_version): refusing to guess"
        )
    pack_mode, version = prov["pack_mode"], prov["feature_version"]
    if pack_mode not in PACK_MODES:
        raise CheckpointError(
            f"{path}: the checkpoint was trained with pack mode {pack_mode!r}; this atom "
            f"knows {', '.join(PACK_MODES)}: chat with the atom version that trained it"
        )
    if type(version) is not int or version != FEATURE_VERSION:
        fix = (
            "upgrade atom"
            if type(version) is int and version > FEATURE_VERSION
            else "chat with the atom version that trained it"
        )
        raise CheckpointError(
            f"{path}: the checkpoint was trained on features version {version!r}; this atom "
            f"computes version {FEATURE_VERSION}: {fix}"
        )
    config = meta.get("model_config")
    if isinstance(config, dict):
        for key, value in (("pack_mode", pack_mode), ("feature_version", version)):
            if key in config and config[key] != value:
                raise CheckpointError(
                    f"{path}: inconsistent checkpoint: provenance {key} is {value!r} but its "
                    f"model config says {config[key]!r}"
                )


def run_config_of(meta: dict) -> RunConfig:
    """The run's `RunConfig` from a checkpoint's metadata: its ``config``, or, in a checkpoint
    written before it, its ``args`` (the flags a run had then; a flag added since takes its
    default) with the model section from its ``model_config``."""
    if isinstance(meta.get("config"), dict):
        return RunConfig.from_dict(meta["config"])
    config = RunConfig.from_args(meta.get("args") or {})
    if isinstance(meta.get("model_config"), dict):
        config = config.replace(model=ModelConfig.from_dict(meta["model_config"]))
    return config


def model_config(ck: Checkpoint) -> ModelConfig:
    """The checkpoint's model config; CheckpointError if this atom cannot build it."""
    d = ck.meta.get("model_config")
    if not isinstance(d, dict):
        raise CheckpointError(
            f"{ck.path}: the checkpoint has no model config: not a model checkpoint"
        )
    try:
        return ModelConfig.from_dict(d)
    except (ValueError, TypeError) as e:  # includes UnsupportedOption
        raise CheckpointError(
            f"{ck.path}: this atom cannot build the checkpoint's model: {e}"
        ) from None


def build_model(ck: Checkpoint, config: ModelConfig | None = None) -> ReferenceModel:
    """A float32 CPU model with the checkpoint's weights (`config`: default its own)."""
    config = model_config(ck) if config is None else config
    try:
        model = ReferenceModel(config)
    except ValueError as e:
        raise CheckpointError(
            f"{ck.path}: this atom cannot build the checkpoint's model: {e}"
        ) from None
    weights = ck.group(MODEL)
    if not weights:
        raise CheckpointError(f"{ck.path}: the checkpoint holds no model weights ({MODEL}/*)")
    # safetensors loads onto the CPU already; .to() keeps this true whatever wrote the file.
    weights = {k: v.to("cpu") for k, v in weights.items()}
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # shape mismatch
        first = str(e).strip().splitlines()[-1].strip()
        raise CheckpointError(
            f"{ck.path}: the weights do not fit the model config: {first}"
        ) from None
    if missing or unexpected:
        raise CheckpointError(
            f"{ck.path}: the weights do not fit the model config: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    return model


def load_model(
    path: str | os.PathLike, warn: Callable[[str], None] | None = None
) -> tuple[ReferenceModel, dict]:
    """The model of a checkpoint file, or of a run folder's newest valid checkpoint, on the
    CPU in eval mode, with the checkpoint's metadata plus ``"path"`` (the file loaded).

    CheckpointError names the problem: missing file, folder without a valid checkpoint,
    corrupt or foreign file, newer format, features (pack mode, feature version) this code
    does not compute, weights that do not fit the saved model config."""
    ck = open_checkpoint(path, warn=warn)
    meta = dict(ck.meta)
    check_provenance(meta, ck.path)
    model = build_model(ck)
    model.eval()
    meta["path"] = str(ck.path)
    return model, meta


def optimizer_moments(ck: Checkpoint) -> dict[str, dict[str, torch.Tensor]]:
    """AdamW's exp_avg (m), exp_avg_sq (v) and step per parameter, in the model's parameter
    order; parameters without optimizer state (a checkpoint written before the first step)
    are left out."""
    names = ck.meta.get("optimizer", {}).get("param_names", [])
    out = {}
    for name in names:
        moments = {k: ck.tensors.get(f"{OPTIM}/{name}/{k}") for k in _MOMENTS}
        if all(v is not None for v in moments.values()):
            out[name] = moments
    return out


def param_names(ck: Checkpoint) -> list[str]:
    """The model's parameters in `named_parameters()` order, as the checkpoint recorded."""
    return list(ck.meta["optimizer"]["param_names"])
