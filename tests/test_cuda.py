"""CUDA-only checks (skipped without a GPU; scripts/gpu_check.sh runs them on a GPU box):
the compiled Triton loop against the CPU fused loop, the whole trainer on CUDA (feature ids,
pinned double buffers, the Triton loop), exact resume on CUDA, and a CUDA-trained
checkpoint chatting on the CPU.

Tolerances: float32 logits within 1e-4 and gradients within 1e-3 relative between CUDA and
the CPU (other kernels, other summation orders, over a whole window); a resume on CUDA is
compared bit for bit with the uninterrupted CUDA run (the same kernels in the same order).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from trainer_kit import REPO, assert_same_state, run

from atom_train.batched import BatchedByteTick
from atom_train.checkpoint import FINAL, load_checkpoint
from atom_train.model import AtomNativeModel, ModelConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
CUDA = ["--device", "cuda", "--tf32"]


def _window(config: ModelConfig, B: int, K: int):
    gen = torch.Generator().manual_seed(0)
    feats = (torch.rand(K, B, 320, generator=gen) < 0.05).float()
    tgt = torch.randint(0, 256, (K, B), generator=gen)
    masks = (torch.rand(K, B, generator=gen) >= 0.5).float()
    return feats, tgt, masks


@pytest.mark.parametrize("B", [5, 64])
def test_cuda_triton_window_equals_cpu_fused(B):
    config = ModelConfig(learnable_leak=True, field_max_rms=1.2, episode_length=40)
    feats, tgt, masks = _window(config, B, 64)
    outs = {}
    for device, recurrence in (("cpu", "fused"), ("cuda", "triton")):
        model = AtomNativeModel(config).to(device)
        bt = BatchedByteTick(model, B, device=device, recurrence=recurrence)
        out = bt.run_window(
            feats.to(device), tgt.to(device), 20, masks=masks.to(device), return_details=True
        )
        out.loss.backward()
        grads = {k: p.grad.detach().cpu() for k, p in model.named_parameters()}
        outs[recurrence] = (out.logits.cpu(), float(out.loss), grads)
    (la, lossa, ga), (lb, lossb, gb) = outs["triton"], outs["fused"]
    assert float((la - lb).abs().max()) <= 1e-4
    assert abs(lossa - lossb) <= 1e-4
    for k in gb:
        assert float((ga[k] - gb[k]).norm()) <= 1e-3 * float(gb[k].norm()) + 1e-6, k


def test_trainer_on_cuda_resumes_exactly_and_chats_on_the_cpu(corpus, tmp_path):
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    assert run(corpus, straight, 96, "--ckpt-every", "48", *CUDA) == 0
    ck = load_checkpoint(straight / FINAL)
    tr = ck.meta["training"]
    assert ck.meta["args"]["recurrence"] == "auto" and tr["device"].startswith("cuda")
    assert tr["recurrence"] == "triton" and tr["transport"] == "ids"  # what auto chose
    assert run(corpus, halves, 48, "--ckpt-every", "48", *CUDA) == 0
    assert run(corpus, halves, 96, "--ckpt-every", "48", *CUDA) == 0  # the same command again
    assert_same_state(halves / FINAL, straight / FINAL)
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
