"""Training-step throughput of one configuration, measured the way the trainer runs it.

`measure_step(config)` times one configuration in this process; `python -m atom_train.bench
step` runs one subprocess per configuration and calls it. By hand:

    python -m atom_train.bench.step --mode isolated -B 128 -K 64 --threads 1 --seconds 20
    python -m atom_train.bench.step --mode trainer -B 128 -K 64 --threads 2 --seconds 300
    python -m atom_train.bench.step --mode legacy -K 64 --seconds 20
    python -m atom_train.bench.step --split -B 128 -K 64 --recurrence native

Modes:

- ``isolated``: the trainer's own window step (`atom_train.trainer.step.WindowStep`: forward,
  backward, the same gradient clipping, AdamW, detach) on windows the Rust loader prepared
  in memory beforehand, in the transport the trainer would use (dense on CPU, ids on CUDA):
  the step alone;
- ``trainer``: the trainer's real window, trained by the trainer's loop
  (`atom_train.trainer.loop.WindowLoop`, one window per `next` of `windows`, timed here) on
  the trainer's plan of this configuration (`loop.scratch_plan` of `run_config`: a new run
  with no run folder, no checkpoints, validation or logs), so its backend choice and the
  Triton self-check, model, state, masks and window cuts are the trainer's: the Rust loader
  feeding the step through the prefetch thread (`WindowPrefetcher`, pinned buffers on CUDA,
  masks drawn ahead), so the difference from ``isolated`` is what the loader and the
  hand-off cost; reported with the loader thread's own share of the time (``loader_share``:
  filling windows, drawing masks, taking its state; near 1 the loader limits the step) and,
  apart, the share the step waited in ``get()`` (``step_wait_share``: on CUDA mostly the
  GPU's time, since a buffer is refilled only once the GPU is done with it); with the noise
  probe on, its two warm-up windows measure too (so the probe's memory is in the peak),
  then the windows the trainer measures;
- ``legacy``: the single-stream reference trained tick by tick (the baseline batching is measured against);
- ``eval``: the same model scored without gradients at the same B and K
  (`atom_train.model.scoring.score_text`: the trainer's validation and `python -m atom_train.eval`,
  its loader included), a dozen windows per call: the forward alone, against ``isolated``.

Every mode warms up, then measures repeated intervals (`atom_train.common.measure.measure`) and
reports min / median / max bytes/s, how long it measured and whether the spread is wide.

The other modes and measurements build the trainer's objects themselves (`_setup`: the
backend as the plan chooses it, `backend_of`, then model, runtime, optimizer and step).
With ``ceiling`` (the bench sets it for the isolated step on a CPU) the result also has this
machine's GEMM ceiling for the step (`gemm_ceiling`); `--split` (`window_split`) times the
parts of a window instead: the field loop forward and backward, the byte CE, the optimizer
and the rest, on the thread's CPU clock.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch

from atom_train.common.cli import (
    CORPUS_HELP,
    ArgumentParser,
    UserError,
    add_shared,
    say,
    set_command,
    user_error_exit,
)
from atom_train.common.measure import device_memory_mb, device_peak_mb, measure, peak_rss_mb
from atom_train.data.loader import BatchedByteStream, ByteCorpus
from atom_train.data.synthetic import write_synthetic_corpus
from atom_train.model.backend import Backend, choose_backend
from atom_train.model.batched import BatchedByteTick
from atom_train.model.config import ModelConfig
from atom_train.model.reference import ReferenceModel, draw_masks
from atom_train.trainer.loop import LoopHooks, WindowLoop, scratch_plan
from atom_train.trainer.prefetch import Window
from atom_train.trainer.run_config import RunConfig
from atom_train.trainer.step import NoiseProbe, WindowStep, make_optimizer
from atom_train.trainer.text_sources import check_held_out, open_built_corpus

MODES = ("isolated", "trainer", "legacy", "eval")
DEFAULTS: dict[str, Any] = {
    "mode": "isolated",
    "B": 128,
    "K": 64,
    "threads": 1,
    "loader_threads": 1,
    "n_modes": 32,
    "seconds": 10.0,
    "recurrence": "auto",
    "transport": "auto",
    "device": "cpu",
    "grad_clip": 1.0,
    "lr": 2e-3,
    "corpus_mb": 8,
    "intervals": 5,
    "ceiling": False,
    "noise_scale_every": 0,
}


@dataclass
class _Setup:
    backend: Backend
    config: ModelConfig
    step: WindowStep

    @property
    def device(self) -> torch.device:
        return self.backend.device

    @property
    def recurrence(self) -> str:
        return self.backend.recurrence

    @property
    def transport(self) -> str:
        return self.backend.transport


def backend_of(cfg: dict[str, Any], config: ModelConfig) -> Backend:
    """The configuration's backend, chosen as the trainer's plan chooses it for a run of this
    model at B streams (`model.backend.choose_backend`): the Triton fit check, and an
    ``auto`` that chose Triton proven first (with the noise probe's half batch, as the
    trainer's); said on stderr."""
    B = cfg["B"]
    noise = (cfg.get("noise_scale_every") or 0) > 0 and B >= 2
    return choose_backend(
        cfg["device"], cfg["recurrence"], config=config, B=B, transport=cfg["transport"],
        also=(B // 2,) if noise else (),
    )  # fmt: skip


def _setup(cfg: dict[str, Any]) -> _Setup:
    """The trainer's objects for one configuration: backend, model, runtime, optimizer, step."""
    config = model_config(cfg)
    backend = backend_of(cfg, config)
    dev = backend.device
    torch.manual_seed(0)
    model = ReferenceModel(config).to(dev)
    runtime = BatchedByteTick(model, cfg["B"], device=dev, recurrence=backend.recurrence)
    opt = make_optimizer(model, cfg["lr"], 0.01)
    every = cfg.get("noise_scale_every") or 0
    probe = NoiseProbe(runtime, cfg["B"]) if every > 0 and cfg["B"] >= 2 else None
    step = WindowStep(runtime, opt, cfg["grad_clip"], probe=probe)
    return _Setup(backend, config, step)


def model_config(cfg: dict[str, Any]) -> ModelConfig:
    """The configuration's model: a whole config (``model_config``, a dict: the pre-flight
    measures the planned run's model), or the default one with ``n_modes``."""
    if cfg.get("model_config"):
        return ModelConfig.from_dict(cfg["model_config"])
    return ModelConfig(n_modes=cfg["n_modes"])


def _sync(dev: torch.device):
    return (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None


def measure_step(config: dict[str, Any]) -> dict[str, Any]:
    """Time one configuration (keys: DEFAULTS); returns the measurement and the config."""
    cfg = {**DEFAULTS, **config}
    if cfg["mode"] not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {cfg['mode']!r}")
    torch.set_num_threads(cfg["threads"])
    with tempfile.TemporaryDirectory(prefix="atom-bench-step-") as tmp:
        data = cfg.get("data") or [os.path.join(tmp, "corpus.txt")]
        data = [data] if isinstance(data, str) else list(data)
        if not cfg.get("data"):
            write_synthetic_corpus(data[0], cfg["corpus_mb"] << 20)
        if cfg["mode"] == "trainer":
            result = _trainer(cfg, data)
        else:
            modes = {"legacy": _legacy, "eval": _eval, "isolated": _batched}
            result = modes[cfg["mode"]](cfg, ByteCorpus(data))
    result.update(peak_rss_mb=peak_rss_mb())
    return {**cfg, **result}


def _batched(cfg: dict[str, Any], corpus: ByteCorpus) -> dict[str, Any]:
    """The isolated step: the trainer's `WindowStep` on four windows prepared beforehand."""
    su = _setup(cfg)
    dev, config, transport = su.device, su.config, su.transport
    B, K = cfg["B"], cfg["K"]
    stream = BatchedByteStream(corpus, B, threads=cfg["loader_threads"])
    gen = torch.Generator().manual_seed(0)
    p = config.last_atom_dropout
    lr = cfg["lr"]
    tick = 0
    info: dict[str, Any] = {
        "recurrence": su.recurrence,
        "recurrence_reason": su.backend.recurrence_reason,
        "transport": transport,
    }
    # With the noise probe (--noise-scale-every N): the two warm-up windows measure the noise
    # (their memory is then in the peak), and every N-th after them, as the trainer's rate.
    every, calls, window_step = cfg.get("noise_scale_every") or 0, [0, 0], su.step

    def step(*args) -> None:
        calls[0] += 1
        measure = window_step.probe is not None and (calls[0] <= 2 or calls[0] % every == 0)
        calls[1] += measure
        window_step(*args, measure=measure)

    windows = []
    for _ in range(4):  # distinct windows, prepared (and copied to the device) up front
        if transport == "ids":
            _, feats, tgt = stream.next_window_ids(K)
        else:
            _, feats, tgt = stream.next_window(K)
        masks = draw_masks(torch.empty(K, B), p, gen)
        feats, tgt = (torch.from_numpy(x.copy()).to(dev) for x in (feats, tgt))
        windows.append((feats, tgt, masks.to(dev)))

    def work() -> int:
        nonlocal tick
        feats, tgt, masks = windows[(tick // K) % len(windows)]
        step(feats, tgt, tick, masks, lr)
        tick += K
        return K * B

    result = measure(
        work, cfg["seconds"], warmup_calls=2, intervals=cfg["intervals"], sync=_sync(dev)
    )
    if cfg["ceiling"] and dev.type == "cpu":
        info.update(gemm_ceiling(cfg, windows[0]))
    info["noise_windows"] = calls[1]  # (windows that measured the noise scale)
    return {**result, **info, **_peak_memory(dev)}


def _peak_memory(dev: torch.device) -> dict[str, Any]:
    out: dict[str, Any] = {"peak_device_mb": device_peak_mb(dev)}
    memory = device_memory_mb(dev)
    if memory is not None:
        out["peak_device_reserved_mb"] = memory["peak_reserved"]
        out["device_outside_allocator_mb"] = memory["outside_allocator"]
    return out


def run_config(cfg: dict[str, Any], data: list[str]) -> RunConfig:
    """The trainer's config of a configuration (keys: DEFAULTS) training on `data`: its B,
    K, rate, clipping, model, device, loop, transport, threads and noise-scale period, the
    trainer's defaults for the rest, and no checkpoints, validation or logs (windows cut at
    K and at episode ends only). Any text is timed, as before (``allow_binary``: the
    trainer's text checks refuse a corpus to train on, not a measurement)."""
    return RunConfig(model=model_config(cfg)).replace(
        data=list(data), allow_binary=True, B=cfg["B"], bptt=cfg["K"], lr=cfg["lr"],
        grad_clip=cfg["grad_clip"], device=cfg["device"], recurrence=cfg["recurrence"],
        transport=cfg["transport"], threads=cfg["threads"],
        loader_threads=cfg["loader_threads"],
        noise_scale_every=cfg.get("noise_scale_every") or 0,
        ckpt_every=0, snapshot_every=0, val_every=0, log_every=0, sample_every=0,
    )  # fmt: skip


def _say_but_the_length(message: str) -> None:
    """The plan's warnings on stderr, but the one about the run's length: the bench's last
    tick is a bound it never reaches, not a run that would memorise the corpus."""
    if "it will memorise it" not in message:
        say(message)


class _WarmedProbeLoop(WindowLoop):
    """The trainer's loop, whose first two windows also measure the noise scale when the
    probe is on (so its memory is in the peak however rare the trainer's measurements)."""

    def measures(self, w: Window) -> bool:
        warm = self.step.probe is not None and self.state.counters.step < 2
        return warm or super().measures(w)


class _Timed(LoopHooks):
    """The trainer mode's hooks: the loader thread's busy time and the step's wait in
    `get()` of each window, and the windows that measured the noise."""

    def __init__(self) -> None:
        self.busy = self.waited = 0.0
        self.noise_windows = 0

    def train_window(self, w: Window, lr: float):
        self.noise_windows += self.loop.measures(w)
        return super().train_window(w, lr)

    def after_window(self, w: Window, lr: float, stats) -> object:
        self.busy += w.loader_busy_s
        self.waited += w.waited_s
        return None


def _trainer(cfg: dict[str, Any], data: list[str]) -> dict[str, Any]:
    """The trainer's window, by the trainer's loop (`trainer.loop.WindowLoop`) on the
    trainer's plan of this configuration (`scratch_plan`: its backend choice and
    self-check, model, state, step, masks and prefetcher), each `next` window timed."""
    plan = scratch_plan(run_config(cfg, data), total_ticks=1 << 40, warn=_say_but_the_length)
    loop = _WarmedProbeLoop(plan)
    hooks = _Timed()
    windows = loop.windows(hooks)

    def work() -> int:
        return next(windows).K * plan.B

    try:
        for _ in range(2):
            work()
        hooks.busy = hooks.waited = 0.0
        t0 = time.perf_counter()
        result = measure(
            work, cfg["seconds"], warmup_calls=0, intervals=cfg["intervals"],
            sync=_sync(plan.device),
        )  # fmt: skip
        wall = max(time.perf_counter() - t0, 1e-9)
    finally:
        windows.close()  # (the prefetcher)
        loop.close()
    return {
        **result,
        "recurrence": plan.recurrence,
        "recurrence_reason": plan.recurrence_reason,
        "transport": plan.transport,
        "loader_share": hooks.busy / wall,
        "step_wait_share": hooks.waited / wall,
        "noise_windows": hooks.noise_windows,  # (windows that measured the noise scale)
        **_peak_memory(plan.device),
    }


def _legacy(cfg: dict[str, Any], corpus: ByteCorpus) -> dict[str, Any]:
    """The single-stream reference, tick by tick (the unbatched trainer), on the CPU."""
    torch.manual_seed(0)
    config = ModelConfig(n_modes=cfg["n_modes"])
    model = ReferenceModel(config)
    opt = make_optimizer(model, cfg["lr"], 0.01)
    stream = BatchedByteStream(corpus, 1, threads=1)
    K = cfg["K"]
    gen = torch.Generator().manual_seed(0)
    state = model.new_state()
    windows = []
    for _ in range(4):
        _, feats, tgt = stream.next_window(K)
        windows.append((torch.from_numpy(feats[:, 0].copy()), torch.from_numpy(tgt[:, 0].copy())))
    tick = 0

    def work() -> int:
        nonlocal tick
        feats, tgt = windows[(tick // K) % len(windows)]
        out = model.reference_window(state, feats, tgt, tick, generator=gen)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        if cfg["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        state.detach()
        tick += K
        return K

    result = measure(work, cfg["seconds"], warmup_calls=1, intervals=cfg["intervals"])
    return {**result, "B": 1, "recurrence": None, "transport": "dense"}


def _eval(cfg: dict[str, Any], corpus: ByteCorpus) -> dict[str, Any]:
    """Scoring: `score_text` on the first 12 windows of the corpus, from fresh state each
    call, as eval scores a text (the stream and runtime made per call, one host read)."""
    from atom_train.model.scoring import score_text

    # (As eval chooses: one device and loop, no fit check, no self-check.)
    backend = choose_backend(cfg["device"], cfg["recurrence"], warn=None, prove=False)
    dev, recurrence = backend.device, backend.recurrence
    torch.manual_seed(0)
    model = ReferenceModel(ModelConfig(n_modes=cfg["n_modes"])).to(dev)
    B, K = cfg["B"], cfg["K"]

    def work() -> int:
        score = score_text(
            model, corpus, streams=B, n_bytes=12 * K * B, K=K, device=dev, recurrence=recurrence
        )
        return score.bytes_scored

    result = measure(
        work, cfg["seconds"], warmup_calls=1, intervals=cfg["intervals"], sync=_sync(dev)
    )
    return {
        **result,
        "recurrence": recurrence,
        "transport": "dense",
        "peak_device_mb": device_peak_mb(dev),
    }


def gemm_ceiling(cfg: dict[str, Any], window) -> dict[str, float]:
    """The step's GEMM ceiling on this machine, in bytes per CPU-second: what the step would
    reach if all its work were matmuls at the rate of a large float32 GEMM on one thread.

    ``flops_per_byte``: the matmul FLOPs of one training window (forward, backward, the
    optimizer step) counted by torch's FlopCounterMode with the fused loop, i.e. the model's
    products as written, without a recomputing loop's extra forward; ``gemm_gflops``: one
    thread's best rate on a [4096, 512] x [512, 512] float32 product, on its CPU clock."""
    from torch.utils.flop_counter import FlopCounterMode

    su = _setup({**cfg, "recurrence": "fused", "device": "cpu"})
    feats, tgt, masks = window
    K, B = tgt.shape
    su.step(feats, tgt, 0, masks, cfg["lr"])  # the optimizer makes its state on its first step
    with FlopCounterMode(display=False) as counter:
        su.step(feats, tgt, K, masks, cfg["lr"])
    flops_per_byte = counter.get_total_flops() / (K * B)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(4096, 512), torch.randn(512, 512)
        c = torch.empty(4096, 512)
        best = float("inf")
        for i in range(8):  # on the thread's CPU clock: a busy machine's waits do not count
            t0 = time.thread_time()
            torch.mm(a, b, out=c)
            if i:  # the first one warms up
                best = min(best, time.thread_time() - t0)
    finally:
        torch.set_num_threads(threads)
    gflops = 2 * 4096 * 512 * 512 / best / 1e9
    return {
        "flops_per_byte": flops_per_byte,
        "gemm_gflops": gflops,
        "ceiling_bytes_per_cpu_s": gflops * 1e9 / flops_per_byte,
    }


@contextlib.contextmanager
def _cpu_timed(cls, names: tuple[str, ...], into: dict[str, float], label: str):
    """Within: each call of `cls`'s static methods `names` adds its thread CPU time (ms) to
    `into[label + " " + name]` (the class is put back on the way out)."""
    saved = {n: cls.__dict__[n] for n in names}

    def timed(fn, key):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                into[key] = into.get(key, 0.0) + (time.thread_time() - t0) * 1e3

        return staticmethod(wrapper)

    try:
        for n in names:
            setattr(cls, n, timed(saved[n].__func__, f"{label} {n}"))
        yield
    finally:
        for n, fn in saved.items():
            setattr(cls, n, fn)


def _synthetic_windows(
    B: int,
    K: int,
    n: int,
    dropout: float,
    transport: str = "dense",
    device: torch.device | str = "cpu",
) -> list[list[torch.Tensor]]:
    """`n` consecutive windows of synthetic text for B streams, each [feats, tgt, last-atom
    masks] on `device` (feature ids with the "ids" transport): what the window-level
    measurements (`window_split`, `count_window_ops`) feed the step. The same windows at
    every call: a seeded corpus and mask generator."""
    with tempfile.TemporaryDirectory(prefix="atom-windows-") as tmp:
        path = os.path.join(tmp, "corpus.txt")
        write_synthetic_corpus(path, max(1 << 16, 4 * B * K))
        stream = BatchedByteStream(ByteCorpus(path), B, threads=1)
        gen = torch.Generator().manual_seed(0)
        out = []
        for _ in range(n):
            _, feats, tgt = (
                stream.next_window_ids(K) if transport == "ids" else stream.next_window(K)
            )
            masks = draw_masks(torch.empty(K, B), dropout, gen)
            out.append(
                [torch.from_numpy(x.copy()).to(device) for x in (feats, tgt)] + [masks.to(device)]
            )
        return out


def window_split(config: dict[str, Any], windows: int = 6) -> dict[str, Any]:
    """Where a training window's CPU time goes, in ms per window: the field loop's forward
    and backward, the byte CE (its forward computes its gradients too), the optimizer step,
    and the rest (input layers, readout, atoms, autograd, clipping, Python), measured with
    the thread's CPU clock around each (robust to a busy machine, unlike wall-clock
    profiles) over `windows` windows after two warm-up ones. One thread: the parts' clocks
    would miss the pool's other threads."""
    from atom_train.model import byte_ce, field_loops, field_native

    cfg = {**DEFAULTS, **config, "threads": 1}
    torch.set_num_threads(1)
    su = _setup(cfg)
    loop = {
        "native": field_native.NativeFieldLoop,
        "fused": field_loops.FusedFieldLoop,
        "compiled": field_loops.CompiledFieldLoop,
    }.get(su.recurrence)
    if loop is None:
        raise ValueError(f"window_split times the CPU loops, not {su.recurrence!r}")
    B, K = cfg["B"], cfg["K"]
    data = _synthetic_windows(B, K, windows + 2, su.config.last_atom_dropout)
    for i in range(2):
        su.step(*data[i][:2], i * K, data[i][2], cfg["lr"])
    parts: dict[str, float] = {}
    opt = su.step.optimizer
    step_fn = opt.step

    def timed_step(*args, **kwargs):
        t0 = time.thread_time()
        try:
            return step_fn(*args, **kwargs)
        finally:
            parts["optimizer step"] = (
                parts.get("optimizer step", 0.0) + (time.thread_time() - t0) * 1e3
            )

    with (
        _cpu_timed(loop, ("forward", "backward"), parts, "field loop"),
        _cpu_timed(byte_ce.ByteCE, ("forward", "backward"), parts, "byte CE"),
    ):
        opt.step = timed_step
        try:
            cpu0 = time.thread_time()
            for i in range(2, windows + 2):
                su.step(*data[i][:2], i * K, data[i][2], cfg["lr"])
            total = (time.thread_time() - cpu0) * 1e3
        finally:
            del opt.step
    parts = {k: v / windows for k, v in parts.items()}
    parts["rest"] = total / windows - sum(parts.values())
    return {
        "recurrence": su.recurrence,
        "B": B,
        "K": K,
        "threads": 1,
        "window_cpu_ms": total / windows,
        "parts_ms": dict(sorted(parts.items(), key=lambda kv: -kv[1])),
    }


def count_window_ops(config: dict[str, Any]) -> dict[str, int]:
    """Operators one training window dispatches, counted with torch.profiler after one
    warm-up window: ``aten`` = top-level aten operators (those not called from inside
    another aten operator, so each is one dispatch from Python), ``triton`` = Triton kernel
    launches."""
    from torch.profiler import ProfilerActivity, profile

    from atom_train.model.byte_ce import CHUNK_ROWS

    cfg = {**DEFAULTS, **config}
    torch.set_num_threads(cfg["threads"])
    su = _setup(cfg)
    dev, step, transport = su.device, su.step, su.transport
    if cfg.get("as_on") == "cuda":
        # Count on a CPU what the CUDA path dispatches: its byte-CE chunking (one chunk for
        # this window) and its transport (feature ids); the rest does not depend on the device.
        step.runtime.ce_chunk_rows = CHUNK_ROWS["cuda"]
        transport = "ids"
    B, K = cfg["B"], cfg["K"]
    # a warm-up window, then the counted one
    windows = _synthetic_windows(B, K, 2, su.config.last_atom_dropout, transport, dev)
    # One window first: the optimizer makes its state on its first step.
    step(*windows[0][:2], 0, windows[0][2], cfg["lr"])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(*windows[1][:2], K, windows[1][2], cfg["lr"])
    aten = triton = 0
    for e in prof.events():
        parent = e.cpu_parent
        nested = False
        while parent is not None:  # inside another aten op, or inside a Triton launch
            if parent.name.startswith("aten::") or parent.name.startswith("triton:"):
                nested = True
                break
            parent = parent.cpu_parent
        if e.name.startswith("triton:"):
            triton += 1
        elif e.name.startswith("aten::") and not nested:
            aten += 1
    return {
        "aten": aten,
        "triton": triton,
        "recurrence": su.recurrence,
        "B": B,
        "K": K,
        "transport": transport,
        "as_on": cfg.get("as_on"),
    }


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(
        prog="python -m atom_train.bench.step",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    ap.add_argument("--mode", choices=MODES, default=DEFAULTS["mode"], help="what to time")
    add_shared(ap, "B", type=int, default=DEFAULTS["B"], help="streams")
    add_shared(
        ap, "bptt", type=int, default=DEFAULTS["K"], metavar="K", help="BPTT window in ticks"
    )
    add_shared(ap, "threads", type=int, default=DEFAULTS["threads"], help="torch threads")
    add_shared(ap, "loader_threads", type=int, default=DEFAULTS["loader_threads"])
    add_shared(ap, "n_modes", type=int, default=DEFAULTS["n_modes"], help="field modes n")
    add_shared(ap, "seconds", type=float, default=DEFAULTS["seconds"], help="measured (wall)")
    add_shared(ap, "recurrence", default=DEFAULTS["recurrence"], help="field loop (or auto)")
    add_shared(ap, "transport", choices=("auto", "dense", "ids"), default="auto")
    add_shared(ap, "device", default=DEFAULTS["device"], help="cpu or cuda")
    ap.add_argument(
        "--model-config",
        type=json.loads,
        default=None,
        metavar="JSON",
        help="the whole model config as JSON (default: the default model with --n-modes)",
    )
    add_shared(
        ap,
        "data",
        action="append",
        default=None,
        metavar="FILE",
        help="text to read (repeatable; default: a synthetic corpus of 8 MB)",
    )
    add_shared(ap, "corpus", metavar="DIR", help=f"{CORPUS_HELP}: its train shards")
    ap.add_argument(
        "--noise-scale-every",
        type=int,
        default=0,
        metavar="N",
        help="the trainer's noise-scale probe on: its half batch on the warm-up windows (in "
        "the peak memory) and on every N-th window after (0: off)",
    )
    ap.add_argument("--count-ops", action="store_true", help="count operators of one window")
    ap.add_argument("--split", action="store_true", help="where a window's CPU time goes")
    ap.add_argument(
        "--as-on", choices=("cuda",), default=None, help="count what the CUDA path dispatches"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    set_command("bench.step")
    try:
        args = build_parser().parse_args(argv)
        if args.corpus:
            args.data = [*(args.data or []), *map(str, open_built_corpus(args.corpus).train)]
        elif args.data:
            check_held_out(args.data, "--data")
    except UserError as e:
        return user_error_exit(e)
    exclude = ("count_ops", "split", "bptt", "corpus")
    config = {k: v for k, v in vars(args).items() if k not in exclude}
    config["K"] = args.bptt  # (a configuration names the window K, as bench's JSON does)
    try:
        if args.count_ops:
            result = count_window_ops(config)
        elif args.split:
            result = window_split(config)
        else:
            result = measure_step(config)
    except UserError as e:  # (the trainer mode's plan refuses what the trainer refuses)
        return user_error_exit(e)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
