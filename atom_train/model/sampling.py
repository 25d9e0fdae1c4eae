"""Sampling bytes from a model with the single-stream reference (CPU): chat, and the
trainer's samples (`sample_text`).

Bytes are fed one at a time through the Atomizer and the reference tick, with the same
lockstep schedule as training (episode resets and atom flushes by global tick); each sampled
byte is fed back the same way. A `Sampler` keeps that stream going across calls, so a chat is
one continuous text (prompt, reply, next prompt, ...) and not a series of fresh completions.
Sampling is reproducible: the seed fixes every draw, and the reference runs on the CPU.

Example::

    s = Sampler(model, temperature=0.8, top_k=40, seed=1)
    s.feed("Bonjour\\n".encode())
    reply = bytes(s.sample(200, stop=b"\\n"))
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from atom_train.data.atomizer import Atomizer
from atom_train.model.config import ModelConfig
from atom_train.model.reference import ReferenceModel, StreamState


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


class Sampler:
    """One stream of the reference model that is fed bytes and samples continuations.

    `feed(data)` advances the stream over `data`; `sample(n, stop)` draws up to `n` bytes, each
    fed back into the stream before the next is drawn. The stream's global tick counts every
    byte fed, so episode resets and atom flushes fall where training would put them.
    """

    def __init__(
        self,
        model: ReferenceModel,
        temperature: float = 0.8,
        top_k: int = 40,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.temperature = temperature
        self.top_k = top_k
        self.atomizer = Atomizer(model.config.pack_mode)
        self.state: StreamState = model.new_state()
        self.generator = torch.Generator().manual_seed(seed)
        self.tick = 0  # global tick of the next byte fed
        self.logits: torch.Tensor | None = None  # the prediction for the next byte

    @torch.no_grad()
    def _feed_byte(self, b: int) -> None:
        self.model.apply_schedule(self.state, self.tick)
        x = torch.from_numpy(self.atomizer.push(b)).to(self.model.gamma.dtype)
        self.logits = self.model.tick(self.state, x).logits
        self.tick += 1

    def feed(self, data: bytes) -> None:
        """Advance the stream over `data` (no sampling)."""
        for b in data:
            self._feed_byte(b)

    def sample(self, max_bytes: int, stop: bytes | None = None) -> Iterator[int]:
        """Yield up to `max_bytes` sampled bytes; with `stop`, end right after yielding a byte
        in `stop` (it is yielded and fed like any other). Needs at least one byte fed first."""
        if self.logits is None:
            raise ValueError("feed at least one byte before sampling: the model predicts the next")
        for _ in range(max_bytes):
            b = sample_byte(self.logits, self.temperature, self.top_k, self.generator)
            self._feed_byte(b)
            yield b
            if stop is not None and b in stop:
                return


def stream_bytes(
    model: ReferenceModel,
    prompt: bytes,
    max_bytes: int,
    temperature: float = 0.8,
    top_k: int = 40,
    seed: int = 0,
) -> Iterator[int]:
    """Yield up to `max_bytes` sampled bytes that continue `prompt` (an empty prompt is read
    as b"\\n": the model needs one byte of input before it can predict)."""
    sampler = Sampler(model, temperature, top_k, seed)
    sampler.feed(prompt or b"\n")
    yield from sampler.sample(max_bytes)


def generate(
    model: ReferenceModel,
    prompt: bytes,
    max_bytes: int,
    temperature: float = 0.8,
    top_k: int = 40,
    seed: int = 0,
) -> bytes:
    """The sampled continuation of `prompt` (at most `max_bytes` bytes)."""
    return bytes(stream_bytes(model, prompt, max_bytes, temperature, top_k, seed))


def sample_text(
    model: ReferenceModel,
    config: ModelConfig,
    prompt: str,
    n_bytes: int,
    temperature: float = 0.8,
    top_k: int = 40,
    seed: int = 0,
) -> str:
    """A chat sample: the reference model (a CPU copy of `model`'s weights) continuing
    `prompt` for `n_bytes` bytes, decoded as UTF-8 (invalid bytes replaced)."""
    cpu_model = ReferenceModel(config)
    cpu_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    out = generate(
        cpu_model,
        prompt.encode(),
        max_bytes=n_bytes,
        temperature=temperature,
        top_k=top_k,
        seed=seed,
    )
    return out.decode("utf-8", errors="replace")
