"""Deciding what a trainer command line means before any work: `resolve_run(args) -> RunPlan`.

A command line, together with what its run folder already holds, is one of four things
(SPEC §4, "a run's lifecycle"):

- **new**: an empty (or never checkpointed) run folder: tick 0, fresh weights;
- **resume**: the folder holds a run: continue from its newest valid checkpoint, exactly;
  when policy flags differ from the checkpoint's (`POLICY_FLAGS`) it is a **pivot**: the
  same continuation under the new policy, recorded as a ``pivot`` event in loss.jsonl;
- **fork** (``--fork CKPT`` into a new folder): an audit branch that continues exactly from
  CKPT (weights, m, v, loader, runtime, RNGs, counters), policy flags free to differ;
- **init** (``--init CKPT``): a new run at tick 0 on any data from CKPT's weights (and with
  ``--keep-optimizer`` its m, v and optimizer step).

What can never change inside one run (model config, B, pack mode, the data's signature) is
refused with the fix (``--fork`` / ``--init``). Every refusal is a `UserError` raised here,
before the run folder is touched. The plan reads checkpoints and opens the corpora (a memory
map, no read); it builds no model and writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from atom_train.batched import BatchedUnsupported, check_batched_supported
from atom_train.checkpoint import (
    Checkpoint,
    CheckpointError,
    latest_valid_checkpoint,
    list_checkpoints,
    load_checkpoint,
)
from atom_train.cli import UserError, say
from atom_train.data import AtomDataError, BatchedByteStream, ByteCorpus
from atom_train.field_loops import RECURRENCES
from atom_train.model import UNIMPLEMENTED_OPTIONS, ModelConfig
from atom_train.run_state import saved_lr_schedule
from atom_train.schedule import LRSchedule, WindowSchedule

# Model config fields that are not command-line flags: provenance fixed by the code, and the
# options of the original model that no implementation here provides (model.py rejects them).
_NOT_FLAGS = {"feature_version", *UNIMPLEMENTED_OPTIONS}

# Flags that set the training policy: they may change at a pivot or in a fork (recorded), and
# a resume that changes none of them is a plain resume. "total_ticks" is the resolved length
# of the run, whether given as --total-ticks or --total-bytes.
POLICY_FLAGS = (
    "lr",
    "lr_schedule",
    "warmup_steps",
    "min_lr_ratio",
    "weight_decay",
    "grad_clip",
    "total_ticks",
    "bptt",
    "ckpt_every",
    "snapshot_every",
    "val_every",
    "sample_every",
    "log_every",
)
# A pivot or fork that changes one of these starts a new learning-rate segment at its step.
_LR_FLAGS = {"lr", "lr_schedule", "warmup_steps", "min_lr_ratio", "total_ticks"}
# ... and one of these changes how many steps remain (windows are cut differently).
_STEP_COUNT_FLAGS = {"bptt", "ckpt_every", "snapshot_every"}
# Flags that say how to run, not what to compute; they may change freely (recorded).
_FREE_FLAGS = (
    "device",
    "threads",
    "loader_threads",
    "tf32",
    "recurrence",
    "transport",
    "resident",
    "val",
    "val_bytes",
    "val_streams",
    "sample_prompt",
    "sample_bytes",
)
MODES = ("new", "resume", "fork", "init")


def model_flag_fields() -> list[dataclasses.Field]:
    """The ModelConfig fields that are command-line flags (``--n-modes``, ...)."""
    return [f for f in dataclasses.fields(ModelConfig) if f.name not in _NOT_FLAGS]


def given_model_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The model flags given on the command line (None = not given)."""
    return {
        f.name: getattr(args, f.name)
        for f in model_flag_fields()
        if getattr(args, f.name, None) is not None
    }


@dataclass
class RunPlan:
    mode: str  # one of MODES
    args: argparse.Namespace
    out: Path
    config: ModelConfig
    B: int
    total: int  # the run's last tick
    corpus: ByteCorpus
    val_corpus: ByteCorpus | None
    device: torch.device
    recurrence: str  # resolved: never "auto"
    transport: str  # "dense" or "ids"
    window_schedule: WindowSchedule
    lr_schedule: LRSchedule
    source: Checkpoint | None = None  # the checkpoint resumed, forked or initialised from
    keep_optimizer: bool = False  # init: m, v and step come from the source
    # Policy flags that differ from the source's (resume: a pivot; fork: the branch's policy).
    changes: dict[str, list] = field(default_factory=dict)
    other_changes: dict[str, list] = field(default_factory=dict)  # free flags, informational
    extended: list | None = None  # resume: [old, new] last tick, when only that changed
    notes: list[str] = field(default_factory=list)  # said at start

    @property
    def pivot(self) -> bool:
        return self.mode == "resume" and bool(self.changes)

    def policy(self) -> dict[str, Any]:
        """The training policy in force (status.json and the pivot/fork events show it)."""
        return policy_of(self.args, self.total)


def policy_of(args: argparse.Namespace | dict, total: int | None) -> dict[str, Any]:
    get = args.get if isinstance(args, dict) else lambda k, d=None: getattr(args, k, d)
    out = {k: get(k) for k in POLICY_FLAGS if k != "total_ticks"}
    out["total_ticks"] = total
    return out


# ---- validation of the command line (no I/O) ------------------------------------------------


def check_args(a: argparse.Namespace) -> None:
    """Refuse flag values no run can use, naming the flag."""
    if not a.data:
        raise UserError("no training data: pass --data GLOB (a file, folder/*.txt, ...)")
    if a.B < 1:
        raise UserError(f"-B must be at least 1 (got {a.B})")
    if a.bptt < 0:
        raise UserError(f"--bptt must be >= 0 (got {a.bptt})")
    for name in ("ckpt_every", "snapshot_every", "val_every", "sample_every", "log_every"):
        if getattr(a, name) < 0:
            raise UserError(f"--{name.replace('_', '-')} must be >= 0")
    if a.val_streams < 1 or a.val_bytes < a.val_streams:
        raise UserError("--val-bytes must be at least --val-streams, which must be >= 1")
    if not (math.isfinite(a.lr) and a.lr > 0):
        raise UserError(f"--lr must be a positive number (got {a.lr})")
    if not (math.isfinite(a.weight_decay) and a.weight_decay >= 0):
        raise UserError(f"--weight-decay must be >= 0 (got {a.weight_decay})")
    if not (math.isfinite(a.grad_clip) and a.grad_clip >= 0):
        raise UserError(f"--grad-clip must be >= 0 (0 = off; got {a.grad_clip})")
    if a.warmup_steps < 0:
        raise UserError(f"--warmup-steps must be >= 0 (got {a.warmup_steps})")
    if not 0 <= a.min_lr_ratio <= 1:
        raise UserError(f"--min-lr-ratio must be in [0, 1] (got {a.min_lr_ratio})")
    if a.keep_optimizer and not a.init:
        raise UserError(
            "--keep-optimizer needs --init CKPT (it keeps that checkpoint's m and v); to "
            "continue a run with its optimizer, resume it or --fork it"
        )
    if a.init and a.fork:
        raise UserError("give --init or --fork, not both")
    if a.recurrence not in ("auto", *RECURRENCES):
        raise UserError(f"--recurrence must be auto or one of {', '.join(RECURRENCES)}")


def resolve_total(a: argparse.Namespace, B: int) -> int:
    if a.total_ticks is not None and a.total_bytes is not None:
        raise UserError("give --total-ticks or --total-bytes, not both")
    if a.total_ticks is not None:
        total = a.total_ticks
    elif a.total_bytes is not None:
        if not math.isfinite(a.total_bytes):
            raise UserError(f"--total-bytes must be a finite number (got {a.total_bytes})")
        total = math.ceil(a.total_bytes / B)
    else:
        raise UserError("say how long to train: --total-ticks N or --total-bytes N")
    if total <= 0:
        raise UserError("--total-ticks / --total-bytes must be positive")
    return total


# ---- the plan ------------------------------------------------------------------------------


def resolve_run(args: argparse.Namespace, warn: Callable[[str], None] = say) -> RunPlan:
    """What this command line means in its run folder; every refusal is a UserError."""
    a = args
    check_args(a)
    out = Path(a.output_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output-dir {out} is a file, not a folder: choose another --output-dir")
    notes: list[str] = []
    resume = latest_valid_checkpoint(out, warn=lambda m: warn("warning: " + m))
    source, mode = resume, "resume"
    if resume is not None:
        if a.fork:
            _check_refork(resume.meta.get("origin", {}), a.fork, out, resume)
            notes.append(f"--fork ignored: resuming the fork in {out} from {resume.path.name}")
        elif a.init:
            notes.append(f"--init ignored: resuming the run in {out} from {resume.path.name}")
    elif a.fork:
        source, mode = _load(a.fork, "--fork"), "fork"
        _check_fork_target(out, source)
    elif a.init:
        source, mode = _load(a.init, "--init"), "init"
    else:
        mode = "new"
    continues = mode in ("resume", "fork")

    config = _model_config(a, mode, source, out)
    B = a.B
    if continues:
        saved_B = int(source.meta["training"]["B"])
        if saved_B != B:
            raise UserError(
                f"{_whose(mode, out, source)} was trained with -B {saved_B}, not -B {B}: rerun "
                f"with -B {saved_B}, or start a new run with --init {source.path} --output-dir NEW"
            )
    corpus = open_corpus(a.data, "--data", a.resident)
    val_corpus = open_corpus(a.val, "--val", a.resident) if a.val else None
    if continues:
        _check_loader_state(source, corpus, B, config)
    if corpus.size < B:
        warn(
            f"warning: -B {B} is larger than the corpus ({corpus.size:,} bytes): streams will "
            "read the same bytes as each other; use a larger corpus or a smaller -B"
        )
    total = resolve_total(a, B)
    device = resolve_device(a)
    recurrence = resolve_recurrence(a.recurrence, device)
    transport = (
        a.transport if a.transport != "auto" else ("ids" if device.type == "cuda" else "dense")
    )
    windows = WindowSchedule(a.bptt, config.episode_length, total, a.ckpt_every, a.snapshot_every)

    changes: dict[str, list] = {}
    other: dict[str, list] = {}
    extended: list | None = None
    tick = step = 0
    if continues:
        saved_args = source.meta.get("args", {})
        saved_policy = policy_of(saved_args, source.meta["training"].get("total_ticks"))
        new_policy = policy_of(a, total)
        changes = {
            k: [saved_policy[k], new_policy[k]]
            for k in POLICY_FLAGS
            if saved_policy[k] != new_policy[k]
        }
        other = {
            k: [saved_args.get(k), getattr(a, k)]
            for k in _FREE_FLAGS
            if k in saved_args and saved_args.get(k) != getattr(a, k)
        }
        tick, step = int(source.meta["training"]["tick"]), int(source.meta["training"]["step"])
        saved_lr = saved_lr_schedule(source.meta)
        if (
            mode == "resume"
            and set(changes) == {"total_ticks"}
            and (saved_lr is not None and saved_lr.kind == "constant")
        ):
            # Only a longer (or shorter) run under a constant rate: the steps already planned
            # do not change, so this continues the run (a resume, bit-identical to a straight
            # run of the new length), recorded in the resume event, not a pivot.
            extended = changes.pop("total_ticks")
    lr_schedule = _lr_schedule(a, windows, changes, source if continues else None, tick, step)
    return RunPlan(
        mode=mode,
        args=a,
        out=out,
        config=config,
        B=B,
        total=total,
        corpus=corpus,
        val_corpus=val_corpus,
        device=device,
        recurrence=recurrence,
        transport=transport,
        window_schedule=windows,
        lr_schedule=lr_schedule,
        source=source,
        keep_optimizer=bool(a.keep_optimizer),
        changes=changes,
        other_changes=other,
        extended=extended,
        notes=notes,
    )


def _load(path: str, flag: str) -> Checkpoint:
    try:
        return load_checkpoint(path)
    except CheckpointError as e:
        raise UserError(f"{flag}: {e}") from None


def _whose(mode: str, out: Path, source: Checkpoint) -> str:
    return f"the run in {out}" if mode == "resume" else f"--fork {source.path}"


def _first_event(out: Path) -> dict | None:
    try:
        with open(out / "loss.jsonl", encoding="utf-8") as f:
            return json.loads(f.readline())
    except (OSError, ValueError):
        return None


def _check_fork_target(out: Path, source: Checkpoint) -> None:
    """A fork needs a folder that holds no run (or only the start of this same fork, killed
    before its first checkpoint)."""
    first = _first_event(out) if out.is_dir() else None
    same_fork = (
        first is not None
        and first.get("event") == "fork"
        and (first.get("source_sha256") == source.sha256)
    )
    log = out / "loss.jsonl"
    if list_checkpoints(out) or (log.exists() and log.stat().st_size > 0 and not same_fork):
        raise UserError(
            f"--fork: {out} already holds a run (checkpoints or loss.jsonl): fork into a new "
            "--output-dir, or rerun without --fork to resume the run that is there"
        )


def _check_refork(origin: dict, fork: str, out: Path, resume: Checkpoint) -> None:
    """Rerunning a fork's command resumes the fork; another run in the folder is refused."""
    if origin.get("mode") == "fork":
        try:
            sha = load_checkpoint(fork).sha256
        except CheckpointError:
            sha = None  # the source may be gone: the folder's own origin is what counts
        if sha is None or sha == origin.get("source_sha256"):
            return
    raise UserError(
        f"--fork: {out} already holds a run (newest checkpoint {resume.path.name}): fork into "
        "a new --output-dir, or rerun without --fork to resume the run that is there"
    )


def _model_config(a, mode: str, source: Checkpoint | None, out: Path) -> ModelConfig:
    given = given_model_flags(a)
    if mode in ("resume", "fork"):
        saved = source.meta["model_config"]
        diff = {k: (saved.get(k), v) for k, v in given.items() if saved.get(k) != v}
        if diff:
            lines = ", ".join(f"{k}: checkpoint {s!r} vs flag {g!r}" for k, (s, g) in diff.items())
            raise UserError(
                f"model flags differ from {_whose(mode, out, source)} ({lines}): the model "
                f"never changes inside a run; rerun with the original flags, or start a new run "
                f"from these weights with --init {source.path} --output-dir NEW"
            )
        config = _config_from(saved, source)
    elif mode == "init":
        saved = dict(source.meta["model_config"])
        if "pack_mode" in given and given["pack_mode"] != saved.get("pack_mode"):
            raise UserError(
                f"--init checkpoint was trained with pack_mode={saved.get('pack_mode')!r}, not "
                f"{given['pack_mode']!r}: features of another pack_mode would turn its weights "
                "into noise"
            )
        config = _config_from({**saved, **given}, source)
    else:
        try:
            config = ModelConfig.from_dict({**ModelConfig().to_dict(), **given})
        except (ValueError, TypeError) as e:
            raise UserError(f"bad model config: {e}") from None
    try:
        config.validate()
        check_batched_supported(config)
    except (ValueError, BatchedUnsupported) as e:
        raise UserError(f"model config: {e}") from None
    return config


def _config_from(d: dict, ck: Checkpoint) -> ModelConfig:
    try:
        return ModelConfig.from_dict(d)
    except (ValueError, TypeError) as e:
        raise UserError(f"{ck.path}: its model config does not fit this atom ({e})") from None


def open_corpus(globs: list[str] | str, flag: str, resident: bool) -> ByteCorpus:
    try:
        return ByteCorpus(globs, resident=resident)
    except AtomDataError as e:
        # The loader's messages name --data, the usual caller; name the flag actually used.
        raise UserError(str(e).replace("check --data", f"check {flag}")) from None


def _check_loader_state(
    source: Checkpoint, corpus: ByteCorpus, B: int, config: ModelConfig
) -> None:
    """The saved loader state fits this corpus (the loader checks signature, B, pack mode)."""
    probe = BatchedByteStream(corpus, B, pack_mode=config.pack_mode, threads=1)
    try:
        probe.load_state_dict(source.meta["loader_state"])
    except AtomDataError as e:
        raise UserError(
            f"cannot resume {source.path}: {e}. To train these weights on this data, start a "
            f"new run with --init {source.path} --output-dir NEW"
        ) from None


def resolve_device(a: argparse.Namespace) -> torch.device:
    if a.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but torch sees no CUDA device: use --device cpu")
    return torch.device(a.device)


def resolve_recurrence(name: str, device: torch.device) -> str:
    """`auto`: the Triton loop on CUDA when Triton imports, else the fused loop (the fastest
    proven path on a CPU: `compiled` needs a compiler and a compile per process)."""
    from atom_train.field_loops import triton_available

    if name == "triton" and not triton_available(device):
        raise UserError(
            "--recurrence triton needs Triton and a CUDA device (--device cuda; on a CPU only "
            "under TRITON_INTERPRET=1, for tests): use --recurrence fused"
        )
    if name != "auto":
        return name
    return "triton" if device.type == "cuda" and triton_available(device) else "fused"


def _lr_schedule(
    a, windows: WindowSchedule, changes: dict, source: Checkpoint | None, tick: int, step: int
) -> LRSchedule:
    """The learning rate of each step (see docs/checkpoints.md, "A run's lifecycle"):

    - a new run (or an init): warm-up from step 0, then constant or cosine to the last tick;
    - a resume or fork that changes no LR flag continues the checkpoint's schedule (if the
      number of remaining steps changed, the cosine is stretched to end at the last tick);
    - one that changes an LR flag (lr, schedule, warm-up, floor, total) starts a new segment
      at its step: warm-up only if --warmup-steps itself changed, then --lr, constant or
      cosine down to --min-lr-ratio x lr at the new last tick."""
    steps_left = windows.count_windows(tick)
    saved = saved_lr_schedule(source.meta) if source is not None else None
    if source is None or saved is None:
        return LRSchedule(a.lr, a.lr_schedule, a.warmup_steps, a.min_lr_ratio, 0, steps_left)
    if changes.keys() & _LR_FLAGS:
        warm = a.warmup_steps if "warmup_steps" in changes else 0
        return LRSchedule(a.lr, a.lr_schedule, warm, a.min_lr_ratio, step, step + steps_left)
    if changes.keys() & _STEP_COUNT_FLAGS or saved.end_step != step + steps_left:
        # Fewer or more windows remain (other cuts, or a longer run): the cosine, if any,
        # still reaches its floor at the last tick.
        return dataclasses.replace(saved, end_step=step + steps_left)
    return saved
