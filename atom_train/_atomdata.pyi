"""Stubs of the private native module `atom_train._atomdata`, the binding crate's (atom-py/:
the loader in atom-py/src/data.rs, the native field loop in atom-py/src/field.rs, the
exceptions in atom-py/src/error.rs).

Use `atom_train.data.loader` and `atom_train.model.field_native`, which re-export these names.
"""

import os
from collections.abc import Sequence
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

FEATURE_DIM: Final[int]  # 320
FEATURE_VERSION: Final[int]  # 1
FEATURE_IDS_PER_TICK: Final[int]  # 17
FEATURE_ID_PAD: Final[int]  # 320
HORIZON: Final[int]  # 64
PACK_MODES: Final[list[str]]  # ["utf8", "plain"]
STATE_FORMAT: Final[str]  # "atomdata.stream_state"
STATE_VERSION: Final[int]  # 2 (the version written; 1, the JSON state with contexts, is read)
FIELD_BLOCK: Final[int]  # 16: streams per block of the native field loop
FIELD_CONSTS: Final[list[str]]  # the FieldConsts attributes the native loop reads

class AtomError(ValueError):
    """An error of the native extension; the message says how to fix it."""

class AtomDataError(AtomError):
    """A loader error; the message says how to fix it."""

class AtomDataIOError(AtomDataError, OSError):
    """A loader error caused by the file system (unreadable, changed or replaced shard)."""

class AtomFieldError(AtomError):
    """A native field loop error (arrays, constants, instruction set)."""

class _FieldConsts(Protocol):
    """What the native loop reads of `atom_train.model.config.FieldConsts`."""

    dt: float
    max_rms: float
    log_target: float
    amp_rate: float
    phase_sync_min: float
    amp_log_floor: float
    energy_decay: float
    gain_min: float
    gain_max: float

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
    `threads`: the size of the pool the windows run on (the extension keeps one pool a size,
    shared; 1: the calling thread; None: one thread a core).

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
        """The state for an exact resume: format, version (2), corpus_signature, pack_mode,
        feature_version, B, and positions (an int64 array [B])."""
    def snapshot(self) -> StreamSnapshot:
        """The state now, compact (the B positions copied without the GIL): take one per
        window; `.state_dict()` gives the dict when it is written."""
    def load_state_dict(
        self, state: dict[str, Any], streams: tuple[int, int] | None = None
    ) -> None:
        """Restore a `state_dict()` (or a format-1 state, with contexts): each stream at its
        saved position, warmed up on the 64 bytes before it. `streams=(lo, hi)`: streams
        lo..hi of a state of more streams. Raises AtomDataError if it does not fit."""

class StreamSnapshot:
    """A loader state taken by `BatchedByteStream.snapshot()`, kept in Rust."""

    def state_dict(self) -> dict[str, Any]:
        """`BatchedByteStream.state_dict()` as it was when the snapshot was taken."""
    @property
    def B(self) -> int: ...
    @property
    def positions(self) -> list[int]: ...

def check_state_dict(
    state: dict[str, Any], corpus: ByteCorpus, B: int, pack_mode: str = "utf8"
) -> None:
    """Raise AtomDataError, as `load_state_dict` would, if the state's header (format,
    version, feature version, pack mode, B, corpus signature) does not fit; positions unread."""

def join_state_dicts(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The state of all streams from the states of consecutive shares of them, in order."""

def stream_offsets(
    corpus: ByteCorpus, B: int, offsets: str | int | Sequence[int] | None = "even"
) -> list[int]:
    """The B starting positions `BatchedByteStream(corpus, B, offsets=offsets)` would have."""

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
    consts: _FieldConsts,
    threads: int = 1,
) -> tuple[_Real, _Real, _Real, _Real, _Real]:
    """Steps 2-6 over a window: `(zs [K,B,2n], es [K,B], gs [K,B], g [B], e [B])`, the
    field and energy after each tick, the gain each tick used, the final gain and energy.
    `u` [K,B,2n], `z` [B,2n], `keep` 0-dim or [2n], `ar`/`ai` [n], `cr`/`ci` [n,n],
    `g`/`e` [B]; `consts`: the model's FieldConsts; `threads`: the pool's size (1: the
    calling thread)."""

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
    consts: _FieldConsts,
    need_keep: bool,
    threads: int = 1,
) -> tuple[_Real, _Real, _Real | None, _Real, _Real, _Real, _Real]:
    """The gradients `(gu, gz, gkeep, gar, gai, gcr, gci)` of the forward's array inputs
    from its `zs`, `gs` and the gradient `gzs` of the loss with respect to `zs`; each
    tick is recomputed from `zs`. `gkeep` is None unless `need_keep`."""

def field_kernel() -> str:
    """The instruction set the native field loop uses here: "avx512", "avx2" or "portable"."""
