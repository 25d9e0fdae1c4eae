"""`data.sources`: the mark of a built corpus is the corpus layer's manifest (a sibling
layer, so the name is written twice and held equal here)."""

from __future__ import annotations

from atom_train.corpus.manifest import MANIFEST_NAME
from atom_train.data.sources import BUILT_MANIFEST


def test_a_built_corpus_is_recognised_by_the_corpus_layers_manifest_name():
    assert BUILT_MANIFEST == MANIFEST_NAME
