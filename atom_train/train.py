"""Train a field language model on B byte streams in lockstep: ``python -m atom_train.train``.

Bytes consumed = ticks x B. Rerunning the same command resumes from the newest valid
checkpoint in --output-dir (weights, AdamW state, RNGs, loader positions and contexts, field
and atom state), so a killed run loses at most the work since its last checkpoint.

Examples::

    # a CPU smoke run on your own text
    python -m atom_train.train --data 'data/fr/*.txt' --val data/fr/val.txt -B 32 \\
        --total-ticks 20000 --output-dir runs/smoke

    # a long GPU run: 512 streams, rolling checkpoint every 2000 ticks, a permanent
    # snapshot every 100k ticks (run it under `python -m atom_train.supervise --`)
    python -m atom_train.train --data 'data/fr/train-*.txt' --val 'data/fr/val.txt' \\
        -B 512 --bptt 64 --device cuda --tf32 --total-bytes 5e9 \\
        --ckpt-every 2000 --snapshot-every 100000 --output-dir runs/fr-b512

    # continue a finished run for longer: the same command with a larger --total-ticks
    # start a new run (another corpus, another B) from a checkpoint's weights
    python -m atom_train.train --init runs/fr-b512/ckpt-final.safetensors --data 'other/*.txt' \\
        --output-dir runs/other

Signals: SIGTERM or SIGINT = finish the current window, write a checkpoint, exit 0. SIGUSR1 =
write a checkpoint at the next window boundary and keep training.

Exit codes: 0 = completed or stopped cleanly (see status.json), 2 = user error (nothing to
retry), anything else = crash (the supervisor relaunches).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import platform
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from atom_train import __version__
from atom_train.batched import BatchedByteTick, BatchedUnsupported, check_batched_supported
from atom_train.checkpoint import (
    FINAL,
    ROLLING,
    ROLLING_PREV,
    Checkpoint,
    CheckpointError,
    latest_valid_checkpoint,
    load_checkpoint,
    remove_stale_temp_files,
    save_checkpoint,
    snapshot_name,
)
from atom_train.data import AtomDataError, BatchedByteStream, ByteCorpus
from atom_train.model import UNIMPLEMENTED_OPTIONS, AtomNativeModel, ModelConfig
from atom_train.prefetch import WindowPrefetcher
from atom_train.rundir import (
    AppendLog,
    ProgressTable,
    RunDirError,
    RunLock,
    check_writable,
    write_status,
)

DEFAULT_OUTPUT_DIR = "runs/atom"
LOG2E = 1.0 / math.log(2.0)

# Test hooks (never set outside tests): crash hard at a tick, optionally only once.
_CRASH_AT_ENV = "ATOM_TEST_CRASH_AT_TICK"
_CRASH_MARKER_ENV = "ATOM_TEST_CRASH_MARKER"

# Model config fields that are not command-line flags: provenance fixed by the code, and the
# options of the original model that no implementation here provides (model.py rejects them).
_NOT_FLAGS = {"feature_version", *UNIMPLEMENTED_OPTIONS}


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit code 2."""


# ----------------------------------------------------------------------------------------
# Command line


def _model_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(ModelConfig) if f.name not in _NOT_FLAGS]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m atom_train.train",
        allow_abbrev=False,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--data",
        action="append",
        metavar="GLOB",
        help="training text: a file, folder glob or list of globs (repeatable); all shards are "
        "read as one circular byte string",
    )
    g.add_argument("--val", metavar="GLOB", help="held-out text for validation (not in --data)")
    g.add_argument("--resident", action="store_true", help="copy the corpus into RAM")
    g.add_argument(
        "--offset-seed",
        type=int,
        default=None,
        help="start the B streams at seeded random offsets (default: evenly spaced)",
    )
    g.add_argument(
        "--loader-threads", type=int, default=None, help="loader threads (default: all cores)"
    )
    g.add_argument(
        "--transport",
        choices=("auto", "dense", "ids"),
        default="auto",
        help="how features reach the model: dense 320 floats per byte, or 17 feature ids per "
        "byte expanded on the device (auto: ids on CUDA, dense on CPU)",
    )

    g = p.add_argument_group("schedule")
    g.add_argument("-B", "--streams", dest="B", type=int, default=64, help="streams in lockstep")
    g.add_argument(
        "--bptt",
        type=int,
        default=64,
        metavar="K",
        help="BPTT window in ticks (0 = no BPTT: a window of one tick)",
    )
    g.add_argument("--total-ticks", type=int, help="train until this tick (bytes = ticks x B)")
    g.add_argument("--total-bytes", type=float, help="train until ticks x B reaches this")
    g.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate")
    g.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay")
    g.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm (0 = off)")
    g.add_argument(
        "--warmup-steps", type=int, default=0, help="linear learning-rate warm-up (optimizer steps)"
    )
    g.add_argument(
        "--lr-schedule",
        choices=("constant", "cosine"),
        default="constant",
        help="after warm-up: constant, or cosine decay to --min-lr-ratio x lr at the last tick",
    )
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="floor of the cosine decay")
    g.add_argument("--seed", type=int, default=0, help="seed of the last-atom dropout masks")

    g = p.add_argument_group("checkpoints and logs")
    g.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR, help="run folder")
    g.add_argument("--ckpt-every", type=int, default=2000, help="rolling checkpoint period (ticks)")
    g.add_argument(
        "--snapshot-every",
        type=int,
        default=0,
        help="permanent numbered snapshot period (ticks; 0 = none)",
    )
    g.add_argument("--val-every", type=int, default=2000, help="validation period (ticks)")
    g.add_argument(
        "--val-bytes",
        type=int,
        default=65536,
        help="size of the fixed validation slice (bytes, read by --val-streams streams)",
    )
    g.add_argument("--val-streams", type=int, default=64, help="streams reading the val slice")
    g.add_argument("--sample-every", type=int, default=0, help="chat sample period (ticks; 0=off)")
    g.add_argument("--sample-prompt", default="Bonjour", help="prompt of the chat samples")
    g.add_argument("--sample-bytes", type=int, default=200, help="length of a chat sample")
    g.add_argument("--log-every", type=int, default=200, help="progress.tsv row period (ticks)")
    g.add_argument(
        "--init",
        metavar="CKPT",
        help="start a NEW run from this checkpoint's weights (fresh optimizer, tick 0)",
    )

    g = p.add_argument_group("hardware")
    g.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="training device")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    g.add_argument("--tf32", action="store_true", help="allow TF32 matmuls on CUDA")
    g.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the per-tick field loop (needs a C++ compiler on CPU; compiles "
        "for a few seconds at start; same results within float32 rounding)",
    )

    g = p.add_argument_group(
        "model",
        "model config (defaults: SPEC §3); on a resumed run they must match the checkpoint",
    )
    for f in _model_fields():
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if f.type in (bool, "bool"):
            g.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"model: {f.name} (default {default})",
            )
        else:
            typ = {"int": int, "float": float, "str": str}.get(str(f.type), type(default))
            g.add_argument(
                flag, type=typ, default=None, help=f"model: {f.name} (default {default})"
            )
    return p


def given_model_flags(args: argparse.Namespace) -> dict:
    return {
        f.name: getattr(args, f.name) for f in _model_fields() if getattr(args, f.name) is not None
    }


# ----------------------------------------------------------------------------------------
# Schedule helpers (pure functions of the tick, so a resumed run cuts windows identically)


def window_cut(t: int, total: int, periods: list[int]) -> int:
    """The tick at which the window that starts at tick t closes."""
    end = total
    for p in periods:
        if p > 0:
            end = min(end, (t // p + 1) * p)
    return end


def crossed(prev: int, now: int, every: int) -> bool:
    return every > 0 and prev // every != now // every


def lr_at(step: int, total_steps: int, args: argparse.Namespace) -> float:
    if args.warmup_steps > 0 and step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    if args.lr_schedule == "cosine" and total_steps > args.warmup_steps:
        frac = min(1.0, (step - args.warmup_steps) / (total_steps - args.warmup_steps))
        ratio = args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))
        return args.lr * ratio
    return args.lr


# ----------------------------------------------------------------------------------------


class _Signals:
    """Handlers only set flags; the trainer acts on them at the next window boundary."""

    def __init__(self) -> None:
        self.stop: str | None = None
        self.checkpoint = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_usr1)

    def _on_stop(self, signum, frame) -> None:
        self.stop = signal.Signals(signum).name

    def _on_usr1(self, signum, frame) -> None:
        self.checkpoint = True


def _say(msg: str) -> None:
    print(f"[atom] {msg}", file=sys.stderr, flush=True)


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.output_dir)
        self.signals = _Signals()
        self.lock: RunLock | None = None

    # -- set-up ---------------------------------------------------------------------------

    def _setup_dir(self) -> None:
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create output folder {self.out} ({e.strerror})") from None
        try:
            self.lock = RunLock(self.out)
            self.lock.acquire()
            check_writable(self.out)
        except RunDirError as e:
            raise UserError(str(e)) from None
        for p in remove_stale_temp_files(self.out):
            _say(f"removed {p.name}, left by a checkpoint write that was interrupted")

    def _device(self) -> torch.device:
        a = self.args
        if a.device == "cuda":
            if not torch.cuda.is_available():
                raise UserError("--device cuda but torch sees no CUDA device: use --device cpu")
            if a.tf32:
                torch.backends.cuda.matmul.allow_tf32 = True
                torch.backends.cudnn.allow_tf32 = True
        if a.threads:
            torch.set_num_threads(a.threads)
        return torch.device(a.device)

    def _open_corpus(self, globs: list[str] | str) -> ByteCorpus:
        try:
            return ByteCorpus(globs, resident=self.args.resident)
        except AtomDataError as e:
            raise UserError(str(e)) from None

    def _resolve_total(self, B: int) -> int:
        a = self.args
        if a.total_ticks is not None and a.total_bytes is not None:
            raise UserError("give --total-ticks or --total-bytes, not both")
        if a.total_ticks is not None:
            total = a.total_ticks
        elif a.total_bytes is not None:
            total = math.ceil(a.total_bytes / B)
        else:
            raise UserError("say how long to train: --total-ticks N or --total-bytes N")
        if total <= 0:
            raise UserError("--total-ticks / --total-bytes must be positive")
        return total

    def _check_args(self) -> None:
        a = self.args
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

    def _model_config(self, resume: Checkpoint | None, init: Checkpoint | None) -> ModelConfig:
        given = given_model_flags(self.args)
        if resume is not None:
            saved = resume.meta["model_config"]
            diff = {k: (saved.get(k), v) for k, v in given.items() if saved.get(k) != v}
            if diff:
                lines = ", ".join(
                    f"{k}: checkpoint {s!r} vs flag {g!r}" for k, (s, g) in diff.items()
                )
                raise UserError(
                    f"model flags differ from the run in {self.out} ({lines}): rerun with the "
                    "original flags to resume, or start a new run with --init CKPT "
                    "--output-dir NEW"
                )
            return self._config_from(saved, resume)
        if init is not None:
            saved = dict(init.meta["model_config"])
            for k in ("pack_mode",):
                if k in given and given[k] != saved.get(k):
                    raise UserError(
                        f"--init checkpoint was trained with {k}={saved.get(k)!r}, not "
                        f"{given[k]!r}: features of another {k} would turn its weights into noise"
                    )
            saved.update(given)
            return self._config_from(saved, init)
        try:
            return ModelConfig.from_dict({**ModelConfig().to_dict(), **given})
        except (ValueError, TypeError) as e:
            raise UserError(f"bad model config: {e}") from None

    @staticmethod
    def _config_from(d: dict, ck: Checkpoint) -> ModelConfig:
        try:
            return ModelConfig.from_dict(d)
        except (ValueError, TypeError) as e:
            raise UserError(f"{ck.path}: its model config does not fit this atom ({e})") from None

    # -- checkpoint contents ------------------------------------------------------------------

    def _param_names(self) -> list[str]:
        return [n for n, _ in self.model.named_parameters()]

    def _tensors(self) -> dict[str, torch.Tensor]:
        t: dict[str, torch.Tensor] = {}
        for k, v in self.model.state_dict().items():
            t[f"model/{k}"] = v
        params = dict(self.model.named_parameters())
        for name, p in params.items():
            st = self.opt.state.get(p)
            if not st:
                continue
            for key in ("exp_avg", "exp_avg_sq", "step"):
                v = st[key]
                t[f"optim/{name}/{key}"] = v if torch.is_tensor(v) else torch.tensor(float(v))
        for k, v in self.bt.state_dict().items():
            t[f"runtime/{k}"] = v
        t["rng/dropout"] = self.gen.get_state()
        t["rng/torch_cpu"] = torch.get_rng_state()
        if torch.cuda.is_available() and self.device.type == "cuda":
            for i, s in enumerate(torch.cuda.get_rng_state_all()):
                t[f"rng/torch_cuda/{i}"] = s
        return t

    def _meta(self, kind: str) -> dict:
        a = self.args
        return {
            "kind": kind,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "model_config": self.config.to_dict(),
            "provenance": {
                "pack_mode": self.config.pack_mode,
                "feature_version": self.config.feature_version,
            },
            "training": {
                "tick": self.tick,
                "step": self.step,
                "bytes_seen": self.tick * self.B,
                "B": self.B,
                "total_ticks": self.total,
                "elapsed_s": self._elapsed(),
                "val_ce_bpb": self.last_val,
                "device": str(self.device),
            },
            "optimizer": {
                "name": "AdamW",
                "param_names": self._param_names(),
                "param_groups": [
                    {k: v for k, v in g.items() if k != "params"} for g in self.opt.param_groups
                ],
            },
            "loader_state": self.loader_state,
            "corpus": {"signature": self.corpus.signature, "size": self.corpus.size},
            "args": {k: v for k, v in vars(a).items()},
            "versions": {
                "atom": __version__,
                "torch": torch.__version__,
                "numpy": np.__version__,
                "python": platform.python_version(),
            },
        }

    def _restore(self, ck: Checkpoint) -> None:
        model_t = ck.group("model")
        self.model.load_state_dict(model_t, strict=True)
        names = self._param_names()
        saved_names = ck.meta["optimizer"]["param_names"]
        if saved_names != names:
            raise UserError(f"{ck.path}: optimizer parameters differ from this model's")
        state = {}
        for i, name in enumerate(names):
            keys = {
                k: ck.tensors.get(f"optim/{name}/{k}") for k in ("exp_avg", "exp_avg_sq", "step")
            }
            if all(v is not None for v in keys.values()):
                state[i] = {k: v.to(self.device) if k != "step" else v for k, v in keys.items()}
        groups = ck.meta["optimizer"]["param_groups"]
        for g in groups:
            g["params"] = list(range(len(names)))
            g["betas"] = tuple(g["betas"])
        self.opt.load_state_dict({"state": state, "param_groups": groups})
        for g in self.opt.param_groups:  # honour the flag (the lr is set at every step)
            g["weight_decay"] = self.args.weight_decay
        self.bt.load_state_dict({k: v.to(self.device) for k, v in ck.group("runtime").items()})
        self.gen.set_state(ck.tensors["rng/dropout"])
        torch.set_rng_state(ck.tensors["rng/torch_cpu"])
        if self.device.type == "cuda":
            cuda_states = [
                ck.tensors[k] for k in sorted(ck.tensors) if k.startswith("rng/torch_cuda/")
            ]
            if cuda_states:
                torch.cuda.set_rng_state_all(cuda_states)
        tr = ck.meta["training"]
        self.tick, self.step = int(tr["tick"]), int(tr["step"])
        self.elapsed_before = float(tr.get("elapsed_s", 0.0))
        self.last_val = tr.get("val_ce_bpb")

    @contextlib.contextmanager
    def _off_clock(self):
        """Time spent inside is not counted in the training throughput (bytes/s)."""
        t0 = time.time()
        try:
            yield
        finally:
            self.off_clock_s += time.time() - t0

    def _save(self, kind: str) -> Path:
        with self._off_clock():
            return self._write_checkpoint(kind)

    def _write_checkpoint(self, kind: str) -> Path:
        tensors, meta = self._tensors(), self._meta(kind)
        if kind == "rolling":
            path = save_checkpoint(
                self.out / ROLLING, tensors, meta, keep_previous_as=self.out / ROLLING_PREV
            )
        elif kind == "snapshot":
            path = self.out / snapshot_name(self.tick)
            if path.exists():
                # A resume from an older checkpoint passes this tick again: the snapshot
                # already on disk is permanent and stays as it is.
                _say(f"warning: {path.name} already exists: kept, not overwritten")
                return path
            save_checkpoint(path, tensors, meta, exclusive=True)
        else:
            path = save_checkpoint(self.out / FINAL, tensors, meta)
        self.last_ckpt = path
        return path

    def _elapsed(self) -> float:
        return self.elapsed_before + (time.time() - self.t_start)

    # -- validation and samples ---------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> float:
        """Mean byte CE (bits/byte) on the fixed val slice, from fresh state (no RNG used)."""
        a = self.args
        Bv = a.val_streams
        ticks = a.val_bytes // Bv
        stream = BatchedByteStream(self.val_corpus, Bv, pack_mode=self.config.pack_mode)
        bt = BatchedByteTick(self.model, Bv, device=self.device)
        K = max(1, a.bptt)
        total_ce, t = 0.0, 0
        self.model.eval()
        try:
            while t < ticks:
                end = window_cut(t, ticks, [K, self.config.episode_length])
                _, feats, tgt = stream.next_window(end - t)
                out = bt.run_window(
                    torch.from_numpy(feats).to(self.device),
                    torch.from_numpy(tgt).to(self.device).long(),
                    t,
                    training=False,
                )
                total_ce += out.byte_ce * (end - t)
                t = end
        finally:
            self.model.train()
        return total_ce / ticks * LOG2E

    def sample(self) -> str:
        from atom_train.generate import generate

        a = self.args
        cpu_model = AtomNativeModel(self.config)
        cpu_model.load_state_dict({k: v.cpu() for k, v in self.model.state_dict().items()})
        out = generate(
            cpu_model,
            a.sample_prompt.encode(),
            max_bytes=a.sample_bytes,
            temperature=0.8,
            top_k=40,
            seed=0,
        )
        return out.decode("utf-8", errors="replace")

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> int:
        a = self.args
        self.signals.install()  # early, so a stop during set-up is honoured at the first boundary
        self._check_args()
        self._setup_dir()
        self.device = self._device()
        self.corpus = self._open_corpus(a.data)
        self.val_corpus = self._open_corpus(a.val) if a.val else None

        resume = latest_valid_checkpoint(self.out, warn=lambda m: _say("warning: " + m))
        init = None
        if resume is None and a.init:
            try:
                init = load_checkpoint(a.init)
            except CheckpointError as e:
                raise UserError(f"--init: {e}") from None
        elif resume is not None and a.init:
            _say(f"--init ignored: resuming the run in {self.out} from {resume.path.name}")

        self.config = self._model_config(resume, init)
        try:
            self.config.validate()
            check_batched_supported(self.config)
        except (ValueError, BatchedUnsupported) as e:
            raise UserError(f"model config: {e}") from None
        self.B = a.B
        if resume is not None and int(resume.meta["training"]["B"]) != self.B:
            raise UserError(
                f"the run in {self.out} was trained with -B {resume.meta['training']['B']}, not "
                f"-B {self.B}: rerun with the original -B, or start a new run with --init "
                f"{resume.path} --output-dir NEW"
            )
        self.total = self._resolve_total(self.B)

        torch.manual_seed(a.seed)
        self.model = AtomNativeModel(self.config).to(self.device)
        if init is not None:
            try:
                self.model.load_state_dict(
                    {k: v for k, v in init.group("model").items()}, strict=True
                )
            except RuntimeError as e:
                raise UserError(
                    f"--init {a.init}: weights do not fit this model config ({e})"
                ) from None
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
        self.bt = BatchedByteTick(self.model, self.B, device=self.device, compile=a.compile)
        self.gen = torch.Generator().manual_seed(a.seed)
        offsets = "even" if a.offset_seed is None else a.offset_seed
        try:
            self.stream = BatchedByteStream(
                self.corpus,
                self.B,
                pack_mode=self.config.pack_mode,
                offsets=offsets,
                threads=a.loader_threads,
            )
        except AtomDataError as e:
            raise UserError(str(e)) from None
        self.tick, self.step, self.elapsed_before = 0, 0, 0.0
        self.last_ckpt: Path | None = None
        self.last_val: float | None = None
        self.off_clock_s = 0.0
        if resume is not None:
            try:
                self.stream.load_state_dict(resume.meta["loader_state"])
            except AtomDataError as e:
                raise UserError(
                    f"cannot resume {resume.path}: {e}. To train these weights on this data, "
                    f"start a new run with --init {resume.path} --output-dir NEW"
                ) from None
            self._restore(resume)
            self.last_ckpt = resume.path
        self.loader_state = self.stream.state_dict()

        self.loss_log = AppendLog(self.out / "loss.jsonl")
        self.progress = ProgressTable(self.out / "progress.tsv")
        self.samples = AppendLog(self.out / "samples.jsonl")
        self.t_start = time.time()
        if resume is not None:
            self.loss_log.write_json(
                {
                    "event": "resume",
                    "tick": self.tick,
                    "step": self.step,
                    "checkpoint": resume.path.name,
                    "time": time.time(),
                }
            )
            _say(f"resumed from {resume.path} at tick {self.tick} ({self.tick * self.B:,} bytes)")
        else:
            self.loss_log.write_json(
                {"event": "start", "tick": 0, "time": time.time(), "init": a.init, "B": self.B}
            )
        if self.tick >= self.total:
            self._status_completed()
            _say(
                f"already complete at tick {self.tick} ({self.last_ckpt}); raise --total-ticks "
                "to train further"
            )
            return 0

        write_status(self.out, "running", tick=self.tick)
        try:
            stopped = self._loop()
        except AtomDataError as e:
            # The corpus changed under the running loader (a shard truncated, replaced, ...).
            with contextlib.suppress(OSError):
                write_status(self.out, "failed", tick=self.tick, error=str(e))
            raise UserError(f"{e}; newest checkpoint: {self.last_ckpt}") from None
        except (CheckpointError, OSError) as e:
            # Disk full, output folder gone read-only, ...: nothing already on disk is lost
            # (checkpoints are replaced only by verified ones); the supervisor may retry.
            msg = str(e) if isinstance(e, CheckpointError) else _os_error_message(e, self.out)
            with contextlib.suppress(OSError):
                write_status(self.out, "failed", tick=self.tick, error=msg)
            _say(f"error: {msg}; newest checkpoint: {self.last_ckpt}; rerun to resume from it")
            return 1
        finally:
            self.loss_log.close()
            self.progress.close()
            self.samples.close()
        if stopped:
            write_status(
                self.out, "stopped", tick=self.tick, checkpoint=str(self.last_ckpt), signal=stopped
            )
            _say(
                f"stopped by {stopped} at tick {self.tick}; checkpoint: {self.last_ckpt}; rerun "
                "the same command to resume"
            )
        else:
            self._status_completed()
            _say(
                f"completed at tick {self.tick} ({self.tick * self.B:,} bytes); final "
                f"checkpoint: {self.last_ckpt}"
            )
        return 0

    def _status_completed(self) -> None:
        write_status(
            self.out,
            "completed",
            tick=self.tick,
            checkpoint=str(self.last_ckpt),
            val_ce_bpb=self.last_val,
        )

    def _periods(self) -> list[int]:
        a = self.args
        return [max(1, a.bptt), self.config.episode_length, a.ckpt_every, a.snapshot_every]

    def _loop(self) -> str | None:
        a = self.args
        periods = self._periods()
        compact = a.transport == "ids" or (a.transport == "auto" and self.device.type == "cuda")
        pf = WindowPrefetcher(
            self.stream,
            self.tick,
            self.total,
            lambda t: window_cut(t, self.total, periods),
            max_K=max(periods[0], 1),
            device=self.device,
            compact=compact,
        )
        total_steps = self._count_steps(0, self.total) if a.lr_schedule == "cosine" else 0
        crash_at = int(os.environ.get(_CRASH_AT_ENV, "-1"))
        bar = _progress_bar(self.tick, self.total)
        last_log_t, last_log_tick, last_off = time.time(), self.tick, self.off_clock_s
        log_loss, log_ce, log_n = 0.0, 0.0, 0
        val_ce = None
        try:
            while self.tick < self.total:
                w = pf.get()
                assert w.tick0 == self.tick, (w.tick0, self.tick)
                lr = lr_at(self.step, total_steps, a)
                for g in self.opt.param_groups:
                    g["lr"] = lr
                out = self.bt.run_window(w.feats, w.tgt, w.tick0, training=True, generator=self.gen)
                self.opt.zero_grad(set_to_none=True)
                out.loss.backward()
                gnorm = (
                    float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.grad_clip))
                    if a.grad_clip > 0
                    else None
                )
                self.opt.step()
                self.bt.detach_state()
                pf.release(w)
                prev, self.tick, self.step = self.tick, w.tick0 + w.K, self.step + 1
                self.loader_state = w.loader_state
                loss = float(out.loss.detach())
                bpb = out.byte_ce * LOG2E
                if not math.isfinite(loss):
                    raise FloatingPointError(
                        f"loss is {loss} at tick {self.tick}: lower --lr or check the data; "
                        f"resume from {self.last_ckpt}"
                    )
                self.loss_log.write_json(
                    {
                        "step": self.step,
                        "tick": self.tick,
                        "bytes": self.tick * self.B,
                        "loss": round(loss, 6),
                        "bpb": round(bpb, 6),
                        "lr": lr,
                        "gnorm": None if gnorm is None else round(gnorm, 6),
                    }
                )
                log_loss += loss * w.K
                log_ce += bpb * w.K
                log_n += w.K
                if crash_at >= 0 and self.tick >= crash_at:
                    self._test_crash()
                if self.val_corpus is not None and (
                    crossed(prev, self.tick, a.val_every) or self.tick == self.total
                ):
                    with self._off_clock():
                        val_ce = self.last_val = self.validate()
                    _say(f"tick {self.tick}: val {val_ce:.4f} bits/byte")
                if a.sample_every and crossed(prev, self.tick, a.sample_every):
                    with self._off_clock():
                        text = self.sample()
                    self.samples.write_json(
                        {
                            "tick": self.tick,
                            "prompt": a.sample_prompt,
                            "sample": text,
                            "time": time.time(),
                        }
                    )
                if crossed(prev, self.tick, a.log_every) or self.tick == self.total:
                    now = time.time()
                    # Training throughput: time spent on validation, samples and checkpoints
                    # is not training, so it is left out.
                    busy = now - last_log_t - (self.off_clock_s - last_off)
                    bps = (self.tick - last_log_tick) * self.B / max(busy, 1e-9)
                    self.progress.row(
                        tick=self.tick,
                        bytes_seen=self.tick * self.B,
                        loss=log_loss / log_n,
                        byte_ce_bpb=log_ce / log_n,
                        val_ce_bpb=val_ce,
                        lr=lr,
                        leak=self._leak(),
                        bytes_per_s=bps,
                        elapsed_s=self._elapsed(),
                    )
                    if bar is None:
                        _say(
                            f"tick {self.tick}/{self.total} loss {log_loss / log_n:.4f} "
                            f"ce {log_ce / log_n:.4f} bits/byte  {bps:,.0f} bytes/s"
                        )
                    last_log_t, last_log_tick, last_off = now, self.tick, self.off_clock_s
                    log_loss, log_ce, log_n, val_ce = 0.0, 0.0, 0, None
                if bar is not None:
                    bar.update(self.tick - prev)
                    bar.set_postfix(loss=f"{loss:.3f}", bpb=f"{bpb:.3f}")
                if self.tick == self.total:
                    break
                # Windows are cut at multiples of both periods, so "crossed" means "landed on".
                if crossed(prev, self.tick, a.snapshot_every):
                    _say(f"snapshot {self._save('snapshot').name}")
                if (
                    crossed(prev, self.tick, a.ckpt_every)
                    or self.signals.checkpoint
                    or self.signals.stop
                ):
                    if self.signals.checkpoint:
                        _say(f"SIGUSR1: checkpoint at tick {self.tick}")
                    self.signals.checkpoint = False
                    self._save("rolling")
                if self.signals.stop:
                    return self.signals.stop
        finally:
            pf.close()
            if bar is not None:
                bar.close()
        if a.snapshot_every and self.tick % a.snapshot_every == 0:
            _say(f"snapshot {self._save('snapshot').name}")
        self._save("final")
        return None

    def _count_steps(self, start: int, total: int) -> int:
        periods = self._periods()
        n, t = 0, start
        while t < total:
            t = window_cut(t, total, periods)
            n += 1
        return n

    def _leak(self) -> float:
        return float(self.model.leak().detach().mean())

    def _test_crash(self) -> None:
        marker = os.environ.get(_CRASH_MARKER_ENV)
        if marker:
            if os.path.exists(marker):
                return
            Path(marker).write_text(str(self.tick))
        _say(f"test hook: crashing at tick {self.tick}")
        os._exit(17)


def _os_error_message(e: OSError, out: Path) -> str:
    where = f" ({e.filename})" if e.filename else ""
    return f"cannot write in {out}{where}: {e.strerror or e}: free space or fix permissions"


def _progress_bar(start: int, total: int):
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, unit="tick", dynamic_ncols=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    trainer = Trainer(args)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    try:
        return trainer.run()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if trainer.lock is not None:
            trainer.lock.release()
        for s, h in handlers.items():  # leave the caller's handlers as they were
            signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(main())
