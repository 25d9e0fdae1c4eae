"""The trainer's flags, each declared once: `FLAGS`, one `Flag` per command-line option.

A flag's entry holds everything the code knows about it: its names, type, default, help,
the check of its value (`check`: the message of a refusal, or None) and its **class**, what
it is to a run:

- ``model``: a field of the model config (`ModelConfig`); fixed for the life of a run
  (a resume or fork that changes one is refused: start a new run with ``--init``);
- ``run``: what defines the run besides the model: its streams (``-B``), its data, and the
  seeds of its randomness. ``-B`` and the data never change inside a run (refused, or the
  loader's corpus check refuses them). ``--seed`` and ``--offset-seed`` only matter when a
  run begins (a new run or an ``--init``): on a resume or fork the mask generator's state
  and the streams' positions come from the checkpoint, so a changed value cannot take
  effect. It is ignored, said at start and recorded (the resume or fork event's
  ``ignored``), and the run keeps the value it began with;
- ``policy``: how training proceeds (learning rate and its schedule, clipping, the length,
  K, the periods): may change at a pivot or in a fork, recorded as a ``pivot`` event;
- ``free``: how to run it, not what is computed in the weights (device, threads, the field
  loop, validation and sample settings, the collective timeout): may change on any launch;
  a change is recorded in the resume event's ``changed``;
- ``lifecycle``: how this command relates to runs (``--output-dir``, ``--fork``,
  ``--init``, ``--keep-optimizer``): read by the run plan, never compared.

`build_parser` (the command line), `trainer.plan` (what is compared on resume, pivot and fork)
and the flag reference in docs/flags.md (`markdown_table`, checked by a test) all derive
from this table, so they cannot disagree.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from atom_train.common.cli import (
    SHARED_FLAGS,
    ArgumentParser,
    UserError,
    add_output_dir_argument,
)
from atom_train.model.config import UNIMPLEMENTED_OPTIONS, ModelConfig
from atom_train.model.field_loops import RECURRENCES
from atom_train.trainer import divergence
from atom_train.trainer.loss_log import DEFAULT_RATE as DEFAULT_LOSS_LOG_RATE
from atom_train.trainer.lr_schedule import RESTARTS
from atom_train.trainer.tensorboard_log import IN_RUN as TB_IN_RUN

CLASSES = ("model", "run", "policy", "free", "lifecycle")
# The sections of a RunConfig (trainer/run_config.py), one per concern; "lifecycle" flags
# are the separate `Lifecycle` value.
SECTIONS = (
    "data", "schedule", "optimizer", "periods", "validation", "logging", "hardware",
    "guard", "model", "lifecycle",
)  # fmt: skip

# Model config fields that are not command-line flags: provenance fixed by the code, and the
# options of the original model that no implementation here provides (model/reference.py rejects them).
_NOT_FLAGS = {"feature_version", *UNIMPLEMENTED_OPTIONS}


@dataclass(frozen=True)
class Flag:
    dest: str  # the argparse destination (the key in a checkpoint's saved args)
    names: tuple[str, ...]
    cls: str  # one of CLASSES
    group: str  # the --help section
    help: str
    kwargs: dict = field(default_factory=dict)  # type, default, choices, metavar, action
    check: Callable[[Any], str | None] | None = None  # refusal message for a bad value
    section: str = ""  # the RunConfig section holding its value (one of SECTIONS)

    @property
    def default(self) -> Any:
        return self.kwargs.get("default")

    @property
    def flag(self) -> str:
        """The name messages use (``-B``, ``--lr``)."""
        return self.names[0]


# ---- checks of one value (None: fine) ------------------------------------------------------


def _at_least(n: int | float, what: str = "") -> Callable[[Any], str | None]:
    def check(v):
        return None if v is None or v >= n else f"must be {what or f'>= {n}'} (got {v})"

    return check


def _finite(rule: str, ok: Callable[[float], bool]) -> Callable[[Any], str | None]:
    def check(v):
        if v is None or (math.isfinite(v) and ok(v)):
            return None
        return f"must be {rule} (got {v})"

    return check


_POSITIVE_NUMBER = _finite("a positive number", lambda v: v > 0)
_NONNEG_NUMBER = _finite(">= 0", lambda v: v >= 0)


# ---- the table -----------------------------------------------------------------------------

_DATA, _SCHED, _OPTIM, _LOGS = "data", "schedule", "optimizer", "checkpoints and logs"
_LIFE, _HW, _MODEL = "a run's lifecycle", "hardware", "model"
_GUARD = "divergence guard"

GROUP_HELP = {
    _LIFE: "rerun the same command to resume; rerun with other policy flags (lr, schedule, "
    "clipping, periods, --bptt, length) to pivot; see docs/checkpoints.md",
    _HW: "several processes: launch with torchrun (--nproc-per-node N; several nodes through "
    "torchrun's rendezvous flags): rank r trains streams [r·B/N, (r+1)·B/N)",
    _MODEL: "the model config; on a resumed run it must match the checkpoint",
    _GUARD: "the run watches its loss, gradient norm and val for a divergence and answers it; "
    "see docs/divergence.md. These flags never change what a healthy run computes (a rewind "
    "is recorded as an automatic pivot), so any launch may change them",
}


def _f(
    dest: str, *names: str, cls: str, group: str, help: str, section: str = "", check=None,
    **kwargs,
) -> Flag:  # fmt: skip
    """A flag; one that several commands take has its names from `cli.SHARED_FLAGS` (the
    one spelling every command uses), the others name themselves."""
    if dest in SHARED_FLAGS:
        if names:
            raise ValueError(f"{dest} is a shared flag: its names are cli.SHARED_FLAGS'")
        names = SHARED_FLAGS[dest]
    section = section or ("lifecycle" if cls == "lifecycle" else _GROUP_SECTION[group])
    return Flag(dest, names, cls, group, help, kwargs, check, section)


# The section of a flag whose declaration names none: its --help group's.
_GROUP_SECTION = {
    _DATA: "data", _SCHED: "schedule", _OPTIM: "optimizer", _LOGS: "logging",
    _HW: "hardware", _GUARD: "guard", _MODEL: "model", _LIFE: "lifecycle",
}  # fmt: skip


_PERIOD = _at_least(0)
_POLICY, _THRESHOLDS = divergence.Policy(), divergence.Thresholds()

_BASE_FLAGS: tuple[Flag, ...] = (
    # data
    _f(
        "data", cls="run", group=_DATA, action="append", metavar="GLOB",
        help="training text: a file, folder glob or list of globs (repeatable); all shards "
        "are read as one circular byte string (a built corpus's held-out val among them is "
        "refused: train on a built corpus with --corpus)",
    ),
    _f("corpus", cls="run", group=_DATA, metavar="DIR",
       help="a corpus built by `python -m atom_train.corpus build`: its train shards for "
       "--data and its val for --val (unless --val is given); checked against its manifest "
       "(each file's size and SHA-256) at every launch"),
    _f("val", cls="free", group=_DATA, section="validation", metavar="GLOB",
       help="held-out text for validation (not in --data; '' = none, e.g. to turn it off "
       "on a resume)"),
    _f("resident", "--resident", cls="free", group=_DATA, action="store_true",
       help="copy the corpus into RAM"),
    _f("allow_binary", "--allow-binary", cls="free", group=_DATA, action="store_true",
       help="train on files that look compressed, binary or like markup (HTML, XML) (refused "
       "without it: the trainer reads raw bytes)"),
    _f("offset_seed", "--offset-seed", cls="run", group=_DATA, type=int, default=None,
       help="start the B streams at seeded random offsets (default: evenly spaced)"),
    _f("loader_threads", cls="free", group=_DATA, type=int, default=None,
       check=_at_least(1), help="loader threads (default: all cores)"),
    _f(
        "transport", cls="free", group=_DATA, choices=("auto", "dense", "ids"),
        default="auto",
        help="how features reach the model: dense 320 floats per byte, or 17 feature ids per "
        "byte summed into the input layers on the device (auto: ids on CUDA, dense on CPU)",
    ),
    # schedule
    _f("B", cls="run", group=_SCHED, type=int, default=64,
       check=_at_least(1), help="streams in lockstep"),
    _f("bptt", cls="policy", group=_SCHED, type=int, default=64, metavar="K",
       check=_at_least(0), help="BPTT window in ticks (0 = no BPTT: a window of one tick)"),
    _f("total_ticks", "--total-ticks", cls="policy", group=_SCHED, type=int,
       help="train until this tick (bytes = ticks x B)"),
    _f("total_bytes", "--total-bytes", cls="policy", group=_SCHED, type=float,
       help="train until ticks x B reaches this"),
    # optimizer
    _f("lr", "--lr", cls="policy", group=_OPTIM, type=float, default=2e-3,
       check=_POSITIVE_NUMBER, help="AdamW learning rate"),
    _f("weight_decay", "--weight-decay", cls="policy", group=_OPTIM, type=float, default=0.01,
       check=_NONNEG_NUMBER, help="AdamW weight decay"),
    _f("grad_clip", "--grad-clip", cls="policy", group=_OPTIM, type=float, default=1.0,
       check=_finite(">= 0 (0 = off)", lambda v: v >= 0), help="max gradient norm (0 = off)"),
    _f("warmup_steps", "--warmup-steps", cls="policy", group=_OPTIM, type=int, default=0,
       check=_at_least(0), help="linear learning-rate warm-up (optimizer steps)"),
    _f(
        "lr_schedule", "--lr-schedule", cls="policy", group=_OPTIM,
        choices=("constant", "cosine"), default="constant",
        help="after warm-up: constant, or cosine decay to --min-lr-ratio x lr at the last tick",
    ),
    _f(
        "lr_restart", "--lr-restart", cls="policy", group=_OPTIM, choices=RESTARTS,
        default="peak",
        help="how the new learning-rate segment of a pivot or fork that changes --lr, its "
        "schedule, warm-up, floor or the run's length begins: peak = at --lr, then "
        "--lr-schedule to the last tick (a finished cosine run extended this way jumps back "
        "to its peak); hold = the rate in force, constant to the last tick; decay = the rate "
        "in force, cosine down to --min-lr-ratio x it at the last tick (hold and decay start "
        "from --lr when the pivot changes --lr); the launch says the rate before, now and at "
        "the end",
    ),
    _f("min_lr_ratio", "--min-lr-ratio", cls="policy", group=_OPTIM, type=float, default=0.1,
       check=_finite("in [0, 1]", lambda v: 0 <= v <= 1), help="floor of the cosine decay"),
    _f("seed", cls="run", group=_OPTIM, type=int, default=0,
       help="seed of the last-atom dropout masks (used when a run begins)"),
    # checkpoints and logs
    _f("ckpt_every", "--ckpt-every", cls="policy", group=_LOGS, section="periods", type=int, default=2000,
       check=_PERIOD, help="rolling checkpoint period (ticks; 0 = only at the end and on "
       "signals); windows are cut at its multiples, so checkpoints land exactly on them"),
    _f("snapshot_every", "--snapshot-every", cls="policy", group=_LOGS, section="periods", type=int, default=0,
       check=_PERIOD, help="permanent numbered snapshot period (ticks; 0 = none)"),
    _f("val_every", "--val-every", cls="policy", group=_LOGS, section="periods", type=int, default=2000,
       check=_PERIOD, help="validation period (ticks; 0 = only at the end); runs at the first "
       "window end at or after each multiple (windows end every K ticks and at episode ends)"),
    _f("val_bytes", cls="free", group=_LOGS, section="validation", type=int, default=65536,
       check=_at_least(1),
       help="size of the fixed validation slice (bytes, read by --val-streams streams)"),
    _f("val_streams", cls="free", group=_LOGS, section="validation", type=int, default=64,
       check=_at_least(1), help="streams reading the val slice"),
    _f("sample_every", "--sample-every", cls="policy", group=_LOGS, section="periods", type=int, default=0,
       check=_PERIOD, help="chat sample period (ticks; 0 = off)"),
    _f("sample_prompt", "--sample-prompt", cls="free", group=_LOGS, default="Bonjour",
       help="prompt of the chat samples"),
    _f("sample_bytes", "--sample-bytes", cls="free", group=_LOGS, type=int, default=200,
       check=_at_least(1), help="length of a chat sample"),
    _f("log_every", "--log-every", cls="policy", group=_LOGS, section="periods", type=int, default=200,
       check=_PERIOD, help="progress.tsv row period (ticks; 0 = only at the end); a row at the "
       "first window end at or after each multiple, so with K = 64, --log-every 200 gives rows "
       "at 256, 448, ..."),
    _f("noise_scale_every", "--noise-scale-every", cls="free", group=_LOGS, type=int,
       default=100, metavar="N", check=_PERIOD,
       help="measure the gradient noise scale every N optimizer steps (0 = off): the gradient "
       "over each half of the streams (under torchrun: each rank's) and over all of them on "
       "the same window, logged as grad_sq, trace_cov, b_simple (streams) and "
       "b_simple_bytes; the weights are as without it; a measured step costs 1.6-1.8 plain "
       "ones on a CPU (at N = 100, under a hundredth of the time), nothing under torchrun; "
       "with -B 1 in one process it is off"),
    _f("loss_log_rate", "--loss-log-rate", cls="free", group=_LOGS, type=float,
       default=DEFAULT_LOSS_LOG_RATE, metavar="N", check=_NONNEG_NUMBER,
       help="loss.jsonl's most lines per second: a line per optimizer step up to N steps/s, "
       "above it one line per 1/N s with that slot's count, mean, min and max (so the file "
       "grows with time, not steps); 0 = a line per step"),
    _f("tensorboard", "--tensorboard", cls="free", group=_LOGS, nargs="?", const=TB_IN_RUN,
       default=None, metavar="DIR",
       help="also write TensorBoard event files (step = bytes seen) to DIR; without DIR: the "
       "run folder's tb/ (needs pip install 'atom-train[tensorboard]'); '' = none, e.g. to "
       "turn it off on a resume"),
    # the divergence guard (atom_train.trainer.divergence holds the defaults)
    _f(
        "on_divergence", "--on-divergence", cls="free", group=_GUARD,
        choices=divergence.ACTIONS, default=_POLICY.action,
        help="what a diverging run does: rewind (to its newest checkpoint written before the "
        "divergence began, the rate lowered by --rewind-lr-factor and the streams moved past "
        "the bytes read since: an automatic pivot), stop (status.json 'diverged', exit 3) or "
        "warn (say so and train on)",
    ),
    _f("max_rewinds", "--max-rewinds", cls="free", group=_GUARD, type=int,
       default=_POLICY.max_rewinds, metavar="N", check=_at_least(0),
       help="at most N rewinds within --rewind-span ticks; one more divergence stops the run "
       "as diverged"),
    _f("rewind_span", "--rewind-span", cls="free", group=_GUARD, type=int, default=None,
       metavar="TICKS", check=_at_least(0),
       help="the span of ticks --max-rewinds counts in (default: "
       f"{divergence.REWIND_SPAN_PERIODS} x --ckpt-every; 0 = the whole run); a pivot made by "
       "a person starts the count again"),
    _f("rewind_lr_factor", "--rewind-lr-factor", cls="free", group=_GUARD, type=float,
       default=_POLICY.lr_factor, metavar="F", check=_finite("in (0, 1]", lambda v: 0 < v <= 1),
       help="each rewind multiplies the learning rate the run diverged at by F"),
    _f("spike_window", "--spike-window", cls="free", group=_GUARD, type=int,
       default=_THRESHOLDS.window, metavar="N", check=_at_least(divergence.MIN_HISTORY),
       help="the spike rules' baseline: the median and spread of the last N judged steps"),
    _f("spike_steps", "--spike-steps", cls="free", group=_GUARD, type=int,
       default=_THRESHOLDS.steps, metavar="N", check=_at_least(1),
       help="a spike, or train_bpb above 12 (1.5 x a uniform guess), counts when it lasts N "
       "steps in a row"),
    _f("loss_spike", "--loss-spike", cls="free", group=_GUARD, type=float,
       default=_THRESHOLDS.loss_mads, metavar="K", check=_POSITIVE_NUMBER,
       help="a loss spike: the loss above its running median by K spreads (and by at least "
       f"{divergence.LOSS_FLOOR:g} x the median)"),
    _f("grad_spike", "--grad-spike", cls="free", group=_GUARD, type=float,
       default=_THRESHOLDS.grad_mads, metavar="K", check=_POSITIVE_NUMBER,
       help="a gradient-norm spike: the log of grad_norm above its running median by K "
       f"spreads (and by at least a factor {divergence.GRAD_FLOOR:g})"),
    _f("val_regression", "--val-regression", cls="free", group=_GUARD, type=float,
       default=_THRESHOLDS.val_margin, metavar="BPB", check=_POSITIVE_NUMBER,
       help="a val regression: val_bpb above the run's best by more than BPB bits/byte"),
    _f("val_regression_count", "--val-regression-count", cls="free", group=_GUARD, type=int,
       default=_THRESHOLDS.val_count, metavar="N", check=_at_least(1),
       help="a val regression counts when it lasts N validations in a row"),
    # a run's lifecycle (--output-dir is declared by cli.add_output_dir_argument)
    _f("output_dir", cls="lifecycle", group=_LOGS,
       help="the run's folder, required (a new folder starts a run, a run's folder resumes it)"),
    _f(
        "fork", "--fork", cls="lifecycle", group=_LIFE, metavar="CKPT",
        help="an audit branch: a NEW run folder (--output-dir) that continues exactly from "
        "this checkpoint (weights, m, v, loader, state, RNGs, tick); policy flags may differ",
    ),
    _f(
        "init", "--init", cls="lifecycle", group=_LIFE, metavar="CKPT",
        help="start a NEW run at tick 0, on any data, from this checkpoint's weights (fresh "
        "optimizer unless --keep-optimizer)",
    ),
    _f("keep_optimizer", "--keep-optimizer", cls="lifecycle", group=_LIFE,
       action="store_true",
       help="with --init: keep the checkpoint's AdamW m, v and step (no restart spike)"),
    _f("revert_ok", "--revert-ok", cls="lifecycle", group=_LIFE, action="store_true",
       help="let this command's flags undo an earlier pivot (refused without it: an old "
       "command from the shell's history would silently change the run back)"),
    # hardware
    _f("device", cls="free", group=_HW, choices=("cpu", "cuda"), default="cpu",
       help="training device"),
    _f("threads", cls="free", group=_HW, type=int, default=None,
       check=_at_least(1), help="torch CPU threads (default: torch's choice)"),
    _f(
        "dist_timeout", "--dist-timeout", cls="free", group=_HW, type=float, default=600.0,
        metavar="S", check=_POSITIVE_NUMBER,
        help="under torchrun: a collective waiting longer than S seconds (a rank crashed or "
        "hangs) ends the job instead of hanging it",
    ),
    _f("tf32", "--tf32", cls="free", group=_HW, action="store_true",
       help="allow TF32 in the readout matmuls on CUDA (the field loop stays IEEE fp32)"),
    _f(
        "recurrence", cls="free", group=_HW, choices=("auto", *RECURRENCES),
        default="auto",
        help="the field loop: triton (one kernel per window; CUDA), native (Rust, "
        "parallel over streams; CPU), fused (hand-written backward), compiled (torch.compile "
        "of the fused steps; a C++ compiler on CPU), autograd (the readable cross-check); "
        "auto = triton on CUDA once a self-check on the device has matched it to the fused "
        "loop (else fused, said and recorded), native on a CPU",
    ),
)  # fmt: skip


def model_flag_fields() -> list[dataclasses.Field]:
    """The ModelConfig fields that are command-line flags (``--n-modes``, ...)."""
    return [f for f in dataclasses.fields(ModelConfig) if f.name not in _NOT_FLAGS]


def _model_flags() -> tuple[Flag, ...]:
    """One flag per model config field: default None (= not given: the checkpoint's value
    on a resume, the config's default on a new run)."""
    out = []
    for f in model_flag_fields():
        name = "--" + f.name.replace("_", "-")
        text = f"model: {f.name} (default {f.default})"
        if f.type in (bool, "bool"):
            kw: dict = {"action": argparse.BooleanOptionalAction, "default": None}
        else:
            typ = {"int": int, "float": float, "str": str}[str(f.type)]  # (another: add it)
            kw = {"type": typ, "default": None}
        out.append(Flag(f.name, (name,), "model", _MODEL, text, kw, section="model"))
    return tuple(out)


FLAGS: tuple[Flag, ...] = _BASE_FLAGS + _model_flags()
BY_DEST: dict[str, Flag] = {f.dest: f for f in FLAGS}


def dests(cls: str) -> tuple[str, ...]:
    """The destinations of the flags of one class, in table order."""
    if cls not in CLASSES:
        raise ValueError(f"unknown flag class {cls!r}")
    return tuple(f.dest for f in FLAGS if f.cls == cls)


# ---- the command line ----------------------------------------------------------------------

_DOC = """Train a field language model on B byte streams in lockstep: ``python -m atom_train.train``."""


def build_parser(
    description: str = "", epilog: str = "", *, suppress_defaults: bool = False
) -> argparse.ArgumentParser:
    """The trainer's parser, from `FLAGS` (argument errors are `cli.UserError`s).
    `suppress_defaults`: flags not on the command line are absent from the result (how
    `given_flags` tells what the user said from what argparse filled in)."""
    p = ArgumentParser(
        prog="python -m atom_train.train",  # (no abbreviations: cli.ArgumentParser's rule)
        description=description or _DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
    groups: dict[str, Any] = {}
    for f in FLAGS:
        if f.group not in groups:
            groups[f.group] = p.add_argument_group(f.group, GROUP_HELP.get(f.group))
        g = groups[f.group]
        if f.dest == "output_dir":
            add_output_dir_argument(g)  # the supervisor reads it with the same declaration
            if suppress_defaults:
                g._group_actions[-1].default = argparse.SUPPRESS
            continue
        kwargs = dict(f.kwargs)
        text = f.help
        if f.default is not None:  # (a switch's and a model flag's are None: theirs is none)
            text += " (default: %(default)s)"
        if suppress_defaults:
            kwargs["default"] = argparse.SUPPRESS
        g.add_argument(*f.names, dest=f.dest, help=text, **kwargs)
    return p


def given_flags(argv: list[str]) -> frozenset[str]:
    """The destinations of the flags `argv` gives (parsed like the real parser; call it
    after that parser accepted `argv`)."""
    return frozenset(vars(build_parser(suppress_defaults=True).parse_args(argv)))


def check_values(values: Mapping[str, Any] | argparse.Namespace) -> None:
    """Refuse a flag value no run can use, naming the flag (cli.UserError); `values`: a
    parsed command line, or ``dest -> value`` (`RunConfig.flat`)."""
    if not isinstance(values, Mapping):
        values = vars(values)
    for f in FLAGS:
        if f.check is not None:
            problem = f.check(values.get(f.dest))
            if problem:
                raise UserError(f"{f.flag} {problem}")


# ---- the reference in docs -----------------------------------------------------------------


def _default_text(f: Flag) -> str:
    if f.dest == "output_dir":
        return "required"
    if f.kwargs.get("action") == "store_true":
        return "off"
    if f.cls == "model":  # None on the command line: the config's default (or the run's)
        return f"`{getattr(ModelConfig(), f.dest)}`"
    d = f.default
    return "-" if d is None else f"`{d}`"


def markdown_table() -> str:
    """docs/flags.md's table: every flag with its class, default and help."""
    lines = [
        "| flag | class | default | what |",
        "|---|---|---|---|",
    ]
    for f in FLAGS:
        names = ", ".join(f"`{n}`" for n in f.names)
        lines.append(f"| {names} | {f.cls} | {_default_text(f)} | {f.help} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m atom_train.trainer.flags: print the docs table
    sys.stdout.write(markdown_table())
