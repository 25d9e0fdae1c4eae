"""Scoring a model on text: a function of a model and its settings, touching no trainer
state. The trainer's validation, eval and the LR tool all score through here.

`score_text` is the definition of a validation score: `streams` parallel streams spread
evenly over a text (stream i starts at offset i x size / streams, warmed up on the bytes
before it) each read ``n_bytes // streams`` bytes (circularly), every stream from the fresh
runtime state, windows cut like training windows (K ticks, and at episode ends), no dropout
and no random draw: the same model on the same text always gets the same number.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from atom_train.common.cli import some_of
from atom_train.data.loader import BatchedByteStream, ByteCorpus
from atom_train.model.batched import BatchedByteTick
from atom_train.model.lockstep import window_cut
from atom_train.model.reference import ReferenceModel

LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class Score:
    val_bpb: float  # mean byte cross-entropy, bits per byte
    loss: float  # mean training loss (byte CE in nats + length CE + persistence term)
    bytes_scored: int  # streams x ticks
    len_ce: float  # mean cross-entropy of the length head, nats (a term of `loss`)


@torch.no_grad()
def score_text(
    model: ReferenceModel,
    corpus: ByteCorpus | str | bytes,
    *,
    streams: int = 64,
    n_bytes: int | None = None,
    K: int = 64,
    device: torch.device | str = "cpu",
    recurrence: str = "auto",
    progress: Callable[[int], None] | None = None,
) -> Score:
    """The model's score on `corpus` (see the module docstring); the model is handed back in
    the mode it came in. `corpus`: a `ByteCorpus` (files), or the text itself, a `str`
    (scored as its UTF-8 bytes) or `bytes`: the same score as a file of those bytes.
    `progress(n)` hears of each window's n bytes scored (a bar). The defaults score the
    whole text (`n_bytes` None) as 64 streams on the CPU, with the field loop the commands
    choose (`recurrence` "auto", `model.backend.resolve_recurrence`: the native loop on a
    CPU, Triton on CUDA where it fits), so a notebook's figure is `eval`'s, as fast.

    The sums stay on the device until the end: one host read per text, not per window."""
    corpus = _as_corpus(corpus)
    cfg = model.config
    n_bytes = corpus.size if n_bytes is None else n_bytes
    device = torch.device(device)
    if recurrence == "auto":
        from atom_train.model.backend import resolve_recurrence

        recurrence = resolve_recurrence("auto", device, cfg)
    ticks = n_bytes // streams
    if ticks < 1:
        raise ValueError(f"{n_bytes} bytes cannot feed {streams} streams one tick each")
    stream = BatchedByteStream(corpus, streams, pack_mode=cfg.pack_mode)
    bt = BatchedByteTick(model, streams, device=device, recurrence=recurrence)
    total_ce, total_loss, total_len, t = 0.0, 0.0, 0.0, 0
    was_training = model.training
    model.eval()
    try:
        while t < ticks:
            end = window_cut(t, ticks, [K, cfg.episode_length])
            n = end - t
            _, feats, tgt = stream.next_window(n)
            out = bt.run_window(
                torch.from_numpy(feats).to(device),
                torch.from_numpy(tgt).to(device),
                t,
                training=False,
            )
            total_ce += out.byte_ce * n
            total_loss += out.loss * n
            total_len += out.len_ce * n
            t = end
            if progress is not None:
                progress(n * streams)
    finally:
        model.train(was_training)
    return Score(
        val_bpb=float(total_ce) / ticks * LOG2E,
        loss=float(total_loss) / ticks,
        bytes_scored=ticks * streams,
        len_ce=float(total_len) / ticks,
    )


def _as_corpus(text: ByteCorpus | str | bytes) -> ByteCorpus:
    """A ByteCorpus of `text`: itself, or a text in memory (str as UTF-8, bytes as they are)
    read into RAM from a file that is gone when this returns (the loader reads files: one
    path for all the corpora it scores). Anything else is a TypeError naming what it takes."""
    if isinstance(text, ByteCorpus):
        return text
    if isinstance(text, str):
        data = text.encode("utf-8")
    elif isinstance(text, (bytes, bytearray, memoryview)):
        data = bytes(text)
    else:
        raise TypeError(
            f"score_text scores a ByteCorpus (files: ByteCorpus('val.txt')), a str or bytes, "
            f"not a {type(text).__name__}"
        )
    if not data:
        raise ValueError("score_text was given an empty text: nothing to score")
    with tempfile.TemporaryDirectory(prefix="atom-score-") as d:
        path = Path(d) / "text"
        path.write_bytes(data)
        return ByteCorpus(str(path), resident=True)


def validate(model: ReferenceModel, plan) -> float:
    """The trainer's validation of `model`: bits/byte on `plan.val` (a `trainer.plan.RunPlan`:
    its val text, bytes and streams) with the plan's K, device and field loop. The trainer
    and the LR tool both score through here, so their numbers are the same number."""
    v = plan.val
    return score_text(
        model,
        v.corpus,
        streams=v.streams,
        n_bytes=v.bytes,
        K=plan.window_schedule.K,
        device=plan.device,
        recurrence=plan.recurrence,
    ).val_bpb


# Val texts up to this size are worth scoring whole at every validation (the start banner
# recommends it when the slice is smaller).
SMALL_VAL_BYTES = 16 << 20


def describe_val(corpus: ByteCorpus, n_bytes: int, streams: int, flag: str = "--val") -> str:
    """What a validation score with these settings measures, in one line for people."""
    ticks = n_bytes // streams
    names = some_of(corpus.shards)
    share = min(ticks * streams, corpus.size) / max(corpus.size, 1)
    text = (
        f"val: {ticks * streams:,} bytes of {names} ({100 * share:.0f}% of its "
        f"{corpus.size:,}), read as {streams} streams of {ticks:,} bytes from fresh state "
        f"(each byte scored with at most {ticks - 1:,} bytes of context)"
    )
    scored = ticks * streams
    if scored < corpus.size <= SMALL_VAL_BYTES:
        if n_bytes < corpus.size:
            text += f"; to score all of it: --val-bytes {corpus.size}"
        else:  # all of it was asked for: every stream reads whole ticks
            text += (
                f"; its last {corpus.size - scored:,} bytes are left out (each of the "
                f"{streams} streams reads the same whole number of bytes)"
            )
    return text
