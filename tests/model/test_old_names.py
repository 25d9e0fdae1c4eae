"""The reference model's old names (`atom_train.model.network`, `AtomNativeModel`) still work
for one version, each with a DeprecationWarning that names the new one."""

from __future__ import annotations

import importlib

import pytest

import atom_train
from atom_train.model.reference import ReferenceModel, ReferenceWindow, draw_masks


def test_the_old_module_and_class_name_the_reference_model():
    network = importlib.import_module("atom_train.model.network")
    with pytest.warns(DeprecationWarning, match=r"model\.reference\.ReferenceModel now"):
        assert network.AtomNativeModel is ReferenceModel
    with pytest.warns(DeprecationWarning, match=r"model\.reference\.draw_masks now"):
        assert network.draw_masks is draw_masks
    with pytest.warns(DeprecationWarning):
        assert network.ReferenceWindow is ReferenceWindow
    with pytest.raises(AttributeError):
        network.NoSuchName  # noqa: B018
    with pytest.warns(DeprecationWarning):
        assert atom_train.AtomNativeModel is ReferenceModel
    assert atom_train.ReferenceModel is ReferenceModel
