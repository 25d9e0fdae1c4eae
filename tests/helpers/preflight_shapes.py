"""What the pre-flight's check tests build their cases from: a run's shape with its numbers
changed where a case says, and progress rows at chosen rates."""

from __future__ import annotations

from atom_train.preflight.checks import RunShape


def shape(**kw) -> RunShape:
    """A run of 1024 streams, 64 ticks a step, 1000 steps over a 1 GB corpus; `kw` replaces
    any of its numbers."""
    base = dict(
        B=1024, K=64, tick=0, total=64_000, steps=1000, corpus_bytes=10**9, ckpt_every=2000,
        snapshot_every=0, val_every=2000, sample_every=0, log_every=200, val=True,
        tensorboard=False, loss_log_rate=2.0,
    )  # fmt: skip
    return RunShape(**{**base, **kw})


def rows(*rates: float, wait: float = 0.0, per_row: int = 1000) -> list[dict]:
    """Progress rows of `per_row` bytes each, at these rates."""
    return [
        {"bytes_per_s": r, "loader_wait_pct": wait, "bytes_seen": per_row * (i + 1)}
        for i, r in enumerate(rates)
    ]
