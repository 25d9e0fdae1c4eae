"""Stubs of the private native module `atom_train._atomdata` (atomdata-rs/src/python.rs).

Use `atom_train.data`, which re-exports these names.
"""

import os
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

FEATURE_DIM: Final[int]  # 320
FEATURE_VERSION: Final[int]  # 1
FEATURE_IDS_PER_TICK: Final[int]  # 17
FEATURE_ID_PAD: Final[int]  # 320
HORIZON: Final[int]  # 64
PACK_MODES: Final[list[str]]  # ["utf8", "plain"]
STATE_FORMAT: Final[str]  # "atomdata.stream_state"
STATE_VERSION: Final[int]  # 1
FIELD_BLOCK: Final[int]  # 16: streams per block of the native field loop

class AtomDataError(ValueError):
    """A loader error; the message says how to fix it."""

class AtomDataIOError(AtomDataError, OSError):
    """A loader error caused by the file system (unreadable, changed or replaced shard)."""

_U8 = npt.NDArray[np.uint8]
_F32 = npt.NDArray[np.float32]
_Real = npt.NDArray[np.float32] | npt.NDArray[np.float64]
_I16 = npt.NDArray[np.int16]
_Path = str | os.PathLike[str]

class ByteCorpus:
    """Sorted shard files (globs expanded) seen as one circular byte string.

    Memory-mapped; `resident=True` copies the corpus into RAM instead.
    """

    def __init__(self, paths: _Path | Sequence[_Path], resident: bool = False) -> None: ...
    @property
    def size(self) -> int:
        """Total size in bytes."""
    @property
    def signature(self) -> list[dict[str, Any]]:
        """`[{"name": file name, "size": bytes}, ...]` in shard order."""
    @property
    def shards(self) -> list[str]:
        """Shard paths, sorted."""
    @property
    def resident(self) -> bool: ...

class BatchedByteStream:
    """B byte streams over a corpus, each with its own Atomizer context.

    Stream i's position is the corpus offset of its next `cur` byte. A tick yields
    `cur = s[p]`, the 320 features of `s[p]` given the context before it, and `tgt = s[p+1]`.
    `offsets`: "even" (stream i at floor(i * size / B)), an int seed, or a list of B offsets.
    `threads`: None for rayon's global pool, or the size of a dedicated pool.

    Arrays returned without `out` are the loader's own buffers, overwritten by the next
    `next_*` call on this stream: copy them (or pass `out`) to keep them longer.
    """

    def __init__(
        self,
        corpus: ByteCorpus,
        B: int,
        pack_mode: str = "utf8",
        offsets: str | int | Sequence[int] | None = "even",
        threads: int | None = None,
    ) -> None: ...
    def next_tick(self) -> tuple[_U8, _F32, _U8]:
        """`(cur u8[B], feats f32[B, 320], tgt u8[B])`."""
    def next_window(
        self, K: int, out: tuple[_U8, _F32, _U8] | None = None
    ) -> tuple[_U8, _F32, _U8]:
        """`(cur u8[K, B], feats f32[K, B, 320], tgt u8[K, B])`, into `out` if given
        (C-contiguous writeable arrays of exactly those dtypes and shapes)."""
    def next_window_ids(
        self, K: int, out: tuple[_U8, _I16, _U8] | None = None
    ) -> tuple[_U8, _I16, _U8]:
        """`(cur u8[K, B], ids i16[K, B, 17], tgt u8[K, B])`: the dims equal to 1.0,
        ascending, padded with 320 (see `atom_train.data.expand_ids`)."""
    @property
    def B(self) -> int: ...
    @property
    def pack_mode(self) -> str: ...
    @property
    def threads(self) -> int: ...
    @property
    def corpus(self) -> ByteCorpus: ...
    @property
    def positions(self) -> list[int]: ...
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: format, version, corpus_signature, pack_mode,
        feature_version, B, positions, contexts."""
    def snapshot(self) -> StreamSnapshot:
        """The state now, compact (B positions and contexts copied without the GIL): take
        one per window; `.state_dict()` gives the JSON form when it is written."""
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict()`; raises AtomDataError if it does not fit this stream."""

class StreamSnapshot:
    """A loader state taken by `BatchedByteStream.snapshot()`, kept in Rust."""

    def state_dict(self) -> dict[str, Any]:
        """`BatchedByteStream.state_dict()` as it was when the snapshot was taken."""
    @property
    def B(self) -> int: ...
    @property
    def positions(self) -> list[int]: ...

def encode_bytes(data: bytes | bytearray, pack_mode: str = "utf8") -> _F32:
    """Features of every byte from the reset state, float32 (N, 320): the Rust twin of
    `Atomizer(pack_mode).encode_bytes(data)`."""

# The native field loop (atomfield-rs), used by `atom_train.model.field_native`. Arrays are
# C-contiguous, all float32 or all float64; the GIL is released while they run.

def field_forward(
    u: _Real,
    z: _Real,
    keep: _Real,
    ar: _Real,
    ai: _Real,
    cr: _Real,
    ci: _Real,
    g: _Real,
    e: _Real,
    resets: Sequence[bool],
    consts: dict[str, float],
    threads: int = 1,
) -> tuple[_Real, _Real, _Real, _Real, _Real]:
    """Steps 2-6 over a window: `(zs [K,B,2n], es [K,B], gs [K,B], g [B], e [B])`, the
    field and energy after each tick, the gain each tick used, the final gain and energy.
    `u` [K,B,2n], `z` [B,2n], `keep` 0-dim or [2n], `ar`/`ai` [n], `cr`/`ci` [n,n],
    `g`/`e` [B]; `consts`: dt, max_rms, log_target, amp_rate, phase_sync_min,
    amp_log_floor, energy_decay, gain_min, gain_max."""

def field_backward(
    u: _Real,
    z: _Real,
    keep: _Real,
    ar: _Real,
    ai: _Real,
    cr: _Real,
    ci: _Real,
    zs: _Real,
    gs: _Real,
    gzs: _Real,
    resets: Sequence[bool],
    consts: dict[str, float],
    need_keep: bool,
    threads: int = 1,
) -> tuple[_Real, _Real, _Real | None, _Real, _Real, _Real, _Real]:
    """The gradients `(gu, gz, gkeep, gar, gai, gcr, gci)` of the forward's array inputs
    from its `zs`, `gs` and the gradient `gzs` of the loss with respect to `zs`; each
    tick is recomputed from `zs`. `gkeep` is None unless `need_keep`."""

def field_kernel() -> str:
    """The instruction set the native field loop uses here: "avx512", "avx2" or "portable"."""
