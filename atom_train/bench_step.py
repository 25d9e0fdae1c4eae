"""Full training step throughput: forward, backward and AdamW, per byte.

`measure_step` times one configuration in this process; `python -m atom_train.bench` runs
one subprocess per configuration and calls it. Run one configuration by hand with:

    python -m atom_train.bench_step --mode batched -B 128 -K 64 --threads 1 --seconds 20
    python -m atom_train.bench_step --mode reference -K 64 --threads 1 --seconds 20

Modes: "batched" (BatchedByteTick, B streams; add --recurrence autograd for the plain-autograd
loop) and "reference" (the single-stream reference trained tick by tick, B ignored: the
baseline). Features come from the Python Atomizer on a synthetic French-like text, prepared
before timing (the loader is not part of this measurement).
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np
import torch

from atom_train.atomizer import Atomizer
from atom_train.batched import BatchedByteTick
from atom_train.bench import peak_rss_mb
from atom_train.model import AtomNativeModel, ModelConfig

_WORDS = [
    "le",
    "la",
    "les",
    "un",
    "une",
    "des",
    "et",
    "est",
    "dans",
    "pour",
    "que",
    "qui",
    "sur",
    "avec",
    "pas",
    "plus",
    "son",
    "sa",
    "ses",
    "au",
    "aux",
    "chat",
    "maison",
    "temps",
    "jour",
    "monde",
    "vie",
    "homme",
    "femme",
    "enfant",
    "main",
    "pays",
    "ville",
    "travail",
    "année",
    "été",
    "être",
    "avoir",
    "faire",
    "dire",
    "aller",
    "voir",
    "savoir",
    "pouvoir",
    "vouloir",
    "venir",
    "prendre",
    "très",
    "bien",
    "où",
    "déjà",
    "après",
    "même",
    "français",
    "élève",
    "côté",
    "fenêtre",
]


def synthetic_text(n_bytes: int, seed: int = 0) -> bytes:
    """Deterministic French-looking text (words, punctuation, capitals, accents, newlines)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    sentence_start = True
    while size < n_bytes:
        w = rng.choice(_WORDS)
        if sentence_start:
            w = w[:1].upper() + w[1:]
        sentence_start = False
        r = rng.random()
        if r < 0.08:
            w += ". " if rng.random() < 0.8 else ".\n"
            sentence_start = True
        elif r < 0.14:
            w += ", "
        else:
            w += " "
        out.append(w)
        size += len(w.encode())
    return "".join(out).encode()[:n_bytes]


def _windows(config: ModelConfig, B: int, K: int, n_windows: int, seed: int = 0):
    """n_windows distinct (feats [K,B,320], tgt [K,B]) windows, B streams at spread offsets."""
    text = synthetic_text(max(16384, 4 * K * n_windows + 1), seed)
    feats = Atomizer(config.pack_mode).encode_bytes(text)
    data = np.frombuffer(text, dtype=np.uint8)
    span = len(text) - K * n_windows - 1
    offsets = (np.arange(B) * 7919) % span
    out = []
    for w in range(n_windows):
        idx = offsets[None, :] + w * K + np.arange(K)[:, None]  # [K,B]
        out.append((torch.from_numpy(feats[idx]), torch.from_numpy(data[idx + 1].astype(np.int64))))
    return out


def measure_step(
    mode: str,
    B: int,
    K: int,
    threads: int,
    n_modes: int = 32,
    seconds: float = 10.0,
    recurrence: str = "fused",
    warmup_windows: int = 2,
    compile: bool = False,
    device: str = "cpu",
) -> dict:
    """Time full training steps (forward, backward, AdamW, detach) for `seconds` after
    `warmup_windows` untimed windows. Returns bytes_per_s (wall), bytes_per_cpu_s (process
    CPU time, all threads), peak_rss_mb, measured_s, ticks, windows and the configuration."""
    if mode not in ("batched", "reference"):
        raise ValueError(f"mode must be 'batched' or 'reference', got {mode!r}")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev = torch.device(device)
    config = ModelConfig(n_modes=n_modes)
    model = AtomNativeModel(config).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    streams = 1 if mode == "reference" else B
    windows = [(f.to(dev), t.to(dev)) for f, t in _windows(config, streams, K, n_windows=4)]

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    gen = torch.Generator().manual_seed(0)
    if mode == "batched":
        runtime = BatchedByteTick(model, B, recurrence=recurrence, compile=compile)
    else:
        state = model.new_state()

    tick = 0

    def step() -> None:
        nonlocal tick
        feats, tgt = windows[(tick // K) % len(windows)]
        if mode == "batched":
            out = runtime.run_window(feats, tgt, tick, generator=gen)
        else:
            out = model.reference_window(state, feats[:, 0], tgt[:, 0], tick, generator=gen)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if mode == "batched":
            runtime.detach_state()
        else:
            state.detach()
        tick += K

    warm0 = time.perf_counter()
    for _ in range(warmup_windows):
        step()
    sync()
    warmup_s = time.perf_counter() - warm0
    n_windows = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while True:
        step()
        n_windows += 1
        wall = time.perf_counter() - wall0
        if wall >= seconds:
            sync()
            wall = time.perf_counter() - wall0
            break
    cpu = time.process_time() - cpu0
    n_bytes = n_windows * K * streams
    return {
        "mode": mode,
        "recurrence": recurrence if mode == "batched" else None,
        "compile": compile if mode == "batched" else None,
        "B": streams,
        "K": K,
        "threads": threads,
        "n_modes": n_modes,
        "windows": n_windows,
        "ticks": n_windows * K,
        "bytes": n_bytes,
        "measured_s": wall,
        "warmup_s": warmup_s,
        "cpu_s": cpu,
        "bytes_per_s": n_bytes / wall,
        "bytes_per_cpu_s": n_bytes / cpu,
        "peak_rss_mb": peak_rss_mb(),
        "device": str(dev),
        "peak_device_mb": (
            torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else None
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--mode", choices=("batched", "reference"), default="batched", help="what to time"
    )
    ap.add_argument("-B", type=int, default=128, help="streams (batched mode)")
    ap.add_argument("-K", type=int, default=64, help="BPTT window length in ticks")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--n-modes", type=int, default=32, help="field modes n")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long to measure (wall)")
    ap.add_argument(
        "--recurrence", choices=("fused", "autograd"), default="fused", help="batched field loop"
    )
    ap.add_argument("--compile", action="store_true", help="torch.compile the field loop")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    args = ap.parse_args(argv)
    result = measure_step(
        args.mode,
        args.B,
        args.K,
        args.threads,
        args.n_modes,
        args.seconds,
        args.recurrence,
        compile=args.compile,
        device=args.device,
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
