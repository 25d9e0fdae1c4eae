"""BatchedByteStream: B streams, windows, offsets, state, threads, zero-copy buffers."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from helpers.loader_state import format_1, header, same_state

from atom_train.data.loader import (
    STATE_FORMAT,
    STATE_VERSION,
    AtomDataError,
    BatchedByteStream,
    ByteCorpus,
    join_state_dicts,
    stream_offsets,
)

TEXT = (
    "Le petit prince s'assit sur une pierre et leva les yeux vers le ciel. « Je me demande "
    "si les étoiles sont éclairées afin que chacun puisse un jour retrouver la sienne ! »\n"
).encode()


@pytest.fixture
def corpus(write_shards):
    data = TEXT * 30 + bytes(range(256))
    return ByteCorpus(write_shards([data[:777], data[777:2000], b"", data[2000:]]))


def data_ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_b_streams_equal_b_independent_single_streams(corpus):
    batched = BatchedByteStream(corpus, 7, offsets=42, threads=2)
    offsets = batched.positions
    cur, feats, tgt = batched.next_window(100)
    for i, o in enumerate(offsets):
        c1, f1, t1 = BatchedByteStream(corpus, 1, offsets=[o], threads=1).next_window(100)
        assert np.array_equal(cur[:, i], c1[:, 0])
        assert np.array_equal(feats[:, i], f1[:, 0])
        assert np.array_equal(tgt[:, i], t1[:, 0])


def test_a_window_equals_k_ticks(corpus):
    window = BatchedByteStream(corpus, 5, pack_mode="plain")
    ticks = BatchedByteStream(corpus, 5, pack_mode="plain")
    cur, feats, tgt = window.next_window(20)
    for t in range(20):
        c, f, g = ticks.next_tick()
        assert c.shape == (5,) and f.shape == (5, 320) and g.shape == (5,)
        assert np.array_equal(c, cur[t]) and np.array_equal(f, feats[t])
        assert np.array_equal(g, tgt[t])
    assert window.positions == ticks.positions


def test_tgt_is_the_next_cur(corpus):
    stream = BatchedByteStream(corpus, 3)
    cur, _, tgt = stream.next_window(30)
    assert np.array_equal(tgt[:-1], cur[1:])
    nxt, _, _ = stream.next_window(1)
    assert np.array_equal(tgt[-1], nxt[0])


def test_even_and_seeded_offsets(corpus):
    size = corpus.size
    assert BatchedByteStream(corpus, 4).positions == [i * size // 4 for i in range(4)]
    assert BatchedByteStream(corpus, 4, offsets="even").positions == [
        i * size // 4 for i in range(4)
    ]
    a = BatchedByteStream(corpus, 8, offsets=123).positions
    assert a == BatchedByteStream(corpus, 8, offsets=123).positions
    assert a != BatchedByteStream(corpus, 8, offsets=124).positions
    assert all(0 <= p < size for p in a) and len(set(a)) == 8
    stream = BatchedByteStream(corpus, 3, offsets=[5, 0, size - 1])
    stream.next_window(4)
    assert stream.positions == [9, 4, 3]


def test_threads_do_not_change_the_result(corpus):
    results = [
        BatchedByteStream(corpus, 300, offsets=9, threads=t).next_window(64) for t in (None, 1, 2)
    ]
    for r in results[1:]:
        for a, b in zip(r, results[0], strict=True):
            assert np.array_equal(a, b)
    assert BatchedByteStream(corpus, 1, threads=2).threads == 2


def test_state_round_trip_mid_stream_equals_an_uninterrupted_run(corpus):
    straight = BatchedByteStream(corpus, 6, offsets=77)
    straight.next_window(50)
    state = straight.state_dict()
    assert state["format"] == STATE_FORMAT and state["version"] == STATE_VERSION == 2
    assert state["B"] == 6 and state["pack_mode"] == "utf8" and state["feature_version"] == 1
    assert state["corpus_signature"] == corpus.signature
    # The positions are the whole state besides the header: no contexts (the 64-byte horizon
    # gives them back), and an int64 array, what a checkpoint stores as a tensor.
    assert set(state) == {
        *("format", "version", "corpus_signature", "pack_mode", "feature_version", "B"),
        "positions",
    }
    assert (
        state["positions"].dtype == np.int64 and state["positions"].tolist() == straight.positions
    )
    assert json.loads(json.dumps(header(state))) == header(state)  # the metadata part: JSON
    expected = [a.copy() for a in straight.next_window(90)]

    resumed = BatchedByteStream(corpus, 6, offsets="even")
    resumed.load_state_dict(state)
    assert resumed.positions == state["positions"].tolist()
    got = resumed.next_window(90)
    for a, b in zip(got, expected, strict=True):
        assert a.tobytes() == b.tobytes()


def test_a_format_1_state_resumes_exactly(corpus):
    """The JSON state of the loader before format 2 (positions and contexts as lists) loads
    into today's loader, which checks each saved context against its position's, and goes
    on exactly as the stream that saved it."""
    straight = BatchedByteStream(corpus, 5, offsets=3)
    straight.next_window(61)
    v1 = json.loads(json.dumps(format_1(straight)))
    expected = [a.copy() for a in straight.next_window(70)]
    resumed = BatchedByteStream(corpus, 5)
    resumed.load_state_dict(v1)
    for got, want in zip(resumed.next_window(70), expected, strict=True):
        assert got.tobytes() == want.tobytes()
    # It is written back in format 2.
    assert resumed.state_dict()["version"] == 2 and "contexts" not in resumed.state_dict()


def test_a_share_of_the_streams_loads_from_the_state_of_all(corpus):
    """Under torchrun a rank loads its streams lo..hi of the checkpoint's all-streams state,
    and the ranks' states join back into it."""
    everyone = BatchedByteStream(corpus, 6, offsets=11)
    everyone.next_window(20)
    state = everyone.state_dict()
    expected = everyone.next_window(30)[0].copy()
    shares = []
    for lo, hi in ((0, 2), (2, 6)):
        part = BatchedByteStream(corpus, hi - lo, offsets=stream_offsets(corpus, 6, 11)[lo:hi])
        part.load_state_dict(state, streams=(lo, hi))
        shares.append(part.state_dict())
        assert np.array_equal(part.next_window(30)[0], expected[:, lo:hi])
    assert same_state(join_state_dicts(shares), state)
    with pytest.raises(AtomDataError, match=r"streams 0\.\.3 are not B = 2 streams"):
        BatchedByteStream(corpus, 2).load_state_dict(state, streams=(0, 3))


def test_stream_offsets_are_the_streams_starting_positions(corpus):
    for offsets in ("even", 5, [3, 1, 4]):
        assert (
            stream_offsets(corpus, 3, offsets)
            == BatchedByteStream(corpus, 3, offsets=offsets).positions
        )
    assert stream_offsets(corpus, 4) == BatchedByteStream(corpus, 4).positions


def test_a_snapshot_is_the_state_when_it_was_taken(corpus):
    stream = BatchedByteStream(corpus, 3, offsets=9)
    stream.next_window(17)
    snap, state = stream.snapshot(), stream.state_dict()
    assert same_state(snap.state_dict(), state) and snap.B == 3
    assert snap.positions == stream.positions
    expected = [a.copy() for a in stream.next_window(40)]
    # It does not move with the stream.
    assert not same_state(stream.state_dict(), state) and same_state(snap.state_dict(), state)
    resumed = BatchedByteStream(corpus, 3)
    resumed.load_state_dict(snap.state_dict())
    for got, want in zip(resumed.next_window(40), expected, strict=True):
        assert np.array_equal(got, want)
    assert repr(snap) == "StreamSnapshot(B=3)"


def test_returned_arrays_are_the_loaders_buffers(corpus):
    stream = BatchedByteStream(corpus, 4)
    cur, feats, tgt = stream.next_window(8)
    first = feats.copy()
    ptrs = [data_ptr(a) for a in (cur, feats, tgt)]
    cur2, feats2, tgt2 = stream.next_window(8)
    # Same memory, overwritten in place: a view is valid until the next call.
    assert [data_ptr(a) for a in (cur2, feats2, tgt2)] == ptrs
    assert np.shares_memory(feats, feats2) and not np.array_equal(feats, first)
    assert feats2.flags.c_contiguous and feats2.flags.writeable
    # A different K gets a new buffer; arrays from before stay alive and untouched.
    _, feats3, _ = stream.next_window(3)
    assert feats3.shape == (3, 4, 320) and not np.shares_memory(feats3, feats2)


def test_out_buffers_are_filled_in_place(corpus):
    k, b = 16, 5
    ref = BatchedByteStream(corpus, b).next_window(k)
    out = (
        np.empty((k, b), np.uint8),
        np.full((k, b, 320), 7.0, np.float32),
        np.empty((k, b), np.uint8),
    )
    got = BatchedByteStream(corpus, b).next_window(k, out=out)
    assert all(g is o for g, o in zip(got, out, strict=True))
    for o, r in zip(out, ref, strict=True):
        assert np.array_equal(o, r)
    ids_out = (
        np.empty((k, b), np.uint8),
        np.empty((k, b, 17), np.int16),
        np.empty((k, b), np.uint8),
    )
    got = BatchedByteStream(corpus, b).next_window_ids(k, out=ids_out)
    assert got[1] is ids_out[1] and np.array_equal(got[0], ref[0])


def test_out_can_be_a_torch_tensors_numpy_view(corpus):
    torch = pytest.importorskip("torch")
    k, b = 8, 3
    tensors = (
        torch.zeros((k, b), dtype=torch.uint8),
        torch.zeros((k, b, 320), dtype=torch.float32),
        torch.zeros((k, b), dtype=torch.uint8),
    )
    BatchedByteStream(corpus, b).next_window(k, out=tuple(t.numpy() for t in tensors))
    ref = BatchedByteStream(corpus, b).next_window(k)
    assert torch.equal(tensors[1], torch.from_numpy(ref[1]))
    assert torch.equal(tensors[0], torch.from_numpy(ref[0]))


def test_the_gil_is_released_while_a_window_runs(corpus):
    # While one thread is inside next_window, this thread runs Python and sees the stream
    # busy; it could not if the window held the GIL. Busy is an error, never a corruption.
    stream = BatchedByteStream(corpus, 256, offsets=1)
    seen_busy = False
    for _ in range(50):  # until seen: a window can end before this thread is scheduled
        worker = threading.Thread(target=stream.next_window, args=(256,))
        worker.start()
        while worker.is_alive() and not seen_busy:
            try:
                stream.positions  # noqa: B018 (the call is the test)
            except AtomDataError as e:
                assert "busy in another thread" in str(e)
                seen_busy = True
        worker.join()
        if seen_busy:
            break
    assert seen_busy


def test_streams_in_parallel_threads_equal_sequential_runs(corpus):
    expected = [BatchedByteStream(corpus, 64, offsets=s).next_window(64)[1] for s in (1, 2)]
    results = {}

    def run(seed):
        results[seed] = BatchedByteStream(corpus, 64, offsets=seed).next_window(64)[1]

    threads = [threading.Thread(target=run, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert np.array_equal(results[1], expected[0]) and np.array_equal(results[2], expected[1])


def test_repr(corpus):
    s = BatchedByteStream(corpus, 3, pack_mode="plain", threads=1)
    assert (
        repr(s)
        == f"BatchedByteStream(B=3, pack_mode='plain', threads=1, corpus={corpus.size} bytes)"
    )
    assert s.B == 3 and s.pack_mode == "plain" and s.corpus is corpus
