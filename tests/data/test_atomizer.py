"""The oracle Atomizer against docs/design.md#features-the-atomizer, written out independently."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atom_train.data.atomizer import (
    FEATURE_DIM,
    HORIZON,
    Atomizer,
    AtomizerState,
    advance,
    byte_class,
    line_bucket,
)


def ones(data: bytes, pack_mode: str = "utf8") -> list[list[int]]:
    return [np.flatnonzero(row).tolist() for row in Atomizer(pack_mode).encode_bytes(data)]


def test_byte_classes_match_the_spec_table():
    for b in range(256):
        c = chr(b)
        if c.isascii() and c.islower() and c.isalpha():
            want = 1
        elif c.isascii() and c.isupper():
            want = 2
        elif c.isascii() and c.isdigit():
            want = 3
        elif c in " \t":
            want = 4
        elif c in "\n\r":
            want = 5
        elif 0x21 <= b <= 0x7E:
            want = 6
        elif b < 0x80:
            want = 7
        elif 0xC2 <= b <= 0xF4:
            want = 8
        elif 0x80 <= b <= 0xBF:
            want = 9
        else:
            want = 10
        assert byte_class(b) == want, hex(b)


def test_line_buckets():
    assert [line_bucket(n) for n in (0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64)] == [
        0,
        1,
        2,
        2,
        3,
        3,
        4,
        4,
        5,
        5,
        6,
        6,
        7,
    ]


def test_first_byte_from_the_reset_state():
    # 'A': byte 65, class 2 (256+2), prev none (267), need 0 (278), valid start (282),
    # word_len 0 (286), line_len 64 -> bucket 7 (309), after_stop (310), capital (311).
    assert ones(b"A") == [[65, 258, 267, 278, 282, 286, 309, 310, 311]]
    # plain: no need/validity, and the bits of 0x41 (bits 0 and 6) in 312..320.
    assert ones(b"A", "plain") == [[65, 258, 267, 286, 309, 310, 311, 312, 318]]


def test_utf8_sequences_validity_and_lead_bits():
    # é = C3 A9; then a truncated C3 before 'x'; then a stray continuation; an overlong C0 AF.
    f = ones(b"\xc3\xa9\xc3x\xa9\xc0\xaf")
    assert f[1] == [0xA9, 265, 275, 279, 283, 287, 309, 312, 313, 318, 319]  # bits of C3
    assert 285 in f[3] and 279 in f[3]  # 'x': truncated sequence, need 1 shown
    assert 284 in f[4] and max(f[4]) < 312  # stray continuation: no lead bits
    assert 256 + 10 in f[5]  # C0 is invalid
    assert 284 in f[6]  # AF after C0: unexpected continuation


def test_four_byte_sequence_counts_down_need():
    f = ones("😀".encode())  # F0 9F 98 80
    assert [sorted(set(r) & {278, 279, 280, 281})[0] - 278 for r in f] == [0, 3, 2, 1]
    assert all(283 in r for r in f[1:])


def test_word_line_and_stop_context():
    f = ones(b"\nab. Cd\nx")
    assert 286 + 2 in f[3]  # '.' after two letters
    assert 310 in f[4] and 311 not in f[4]  # ' ' after '.'
    assert 310 in f[5] and 311 in f[5]  # 'C': capital at a sentence start
    assert 310 not in f[6]
    assert 302 + 0 in f[1] and 302 + 0 in f[8]  # right after '\n': line_len 0
    assert 302 + 3 in f[7]  # '\n' at line_len 6 -> bucket 4-7
    assert 302 + 7 in f[0]  # the reset state's line_len is 64


def test_a_run_of_64_whitespace_bytes_is_a_sentence_stop():
    data = b"word" + b" " * 63 + b"\nX"
    f = ones(data)
    assert 310 not in f[4 + 63]  # the 64th whitespace byte comes after 63: no stop yet
    assert 310 in f[4 + 64] and 311 in f[4 + 64]


def test_word_len_is_capped_at_15():
    f = ones(b"a" * 20)
    assert [next(i for i in r if 286 <= i < 302) - 286 for r in f] == [*range(16), 15, 15, 15, 15]


def test_push_equals_encode_bytes_and_encode_bytes_keeps_the_state():
    data = "Où est-il ? Là.\n".encode()
    atom = Atomizer()
    rows = [atom.push(b) for b in data]
    assert np.array_equal(np.stack(rows), Atomizer().encode_bytes(data))
    state = atom.state
    atom.encode_bytes(b"xyz")
    assert atom.state == state


def test_context_list_order_is_the_saved_state_order():
    s = AtomizerState(prev_cls=8, need=2, lead=0xE2, word_len=3, line_len=9, after_stop=0)
    assert s.as_list() == [8, 2, 0xE2, 3, 9, 0, 64]
    assert AtomizerState.from_list(s.as_list()) == s


def test_unknown_pack_mode():
    with pytest.raises(ValueError, match="unknown pack mode 'bytes'"):
        Atomizer("bytes")


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), plain=st.booleans())
def test_features_are_zero_or_one_with_at_most_17_ones(data, plain):
    x = Atomizer("plain" if plain else "utf8").encode_bytes(data)
    assert x.shape == (len(data), FEATURE_DIM) and x.dtype == np.float32
    assert np.isin(x, (0.0, 1.0)).all()
    assert (x.sum(axis=1) <= 17).all()


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.binary(max_size=100),
    window=st.one_of(
        st.binary(min_size=HORIZON, max_size=HORIZON),
        st.sampled_from(b" \n\ta\x80\xc3.").map(lambda b: bytes([b]) * HORIZON),
        st.lists(st.sampled_from(b" \n\x80ab.\xc3"), min_size=HORIZON, max_size=HORIZON).map(bytes),
    ),
)
def test_the_state_forgets_everything_within_64_bytes(prefix, window):
    a, b = AtomizerState(), AtomizerState()
    for x in prefix:
        a = advance(x, a)
    for x in window:
        a, b = advance(x, a), advance(x, b)
    assert a == b
