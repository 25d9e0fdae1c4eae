"""atom: a batched trainer for byte-level recurrent field language models.

The few names a researcher uses from Python, loaded on first use (PEP 562): ``import
atom_train`` stays cheap and imports neither torch nor the native loader until a name that
needs them is touched.

    import atom_train as atom

    model, meta = atom.load_model("runs/demo")  # a checkpoint file, or a run folder's newest
    print(atom.generate(model, b"Bonjour", max_bytes=80, seed=0).decode(errors="replace"))
    val = atom.ByteCorpus("data/demo/val.txt")
    print(atom.score_text(model, val).val_bpb, "bits/byte")

The layers below this (``common``, ``data``, ``corpus``, ``model``, ``trainer``) and the
commands (``python -m atom_train.<command>``) are described in docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that owns it
_EXPORTS = {
    # data: the loader and the Atomizer oracle
    "ByteCorpus": "atom_train.data.loader",
    "BatchedByteStream": "atom_train.data.loader",
    "AtomDataError": "atom_train.data.loader",
    "Atomizer": "atom_train.data.atomizer",
    # corpus: a built corpus folder's train shards and val
    "open_corpus_dir": "atom_train.corpus.manifest",
    # model: config, parameters and reference, the batched tick, scoring, sampling
    "ModelConfig": "atom_train.model.config",
    "ReferenceModel": "atom_train.model.reference",
    "AtomNativeModel": "atom_train.model.network",  # (ReferenceModel's old name: one version)
    "BatchedByteTick": "atom_train.model.batched",
    "score_text": "atom_train.model.scoring",
    "generate": "atom_train.model.sampling",
    "Sampler": "atom_train.model.sampling",
    # trainer: a run's config, training, reading checkpoints
    "RunConfig": "atom_train.trainer.run_config",
    "Lifecycle": "atom_train.trainer.run_config",
    "train_run": "atom_train.train",
    "load_model": "atom_train.trainer.train_state",
    "load_checkpoint": "atom_train.trainer.checkpoint_file",
}
__all__ = [  # the same names as _EXPORTS (a test holds them equal), spelled out for tools
    "AtomDataError",
    "AtomNativeModel",
    "Atomizer",
    "BatchedByteStream",
    "BatchedByteTick",
    "ByteCorpus",
    "Lifecycle",
    "ModelConfig",
    "ReferenceModel",
    "RunConfig",
    "Sampler",
    "__version__",
    "generate",
    "load_checkpoint",
    "load_model",
    "open_corpus_dir",
    "score_text",
    "train_run",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads them
    from atom_train.corpus.manifest import open_corpus_dir
    from atom_train.data.atomizer import Atomizer
    from atom_train.data.loader import AtomDataError, BatchedByteStream, ByteCorpus
    from atom_train.model.batched import BatchedByteTick
    from atom_train.model.config import ModelConfig
    from atom_train.model.reference import ReferenceModel
    from atom_train.model.reference import ReferenceModel as AtomNativeModel
    from atom_train.model.sampling import Sampler, generate
    from atom_train.model.scoring import score_text
    from atom_train.train import train_run
    from atom_train.trainer.checkpoint_file import load_checkpoint
    from atom_train.trainer.run_config import Lifecycle, RunConfig
    from atom_train.trainer.train_state import load_model


def __getattr__(name: str) -> Any:
    owner = _EXPORTS.get(name)
    if owner is None:
        raise AttributeError(f"module 'atom_train' has no attribute {name!r}")
    value = getattr(importlib.import_module(owner), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
