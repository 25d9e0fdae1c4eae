"""The corpus builder's optional libraries: each is an extra of the package, imported only
when a build needs it, and missing ones are one line naming the extra to install.

    trafilatura = load("html")      # a UserError when absent: pip install 'atom-train[html]'
"""

from __future__ import annotations

import importlib
from types import ModuleType

from atom_train.common.cli import UserError

# extra -> (module imported, what needs it)
EXTRAS = {
    "html": ("trafilatura", "HTML inputs"),
    "language": ("py3langid.langid", "--language"),
    "neardup": ("rensa", "--near-dup"),
    "zstd": ("zstandard", ".zst inputs"),
}


def hint(extra: str) -> str:
    return f"pip install 'atom-train[{extra}]'"


def load(extra: str, what: str | None = None) -> ModuleType:
    """The extra's module, or a `UserError` naming the extra (`what` says who needs it)."""
    module, purpose = EXTRAS[extra]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UserError(
            f"{what or purpose} needs the {module.split('.')[0]} package, which is not "
            f"installed ({e.name or e}): {hint(extra)}"
        ) from None


def available(extra: str) -> bool:
    try:
        load(extra)
    except UserError:
        return False
    return True
