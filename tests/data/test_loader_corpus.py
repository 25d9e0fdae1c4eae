"""ByteCorpus: sorted shards as one circular string, memory-mapped or resident, 64-bit."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from atom_train.data.loader import BatchedByteStream, ByteCorpus


def positional(sizes: list[int]) -> list[bytes]:
    """llm.c's trick: byte g of the concatenation is g % 251, so each byte says where it is."""
    shards, g = [], 0
    for n in sizes:
        shards.append(bytes((x % 251) for x in range(g, g + n)))
        g += n
    return shards


@pytest.mark.parametrize("resident", [False, True])
def test_multi_shard_circular_reads_equal_the_concatenation(write_shards, oracle, resident):
    sizes = [0, 1, 7, 300, 0, 2, 600, 1]  # tiny and empty shards
    shards = positional(sizes)
    data = b"".join(shards)
    size = len(data)
    corpus = ByteCorpus(write_shards(shards), resident=resident)
    assert corpus.size == size and corpus.resident is resident
    seams = np.cumsum(sizes)
    offsets = sorted({int(o) % size for s in seams for o in (s - 2, s)} | {size - 3, size - 1})
    k = 50  # every stream crosses at least one seam; the last ones wrap
    stream = BatchedByteStream(corpus, len(offsets), offsets=offsets)
    for window in range(3):
        cur, feats, tgt = stream.next_window(k)
        for i, o in enumerate(offsets):
            start = o + window * k
            g = (start + np.arange(k)) % size
            assert (cur[:, i] == g % 251).all()
            assert (tgt[:, i] == (g + 1) % size % 251).all()
            want_cur, want_feats, _ = oracle(data, start % size, k)
            assert np.array_equal(cur[:, i], want_cur)
            assert np.array_equal(feats[:, i], want_feats)


def test_shards_are_sorted_globs_expanded_and_signed(tmp_path, write_shards):
    (tmp_path / "b.txt").write_bytes(b"bb")
    (tmp_path / "a.txt").write_bytes(b"a")
    (tmp_path / "c.log").write_bytes(b"ccc")
    (tmp_path / ".hidden.txt").write_bytes(b"h")
    corpus = ByteCorpus([str(tmp_path / "*.log"), tmp_path / "*.txt", str(tmp_path / "a.txt")])
    assert corpus.shards == [str(tmp_path / n) for n in ("a.txt", "b.txt", "c.log")]
    assert corpus.signature == [
        {"name": "a.txt", "size": 1},
        {"name": "b.txt", "size": 2},
        {"name": "c.log", "size": 3},
    ]
    assert corpus.size == 6
    cur, _, tgt = BatchedByteStream(corpus, 1, offsets=[0]).next_window(6)
    assert bytes(cur[:, 0]) == b"abbccc" and bytes(tgt[:, 0]) == b"bbccca"
    assert ByteCorpus(Path(tmp_path / "a.txt")).size == 1
    assert "3 shards, 6 bytes, memory-mapped" in repr(corpus)


def test_a_corpus_smaller_than_the_warm_up_wraps_many_times(write_shards, oracle):
    for data in (b"x", b"ab", "é.".encode()):
        corpus = ByteCorpus(write_shards([data], name=f"t{len(data)}"))
        stream = BatchedByteStream(corpus, len(data), offsets="even")
        cur, feats, _ = stream.next_window(9)
        for i in range(len(data)):
            assert np.array_equal(feats[:, i], oracle(data, i, 9)[1])
            assert np.array_equal(cur[:, i], oracle(data, i, 9)[0])


def test_offsets_past_4_gib_in_a_sparse_file(tmp_path):
    path = tmp_path / "big.bin"
    size = 2**32 + 4096
    marker = 2**32 + 100
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: no disk blocks
        f.seek(marker)
        f.write(b"Bonjour!")
    corpus = ByteCorpus(str(path))
    assert corpus.size == size and corpus.signature == [{"name": "big.bin", "size": size}]
    stream = BatchedByteStream(corpus, 3, offsets=[marker, size - 2, marker - 3])
    cur, feats, tgt = stream.next_window(8)
    assert bytes(cur[:, 0]) == b"Bonjour!"
    assert bytes(cur[:, 2]) == b"\0\0\0Bonjo"
    assert stream.positions == [marker + 8, 6, marker + 5]
    assert stream.state_dict()["positions"].tolist() == [marker + 8, 6, marker + 5]
    even = BatchedByteStream(corpus, 2)
    assert even.positions == [0, size // 2]
    assert feats[0, 0, ord("B")] == 1.0 and tgt[-1, 0] == 0
    os.remove(path)
