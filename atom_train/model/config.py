"""The field model's typed config (`ModelConfig`, saved in every checkpoint), the constants
of its arithmetic, and `FieldConsts` (what every field loop and kernel reads besides
tensors, in one object). No torch: the kernel report compiles the Triton kernels with this
alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from atom_train.data.atomizer import FEATURE_VERSION, PACK_MODES

N_BYTES = 256
# At most this many of the 320 features are 1.0 for any byte (the loader's compact id mode
# ships exactly this many ids per tick); the input layers are initialised for this fan-in.
MAX_ACTIVE_FEATURES = 17
PERSIST_LOSS_WEIGHT = 0.05
# Phase sync is skipped when |sum z| is below this (step 4 of the tick).
PHASE_SYNC_MIN = 1e-6
# Floors in the controller and the persistence cosine (docs/design.md#the-model-one-tick-steps-1-9).
AMP_LOG_FLOOR = 1e-6
COS_EPS = 1e-8
ENERGY_DECAY = 0.99
# Initial real part of the drive bias b_u in every mode (see reset_parameters).
DRIVE_BIAS_INIT = 0.25
GAIN_MIN, GAIN_MAX = 0.1, 10.0

# Options of earlier single-stream versions of this model that change the loss and that
# neither implementation here provides. They exist so that a config asking for one fails
# loudly instead of training something else: `unimplemented_options` names every one set.
# name -> (the value that means "off", what it is)
UNIMPLEMENTED_OPTIONS: dict[str, tuple[Any, str]] = {
    "max_span_bytes": (1, "atoms spanning several bytes (every tick is one byte here)"),
    "readout": ("hard", "readouts other than the hard JL readout (step 8 of the tick)"),
    "slow_every": (1, "a slow field updated every N ticks"),
    "hard_couple": (0.0, "coupling of the hard readout back into the field"),
    "contrast_loss_weight": (0.0, "the contrastive auxiliary loss"),
    "next_packet_loss_weight": (0.0, "the next-packet prediction loss"),
    "adaptive_last_atom_scale": (False, "a learned, input-dependent last-atom readout scale"),
}


class UnsupportedOption(ValueError):
    """The config asks for an option this implementation does not provide."""


@dataclass
class ModelConfig:
    """Every knob of the field model (docs/design.md#the-model-config-and-parameters).

    Saved as JSON in every checkpoint (`to_dict` / `from_dict`); `pack_mode` and
    `feature_version` record which Atomizer features the weights were trained on.
    """

    n_modes: int = 32
    jl_dim: int = 64
    mlp_hidden: int = 128
    atom_dim: int = 16
    n_atoms_max: int = 64
    atom_flush_every: int = 32
    dt: float = 1.0
    # Scalar leak lambda, or (learnable_leak=True) the initial value of every per-mode leak.
    field_leak: float = 0.05
    learnable_leak: bool = False
    field_max_rms: float = 4.0
    amp_target: float = 1.0
    amp_rate: float = 0.01
    persist_rate: float = 0.9
    consolidate_threshold: float = 1.0
    last_atom_dropout: float = 0.5
    max_len: int = 4
    episode_length: int = 4096
    pack_mode: str = "utf8"
    feature_version: int = FEATURE_VERSION
    init_seed: int = 0
    jl_seed: int = 1
    # Not implemented (see UNIMPLEMENTED_OPTIONS); any other value is rejected.
    max_span_bytes: int = 1
    readout: str = "hard"
    slow_every: int = 1
    hard_couple: float = 0.0
    contrast_loss_weight: float = 0.0
    next_packet_loss_weight: float = 0.0
    adaptive_last_atom_scale: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Build from `to_dict()` output; a missing key takes its default, an unknown key or a
        value of the wrong type is a ValueError. The result is validated."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise ValueError(
                f"unknown model config key(s) {unknown}: known keys are {sorted(fields)}"
            )
        kwargs = {}
        for name, value in d.items():
            kind = type(getattr(cls(), name))
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # JSON writes 1.0 as 1 in some writers
            if type(value) is not kind:
                raise ValueError(
                    f"model config {name!r} must be {kind.__name__}, got {value!r} "
                    f"({type(value).__name__})"
                )
            kwargs[name] = value
        config = cls(**kwargs)
        config.validate()
        return config

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        return cls.from_dict(json.loads(text))

    def validate(self) -> None:
        """Raise ValueError naming the first value out of range (does not check the
        unimplemented options: `unimplemented_options` does)."""
        positive = (
            "n_modes",
            "jl_dim",
            "mlp_hidden",
            "atom_dim",
            "n_atoms_max",
            "atom_flush_every",
            "max_len",
            "episode_length",
            "max_span_bytes",
            "slow_every",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"model config {name} must be >= 1, got {getattr(self, name)}")
        checks = [
            ("dt", self.dt > 0, "> 0"),
            ("field_max_rms", self.field_max_rms > 0, "> 0"),
            ("amp_target", self.amp_target > 0, "> 0"),
            ("amp_rate", self.amp_rate >= 0, ">= 0"),
            ("persist_rate", 0 <= self.persist_rate <= 1, "in [0, 1]"),
            ("consolidate_threshold", self.consolidate_threshold >= 0, ">= 0"),
            ("last_atom_dropout", 0 <= self.last_atom_dropout < 1, "in [0, 1)"),
        ]
        if self.learnable_leak:
            # The per-mode leak is sigmoid(logit): the initial value must be strictly inside.
            checks.append(("field_leak", 0 < self.field_leak < 1, "in (0, 1) when learnable"))
        else:
            checks.append(("field_leak", 0 <= self.field_leak < 1, "in [0, 1)"))
        for name, ok, rule in checks:
            if not ok or not math.isfinite(float(getattr(self, name))):
                raise ValueError(f"model config {name} must be {rule}, got {getattr(self, name)}")
        if self.pack_mode not in PACK_MODES:
            raise ValueError(f"model config pack_mode must be one of {PACK_MODES}")
        if self.feature_version != FEATURE_VERSION:
            raise ValueError(
                f"model config feature_version {self.feature_version} is not supported: this "
                f"code computes features version {FEATURE_VERSION}"
            )


def unimplemented_options(config: ModelConfig) -> list[str]:
    """Names (with values) of every UNIMPLEMENTED_OPTIONS entry the config turns on."""
    out = []
    for name, (off, what) in UNIMPLEMENTED_OPTIONS.items():
        value = getattr(config, name)
        if value != off:
            out.append(f"{name}={value!r} ({what}; only {off!r} is implemented)")
    return out


@dataclass(frozen=True)
class FieldConsts:
    """Everything a window's field loop reads besides tensors, in one typed object built once
    per model (`of`) and handed as it is to every loop: the fused and autograd loops, the
    native one (Rust reads these attributes into its `Consts`: `_atomdata.FIELD_CONSTS` names
    them) and the Triton launch (`field_kernels.compile_constants` makes the kernels'
    compile-time arguments of it). The modes `n`; the model's RK4 step `dt`, RMS cap, log of
    the amplitude target and controller rate; and the fixed limits (the phase-sync threshold,
    the controller's log floor, the energy decay, the gain bounds: this module's constants)."""

    n: int
    dt: float
    max_rms: float
    log_target: float
    amp_rate: float
    phase_sync_min: float = PHASE_SYNC_MIN
    amp_log_floor: float = AMP_LOG_FLOOR
    energy_decay: float = ENERGY_DECAY
    gain_min: float = GAIN_MIN
    gain_max: float = GAIN_MAX

    @classmethod
    def of(cls, config: ModelConfig) -> FieldConsts:
        """The constants of `config`'s field loop (the Triton kernels compile one variant per
        set of them)."""
        return cls(
            n=config.n_modes,
            dt=config.dt,
            max_rms=config.field_max_rms,
            log_target=math.log(config.amp_target),
            amp_rate=config.amp_rate,
        )
