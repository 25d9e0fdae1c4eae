"""`data.sources.check_loader_state`, called directly: a checkpoint's loader state that does
not fit the corpus, B or pack mode of a resume is one `UserError` line naming the checkpoint,
the loader's reason and the fix (a new run from its weights); a state that fits passes."""

from __future__ import annotations

import pytest

from atom_train.common.cli import UserError
from atom_train.data.loader import BatchedByteStream, ByteCorpus
from atom_train.data.sources import check_loader_state

FIX = "To train these weights on this data, start a new run with --init"


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"Bonjour tout le monde. " * 20)
    return ByteCorpus(str(tmp_path / "a.txt"))


def refusal(state, corpus, B, mode, checkpoint) -> UserError:
    with pytest.raises(UserError) as e:
        check_loader_state(state, corpus, B, mode, checkpoint)
    assert e.value.__cause__ is None and e.value.__suppress_context__, "one line, no chain"
    return e.value


def test_a_state_that_fits_passes(corpus, tmp_path):
    for B, mode in ((2, "utf8"), (3, "plain")):
        state = BatchedByteStream(corpus, B, pack_mode=mode).state_dict()
        assert check_loader_state(state, corpus, B, mode, tmp_path / "final.safetensors") is None


def test_another_b_or_pack_mode_is_refused_with_the_fix(corpus):
    state = BatchedByteStream(corpus, 2).state_dict()
    e = refusal(state, corpus, 3, "utf8", "run/final.safetensors")
    assert str(e) == (
        "cannot resume run/final.safetensors: cannot load the loader state: it has B = 2 "
        f"streams, this loader has B = 3: resume with B = 2. {FIX} run/final.safetensors "
        "--output-dir NEW"
    )
    e = refusal(state, corpus, 2, "plain", "run/final.safetensors")
    assert str(e) == (
        "cannot resume run/final.safetensors: cannot load the loader state: it was saved with "
        'pack mode "utf8", this loader uses "plain": resume with pack_mode="utf8". '
        f"{FIX} run/final.safetensors --output-dir NEW"
    )
    plain = BatchedByteStream(corpus, 2, pack_mode="plain").state_dict()
    e = refusal(plain, corpus, 2, "utf8", "run/final.safetensors")
    assert 'saved with pack mode "plain", this loader uses "utf8"' in str(e)


def test_another_corpus_is_refused_and_a_path_with_a_space_is_quoted_in_the_fix(corpus, tmp_path):
    (tmp_path / "b.txt").write_bytes(b"autre chose")
    other = ByteCorpus(str(tmp_path / "b.txt"))
    state = BatchedByteStream(corpus, 2).state_dict()
    checkpoint = tmp_path / "my run" / "final.safetensors"
    e = refusal(state, other, 2, "utf8", checkpoint)
    assert str(e) == (
        f"cannot resume {checkpoint}: cannot load the loader state: it was saved on a "
        'different corpus (the state has 1 shards, this corpus 1; shard 0 is "a.txt" (460 '
        'bytes) in the state, "b.txt" (11 bytes) here): resume with the same corpus (--data) '
        f"or start a new run. {FIX} '{checkpoint}' --output-dir NEW"
    )
