"""Bad input gives a clear AtomDataError that names the fix: never a crash or wrong data."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from helpers.loader_state import format_1
from helpers.unprivileged import can_drop_privileges, run_unprivileged

from atom_train.data.loader import (
    AtomDataError,
    AtomDataIOError,
    BatchedByteStream,
    ByteCorpus,
    check_state_dict,
    encode_bytes,
    join_state_dicts,
)


@pytest.fixture
def corpus(write_shards):
    return ByteCorpus(write_shards([b"Bonjour tout le monde. " * 20, b"Salut! " * 10]))


# --- corpus -------------------------------------------------------------------------------


def test_a_glob_that_matches_nothing_names_the_glob_and_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AtomDataError) as e:
        ByteCorpus("data/*.txt")
    assert str(e.value) == f"no file matches 'data/*.txt' (cwd {tmp_path}): check --data"
    assert isinstance(e.value, ValueError)
    with pytest.raises(AtomDataError, match=r"no file matches 'missing\.txt'"):
        ByteCorpus(["missing.txt"])
    with pytest.raises(AtomDataError, match="no corpus path given"):
        ByteCorpus([])
    with pytest.raises(AtomDataError, match="not a valid glob"):
        ByteCorpus("data/[.txt")
    with pytest.raises(AtomDataError, match="paths must be a str"):
        ByteCorpus(42)
    for text in (b"Le texte", bytearray(b"Le texte")):  # the text itself, not a path
        with pytest.raises(AtomDataError) as e:
            ByteCorpus(text)
        assert str(e.value) == (
            "paths must be a str, an os.PathLike or a list of them, got 8 bytes: a ByteCorpus "
            "reads files; to score a text held in memory, give the str or bytes to "
            "atom_train.score_text"
        )


def test_only_empty_shards(write_shards):
    with pytest.raises(AtomDataError, match="the corpus is empty: every shard has 0 bytes"):
        ByteCorpus(write_shards([b"", b""]))


def test_a_directory(tmp_path):
    (tmp_path / "sub").mkdir()
    with pytest.raises(AtomDataError, match=r"sub is a directory: pass the files in it"):
        ByteCorpus(str(tmp_path / "*"))


def test_an_unreadable_file_is_an_os_error(tmp_path):
    link = tmp_path / "dangling.txt"
    link.symlink_to(tmp_path / "gone.txt")
    with pytest.raises(AtomDataIOError, match=r"cannot open .*dangling.txt") as e:
        ByteCorpus(str(link))
    assert isinstance(e.value, OSError) and isinstance(e.value, AtomDataError)


@pytest.mark.skipif(not can_drop_privileges(), reason="no user namespaces: root ignores modes")
def test_a_file_without_read_permission(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_bytes(b"x")
    path.chmod(0)

    def open_it() -> str:
        with pytest.raises(AtomDataIOError, match=r"cannot open .*secret.txt: Permission denied"):
            ByteCorpus(str(path))
        return "refused"

    # As an unprivileged user (even under root, as CI runs): the mode is real.
    assert run_unprivileged(open_it) == "refused"


def test_a_fifo_is_not_a_shard(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(AtomDataError, match="not a regular file"):
        ByteCorpus(str(tmp_path / "pipe"))


# --- stream arguments ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"B": 0}, "B must be an int >= 1, got 0"),
        ({"B": -3}, "B must be an int >= 1, got -3"),
        ({"B": True}, "B must be an int >= 1, got True"),
        ({"B": 2, "threads": 0}, "threads must be an int >= 1, got 0"),
        ({"B": 2, "pack_mode": "utf-8"}, "unknown pack mode 'utf-8': use 'utf8' or 'plain'"),
        ({"B": 2, "offsets": "odd"}, "offsets must be 'even', an int seed >= 0"),
        ({"B": 2, "offsets": -1}, "offsets must be 'even', an int seed >= 0"),
        ({"B": 2, "offsets": [1]}, "offsets has 1 entries but B = 2"),
        ({"B": 2, "offsets": [1, 10**6]}, r"offsets\[1\] = 1000000 is outside the corpus"),
        ({"B": 1, "offsets": [-5]}, r"offsets\[0\] = -5 is not an offset"),
    ],
)
def test_bad_stream_arguments(corpus, kwargs, message):
    with pytest.raises(AtomDataError, match=message):
        BatchedByteStream(corpus, **kwargs)


def test_corpus_must_be_a_byte_corpus():
    with pytest.raises(AtomDataError, match="corpus must be a ByteCorpus, got a str"):
        BatchedByteStream("data/*.txt", 4)


def test_unknown_pack_mode_in_encode_bytes():
    with pytest.raises(AtomDataError, match="unknown pack mode 'bytes'"):
        encode_bytes(b"abc", "bytes")


@pytest.mark.parametrize("k", [0, -1, 2.5, None])
def test_k_must_be_positive(corpus, k):
    stream = BatchedByteStream(corpus, 2)
    with pytest.raises(AtomDataError, match="K must be an int >= 1"):
        stream.next_window(k)
    with pytest.raises(AtomDataError, match="K must be an int >= 1"):
        stream.next_window_ids(k)


def good_out(k=4, b=2):
    return [
        np.zeros((k, b), np.uint8),
        np.zeros((k, b, 320), np.float32),
        np.zeros((k, b), np.uint8),
    ]


@pytest.mark.parametrize(
    ("index", "bad", "message"),
    [
        (1, np.zeros((4, 2, 320), np.float64), "got dtype float64"),
        (1, np.zeros((4, 3, 320), np.float32), r"got shape \[4, 3, 320\]"),
        (1, np.zeros((320, 2, 4), np.float32).T, "got a non-contiguous layout"),  # Fortran
        (1, np.zeros((4, 2, 640), np.float32)[:, :, ::2], "got a non-contiguous layout"),
        (0, np.zeros((4, 2), np.int8), "out cur must be .* uint8 array of shape \\[4, 2\\]"),
        (2, np.zeros(8, np.uint8), r"out tgt .* got shape \[8\]"),
        (1, [[0.0]], "got a list"),
    ],
)
def test_out_with_the_wrong_shape_dtype_or_layout(corpus, index, bad, message):
    stream = BatchedByteStream(corpus, 2)
    out = good_out()
    out[index] = bad
    before = stream.positions
    with pytest.raises(AtomDataError, match=message):
        stream.next_window(4, out=tuple(out))
    assert stream.positions == before


def test_out_must_be_writeable_distinct_and_a_tuple(corpus):
    stream = BatchedByteStream(corpus, 2)
    out = good_out()
    out[1].flags.writeable = False
    with pytest.raises(AtomDataError, match="out feats cannot be written"):
        stream.next_window(4, out=tuple(out))
    out = good_out()
    with pytest.raises(AtomDataError, match="do not overlap"):
        stream.next_window(4, out=(out[0], out[1], out[0]))
    with pytest.raises(AtomDataError, match="out must be a tuple"):
        stream.next_window(4, out=good_out())
    ids_out = (out[0], np.zeros((4, 2, 17), np.int32), out[2])
    with pytest.raises(AtomDataError, match=r"out ids must be .* int16"):
        stream.next_window_ids(4, out=ids_out)


def test_a_torch_tensor_as_out_gets_a_hint(corpus):
    torch = pytest.importorskip("torch")
    stream = BatchedByteStream(corpus, 2)
    out = good_out()
    out[1] = torch.zeros((4, 2, 320))
    with pytest.raises(AtomDataError, match=r"pass tensor.numpy\(\)"):
        stream.next_window(4, out=tuple(out))


# --- saved state --------------------------------------------------------------------------


def test_a_state_from_another_corpus_b_or_pack_mode(corpus, write_shards):
    state = BatchedByteStream(corpus, 2).state_dict()
    other = ByteCorpus(write_shards([b"autre chose"], name="other"))
    with pytest.raises(AtomDataError, match=r"saved on a different corpus .*shard 0 is"):
        BatchedByteStream(other, 2).load_state_dict(state)
    with pytest.raises(AtomDataError, match="it has B = 2 streams, this loader has B = 3"):
        BatchedByteStream(corpus, 3).load_state_dict(state)
    with pytest.raises(AtomDataError, match='saved with pack mode "utf8", this loader uses'):
        BatchedByteStream(corpus, 2, pack_mode="plain").load_state_dict(state)


def _set_position(s: dict, i: int, value: int) -> None:
    s["positions"] = s["positions"].copy()
    s["positions"][i] = value


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.update(version=3), "version 3; this atomdata reads versions 1 to 2"),
        (lambda s: s.update(version=0), "version 0; this atomdata reads versions 1 to 2"),
        (lambda s: s.update(version="2"), "version '2' is not a number"),
        (lambda s: s.update(feature_version=0), "feature version 0"),
        (lambda s: s.pop("format"), 'has no "format": it is not a loader state'),
        (lambda s: s.pop("positions"), 'has no "positions": it is not a loader state'),
        (lambda s: s.update(format="other"), 'format is "other"'),
        (lambda s: _set_position(s, 0, -1), r"positions\[0\] = -1 is not an offset"),
        (lambda s: _set_position(s, 1, 10**6), r"positions\[1\] = 1000000 is not an offset"),
        (lambda s: s.update(positions=[0]), "positions has 1 entries, not B = 2"),
        (lambda s: s.update(positions="ab"), "positions is not a list of B = 2 ints"),
        (lambda s: s.update(positions=np.zeros(2)), "positions is not a list of B = 2 ints"),
        (lambda s: s.update(B=object()), "B <object object at .*> is not a number"),
        (lambda s: s.update(B=True), "B True is not a number"),
        (lambda s: s.update(corpus_signature="x"), "corpus_signature 'x' is not a list of"),
    ],
)
def test_a_bad_state_is_refused_and_changes_nothing(corpus, edit, message):
    stream = BatchedByteStream(corpus, 2, offsets=5)
    state = stream.state_dict()
    edit(state)
    fresh = BatchedByteStream(corpus, 2)
    before = fresh.positions
    with pytest.raises(AtomDataError, match=message):
        fresh.load_state_dict(state)
    assert fresh.positions == before


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["contexts"][1].__setitem__(0, 11), r"contexts\[1\] prev_cls = 11"),
        (lambda s: s["contexts"][1].__setitem__(1, 2), r"contexts\[1\] need = 2 and lead"),
        (lambda s: s["contexts"].append([0] * 7), "contexts has 3 rows, not B = 2"),
        (lambda s: s.update(contexts="x"), "contexts is not a list of B = 2 rows"),
        (lambda s: s.pop("contexts"), 'has no "contexts": it is not a loader state'),
        # A reachable context, but not the one its position gives: not this corpus's state.
        (
            lambda s: s["contexts"][0].__setitem__(5, 1 - s["contexts"][0][5]),
            r"contexts\[0\] = \[.*\] is not the context the 64 bytes before positions\[0\] give",
        ),
    ],
)
def test_a_bad_format_1_state_is_refused_and_changes_nothing(corpus, edit, message):
    stream = BatchedByteStream(corpus, 2, offsets=5)
    stream.next_window(7)
    state = format_1(stream)
    BatchedByteStream(corpus, 2).load_state_dict(format_1(stream))  # the unedited one loads
    edit(state)
    fresh = BatchedByteStream(corpus, 2)
    before = fresh.positions
    with pytest.raises(AtomDataError, match=message):
        fresh.load_state_dict(state)
    assert fresh.positions == before


def test_a_state_without_a_version_is_version_1(corpus):
    """Format 1's first states had no "version": they are read as format 1 (with contexts)."""
    stream = BatchedByteStream(corpus, 2, offsets=5)
    stream.next_window(3)
    state = format_1(stream)
    del state["version"]
    fresh = BatchedByteStream(corpus, 2)
    fresh.load_state_dict(state)
    assert fresh.positions == stream.positions
    del state["contexts"]
    with pytest.raises(AtomDataError, match='has no "contexts"'):
        fresh.load_state_dict(state)


def test_the_header_check_says_what_loading_would(corpus, write_shards):
    """`check_state_dict` (what a resume checks before any stream is made) refuses what
    `load_state_dict` refuses of the header, with the same message, and reads no positions."""
    state = BatchedByteStream(corpus, 2).state_dict()
    other = ByteCorpus(write_shards([b"autre chose"], name="other"))
    cases = [(other, 2, "utf8"), (corpus, 3, "utf8"), (corpus, 2, "plain")]
    for c, B, mode in cases:
        with pytest.raises(AtomDataError) as checked:
            check_state_dict(state, c, B, pack_mode=mode)
        with pytest.raises(AtomDataError) as loaded:
            BatchedByteStream(c, B, pack_mode=mode).load_state_dict(state)
        assert str(checked.value) == str(loaded.value)
    without_positions = {k: v for k, v in state.items() if k != "positions"}
    check_state_dict(without_positions, corpus, 2)
    with pytest.raises(AtomDataError, match="version 7"):
        check_state_dict({**without_positions, "version": 7}, corpus, 2)


def test_states_of_loaders_that_differ_do_not_join(corpus):
    a = BatchedByteStream(corpus, 2).state_dict()
    b = BatchedByteStream(corpus, 3, pack_mode="plain").state_dict()
    with pytest.raises(AtomDataError, match="loader state 1 was not saved by a loader like"):
        join_state_dicts([a, b])
    with pytest.raises(AtomDataError, match="no loader states to join"):
        join_state_dicts([])


# --- shards that change under a running loader ----------------------------------------------


def changing_corpus(tmp_path):
    path = tmp_path / "shard.txt"
    path.write_bytes(b"abcdefgh" * 10_000)
    corpus = ByteCorpus(str(path))
    stream = BatchedByteStream(corpus, 2)
    stream.next_window(4)
    return path, stream


def test_a_truncated_shard_raises_instead_of_sigbus(tmp_path):
    path, stream = changing_corpus(tmp_path)
    before = stream.positions
    os.truncate(path, 100)
    with pytest.raises(AtomDataIOError, match="changed size from 80000 to 100 bytes") as e:
        stream.next_window(4)
    assert "restore it or restart with the new corpus" in str(e.value)
    assert isinstance(e.value, OSError)
    assert stream.positions == before  # nothing was read, the streams did not move
    with pytest.raises(AtomDataIOError):
        stream.next_tick()


def test_a_shard_that_grows_while_mapped(tmp_path):
    path, stream = changing_corpus(tmp_path)
    with open(path, "ab") as f:
        f.write(b"more")
    with pytest.raises(AtomDataIOError, match="changed size from 80000 to 80004 bytes"):
        stream.next_window_ids(4)


def test_a_shard_rewritten_in_place_with_the_same_size(tmp_path):
    path, stream = changing_corpus(tmp_path)
    time.sleep(0.01)
    path.write_bytes(b"ABCDEFGH" * 10_000)
    with pytest.raises(AtomDataIOError, match="was modified"):
        stream.next_window(4)


def test_a_shard_replaced_on_disk(tmp_path):
    path, stream = changing_corpus(tmp_path)
    new = tmp_path / "new.txt"
    new.write_bytes(b"abcdefgh" * 10_000)
    os.replace(new, path)
    with pytest.raises(AtomDataIOError, match="was replaced or removed on disk"):
        stream.next_window(4)


def test_a_resident_corpus_does_not_care(tmp_path):
    path = tmp_path / "shard.txt"
    path.write_bytes(b"abcdefgh" * 100)
    stream = BatchedByteStream(ByteCorpus(str(path), resident=True), 2)
    os.truncate(path, 0)
    cur, _, _ = stream.next_window(8)
    assert bytes(cur[:, 0]) == b"abcdefgh"
