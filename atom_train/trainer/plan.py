"""Deciding what a run means before any work: `resolve_run(config, lifecycle, given) -> RunPlan`.

A command line, together with what its run folder already holds, is one of four things
(docs/design.md#a-runs-lifecycle):

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
map, no read: `data.sources.open_corpus`); it builds no model and writes nothing. The compute
backend (device, loop, transport, precision) is `model.backend.choose_backend`'s, whose one
computation is the Triton loop's self-check, when ``--recurrence auto`` picks Triton on CUDA.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from atom_train.common.cli import OUTPUT_DIR_HINT, UserError, quote, say
from atom_train.data.loader import ByteCorpus
from atom_train.data.sources import check_loader_state, open_corpus
from atom_train.data.text_checks import check_training_text, check_val_apart
from atom_train.model.backend import Backend, choose_backend
from atom_train.model.batched import BatchedUnsupported, check_batched_supported
from atom_train.model.config import ModelConfig
from atom_train.model.field_loops import RECURRENCES
from atom_train.model.lockstep import WindowSchedule
from atom_train.trainer import flags, tensorboard_log
from atom_train.trainer.checkpoint_file import (
    Checkpoint,
    CheckpointError,
    latest_valid_checkpoint,
    list_checkpoints,
    load_checkpoint,
)
from atom_train.trainer.loss_log import read_events
from atom_train.trainer.lr_schedule import LRSchedule, new_segment
from atom_train.trainer.run_config import Lifecycle, RunConfig
from atom_train.trainer.run_config import parse as parse_command
from atom_train.trainer.rundir import EVENTS, LOSS_LOG
from atom_train.trainer.text_sources import check_held_out, open_built_corpus
from atom_train.trainer.train_state import run_config_of, saved_lr_schedule

# Flags that set the training policy (the flag table's "policy" class): they may change at a
# pivot or in a fork (recorded), and a resume that changes none of them is a plain resume.
# "total_ticks" is the resolved length of the run, whether given as --total-ticks or
# --total-bytes.
POLICY_FLAGS = tuple(d for d in flags.dests("policy") if d != "total_bytes")
# A pivot or fork that changes one of these starts a new learning-rate segment at its step.
_LR_FLAGS = {"lr", "lr_schedule", "warmup_steps", "min_lr_ratio", "total_ticks", "lr_restart"}
# ... and one of these changes how many steps remain (windows are cut differently).
_STEP_COUNT_FLAGS = {"bptt", "ckpt_every", "snapshot_every"}
# Flags that say how to run, not what to compute; they may change freely (recorded).
FREE_FLAGS = flags.dests("free")
# Flags that take effect only when a run begins (see atom_train.trainer.flags, class "run"): on a
# resume or fork the checkpoint's value stays in force and a different one is ignored.
BEGIN_ONLY_FLAGS = ("seed", "offset_seed")
MODES = ("new", "resume", "fork", "init")
# More passes over the corpus than this and a run memorises it (said at start; the
# pre-flight's run check warns).
MEMORISE_PASSES = 100


def given_model_flags(config: RunConfig, given: frozenset[str] | None) -> dict[str, Any]:
    """The model flags the command line gives (`given`; None: those whose value is not
    ModelConfig's default)."""
    defaults = ModelConfig()
    return {
        d: config.value(d)
        for d in flags.dests("model")
        if (d in given if given is not None else config.value(d) != getattr(defaults, d))
    }


@dataclass(frozen=True)
class Periods:
    """Every how many ticks each boundary task runs (0 = never, or only at the end: val
    and the progress row also run at the last tick). Windows are cut at multiples of the
    checkpoint and snapshot periods; validation, samples and rows run at the first window
    end at or after a multiple of theirs (`model.lockstep.crossed`)."""

    ckpt: int
    snapshot: int
    val: int
    sample: int
    log: int


@dataclass(frozen=True)
class ValSpec:
    """The validation (`scoring.score_text`): `streams` streams spread evenly over the val
    text, bytes // streams ticks each, from fresh state."""

    corpus: ByteCorpus
    bytes: int
    streams: int


@dataclass(frozen=True)
class SampleSpec:
    prompt: str
    bytes: int


@dataclass(frozen=True)
class Hardware:
    threads: int | None  # torch CPU threads (None: torch's choice)
    loader_threads: int | None  # None: all cores
    tf32: bool  # the readout's matmuls on CUDA
    dist_timeout: float  # seconds


@dataclass(frozen=True)
class Rewind:
    """A rewind the divergence guard decided (`divergence.Response`): the launch continues
    from `checkpoint` (a resume of it, exactly) with the policy in force at the verdict
    (`in_force`, the diverged plan's `run_config`) but ``--lr`` `lr`, and every stream moved
    `skip_ticks` bytes further; recorded as an automatic pivot (`auto`:
    `Response.pivot_fields`)."""

    checkpoint: Path
    lr: float
    skip_ticks: int
    in_force: RunConfig
    total: int  # the diverged plan's last tick
    auto: dict


@dataclass
class RunPlan:
    """Everything a launch of the trainer needs, resolved: the trainer reads this, never the
    command line. `run_config` is the run's configuration in force (what checkpoints save as
    ``meta["config"]``: the flags a resume took from the run, its model config)."""

    mode: str  # one of MODES
    run_config: RunConfig
    lifecycle: Lifecycle
    out: Path
    config: ModelConfig
    B: int
    total: int  # the run's last tick
    corpus: ByteCorpus
    val: ValSpec | None
    device: torch.device
    recurrence: str  # resolved: never "auto"
    recurrence_reason: str  # why that loop (the start event and status.json record it)
    transport: str  # "dense" or "ids"
    window_schedule: WindowSchedule
    lr_schedule: LRSchedule
    periods: Periods
    sample: SampleSpec
    hardware: Hardware
    lr: float  # the optimizer's initial rate (each step's rate is lr_schedule's)
    weight_decay: float
    grad_clip: float  # 0 = off
    seed: int  # the run's: torch's seed and the last-atom mask generator's (new runs)
    offset_seed: int | None  # the streams' starting offsets: None = evenly spaced
    source: Checkpoint | None = None  # the checkpoint resumed, forked or initialised from
    keep_optimizer: bool = False  # init: m, v and step come from the source
    # Policy flags that differ from the source's (resume: a pivot; fork: the branch's policy).
    changes: dict[str, list] = field(default_factory=dict)
    other_changes: dict[str, list] = field(default_factory=dict)  # free flags, informational
    ignored: dict[str, list] = field(default_factory=dict)  # begin-only flags: [kept, given]
    extended: list | None = None  # resume: [old, new] last tick, when only that changed
    notes: list[str] = field(default_factory=list)  # said at start
    tensorboard: Path | None = None  # --tensorboard's folder, resolved (None: off)
    noise_every: int = 0  # a noise-scale measurement every this many steps (0: off)
    loss_log_rate: float = 0.0  # loss.jsonl's most lines per second (0: one per step)
    # A rewind's automatic pivot (`Rewind.auto`: what made it, the bytes skipped); None: a
    # launch a person made.
    auto: dict | None = None
    skip_ticks: int = 0  # every stream moved this many bytes past the source's positions
    transport_reason: str = ""  # why that transport

    @property
    def pivot(self) -> bool:
        return self.mode == "resume" and (bool(self.changes) or self.auto is not None)

    def passes(self, tick: int) -> float:
        """How many times over the corpus the streams have read at `tick` (ticks x B)."""
        return tick * self.B / max(self.corpus.size, 1)

    @property
    def val_corpus(self) -> ByteCorpus | None:
        return None if self.val is None else self.val.corpus

    @property
    def backend(self) -> Backend:
        """The compute backend chosen for this launch (`model.backend.choose_backend`), as
        the plan holds it now: `backend.precision()` is the launch's TF32 context."""
        return Backend(
            self.device,
            self.recurrence,
            self.recurrence_reason,
            self.transport,
            self.transport_reason,
            tf32=self.hardware.tf32 and self.device.type == "cuda",
        )

    def policy(self) -> dict[str, Any]:
        """The training policy in force (status.json and the pivot/fork events show it)."""
        return policy_of(self.run_config, self.total)


def policy_of(config: RunConfig, total: int | None) -> dict[str, Any]:
    """The policy flags' values, with the run's resolved length as ``total_ticks`` (a run
    saved before a flag existed ran under its default: `train_state.run_config_of`)."""
    out = {k: config.value(k) for k in POLICY_FLAGS if k != "total_ticks"}
    out["total_ticks"] = total
    return out


# ---- validation of the command line (no I/O) ------------------------------------------------


def check_config(c: RunConfig, life: Lifecycle) -> None:
    """Refuse flag values no run can use, naming the flag: each flag's own check (the flag
    table), then the rules that involve several flags."""
    if not c.data.data:
        raise UserError("no training data: pass --data GLOB (a file, folder/*.txt, ...)")
    flags.check_values(c.flat())
    if c.validation.val_bytes < c.validation.val_streams:
        raise UserError("--val-bytes must be at least --val-streams, which must be >= 1")
    if life.keep_optimizer and not life.init:
        raise UserError(
            "--keep-optimizer needs --init CKPT (it keeps that checkpoint's m and v); to "
            "continue a run with its optimizer, resume it or --fork it"
        )
    if life.init and life.fork:
        raise UserError("give --init or --fork, not both")
    if c.hardware.recurrence not in ("auto", *RECURRENCES):
        raise UserError(f"--recurrence must be auto or one of {', '.join(RECURRENCES)}")


def resolve_total(s: Any, B: int) -> int:
    """The run's last tick from the schedule section `s` (--total-ticks or --total-bytes)."""
    if s.total_ticks is not None and s.total_bytes is not None:
        raise UserError("give --total-ticks or --total-bytes, not both")
    if s.total_ticks is not None:
        total = s.total_ticks
    elif s.total_bytes is not None:
        if not math.isfinite(s.total_bytes):
            raise UserError(f"--total-bytes must be a finite number (got {s.total_bytes})")
        total = math.ceil(s.total_bytes / B)
    else:
        raise UserError("say how long to train: --total-ticks N or --total-bytes N")
    if total <= 0:
        raise UserError("--total-ticks / --total-bytes must be positive")
    return total


# ---- the plan ------------------------------------------------------------------------------


def resolve_run(
    config: RunConfig,
    lifecycle: Lifecycle,
    given: frozenset[str] | None = None,
    *,
    warn: Callable[[str], None] = say,
    local_rank: int | None = None,
    rewind: Rewind | None = None,
) -> RunPlan:
    """What this configuration means in its run folder (`lifecycle.output_dir`); every
    refusal is a UserError.

    `given`: the flags the command line gave (`flags.given_flags`; `run_config.parse`
    returns them). A resume or fork takes every other flag from the run's newest checkpoint
    (what is in force), so ``--output-dir RUN`` alone resumes the run as it was; None =
    every flag counts as given (for the model flags: those not at ModelConfig's default).
    `local_rank`: this process's GPU under torchrun. `rewind`: the divergence guard's rewind
    (`Rewind`): a resume of its checkpoint, not the newest, under the policy in force at the
    verdict with its lowered rate."""
    life = lifecycle
    if life.init and life.fork:
        raise UserError("give --init or --fork, not both")
    if not life.output_dir:
        raise UserError(f"no --output-dir: {OUTPUT_DIR_HINT}")
    out = Path(life.output_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output-dir {out} is a file, not a folder: choose another --output-dir")
    notes: list[str] = []
    if rewind is not None:  # (a checkpoint of the run in this folder)
        resume = _load(str(rewind.checkpoint), "the rewind's checkpoint")
    else:
        resume = latest_valid_checkpoint(out, warn=lambda m: warn("warning: " + m))
    source, mode = resume, "resume"
    if resume is not None:
        if rewind is not None:
            pass  # (the launch's --fork or --init was said at its start)
        elif life.fork:
            _check_refork(resume.meta.get("origin", {}), life.fork, out, resume)
            notes.append(f"--fork ignored: resuming the fork in {out} from {resume.path.name}")
        elif life.init:
            notes.append(f"--init ignored: resuming the run in {out} from {resume.path.name}")
    elif life.fork:
        source, mode = _load(life.fork, "--fork"), "fork"
        _check_fork_target(out, source)
    elif life.init:
        source, mode = _load(life.init, "--init"), "init"
    else:
        mode = "new"
    continues = mode in ("resume", "fork")
    c = config
    if c.data.corpus and c.data.data and (given is None or "data" in given):
        raise UserError("give --corpus DIR or --data GLOB, not both (--corpus names the shards)")
    # What the run had in force: the source's configuration, or the one at a rewind's verdict.
    saved = None
    if continues:
        saved = rewind.in_force if rewind is not None else run_config_of(source.meta)
    if continues and given is not None:
        c = _in_force(c, given, saved)
    if rewind is not None:
        c = c.replace(lr=rewind.lr)
    if c.data.corpus:
        c = _from_corpus_dir(c, given)
    check_config(c, life)
    if mode == "resume" and given is not None and not life.revert_ok and rewind is None:
        kept = _check_no_revert(c, given, saved, out, notes)
        if kept:
            c = c.replace(**kept)

    model = _model_config(given_model_flags(c, given), mode, source, out)
    sch, per, val_cfg, hw = c.schedule, c.periods, c.validation, c.hardware
    B = sch.B
    if continues:
        saved_B = int(source.meta["training"]["B"])
        if saved_B != B:
            raise UserError(
                f"{_whose(mode, out, source)} was trained with -B {saved_B}, not -B {B}: rerun "
                f"with -B {saved_B}, or start a new run with --init {quote(source.path)} --output-dir NEW"
            )
    corpus = open_corpus(c.data.data, "--data", c.data.resident)
    try:
        check_held_out(corpus.shards, "--data")
    except UserError as e:
        if not continues:
            raise
        # The run already trains on it (its data never changes): say so at every launch.
        warn(f"warning: {e}")
    val_corpus = open_corpus(val_cfg.val, "--val", c.data.resident) if val_cfg.val else None
    if not c.data.allow_binary:
        check_training_text(corpus.shards, "--data")
        if val_corpus is not None:
            check_training_text(val_corpus.shards, "--val")
    if val_corpus is not None:
        check_val_apart(corpus.shards, val_corpus.shards)
    if continues:
        check_loader_state(
            source.meta["loader_state"], corpus, B, model.pack_mode, checkpoint=source.path
        )
    total = resolve_total(sch, B)
    _warn_about_sizes(c, corpus, val_corpus, total, warn)
    noise_every = c.logging.noise_scale_every
    if noise_every and B < 2:
        # The measurement compares part of the streams with all of them: one stream has no
        # part. Asked for, that is a mistake; by default it is simply off.
        if given is None or "noise_scale_every" in given:
            raise UserError(
                "--noise-scale-every compares the gradient of part of the streams with that "
                f"of all of them: it needs -B 2 or more (got -B {B}); drop it, or raise -B"
            )
        noise_every = 0
    windows = WindowSchedule(
        sch.bptt, model.episode_length, total, per.ckpt_every, per.snapshot_every
    )

    changes: dict[str, list] = {}
    other: dict[str, list] = {}
    ignored: dict[str, list] = {}
    extended: list | None = None
    tick = step = 0
    if continues:
        saved_total = source.meta["training"].get("total_ticks")
        if rewind is not None:
            # A rewind's pivot says what it changed in the policy in force at the verdict
            # (the rate it lowered), as a person's says what it changed in the checkpoint's.
            saved_total = rewind.total
        for k in BEGIN_ONLY_FLAGS:
            if saved.value(k) != c.value(k):
                ignored[k] = [saved.value(k), c.value(k)]
        if ignored:
            c = c.replace(**{k: kept for k, (kept, _) in ignored.items()})
        saved_policy = policy_of(saved, saved_total)
        new_policy = policy_of(c, total)
        changes = {
            k: [saved_policy[k], new_policy[k]]
            for k in POLICY_FLAGS
            if saved_policy[k] != new_policy[k]
        }
        other = {
            k: [saved.value(k), c.value(k)] for k in FREE_FLAGS if saved.value(k) != c.value(k)
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
    for k, (kept, asked) in ignored.items():
        notes.append(
            f"--{k.replace('_', '-')} {asked} ignored: it takes effect when a run begins; this "
            f"run continues with {kept} from {source.path.name} (recorded)"
        )
    # (a rewind starts a new segment at the lowered rate, whatever the pivot records)
    opt = c.optimizer
    lr_changes = changes if rewind is None else {**changes, "lr": [None, opt.lr]}
    lr_schedule = _lr_schedule(opt, windows, lr_changes, source if continues else None, tick, step)
    # Last, once nothing else can be refused: the device, the loop (its self-check may
    # compile kernels), the transport and the precision (`model.backend`).
    backend = choose_backend(
        hw.device, hw.recurrence, config=model, B=B, transport=c.data.transport, tf32=hw.tf32,
        local_rank=local_rank, warn=warn,
        also=(B // 2,) if noise_every else (),  # the noise probe's half batch
        forward_only=(val_cfg.val_streams,) if val_corpus is not None else (),
    )  # fmt: skip
    lg = c.logging
    return RunPlan(
        mode=mode,
        run_config=c.replace(model=model),
        lifecycle=life,
        out=out,
        config=model,
        B=B,
        total=total,
        corpus=corpus,
        val=None
        if val_corpus is None
        else ValSpec(val_corpus, val_cfg.val_bytes, val_cfg.val_streams),
        device=backend.device,
        recurrence=backend.recurrence,
        recurrence_reason=backend.recurrence_reason,
        transport=backend.transport,
        transport_reason=backend.transport_reason,
        window_schedule=windows,
        lr_schedule=lr_schedule,
        periods=Periods(
            per.ckpt_every, per.snapshot_every, per.val_every, per.sample_every, per.log_every
        ),
        sample=SampleSpec(lg.sample_prompt, lg.sample_bytes),
        hardware=Hardware(hw.threads, c.data.loader_threads, hw.tf32, hw.dist_timeout),
        lr=opt.lr,
        weight_decay=opt.weight_decay,
        grad_clip=opt.grad_clip,
        seed=opt.seed,
        offset_seed=c.data.offset_seed,
        source=source,
        keep_optimizer=bool(life.keep_optimizer),
        changes=changes,
        other_changes=other,
        ignored=ignored,
        extended=extended,
        notes=notes,
        tensorboard=tensorboard_log.log_dir(lg.tensorboard, out),
        noise_every=noise_every,
        loss_log_rate=lg.loss_log_rate,
        auto=None if rewind is None else dict(rewind.auto),
        skip_ticks=0 if rewind is None else rewind.skip_ticks,
    )


def resolve_command(
    argv: list[str],
    *,
    warn: Callable[[str], None] = say,
    local_rank: int | None = None,
    every_flag_given: bool = False,
) -> RunPlan:
    """`resolve_run` of a trainer command line (`run_config.parse`); `every_flag_given`:
    plan it with ``given=None`` (the values of the flags it leaves out count as given)."""
    config, life, given = parse_command(argv)
    return resolve_run(
        config, life, None if every_flag_given else given, warn=warn, local_rank=local_rank
    )


def _warn_about_sizes(
    c: RunConfig, corpus: ByteCorpus, val: ByteCorpus | None, total: int, warn
) -> None:
    """Sizes that train or score something else than the user likely meant."""
    B, K = c.schedule.B, max(c.schedule.bptt, 1)
    val_bytes = c.validation.val_bytes
    if corpus.size < B:
        warn(
            f"warning: -B {B} is larger than the corpus ({corpus.size:,} bytes): streams will "
            "read the same bytes as each other; use a larger corpus or a smaller -B"
        )
    elif corpus.size < B * K:
        warn(
            f"warning: the corpus ({corpus.size:,} bytes) is smaller than one window of all "
            f"streams (-B {B} x K {K} = {B * K:,} bytes): streams read each other's bytes "
            "within a window; use a larger corpus, a smaller -B or a smaller --bptt"
        )
    if val is not None and val_bytes > val.size:
        warn(
            f"warning: the val slice (--val-bytes {val_bytes:,}) is larger than the val "
            f"text ({val.size:,} bytes): its streams wrap around and score the same bytes "
            f"again; use --val-bytes {val.size} or less"
        )
    passes = total * B / max(corpus.size, 1)
    if passes > MEMORISE_PASSES:
        warn(
            f"warning: the run reads the corpus {passes:,.0f} times over ({total * B:,} bytes "
            f"of {corpus.size:,}): it will memorise it; use more text or a shorter run"
        )


def _from_corpus_dir(c: RunConfig, given: frozenset[str] | None) -> RunConfig:
    """--corpus DIR: the manifest's train shards are --data, its val is --val unless the
    command gives --val (checked against the manifest at every launch)."""
    corpus = c.data.corpus
    if given is not None and "corpus" not in given and not Path(corpus).exists():
        # (a resume: the folder is the run's, from its checkpoint; it was built once)
        raise UserError(
            f"this run trains on the corpus in {corpus}, which is not there now (a disk "
            "not mounted, a folder moved?): put it back at that path and rerun, or give "
            "--corpus DIR where it is now (it must be the same corpus)"
        )
    built = open_built_corpus(corpus)
    own_val = "val" in given if given is not None else c.validation.val is not None
    val = c.validation.val
    if not own_val:
        val = str(built.val) if built.val is not None else None
    return c.replace(data=[str(p) for p in built.train], val=val)


def _in_force(c: RunConfig, given: frozenset[str], saved: RunConfig) -> RunConfig:
    """The configuration completed with the values in force: every run, policy and free flag
    the command line does not give takes the saved value (the length as one: --total-ticks
    and --total-bytes are given or taken together)."""
    length = {"total_ticks", "total_bytes"}
    taken = {
        f.dest: saved.value(f.dest)
        for f in flags.FLAGS
        if f.cls in ("run", "policy", "free")
        and f.dest not in given
        and not (f.dest in length and given & length)
    }
    return c.replace(**taken)


def _check_no_revert(
    c: RunConfig, given: frozenset[str], saved: RunConfig, out: Path, notes: list[str]
) -> dict[str, Any]:
    """Refuse a rerun whose flags would undo an earlier pivot (an old command from the
    shell's history, say) unless --revert-ok: say what would change back, and how to resume
    with what is in force instead. A value an automatic pivot (a rewind of the divergence
    guard) moved away from is not refused but kept as the guard left it, said in `notes`:
    the supervisor relaunches the command that diverged, and the rewind's lower rate stays.
    Returns those flags' values in force."""
    moved = [k for k in sorted(given & set(POLICY_FLAGS)) if saved.value(k) != c.value(k)]
    if not moved:
        return {}  # (the usual rerun: no need to read the run's events)
    pivots = [e for e in read_events(out) if e.get("event") == "pivot"]
    undone, kept = [], {}
    for k in moved:
        now, new = saved.value(k), c.value(k)
        for e in reversed(pivots):
            before_after = e.get("changes", {}).get(k)
            if before_after and before_after[1] == now and before_after[0] == new:
                if e.get("auto"):
                    kept[k] = now
                    notes.append(
                        f"--{k.replace('_', '-')} {new} not applied: the divergence guard's "
                        f"{e['auto']} at tick {e.get('tick')} set {now}, which stays in force "
                        "(--revert-ok applies it)"
                    )
                else:
                    undone.append(
                        f"{k} {now!r} -> {new!r} (undoes the pivot at tick {e.get('tick')})"
                    )
                break
    if undone:
        raise UserError(
            f"this command would undo an earlier pivot of the run in {out}: "
            f"{'; '.join(undone)}. To resume with what is in force, rerun with only "
            f"--output-dir {quote(out)} (or leave those flags out); to undo it, add --revert-ok"
        )
    return kept


def _load(path: str, flag: str) -> Checkpoint:
    try:
        return load_checkpoint(path)
    except CheckpointError as e:
        raise UserError(f"{flag}: {e}") from None


def _whose(mode: str, out: Path, source: Checkpoint) -> str:
    return f"the run in {out}" if mode == "resume" else f"--fork {source.path}"


def _first_event(out: Path) -> dict | None:
    events = read_events(out)
    return events[0] if events else None


def _check_fork_target(out: Path, source: Checkpoint) -> None:
    """A fork needs a folder that holds no run (or only the start of this same fork, killed
    before its first checkpoint)."""
    first = _first_event(out)  # (none for a folder not made yet)
    same_fork = (
        first is not None
        and first.get("event") == "fork"
        and (first.get("source_sha256") == source.sha256)
    )
    logs = [out / LOSS_LOG, out / EVENTS]
    held = any(p.exists() and p.stat().st_size > 0 for p in logs)
    if list_checkpoints(out) or (held and not same_fork):
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


def _model_config(
    given: dict[str, Any], mode: str, source: Checkpoint | None, out: Path
) -> ModelConfig:
    """The run's model config: a new run's from the flags, a resume's or fork's the
    checkpoint's (`given`, the model flags the command gives, must agree), an init's the
    checkpoint's with `given` applied (same weight shapes)."""
    if mode in ("resume", "fork"):
        saved = source.meta["model_config"]
        diff = {k: (saved.get(k), v) for k, v in given.items() if saved.get(k) != v}
        if diff:
            lines = ", ".join(f"{k}: checkpoint {s!r} vs flag {g!r}" for k, (s, g) in diff.items())
            raise UserError(
                f"model flags differ from {_whose(mode, out, source)} ({lines}): the model "
                f"never changes inside a run; rerun without them (a resume keeps the run's "
                f"model), or start a new run from these weights with --init {quote(source.path)} "
                "--output-dir NEW (the same model shape; other values of the shape-free fields "
                "like the leak or the episode length)"
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
        _check_init_shape(_config_from(saved, source), config, source)
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


def _param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    from atom_train.model.reference import ReferenceModel

    return {k: tuple(v.shape) for k, v in ReferenceModel(config).state_dict().items()}


def _check_init_shape(saved: ModelConfig, config: ModelConfig, ck: Checkpoint) -> None:
    """--init loads the checkpoint's weights: the model flags may change only what leaves
    every weight's shape as it is. Name the fields that do not."""
    if saved == config:
        return
    base = _param_shapes(saved)
    if _param_shapes(config) == base:
        return
    new = config.to_dict()
    culprits = [
        k
        for k, v in saved.to_dict().items()
        if v != new[k] and _param_shapes(dataclasses.replace(saved, **{k: new[k]})) != base
    ]
    names = ", ".join(
        f"{k} {getattr(saved, k)!r} (checkpoint) vs {new[k]!r} (--{k.replace('_', '-')})"
        for k in culprits
    )
    raise UserError(
        f"--init {ck.path}: the weights need the same model shape, and these flags change it: "
        f"{names or 'several fields together'}; drop them (fields that keep the shape, like "
        "the leak or the episode length, may change)"
    )


def _config_from(d: dict, ck: Checkpoint) -> ModelConfig:
    try:
        return ModelConfig.from_dict(d)
    except (ValueError, TypeError) as e:
        raise UserError(f"{ck.path}: its model config does not fit this atom ({e})") from None


def _lr_schedule(
    o, windows: WindowSchedule, changes: dict, source: Checkpoint | None, tick: int, step: int
) -> LRSchedule:
    """The learning rate of each step from the optimizer section `o` (see
    docs/checkpoints.md, "A run's lifecycle"):

    - a new run (or an init): warm-up from step 0, then constant or cosine to the last tick;
    - a resume or fork that changes no LR flag continues the checkpoint's schedule (if the
      number of remaining steps changed, the cosine is stretched to end at the last tick);
    - one that changes an LR flag (lr, schedule, warm-up, floor, total, --lr-restart)
      starts a new segment at its step, shaped by --lr-restart (`lr_schedule.new_segment`):
      warm-up only if --warmup-steps itself changed, then (peak) --lr, constant or cosine
      down to --min-lr-ratio x lr at the new last tick, or (hold, decay) the rate in force,
      constant or cosine down to --min-lr-ratio x it."""
    steps_left = windows.count_windows(tick)
    saved = saved_lr_schedule(source.meta) if source is not None else None
    if source is None or saved is None:
        return LRSchedule(o.lr, o.lr_schedule, o.warmup_steps, o.min_lr_ratio, 0, steps_left)
    if changes.keys() & _LR_FLAGS:
        return new_segment(
            o.lr_restart,
            lr=o.lr,
            kind=o.lr_schedule,
            warmup_steps=o.warmup_steps if "warmup_steps" in changes else 0,
            min_lr_ratio=o.min_lr_ratio,
            start_step=step,
            end_step=step + steps_left,
            rate_now=saved.at(step),
            lr_changed="lr" in changes,
        )
    if changes.keys() & _STEP_COUNT_FLAGS or saved.end_step != step + steps_left:
        # Fewer or more windows remain (other cuts, or a longer run): the cosine, if any,
        # still reaches its floor at the last tick.
        return dataclasses.replace(saved, end_step=step + steps_left)
    return saved
