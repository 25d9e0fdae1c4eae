"""The cost of the trainer's one gradient all-reduce per window, measured.

    torchrun --nproc-per-node 2 scripts/allreduce_cost.py [--device cpu|cuda] [--repeat 200]

Averages a flat float32 buffer of the model's parameter count (the default config's, as
`atom_train.trainer.distributed.World.average_grads` does: one all-reduce, then a division) across
the ranks `--repeat` times after a warm-up, and prints on rank 0 one JSON line: the bytes
each rank sends in, the mean and median seconds per all-reduce, and the backend.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

from atom_train.model.config import ModelConfig
from atom_train.model.reference import ReferenceModel
from atom_train.trainer.distributed import init_world, world_from_env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--repeat", type=int, default=200)
    a = ap.parse_args()
    world = init_world(world_from_env(), a.device, timeout_s=60)
    n = sum(p.numel() for p in ReferenceModel(ModelConfig()).parameters())
    dev = torch.device(a.device, world.local_rank) if a.device == "cuda" else torch.device("cpu")
    flat = torch.randn(n, device=dev)
    times = []
    for i in range(a.repeat + 20):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        dist.all_reduce(flat)
        flat.div_(world.size)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if i >= 20:  # warm-up
            times.append(time.perf_counter() - t0)
    if world.is_main:
        print(
            json.dumps(
                {
                    "world_size": world.size,
                    "backend": world.backend,
                    "params": n,
                    "bytes": 4 * n,
                    "mean_s": statistics.mean(times),
                    "median_s": statistics.median(times),
                    "repeat": a.repeat,
                }
            )
        )
    world.close(clean=True)


if __name__ == "__main__":
    main()
