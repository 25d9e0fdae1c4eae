"""CUDA-only checks (skipped without a GPU; scripts/gpu_check.sh runs them on a GPU box):
the compiled Triton loop against the CPU fused loop; the whole trainer on CUDA (feature ids,
pinned double buffers, the Triton loop); resume and fork on CUDA; a CUDA-trained checkpoint
chatting on the CPU; and the host path a CPU run cannot prove: the trainer's windows never
wait for the GPU (sync debug mode "error"), prefetched windows stay intact while the GPU is
far behind, the step clock holds a bounded number of events, the runtime names its device
as its tensors do, and a --tf32 run leaves the process's precision settings as it found
them.

Tolerances: a CUDA window's logits, loss and gradients against the CPU's in float64, within
8 times the CPU float32 window's own error (the error model of atom_train.model.loop_check:
other kernels, other summation orders, judged against the truth); a resume or a fork on
CUDA is compared bit for bit with the uninterrupted CUDA run: the same kernels run in the
same order on the same shapes (the Triton loop sums without atomics, the masks are drawn on
the CPU), so nothing may differ.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers.field_cases import judge_window, window_results
from helpers.torch_flags import precision_flags
from helpers.trainer_kit import REPO, assert_same_state, run, steps

from atom_train import train
from atom_train.common.measure import StepClock
from atom_train.data.loader import BatchedByteStream, ByteCorpus
from atom_train.model.batched import BatchedByteTick, _on
from atom_train.model.config import ModelConfig
from atom_train.model.lockstep import WindowSchedule
from atom_train.model.reference import ReferenceModel, draw_masks
from atom_train.trainer.checkpoint_file import FINAL, load_checkpoint
from atom_train.trainer.prefetch import MaskDrawer, WindowPrefetcher
from atom_train.trainer.train_state import run_config_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
CUDA = ["--device", "cuda", "--tf32"]


def _window(config: ModelConfig, B: int, K: int):
    gen = torch.Generator().manual_seed(0)
    feats = (torch.rand(K, B, 320, generator=gen) < 0.05).float()
    tgt = torch.randint(0, 256, (K, B), generator=gen)
    masks = (torch.rand(K, B, generator=gen) >= 0.5).float()
    return feats, tgt, masks


@pytest.mark.parametrize("B", [5, pytest.param(64, marks=pytest.mark.first_contact)])
def test_cuda_triton_window_equals_cpu_fused(B, record_property):
    """A whole training window on CUDA with the Triton loop against the CPU's fused loop in
    float64: the logits (per stream), the loss and every parameter's gradient within
    ERROR_RATIO = 8 x the CPU float32 window's own error (field_cases.judge_window: the error
    model of atom_train.model.loop_check)."""
    config = ModelConfig(learnable_leak=True, field_max_rms=1.2, episode_length=40)
    feats, tgt, masks = _window(config, B, 64)
    cuda = ReferenceModel(config).to("cuda")
    got = window_results(cuda, B, feats, tgt, masks, 20, "triton")
    j = judge_window(got, lambda dtype: ReferenceModel(config).to(dtype), B, feats, tgt, masks, 20)
    record_property("error_ratio", round(j.ratio, 3))
    assert j.failure is None, j.failure


@pytest.mark.first_contact
def test_trainer_on_cuda_resumes_and_forks_exactly_and_chats_on_the_cpu(corpus, tmp_path):
    straight, half, fork = tmp_path / "straight", tmp_path / "half", tmp_path / "fork"
    assert run(corpus, straight, 96, "--ckpt-every", "48", *CUDA) == 0
    ck = load_checkpoint(straight / FINAL)
    tr = ck.meta["training"]
    assert run_config_of(ck.meta).value("recurrence") == "auto" and tr["device"].startswith("cuda")
    assert tr["recurrence"] == "triton" and tr["transport"] == "ids"  # what auto chose
    start = json.loads((straight / "loss.jsonl").read_text().splitlines()[0])
    assert start["recurrence_reason"].startswith(
        "auto: Triton, proven against the fused loop on cuda"
    )
    assert run(corpus, half, 48, "--ckpt-every", "48", *CUDA) == 0
    source = tmp_path / "source.safetensors"  # the half run's tick-48 checkpoint, kept
    source.write_bytes((half / FINAL).read_bytes())
    assert run(corpus, fork, 96, "--ckpt-every", "48", "--fork", str(source), *CUDA) == 0
    assert run(corpus, half, 96, "--ckpt-every", "48", *CUDA) == 0  # the same command again
    assert_same_state(half / FINAL, straight / FINAL)
    assert_same_state(fork / FINAL, straight / FINAL)
    assert load_checkpoint(fork / FINAL).meta["origin"]["mode"] == "fork"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "atom_train.chat",
            "--checkpoint",
            str(straight),
            "--prompt",
            "Bonjour",
            "--max-bytes",
            "16",
            "--seed",
            "0",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert r.returncode == 0, r.stderr
    assert "trained on cuda" in r.stderr and r.stdout.strip()


@contextlib.contextmanager
def sync_debug(mode: str | int):
    """torch.cuda's sync debug mode inside ("error": a host sync raises), as before after."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


@pytest.mark.parametrize("leak", ["--learnable-leak", "--no-learnable-leak"])
def test_cuda_trainer_windows_never_wait_for_the_gpu(corpus, tmp_path, monkeypatch, leak):
    """Every window after the first (where kernels compile and memory is first allocated)
    runs with host syncs made errors: the prefetcher's hand-over, the step, the per-window
    bookkeeping and the window boundary; in both leak modes (the scalar leak's keep is made
    on the device, also for the noise probe's own runtime), with the noise scale measured
    every 2 steps (its windows are strict too: the first, from tick 16, is the second window,
    where the half batch's kernels compile: Triton's compile waits for nothing on the GPU). Log ticks and checkpoint writes read device values by
    design and are allowed to. (tests/trainer/test_step.py proves the same window on the
    meta device without a GPU.)"""
    windows = []

    def strict(fn):
        def wrapped(*args, **kwargs):
            with sync_debug("error" if len(windows) > 1 else 0):
                return fn(*args, **kwargs)

        return wrapped

    def lenient(fn):
        def wrapped(*args, **kwargs):
            with sync_debug(0):
                return fn(*args, **kwargs)

        return wrapped

    def counted(fn):
        def wrapped(self, w, lr):
            windows.append(w.tick0)
            return strict(fn)(self, w, lr)

        return wrapped

    monkeypatch.setattr(train.Trainer, "train_window", counted(train.Trainer.train_window))
    for name in ("after_window", "boundary"):
        monkeypatch.setattr(train.Trainer, name, strict(getattr(train.Trainer, name)))
    for name in ("log_row", "save"):
        monkeypatch.setattr(train.Trainer, name, lenient(getattr(train.Trainer, name)))
    for name in ("get", "release"):
        monkeypatch.setattr(WindowPrefetcher, name, strict(getattr(WindowPrefetcher, name)))
    out = tmp_path / "run"
    assert run(
        corpus, out, 128, "--ckpt-every", "64", "--log-every", "32", "--noise-scale-every",
        "2", leak, *CUDA,
    ) == 0  # fmt: skip
    assert windows == list(range(0, 128, 16))
    # Measured: the windows from ticks 16, 32, 80 and 96 (all strict).
    assert [x["tick"] - 16 for x in steps(out) if "grad_sq_small" in x] == [16, 32, 80, 96]
    assert torch.cuda.get_sync_debug_mode() == 0


@pytest.mark.parametrize("compact", [False, True])
def test_cuda_prefetched_windows_stay_intact_while_the_gpu_is_far_behind(corpus, compact):
    """A long GPU sleep is queued before each window's copy and the window's buffer is given
    back at once: were a pinned buffer refilled before its copy had run, the device would
    hold a later window's bytes. Each device window must equal a CPU read of the same
    stream, and the loader thread's wait for the GPU must show as such, not as its work."""
    B, K, n = 256, 64, 10
    data = ByteCorpus(str(corpus / "train-*.txt"))
    sched = WindowSchedule(K, 1 << 30, n * K)
    cuda = torch.device("cuda")
    drawer = MaskDrawer(torch.Generator().manual_seed(5), 0.3, B, 0, B)
    stream = BatchedByteStream(data, B, offsets=3, threads=2)
    pf = WindowPrefetcher(stream, 0, n * K, sched.cut, K, cuda, compact, drawer)
    kept, windows = [], []
    try:
        for _ in range(n):
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the next copy
            w = pf.get()
            # Copies of the device tensors, queued on the same stream after their copy.
            kept.append((w.feats.clone(), w.tgt.clone(), w.masks.clone()))
            pf.release(w)
            windows.append(w)
        torch.cuda.synchronize()
    finally:
        pf.close()
    direct = BatchedByteStream(data, B, offsets=3, threads=1)
    gen = torch.Generator().manual_seed(5)
    for i, (feats, tgt, masks) in enumerate(kept):
        _, want_feats, want_tgt = (direct.next_window_ids if compact else direct.next_window)(K)
        assert np.array_equal(feats.cpu().numpy(), want_feats), f"window {i} feats"
        assert np.array_equal(tgt.cpu().numpy(), want_tgt), f"window {i} tgt"
        assert torch.equal(masks.cpu(), draw_masks(torch.empty(K, B), 0.3, gen)), f"window {i}"
    # From the third window on, each buffer waited for the GPU before its refill.
    gpu_wait = sum(w.gpu_wait_s for w in windows[2:])
    assert gpu_wait > 0.3 and gpu_wait > 2 * sum(w.loader_busy_s for w in windows[2:])


def test_cuda_step_clock_holds_a_bounded_number_of_events():
    clock = StepClock(torch.device("cuda"))
    x = torch.randn(512, 512, device="cuda")
    for _ in range(300):
        clock.start()
        x = torch.tanh(x @ x)
        clock.mark()
        x = torch.tanh(x @ x)
        clock.mark()
        assert clock.pending <= StepClock.MAX_PENDING + 1
    phases = clock.read()
    assert phases["compute"] > 0 and phases["optimizer"] > 0 and clock.pending == 0


def test_cuda_runtime_names_its_device_as_its_tensors_do():
    config = ModelConfig(n_modes=8, jl_dim=16, mlp_hidden=32, atom_dim=8)
    bt = BatchedByteTick(ReferenceModel(config).to("cuda"), 4, device="cuda")
    assert bt.device == bt.z.device == torch.device("cuda", torch.cuda.current_device())
    x = torch.zeros(3, device="cuda")
    assert _on(x, bt.device) is x  # already there: no operator


def test_cuda_a_tf32_run_leaves_the_precision_settings_as_it_found_them(corpus, tmp_path):
    before = precision_flags()
    assert run(corpus, tmp_path / "run", 32, *CUDA) == 0
    assert precision_flags() == before
    # On CUDA the step's wait for its window is the GPU's time, and is named so.
    lines = (tmp_path / "run" / "progress.tsv").read_text().splitlines()
    rows = [dict(zip(lines[0].split("\t"), x.split("\t"), strict=True)) for x in lines[1:]]
    assert rows and all(r["gpu_wait_pct"] and not r["loader_wait_pct"] for r in rows)
