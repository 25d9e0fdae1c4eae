"""Sampling bytes from a model with the single-stream reference (CPU), for chat and samples.

The prompt is fed byte by byte through the Atomizer and the reference tick (with the same
lockstep schedule as training: episode resets and atom flushes by tick); each sampled byte is
fed back the same way. Sampling is reproducible: a `seed` fixes every draw.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from atom_train.atomizer import Atomizer
from atom_train.model import AtomNativeModel


def sample_byte(logits: torch.Tensor, temperature: float, top_k: int, gen: torch.Generator) -> int:
    """One byte from (256,) logits: greedy at temperature 0, else softmax(logits / T) over
    the top_k most likely bytes (top_k <= 0 or >= 256: all)."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits.double() / temperature
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = torch.where(logits < kth, torch.full_like(logits, float("-inf")), logits)
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


@torch.no_grad()
def stream_bytes(
    model: AtomNativeModel,
    prompt: bytes,
    max_bytes: int,
    temperature: float = 0.8,
    top_k: int = 40,
    seed: int = 0,
) -> Iterator[int]:
    """Yield up to `max_bytes` sampled bytes that continue `prompt`."""
    if not prompt:
        prompt = b"\n"  # the model needs one byte of input before it can predict
    atomizer = Atomizer(model.config.pack_mode)
    state = model.new_state()
    gen = torch.Generator().manual_seed(seed)
    dtype = model.gamma.dtype
    tick = 0

    def feed(b: int):
        nonlocal tick
        model.apply_schedule(state, tick)
        x = torch.from_numpy(atomizer.push(b)).to(dtype)
        tick += 1
        return model.tick(state, x).logits

    for b in prompt[:-1]:
        feed(b)
    logits = feed(prompt[-1])
    for _ in range(max_bytes):
        b = sample_byte(logits, temperature, top_k, gen)
        yield b
        logits = feed(b)


def generate(
    model: AtomNativeModel,
    prompt: bytes,
    max_bytes: int,
    temperature: float = 0.8,
    top_k: int = 40,
    seed: int = 0,
) -> bytes:
    """The sampled continuation of `prompt` (at most `max_bytes` bytes)."""
    return bytes(stream_bytes(model, prompt, max_bytes, temperature, top_k, seed))
