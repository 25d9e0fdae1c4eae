"""The Atomizer: byte -> 320 features, written for clarity, not speed.

This module is the oracle. The Rust loader (`atomdata-rs`) computes the same features for B
streams in parallel and is tested against `Atomizer.encode_bytes` bit for bit; the chat path
uses `Atomizer.push` one byte at a time. See `docs/atomizer.md` for the layout table.

Every feature value is exactly 0.0 or 1.0 (float32). The features of byte `b` depend only on
`b` and the context state *before* it; the state is updated after every byte.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

FEATURE_DIM = 320
FEATURE_VERSION = 1
PACK_MODES = ("utf8", "plain")
# Every part of the context forgets the reset state within this many bytes.
HORIZON = 64

# Byte classes.
CLS_NONE = 0  # only as "previous" at stream start
CLS_LOWER = 1  # a-z
CLS_UPPER = 2  # A-Z
CLS_DIGIT = 3
CLS_SPACE = 4  # space or tab
CLS_NEWLINE = 5  # \n or \r
CLS_PUNCT = 6  # other printable ASCII
CLS_CONTROL = 7  # other ASCII control, incl. NUL and DEL
CLS_LEAD = 8  # UTF-8 lead byte 0xC2-0xF4
CLS_CONT = 9  # UTF-8 continuation 0x80-0xBF
CLS_INVALID = 10  # 0xC0, 0xC1, 0xF5-0xFF
N_CLASSES = 11
LETTER_LIKE = frozenset({CLS_LOWER, CLS_UPPER, CLS_LEAD, CLS_CONT})

# Feature layout: (start, stop) of each block, half-open.
BYTE = (0, 256)
CLS = (256, 267)
PREV_CLS = (267, 278)
NEED = (278, 282)  # utf8 only
VALIDITY = (282, 286)  # utf8 only
WORD_LEN = (286, 302)
LINE_BUCKET = (302, 310)
AFTER_STOP = 310
CAPITAL_AFTER_STOP = 311
BITS = (312, 320)  # utf8: lead byte bits of a continuation; plain: bits of the byte

# Validity codes in [282, 286).
VALID_START = 0  # expected a non-continuation and got one
VALID_CONT = 1  # expected a continuation and got one
UNEXPECTED_CONT = 2  # continuation with need == 0
TRUNCATED = 3  # need > 0, got a non-continuation

WORD_LEN_CAP = 15
LINE_LEN_CAP = 64
SPACE_RUN_CAP = 64


def byte_class(b: int) -> int:
    """The class of byte `b` (1-10; 0 is only ever a `prev_cls`)."""
    if 0x61 <= b <= 0x7A:
        return CLS_LOWER
    if 0x41 <= b <= 0x5A:
        return CLS_UPPER
    if 0x30 <= b <= 0x39:
        return CLS_DIGIT
    if b in (0x20, 0x09):
        return CLS_SPACE
    if b in (0x0A, 0x0D):
        return CLS_NEWLINE
    if 0x21 <= b <= 0x7E:
        return CLS_PUNCT
    if b < 0x80:
        return CLS_CONTROL  # 0x00-0x1F (other than tab, LF, CR) and DEL
    if 0xC2 <= b <= 0xF4:
        return CLS_LEAD
    if 0x80 <= b <= 0xBF:
        return CLS_CONT
    return CLS_INVALID  # 0xC0, 0xC1, 0xF5-0xFF


def line_bucket(line_len: int) -> int:
    """Bucket of `line_len`: 0, 1, 2-3, 4-7, 8-15, 16-31, 32-63, 64 -> 0..7."""
    if line_len >= LINE_LEN_CAP:
        return 7
    if line_len == 0:
        return 0
    return line_len.bit_length()  # 1 -> 1, 2-3 -> 2, 4-7 -> 3, ..., 32-63 -> 6


def utf8_need(lead: int) -> int:
    """Continuation bytes a UTF-8 lead byte announces."""
    if lead <= 0xDF:
        return 1
    if lead <= 0xEF:
        return 2
    return 3


@dataclass
class AtomizerState:
    """The context state carried from byte to byte; the defaults are the reset state."""

    prev_cls: int = CLS_NONE
    need: int = 0  # UTF-8 continuation bytes still expected, 0-3
    lead: int = 0  # lead byte of the sequence in progress (0 when need == 0)
    word_len: int = 0  # consecutive letter-like bytes before this one, capped at 15
    line_len: int = LINE_LEN_CAP  # bytes since the last \n, capped at 64
    after_stop: int = 1  # 1 after . ! ? (or a long whitespace run), else 0
    space_run: int = SPACE_RUN_CAP  # whitespace bytes since the last non-whitespace, capped

    def as_list(self) -> list[int]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    @classmethod
    def from_list(cls, values: list[int]) -> AtomizerState:
        return cls(*values)


def features(b: int, state: AtomizerState, pack_mode: str = "utf8") -> np.ndarray:
    """The 320 features of byte `b` given the state before it (the state is not changed)."""
    _check_pack_mode(pack_mode)
    x = np.zeros(FEATURE_DIM, dtype=np.float32)
    c = byte_class(b)
    x[BYTE[0] + b] = 1.0
    x[CLS[0] + c] = 1.0
    x[PREV_CLS[0] + state.prev_cls] = 1.0
    x[WORD_LEN[0] + state.word_len] = 1.0
    x[LINE_BUCKET[0] + line_bucket(state.line_len)] = 1.0
    if state.after_stop:
        x[AFTER_STOP] = 1.0
        if c == CLS_UPPER:
            x[CAPITAL_AFTER_STOP] = 1.0
    if pack_mode == "utf8":
        x[NEED[0] + state.need] = 1.0
        if c == CLS_CONT:
            validity = VALID_CONT if state.need > 0 else UNEXPECTED_CONT
        else:
            validity = VALID_START if state.need == 0 else TRUNCATED
        x[VALIDITY[0] + validity] = 1.0
        if c == CLS_CONT and state.need > 0:
            _set_bits(x, state.lead)
    else:
        _set_bits(x, b)
    return x


def advance(b: int, state: AtomizerState) -> AtomizerState:
    """The state after byte `b` (the same in both pack modes)."""
    c = byte_class(b)
    s = dataclasses.replace(state)
    s.prev_cls = c
    if c == CLS_LEAD:
        s.need = utf8_need(b)
        s.lead = b
    elif c == CLS_CONT:
        s.need = max(state.need - 1, 0)
    else:
        s.need = 0
    if s.need == 0:
        s.lead = 0  # so that equal streams have equal states
    s.word_len = min(state.word_len + 1, WORD_LEN_CAP) if c in LETTER_LIKE else 0
    s.line_len = 0 if b == 0x0A else min(state.line_len + 1, LINE_LEN_CAP)
    if c in (CLS_SPACE, CLS_NEWLINE):
        s.space_run = min(state.space_run + 1, SPACE_RUN_CAP)
        if s.space_run == SPACE_RUN_CAP:
            s.after_stop = 1
    else:
        s.space_run = 0
        s.after_stop = 1 if b in b".!?" else 0
    return s


class Atomizer:
    """Byte -> features, one byte at a time (`push`) or a whole string (`encode_bytes`)."""

    def __init__(self, pack_mode: str = "utf8") -> None:
        _check_pack_mode(pack_mode)
        self.pack_mode = pack_mode
        self.state = AtomizerState()

    def reset(self) -> None:
        self.state = AtomizerState()

    def push(self, b: int) -> np.ndarray:
        """Features of `b` given the current state, then advance the state past `b`."""
        x = features(b, self.state, self.pack_mode)
        self.state = advance(b, self.state)
        return x

    def encode_bytes(self, data: bytes) -> np.ndarray:
        """Features of every byte of `data`, starting from the reset state: float32 (N, 320).

        Does not touch `self.state`.
        """
        state = AtomizerState()
        out = np.zeros((len(data), FEATURE_DIM), dtype=np.float32)
        for i, b in enumerate(data):
            out[i] = features(b, state, self.pack_mode)
            state = advance(b, state)
        return out


def _set_bits(x: np.ndarray, value: int) -> None:
    for bit in range(8):
        if value >> bit & 1:
            x[BITS[0] + bit] = 1.0


def _check_pack_mode(pack_mode: str) -> None:
    if pack_mode not in PACK_MODES:
        raise ValueError(f"unknown pack mode {pack_mode!r}: use one of {', '.join(PACK_MODES)}")
