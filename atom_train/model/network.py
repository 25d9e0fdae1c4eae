"""The old home of the single-stream reference model, kept for one version: the model is
`atom_train.model.reference.ReferenceModel` now (``AtomNativeModel`` was its old name; the
"native" loop is the Rust one, `model.field_native`). Importing from here still works, with
a DeprecationWarning."""

from __future__ import annotations

import warnings
from typing import Any

from atom_train.model import reference as _reference

_RENAMED = {"AtomNativeModel": "ReferenceModel"}


def __getattr__(name: str) -> Any:
    new = _RENAMED.get(name, name)
    value = getattr(_reference, new)  # (AttributeError for a name neither module has)
    warnings.warn(
        f"atom_train.model.network.{name} is atom_train.model.reference.{new} now; the old "
        "name goes in the next version",
        DeprecationWarning,
        stacklevel=2,
    )
    return value
