"""Shared by the trainer's tests: a tiny model's flags, a small corpus, and ways to run the
trainer (in process or as a subprocess) and compare what it wrote."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from atom_train import train
from atom_train.data.synthetic import synthetic_text
from atom_train.trainer.checkpoint_file import load_checkpoint
from helpers import REPO

TINY = [
    "--n-modes", "8", "--jl-dim", "16", "--mlp-hidden", "32", "--atom-dim", "8",
    "--learnable-leak", "--threads", "1", "--loader-threads", "1", "-B", "4", "--bptt", "16",
    "--episode-length", "64", "--log-every", "16", "--val-every", "0",
    # A line per step in loss.jsonl: the tests compare runs step by step (the default
    # rate's aggregates depend on the clock; tests/trainer/test_loss_log.py tests them).
    "--loss-log-rate", "0",
]  # fmt: skip


def make_corpus(d: Path) -> Path:
    """Two shards of synthetic French (12 kB each) and a val.txt, in folder d."""
    for shard in range(2):
        (d / f"train-{shard}.txt").write_bytes(synthetic_text(12_000, seed=shard))
    (d / "val.txt").write_text("Le garçon est à côté de la fenêtre.\n" * 40, encoding="utf-8")
    return d


def args(corpus: Path, out: Path, total: int, *extra: str) -> list[str]:
    return [
        "--data", str(corpus / "train-*.txt"), "--output-dir", str(out),
        "--total-ticks", str(total), *TINY, *extra,
    ]  # fmt: skip


@contextlib.contextmanager
def sigint_stays_pytests():
    """Inside, a trainer run in this process (train.main) installs its handlers for SIGTERM
    and SIGUSR1 but leaves SIGINT to pytest; the three are put back afterwards. The
    trainer's SIGINT (finish the window, checkpoint, exit 0) would turn a Ctrl-C, or
    gpu_check.sh stopping the tests at their bound, into a run that ended early and a test
    that fails on the final checkpoint it lacks: a cut reported as a bug. Left to pytest,
    SIGINT stops the session (KeyboardInterrupt): the tests that finished are reported, the
    one under way is not. (A finished trainer's handlers left in place would also swallow a
    later SIGTERM to pytest.)"""
    kinds = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    saved = {s: signal.getsignal(s) for s in kinds}
    install = train.Signals.install

    def all_but_sigint(self) -> None:
        install(self)
        signal.signal(signal.SIGINT, saved[signal.SIGINT])

    train.Signals.install = all_but_sigint
    try:
        yield
    finally:
        train.Signals.install = install
        for s, handler in saved.items():
            signal.signal(s, handler)


def snapshot_of(folder: Path) -> dict[str, tuple[int, int]]:
    """Each file of `folder` by name: its size and modification time (to show nothing wrote)."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of a run folder (a module's shared run) as `tmp_path`/run, for one test to change."""
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    return out


def run(corpus: Path, out: Path, total: int, *extra: str) -> int:
    """train.main in this process (SIGINT left to pytest: `sigint_stays_pytests`)."""
    with sigint_stays_pytests():
        return train.main(args(corpus, out, total, *extra))


def spawn(corpus: Path, out: Path, total: int, *extra: str, env: dict | None = None):
    cmd = [sys.executable, "-m", "atom_train.train", *args(corpus, out, total, *extra)]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def steps(out: Path) -> list[dict]:
    lines = (out / "loss.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if '"step"' in x and '"event"' not in x]


def last_by_step(out: Path) -> dict[int, float]:
    """Per-step loss; for steps redone after a resume, the last line wins."""
    return {s["step"]: s["loss"] for s in steps(out)}


def assert_same_state(a: Path, b: Path) -> None:
    ca, cb = load_checkpoint(a), load_checkpoint(b)
    assert ca.meta["training"]["tick"] == cb.meta["training"]["tick"]
    assert ca.meta["training"]["step"] == cb.meta["training"]["step"]
    assert ca.meta["loader_state"] == cb.meta["loader_state"]
    keys = {k for k in ca.tensors if not k.startswith("rng/torch_cpu")}
    assert keys == {k for k in cb.tensors if not k.startswith("rng/torch_cpu")}
    for k in sorted(keys):
        assert torch.equal(ca.tensors[k], cb.tensors[k]), k


def wait_for_steps(out: Path, n: int, proc, timeout: float = 60) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if (out / "loss.jsonl").exists() and len(steps(out)) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited early: {proc.communicate()[0]}")
        time.sleep(0.05)
    raise AssertionError("trainer made no progress")


def assert_close_state(a: Path, b: Path, rel: float, floor: float) -> None:
    """Checkpoints a and b hold the same run within float tolerance: the same tick, step and
    loader state, the same tensors, RNG states and integer tensors equal, every float tensor
    within ||a - b|| <= rel ||b|| + floor."""
    ca, cb = load_checkpoint(a), load_checkpoint(b)
    assert ca.meta["training"]["tick"] == cb.meta["training"]["tick"]
    assert ca.meta["training"]["step"] == cb.meta["training"]["step"]
    assert ca.meta["loader_state"] == cb.meta["loader_state"]
    assert set(ca.tensors) == set(cb.tensors)
    for k, tb in cb.tensors.items():
        ta = ca.tensors[k]
        if k.startswith("rng/") or not tb.is_floating_point():
            assert torch.equal(ta, tb), k
            continue
        err = float((ta.double() - tb.double()).norm())
        assert err <= rel * float(tb.double().norm()) + floor, (k, err)
