"""Scoring a model on text (`atom_train.model.scoring`): the definition of a validation score."""

from __future__ import annotations

import math

import pytest
import torch

from atom_train.data.loader import ByteCorpus
from atom_train.data.synthetic import synthetic_text
from atom_train.model.config import ModelConfig
from atom_train.model.reference import ReferenceModel
from atom_train.model.sampling import sample_text
from atom_train.model.scoring import score_text

CFG = ModelConfig(n_modes=8, jl_dim=16, mlp_hidden=32, atom_dim=8, episode_length=64)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("score") / "val.txt"
    path.write_bytes(synthetic_text(4000, seed=3))
    return ByteCorpus(str(path))


def _score(model, corpus, K=16, streams=4, n_bytes=1024):
    return score_text(
        model, corpus, streams=streams, n_bytes=n_bytes, K=K, device=torch.device("cpu"),
        recurrence="fused",
    )  # fmt: skip


def test_the_same_model_on_the_same_text_gets_the_same_score(text):
    model = ReferenceModel(CFG)
    a, b = _score(model, text), _score(model, text)
    assert a == b and a.bytes_scored == 1024
    assert model.training, "the model is handed back in training mode"
    assert 0 < a.val_bpb < 9 and a.loss > 0


def test_the_score_does_not_depend_on_the_window_length(text):
    """Windows only cut backprop: without gradients, K = 16 and K = 5 run the same ticks
    from the same state (float32; the readout batches K*B rows: 1e-5 relative)."""
    model = ReferenceModel(CFG)
    assert _score(model, text, K=5).val_bpb == pytest.approx(
        _score(model, text, K=16).val_bpb, rel=1e-5
    )


def test_bytes_scored_are_whole_ticks_of_every_stream(text):
    assert _score(ReferenceModel(CFG), text, streams=3, n_bytes=1000).bytes_scored == 999


def test_samples_are_deterministic_text():
    model = ReferenceModel(CFG)
    a = sample_text(model, CFG, "Bonjour", 30)
    assert a == sample_text(model, CFG, "Bonjour", 30)  # a fixed seed: the same continuation
    assert a != sample_text(model, CFG, "Bonjour", 30, seed=1)
    assert len(a.encode("utf-8", errors="surrogateescape")) <= 3 * 30


def test_a_model_that_predicts_nothing_scores_8_bits_per_byte(text):
    """With the byte readout and the length head zeroed, every byte has probability 1/256
    and every span length 1/max_len: the score is known exactly, 8 bits/byte (the length
    CE ln(max_len)), whatever the text and the state."""
    model = ReferenceModel(CFG)
    with torch.no_grad():
        for t in (model.W0, model.alpha, *model.last_atom.parameters(),
                  *model.len_head.parameters()):  # fmt: skip
            t.zero_()
    s = _score(model, text)
    assert s.bytes_scored == 1024
    assert s.val_bpb == pytest.approx(8.0, abs=1e-5)
    assert s.len_ce == pytest.approx(math.log(CFG.max_len), rel=1e-6)
    # The loss adds the persistence term (>= 0, small here) to the two CEs.
    ces = 8.0 * math.log(2) + math.log(CFG.max_len)
    assert ces - 1e-5 <= s.loss <= ces + 0.01


def test_a_text_in_memory_scores_as_the_file_of_its_bytes(text, tmp_path):
    """score_text of a str (its UTF-8 bytes) or bytes: exactly the score of a file holding
    those bytes; anything else is one error naming what it takes."""
    torch.manual_seed(0)
    model = ReferenceModel(CFG)
    raw = synthetic_text(4000, seed=3)

    def score(t):  # (a short score: the text's path into the loader is what is tested)
        return score_text(model, t, streams=4, n_bytes=128, K=16, recurrence="autograd")

    want = score(text)
    assert score(raw) == want and score(raw.decode("utf-8")) == want
    with pytest.raises(TypeError, match=r"scores a ByteCorpus .*, a str or bytes, not a int"):
        score_text(model, 42)


def test_the_library_scores_with_the_loop_the_commands_choose(text, monkeypatch):
    """score_text's default ("auto") is the commands' choice (`model.backend`): on a CPU the
    native loop where the extension has it, so a notebook's figure is eval's to the last
    digit, at eval's speed; "auto" is resolved once, by the one rule."""
    from atom_train.model import backend, field_loops

    model = ReferenceModel(CFG)
    chosen = backend.resolve_recurrence("auto", torch.device("cpu"), CFG)
    assert chosen == ("native" if field_loops.available("native", torch.device("cpu")) else "fused")
    kw = {"streams": 4, "n_bytes": 1024, "K": 16}
    assert score_text(model, text, **kw) == score_text(model, text, recurrence=chosen, **kw)
    asked = []
    real = backend.resolve_recurrence
    monkeypatch.setattr(
        backend, "resolve_recurrence", lambda *a, **k: asked.append(a[0]) or real(*a, **k)
    )
    score_text(model, text, **kw)
    score_text(model, text, recurrence="fused", **kw)
    assert asked == ["auto"]
