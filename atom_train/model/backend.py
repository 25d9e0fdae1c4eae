"""The compute backend of a launch, decided in one place: `choose_backend(...) -> Backend`.

What a launch computes on, and why, from plain values (the flags' strings, the model's
config, the streams), so every command makes the same choice: the trainer's plan
(`atom_train.trainer.plan`), tune, bench and eval call it.

- **device** (`resolve_device`): ``cpu`` or ``cuda`` with its index (``cuda:<i>``, or
  LOCAL_RANK's GPU under torchrun);
- **recurrence** (`resolve_recurrence`): the field loop; ``auto`` is Triton on CUDA when it
  imports and its kernels fit the model, the native (Rust) loop on a CPU when the extension
  has it, else the fused loop;
- **the self-check** (`prove_recurrence`): an ``auto`` that chose Triton first proves it on
  this device against the fused loop (`atom_train.model.loop_check.check_triton_loop`), and
  takes the fused loop if that fails;
- **transport** (`resolve_transport`): feature ids on CUDA (the device builds the features),
  dense features elsewhere;
- **precision** (`Backend.precision`): TF32 in the readout on CUDA with --tf32
  (`atom_train.model.precision`).

Every refusal is a `UserError` naming the fix. The one computation is the self-check (it
compiles the Triton kernels the run then reuses).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from atom_train.common.cli import UserError, say
from atom_train.model import field_loops
from atom_train.model.config import FieldConsts, ModelConfig
from atom_train.model.devices import normalize_device
from atom_train.model.precision import readout_precision

TRANSPORTS = ("auto", "dense", "ids")


@dataclass(frozen=True)
class Backend:
    """What a launch computes on, each choice with its reason (the start event and
    status.json record the loop's)."""

    device: torch.device  # with its index: cuda:<i>, cpu
    recurrence: str  # the field loop: never "auto"
    recurrence_reason: str  # why that loop
    transport: str  # "dense" or "ids"
    transport_reason: str
    tf32: bool = False  # TF32 in the readout's matmuls (only ever on CUDA)

    def precision(self) -> contextlib.AbstractContextManager:
        """The launch's process-wide matmul precision, restored on exit."""
        return readout_precision(self.device, self.tf32)

    def why(self) -> dict[str, str]:
        """Each choice and its reason, by name."""
        return {
            "device": str(self.device),
            "recurrence": f"{self.recurrence} ({self.recurrence_reason})",
            "transport": f"{self.transport} ({self.transport_reason})",
            "precision": "TF32 in the readout (--tf32)" if self.tf32 else "IEEE float32",
        }


def choose_backend(
    device: str | torch.device,
    recurrence: str = "auto",
    *,
    config: ModelConfig | None = None,
    B: int | None = None,
    transport: str = "auto",
    tf32: bool = False,
    local_rank: int | None = None,
    warn: Callable[[str], None] | None = say,
    prove: bool = True,
    also: tuple[int, ...] = (),
    forward_only: tuple[int, ...] = (),
) -> Backend:
    """The backend for these flags (`device`, `recurrence`, `transport`, `tf32`: the
    trainer's flags of those names) and this model (`config`) at `B` streams: the device,
    the loop (`resolve_recurrence`; with `prove` and a config and B, an ``auto`` that chose
    Triton proven first: `prove_recurrence`, `also` and `forward_only` its other launches),
    the transport and the precision. What is passed over, and the self-check's outcome, are
    said through `warn`. Without a config the loop is chosen without the Triton fit check
    (eval: one device for checkpoints of several models) and not proven."""
    dev = resolve_device(device, local_rank)
    loop = resolve_recurrence(recurrence, dev, config, warn)
    if prove and config is not None and B is not None:
        loop, reason = prove_recurrence(
            recurrence, loop, dev, config, B, warn or (lambda _m: None), also, forward_only
        )
    else:
        reason = recurrence_reason(recurrence, loop, dev, config)
    how, how_why = resolve_transport(transport, dev)
    return Backend(dev, loop, reason, how, how_why, tf32=bool(tf32) and dev.type == "cuda")


def resolve_device(device: str | torch.device, local_rank: int | None = None) -> torch.device:
    """The device, with its index (``cuda`` -> ``cuda:<i>``: tensors report theirs, and
    ``cuda`` != ``cuda:0``, so an index-less device would defeat every "already there"
    check). Under torchrun the index is LOCAL_RANK's GPU (`distributed.init_world` selects
    it); otherwise torch's current device."""
    kind = torch.device(device).type
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but torch sees no CUDA device: use --device cpu")
    if kind == "cuda" and local_rank is not None:
        return torch.device("cuda", local_rank)  # (init_world selects it, after the plan)
    return normalize_device(device)


def resolve_transport(transport: str, device: torch.device) -> tuple[str, str]:
    """How windows reach the device, and why: ``auto`` is feature ids on CUDA (the device
    builds the features from the bytes: less to copy) and dense features elsewhere."""
    if transport not in TRANSPORTS:
        raise UserError(f"--transport must be one of {', '.join(TRANSPORTS)} (got {transport!r})")
    if transport != "auto":
        return transport, f"--transport {transport}"
    if device.type == "cuda":
        return "ids", "auto: feature ids on CUDA"
    return "dense", f"auto: dense features on {device.type}"


def resolve_recurrence(
    name: str,
    device: torch.device,
    config: ModelConfig | None = None,
    warn: Callable[[str], None] | None = None,
) -> str:
    """`auto`: the Triton loop on CUDA when Triton imports and its kernels fit the model
    (`field_triton.triton_unfit_reason`: spills measured by the kernel report), else the
    fused loop; on a CPU the native (Rust) loop when the extension has it, else the fused
    loop. An `auto` that passes over Triton or the native loop, and an explicit `triton` for
    a model the kernels do not fit, are said through `warn` with the reason."""
    if name != "auto" and name not in field_loops.LOOPS:
        raise UserError(f"--recurrence must be auto or one of {', '.join(field_loops.LOOPS)}")
    if name == "triton" and not field_loops.available("triton", device):
        raise UserError(
            "--recurrence triton needs Triton and a CUDA device (--device cuda; on a CPU only "
            "under TRITON_INTERPRET=1, for tests): use --recurrence fused"
        )
    if name == "native" and not field_loops.available("native", device):
        if device.type != "cpu":
            raise UserError(
                f"--recurrence native runs on the CPU, not {device.type}: use --device cpu, or "
                "--recurrence auto"
            )
        raise UserError(
            "--recurrence native needs the native field loop, which this build of the "
            "extension lacks: rebuild it (make setup), or use --recurrence fused"
        )
    wants_triton = name == "triton" or (
        name == "auto" and device.type == "cuda" and field_loops.available("triton", device)
    )
    if wants_triton and config is not None:
        from atom_train.model.field_triton import triton_unfit_reason

        reason = triton_unfit_reason(config, per_mode_leak=config.learnable_leak)
        if reason and name == "auto":
            if warn:
                warn(f"--recurrence auto: the fused loop, not Triton: {reason}")
            return "fused"
        if reason and warn:
            warn(f"warning: --recurrence triton: {reason}; it runs, slower than it could")
    if name != "auto":
        return name
    if wants_triton:
        return "triton"
    if device.type == "cpu":
        if field_loops.available("native", device):
            return "native"
        if warn:
            warn(
                "--recurrence auto: the fused loop, not the native one: this build of the "
                "extension has none (rebuild it: make setup)"
            )
    return "fused"


def recurrence_reason(
    asked: str, chosen: str, device: torch.device, config: ModelConfig | None
) -> str:
    """Why `chosen` (`resolve_recurrence`'s answer to `asked`), in a few words, where no
    self-check ran."""
    if asked != "auto":
        return f"--recurrence {asked}"
    if device.type != "cuda" or chosen == "triton":
        return f"auto: the {chosen} loop on {device.type}"
    if not field_loops.available("triton", device):
        return "auto: Triton is not installed"
    if config is None:
        return f"auto: the {chosen} loop"
    from atom_train.model.field_triton import triton_unfit_reason

    why = triton_unfit_reason(config, per_mode_leak=config.learnable_leak)
    return f"auto: {why or f'the {chosen} loop'}"


def prove_recurrence(
    asked: str,
    chosen: str,
    device: torch.device,
    config: ModelConfig,
    B: int,
    warn: Callable[[str], None] = say,
    also: tuple[int, ...] = (),
    forward_only: tuple[int, ...] = (),
) -> tuple[str, str]:
    """The loop a run uses and why, in one line: `chosen` (`resolve_recurrence`'s answer to
    `asked`), except that an `auto` that chose Triton first proves it on this device: the
    Triton loop runs against the fused loop (`loop_check.check_triton_loop`: forward and
    backward, every kernel variant the run launches: B's, and those of the stream counts in
    `also` (the noise probe's half batch) and `forward_only` (validation's streams), against
    the float64 fused loop within the stated error model). If compiling or the comparison
    fails, the run takes the fused loop instead, and `warn` says why in one line (a run under
    the supervisor would otherwise crash at its first window, and again at every relaunch).
    An explicit ``--recurrence triton`` is not checked: if the kernels fail, the run fails.
    The check's cost is said (mostly the compile, which the run then reuses). (Under
    torchrun B is the whole run's, not the rank's share: where the two specialize the kernels
    differently, the check proves a sibling variant and the run compiles its own.)"""
    if asked != "auto" or chosen != "triton":
        return chosen, recurrence_reason(asked, chosen, device, config)
    from atom_train.model.loop_check import check_triton_loop

    check = check_triton_loop(
        device,
        FieldConsts.of(config),
        B,
        per_mode_keep=config.learnable_leak,
        keep_grad=config.learnable_leak,
        u_width=2 * config.n_modes + config.atom_dim,  # the drive matmul's rows
        also=also,
        forward_only=forward_only,
    )
    streams = "+".join(str(b) for b in check.streams) or str(check.B)
    where = f"on {device} (B {streams}, K {check.K}, {check.seconds:.1f} s with the compile)"
    if check.failure is not None:
        warn(
            f"warning: --recurrence auto: the fused loop, not Triton: the Triton loop's "
            f"self-check {where} failed: {check.failure} (--recurrence triton insists)"
        )
        return "fused", f"auto: the Triton loop's self-check failed: {check.failure}"
    warn(
        f"recurrence auto: Triton, proven against the fused loop {where}: outputs within "
        f"{check.out_err:.1e}, gradients within {check.grad_err:.1e} of float64 (relative), "
        f"{check.ratio:.1f} x the fused loop's own float32 error at most"
    )
    return "triton", (
        f"auto: Triton, proven against the fused loop on {device} (outputs within "
        f"{check.out_err:.1e}, gradients {check.grad_err:.1e} of float64; "
        f"{check.ratio:.1f} x the fused loop's own error)"
    )
