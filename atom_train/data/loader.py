"""The loader's public API: byte corpora and B parallel byte streams with Atomizer features.

The work is done by the Rust extension `atom_train._atomdata` (see `docs/loader.md`); this
module re-exports it and adds `expand_ids`, the inverse of the compact id encoding.

    from atom_train.data.loader import ByteCorpus, BatchedByteStream

    corpus = ByteCorpus("data/*.txt")                  # sorted shards, memory-mapped
    stream = BatchedByteStream(corpus, B=256, offsets=1234)
    cur, feats, tgt = stream.next_window(64)           # u8[64,256], f32[64,256,320], u8[64,256]
    state = stream.state_dict()                        # signature, pack mode, ..., positions
    snap = stream.snapshot()                           # the same, compact: snap.state_dict()
    stream.load_state_dict(state)                      # exact resume, checked

A state is the corpus signature, the pack mode, the feature version, B and the B positions
(an int64 numpy array; a checkpoint stores it as a tensor): the contexts follow from the
positions, by the Atomizer's 64-byte horizon. `load_state_dict` also reads the earlier
format 1 (the JSON state that listed the contexts too).

Returned arrays are views of the loader's own buffers, overwritten by the next call on the
same stream: copy them, or pass `out=` buffers you own, to keep them longer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atom_train._atomdata import (
    FEATURE_DIM,
    FEATURE_ID_PAD,
    FEATURE_IDS_PER_TICK,
    FEATURE_VERSION,
    HORIZON,
    PACK_MODES,
    STATE_FORMAT,
    STATE_VERSION,
    AtomDataError,
    AtomDataIOError,
    AtomError,
    BatchedByteStream,
    ByteCorpus,
    StreamSnapshot,
    check_state_dict,
    encode_bytes,
    join_state_dicts,
    stream_offsets,
)

__all__ = [
    "FEATURE_DIM",
    "FEATURE_IDS_PER_TICK",
    "FEATURE_ID_PAD",
    "FEATURE_VERSION",
    "HORIZON",
    "PACK_MODES",
    "STATE_FORMAT",
    "STATE_VERSION",
    "AtomDataError",
    "AtomDataIOError",
    "AtomError",
    "BatchedByteStream",
    "ByteCorpus",
    "StreamSnapshot",
    "check_state_dict",
    "encode_bytes",
    "expand_ids",
    "join_state_dicts",
    "stream_offsets",
]


def expand_ids(ids: Any) -> Any:
    """Dense float32 features `[..., 320]` from feature ids `[..., 17]` (padded with 320).

    Works on a numpy array (returns numpy) or a torch tensor on any device (returns a torch
    float32 tensor on that device); the result equals the dense `next_window` features
    exactly.
    """
    if isinstance(ids, np.ndarray):
        _check_ids_shape(ids.shape, ids.dtype.kind in "iu")
        flat = ids.reshape(-1, FEATURE_IDS_PER_TICK)
        out = np.zeros((flat.shape[0], FEATURE_DIM), dtype=np.float32)
        rows, slots = np.nonzero(flat < FEATURE_ID_PAD)
        out[rows, flat[rows, slots]] = 1.0
        return out.reshape((*ids.shape[:-1], FEATURE_DIM))
    import torch  # only when given a tensor: the loader does not need torch

    if not isinstance(ids, torch.Tensor):
        raise AtomDataError(f"ids must be a numpy array or a torch tensor, got {type(ids)}")
    _check_ids_shape(tuple(ids.shape), not ids.dtype.is_floating_point and not ids.is_complex())
    ids = ids.long()
    real = ids < FEATURE_ID_PAD
    out = torch.zeros((*ids.shape[:-1], FEATURE_DIM), dtype=torch.float32, device=ids.device)
    # Pads add 0.0 to dim 0; real ids are distinct, so each dim ends exactly 0.0 or 1.0.
    return out.scatter_add_(-1, torch.where(real, ids, 0), real.to(torch.float32))


def _check_ids_shape(shape: tuple[int, ...], integer: bool) -> None:
    if not integer or not shape or shape[-1] != FEATURE_IDS_PER_TICK:
        raise AtomDataError(
            f"ids must be integers of shape [..., {FEATURE_IDS_PER_TICK}] "
            f"(from next_window_ids), got shape {list(shape)}"
        )
