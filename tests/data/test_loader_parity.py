"""The Rust loader's features equal the Python Atomizer's, bit for bit."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atom_train.data.atomizer import Atomizer
from atom_train.data.loader import (
    FEATURE_ID_PAD,
    FEATURE_IDS_PER_TICK,
    BatchedByteStream,
    ByteCorpus,
    encode_bytes,
    expand_ids,
)

MODES = ("utf8", "plain")

# Bytes that hit the interesting cases more often than uniform bytes do.
texty = st.lists(
    st.one_of(
        st.binary(max_size=8),
        st.sampled_from(
            [
                "é".encode(),
                "😀".encode(),
                "€".encode(),
                b"\xc3",
                b"\x80",
                b"\xc0\xaf",
                b". ",
                b"\n",
                b" " * 70,
                b"A",
            ]
        ),
        st.text(max_size=10).map(str.encode),
    ),
    max_size=40,
).map(b"".join)


@pytest.mark.parametrize("pack_mode", MODES)
@settings(max_examples=500, deadline=None)
@given(data=st.one_of(st.binary(max_size=300), texty))
def test_rust_encode_equals_the_oracle(pack_mode, data):
    expected = Atomizer(pack_mode).encode_bytes(data)
    got = encode_bytes(data, pack_mode)
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.array_equal(got, expected)


@settings(max_examples=300, deadline=None)
@given(
    shards=st.lists(st.one_of(st.binary(max_size=60), texty), min_size=1, max_size=5),
    offsets=st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=5),
    k=st.integers(min_value=1, max_value=80),
    pack_mode=st.sampled_from(MODES),
)
def test_streams_equal_the_oracle_on_the_circular_string(oracle, shards, offsets, k, pack_mode):
    data = b"".join(shards)
    if not data:
        return
    offsets = [o % len(data) for o in offsets]
    with tempfile.TemporaryDirectory() as tmp:
        for i, shard in enumerate(shards):
            Path(tmp, f"{i:03d}.bin").write_bytes(shard)
        corpus = ByteCorpus(f"{tmp}/*.bin")
        stream = BatchedByteStream(corpus, len(offsets), pack_mode=pack_mode, offsets=offsets)
        cur, feats, tgt = stream.next_window(k)
    for i, o in enumerate(offsets):
        want_cur, want_feats, want_tgt = oracle(data, o, k, pack_mode)
        assert np.array_equal(cur[:, i], want_cur)
        assert np.array_equal(tgt[:, i], want_tgt)
        assert np.array_equal(feats[:, i], want_feats), f"stream {i} at offset {o}"


@pytest.mark.parametrize("pack_mode", MODES)
def test_a_warmed_up_stream_at_any_offset_equals_the_full_encode(write_shards, pack_mode):
    # The 64-byte horizon: one stream per offset >= 64, each compared with the encode of
    # the whole string from its start (no warm-up involved on the oracle side).
    data = (
        "Voilà. Un été à Paris!\n".encode()
        + b" " * 80
        + b"\xc3\xe2\x82 \x80\x80 "
        + b"abcdefghijklmnopqrstuvwxyz"
        + bytes(range(256))
        + b"\n" * 70
        + b"Fin."
    )
    k = 12
    offsets = list(range(64, len(data) - k))
    stream = BatchedByteStream(
        ByteCorpus(write_shards([data])), len(offsets), pack_mode=pack_mode, offsets=offsets
    )
    _, feats, _ = stream.next_window(k)
    full = Atomizer(pack_mode).encode_bytes(data)
    for i, o in enumerate(offsets):
        assert np.array_equal(feats[:, i], full[o : o + k]), f"offset {o}"


@pytest.mark.parametrize("pack_mode", MODES)
def test_compact_ids_expand_to_the_dense_features(write_shards, pack_mode):
    data = bytes(range(256)) + "Ça, c'est l'été! \xe2\x82".encode() * 3
    corpus = ByteCorpus(write_shards([data[:100], data[100:]]))
    dense = BatchedByteStream(corpus, 5, pack_mode=pack_mode, offsets=3)
    compact = BatchedByteStream(corpus, 5, pack_mode=pack_mode, offsets=3)
    for k in (1, 7, 300):
        cur, feats, tgt = dense.next_window(k)
        cur2, ids, tgt2 = compact.next_window_ids(k)
        assert ids.dtype == np.int16 and ids.shape == (k, 5, FEATURE_IDS_PER_TICK)
        assert np.array_equal(cur, cur2) and np.array_equal(tgt, tgt2)
        assert np.array_equal(expand_ids(ids), feats)
        # ids are the dims equal to 1.0, ascending, then the pad.
        row = ids[0, 0]
        on = np.flatnonzero(feats[0, 0])
        assert row[: len(on)].tolist() == on.tolist()
        assert (row[len(on) :] == FEATURE_ID_PAD).all()


def test_expand_ids_on_torch_tensors(write_shards):
    torch = pytest.importorskip("torch")
    data = "Où ça? Là-bas.\n".encode() * 20
    corpus = ByteCorpus(write_shards([data]))
    _, ids, _ = BatchedByteStream(corpus, 4).next_window_ids(30)
    _, feats, _ = BatchedByteStream(corpus, 4).next_window(30)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        got = expand_ids(torch.from_numpy(ids).to(device))
        assert got.device.type == device and got.dtype == torch.float32
        assert torch.equal(got.cpu(), torch.from_numpy(feats))


def test_a_window_too_large_to_cache_is_written_exactly(write_shards):
    # >= 16 MiB of features takes the non-temporal store path; ids take the cached path.
    data = "Où est l'élève ? Là-bas.  Très bien!\n".encode() * 50
    corpus = ByteCorpus(write_shards([data[:1000], data[1000:]]))
    B, K = 512, 32
    _, feats, _ = BatchedByteStream(corpus, B, offsets=2).next_window(K)
    _, ids, _ = BatchedByteStream(corpus, B, offsets=2).next_window_ids(K)
    assert feats.nbytes >= 16 << 20
    assert np.array_equal(feats, expand_ids(ids))
