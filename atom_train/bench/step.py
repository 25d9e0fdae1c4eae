"""Training-step throughput of one configuration, measured the way the trainer runs it.

`measure_step(config)` times one configuration in this process; `python -m atom_train.bench
step` runs one subprocess per configuration and calls it. By hand:

    python -m atom_train.bench.step --mode isolated -B 128 -K 64 --threads 1 --seconds 20
    python -m atom_train.bench.step --mode trainer -B 128 -K 64 --threads 2 --seconds 300
    python -m atom_train.bench.step --mode legacy -K 64 --seconds 20

Modes:

- ``isolated``: the trainer's own window step (`atom_train.trainer.step.WindowStep`: forward,
  backward, the same gradient clipping, AdamW, detach) on windows the Rust loader prepared
  in memory beforehand, in the transport the trainer would use (dense on CPU, ids on CUDA):
  the step alone;
- ``trainer``: the trainer's real window: the Rust loader feeding the step through the
  prefetch thread (`WindowPrefetcher`, pinned buffers on CUDA, masks drawn ahead), so the
  difference from ``isolated`` is what the loader and the hand-off cost; reported with the
  loader thread's own share of the time (``loader_share``: filling windows, drawing masks,
  taking its state; near 1 the loader limits the step) and, apart, the share the step
  waited in ``get()`` (``step_wait_share``: on CUDA mostly the GPU's time, since a buffer
  is refilled only once the GPU is done with it);
- ``legacy``: the single-stream reference trained tick by tick (the baseline batching is measured against);
- ``eval``: the same model scored without gradients at the same B and K
  (`atom_train.model.scoring.score_text`: the trainer's validation and `python -m atom_train.eval`,
  its loader included), a dozen windows per call: the forward alone, against ``isolated``.

Every mode warms up, then measures repeated intervals (`atom_train.common.measure.measure`) and
reports min / median / max bytes/s, how long it measured and whether the spread is wide.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch

from atom_train.common.measure import device_memory_mb, device_peak_mb, measure, peak_rss_mb
from atom_train.data.loader import BatchedByteStream, ByteCorpus
from atom_train.data.synthetic import write_synthetic_corpus
from atom_train.model.batched import BatchedByteTick
from atom_train.model.config import ModelConfig
from atom_train.model.lockstep import WindowSchedule
from atom_train.model.network import AtomNativeModel, draw_masks
from atom_train.trainer.plan import resolve_recurrence
from atom_train.trainer.prefetch import MaskDrawer, WindowPrefetcher
from atom_train.trainer.step import WindowStep, make_optimizer

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
}


@dataclass
class _Setup:
    device: torch.device
    config: ModelConfig
    step: WindowStep
    recurrence: str
    transport: str


def _setup(cfg: dict[str, Any]) -> _Setup:
    """The trainer's objects for one configuration: model, runtime, optimizer, step."""
    dev = torch.device(cfg["device"])
    torch.manual_seed(0)
    config = model_config(cfg)
    model = AtomNativeModel(config).to(dev)
    recurrence = resolve_recurrence(cfg["recurrence"], dev)
    runtime = BatchedByteTick(model, cfg["B"], device=dev, recurrence=recurrence)
    opt = make_optimizer(model, cfg["lr"], 0.01)
    step = WindowStep(runtime, opt, cfg["grad_clip"])
    transport = cfg["transport"]
    if transport == "auto":
        transport = "ids" if dev.type == "cuda" else "dense"
    return _Setup(dev, config, step, recurrence, transport)


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
        corpus_path = cfg.get("data") or os.path.join(tmp, "corpus.txt")
        if not cfg.get("data"):
            write_synthetic_corpus(corpus_path, cfg["corpus_mb"] << 20)
        corpus = ByteCorpus(corpus_path)
        result = {"legacy": _legacy, "eval": _eval}.get(cfg["mode"], _batched)(cfg, corpus)
    result.update(peak_rss_mb=peak_rss_mb())
    return {**cfg, **result}


def _batched(cfg: dict[str, Any], corpus: ByteCorpus) -> dict[str, Any]:
    su = _setup(cfg)
    dev, config, step, transport = su.device, su.config, su.step, su.transport
    B, K = cfg["B"], cfg["K"]
    stream = BatchedByteStream(corpus, B, threads=cfg["loader_threads"])
    gen = torch.Generator().manual_seed(0)
    p = config.last_atom_dropout
    lr = cfg["lr"]
    tick = 0
    info: dict[str, Any] = {"recurrence": su.recurrence, "transport": transport}
    if cfg["mode"] == "isolated":
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
    else:
        # The trainer's schedule: cuts at K and at episode ends, far beyond what is measured.
        sched = WindowSchedule(K, config.episode_length, total=1 << 40)
        pf = WindowPrefetcher(
            stream,
            0,
            sched.total,
            sched.cut,
            max_K=K,
            device=dev,
            compact=transport == "ids",
            masks=MaskDrawer(gen, p, B, 0, B),
        )
        busy, waited = [0.0], [0.0]

        def work() -> int:
            w = pf.get()
            busy[0] += w.loader_busy_s
            waited[0] += w.waited_s
            step(w.feats, w.tgt, w.tick0, w.masks, lr)
            pf.release(w)
            return w.K * B

        try:
            for _ in range(2):
                work()
            busy[0] = waited[0] = 0.0
            t0 = time.perf_counter()
            result = measure(
                work, cfg["seconds"], warmup_calls=0, intervals=cfg["intervals"], sync=_sync(dev)
            )
            wall = max(time.perf_counter() - t0, 1e-9)
            info["loader_share"] = busy[0] / wall
            info["step_wait_share"] = waited[0] / wall
        finally:
            pf.close()
    info["peak_device_mb"] = device_peak_mb(dev)
    memory = device_memory_mb(dev)
    if memory is not None:
        info["peak_device_reserved_mb"] = memory["peak_reserved"]
        info["device_outside_allocator_mb"] = memory["outside_allocator"]
    return {**result, **info}


def _legacy(cfg: dict[str, Any], corpus: ByteCorpus) -> dict[str, Any]:
    """The single-stream reference, tick by tick (the unbatched trainer), on the CPU."""
    torch.manual_seed(0)
    config = ModelConfig(n_modes=cfg["n_modes"])
    model = AtomNativeModel(config)
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

    dev = torch.device(cfg["device"])
    torch.manual_seed(0)
    model = AtomNativeModel(ModelConfig(n_modes=cfg["n_modes"])).to(dev)
    recurrence = resolve_recurrence(cfg["recurrence"], dev)
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
    with tempfile.TemporaryDirectory(prefix="atom-ops-") as tmp:
        path = os.path.join(tmp, "corpus.txt")
        write_synthetic_corpus(path, max(1 << 16, 4 * B * K))
        stream = BatchedByteStream(ByteCorpus(path), B, threads=1)
        gen = torch.Generator().manual_seed(0)
        windows = []
        for _ in range(2):  # a warm-up window, then the counted one
            _, feats, tgt = (
                stream.next_window_ids(K) if transport == "ids" else stream.next_window(K)
            )
            masks = draw_masks(torch.empty(K, B), su.config.last_atom_dropout, gen)
            windows.append(
                [torch.from_numpy(x.copy()).to(dev) for x in (feats, tgt)] + [masks.to(dev)]
            )
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
    ap = argparse.ArgumentParser(
        prog="python -m atom_train.bench.step",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    ap.add_argument("--mode", choices=MODES, default=DEFAULTS["mode"], help="what to time")
    ap.add_argument("-B", type=int, default=DEFAULTS["B"], help="streams")
    ap.add_argument("-K", type=int, default=DEFAULTS["K"], help="BPTT window length in ticks")
    ap.add_argument("--threads", type=int, default=DEFAULTS["threads"], help="torch threads")
    ap.add_argument("--loader-threads", type=int, default=DEFAULTS["loader_threads"])
    ap.add_argument("--n-modes", type=int, default=DEFAULTS["n_modes"], help="field modes n")
    ap.add_argument("--seconds", type=float, default=DEFAULTS["seconds"], help="measured (wall)")
    ap.add_argument("--recurrence", default=DEFAULTS["recurrence"], help="field loop (or auto)")
    ap.add_argument("--transport", choices=("auto", "dense", "ids"), default="auto")
    ap.add_argument("--device", default=DEFAULTS["device"], help="cpu or cuda")
    ap.add_argument(
        "--model-config",
        type=json.loads,
        default=None,
        metavar="JSON",
        help="the whole model config as JSON (default: the default model with --n-modes)",
    )
    ap.add_argument(
        "--data",
        action="append",
        default=None,
        metavar="FILE",
        help="text to read (repeatable; default: a synthetic corpus of 8 MB)",
    )
    ap.add_argument("--count-ops", action="store_true", help="count operators of one window")
    ap.add_argument(
        "--as-on", choices=("cuda",), default=None, help="count what the CUDA path dispatches"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = {k: v for k, v in vars(args).items() if k != "count_ops"}
    result = count_window_ops(config) if args.count_ops else measure_step(config)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
