"""Loader states in the tests: comparing two (`same_state`: the header and the positions,
which are a numpy array), and making a format-1 state, the JSON state the loader wrote before
format 2, of a stream (`format_1`: the contexts computed by the Python Atomizer, the oracle,
from the 64 bytes before each position, as that loader recorded them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from atom_train.data.atomizer import AtomizerState, advance
from atom_train.data.loader import HORIZON, BatchedByteStream


def header(state: dict) -> dict:
    return {k: v for k, v in state.items() if k != "positions"}


def same_state(a: dict, b: dict) -> bool:
    """Two loader states are equal: their header, and their positions element by element."""
    return header(a) == header(b) and np.array_equal(a["positions"], b["positions"])


def format_1(stream: BatchedByteStream) -> dict:
    """The format-1 state (JSON: lists, with the contexts) of `stream` now."""
    data = b"".join(Path(p).read_bytes() for p in stream.corpus.shards)
    contexts = []
    for p in stream.positions:
        state = AtomizerState()
        for j in range(HORIZON):
            state = advance(data[(p - HORIZON + j) % len(data)], state)
        contexts.append(state.as_list())
    state = stream.state_dict()
    return {
        **header(state),
        "version": 1,
        "positions": [int(p) for p in state["positions"]],
        "contexts": contexts,
    }
