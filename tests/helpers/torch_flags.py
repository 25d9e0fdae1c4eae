"""torch's process-wide float32 precision settings, read and put back (the test fixture
`conftest.keep_precision_flags` restores them after every test that changes them).

What ``--tf32`` and its kin change for the whole process: the float32 precision of matmuls,
convolutions and RNNs per backend (``torch.backends.*.fp32_precision``), the legacy flags
beside them (``torch.set_float32_matmul_precision``, ``allow_tf32``), the reduced-precision
reductions and cuDNN's switches. A test that trains on CUDA with ``--tf32`` in process
would otherwise leave TF32 on for every later test of the process (a CUDA-vs-CPU parity
test at 1e-4 would then see TF32's 1e-3).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# (backend, operation) pairs of torch's float32 precision settings (torch >= 2.9), parents
# first: setting a parent also sets its children, so they are restored after it.
_FP32_PRECISION = (
    ("generic", "all"),
    ("cuda", "all"),
    ("mkldnn", "all"),
    ("cuda", "matmul"),
    ("cuda", "conv"),
    ("cuda", "rnn"),
    ("mkldnn", "matmul"),
    ("mkldnn", "conv"),
    ("mkldnn", "rnn"),
)
_CUDNN = ("enabled", "benchmark", "deterministic")
_REDUCED = ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction")


def _legacy_flags() -> dict[str, tuple]:
    """The legacy settings: name -> (getter, setter)."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    return {
        "float32_matmul_precision": (
            torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision,
        ),
        "cuda.matmul.allow_tf32": (
            lambda: matmul.allow_tf32,
            lambda v: setattr(matmul, "allow_tf32", v),
        ),
        "cudnn.allow_tf32": (lambda: cudnn.allow_tf32, lambda v: setattr(cudnn, "allow_tf32", v)),
    }


def precision_flags() -> dict[str, object]:
    """torch's process-wide float32 precision settings now (for `restore_precision_flags`).

    A legacy setting that cannot be read is left out: torch >= 2.9 keeps the legacy flags
    beside the per-backend precisions and refuses to read one once the two disagree."""
    flags: dict[str, object] = {}
    for name, (get, _) in _legacy_flags().items():
        value = _read(get)
        if value is not None:
            flags[name] = value
    if hasattr(torch._C, "_get_fp32_precision_getter"):
        for backend, op in _FP32_PRECISION:
            flags[f"{backend}.{op}"] = torch._C._get_fp32_precision_getter(backend, op)
    for name in _REDUCED:
        flags[f"cuda.matmul.{name}"] = getattr(torch.backends.cuda.matmul, name)
    for name in _CUDNN:
        flags[f"cudnn.{name}"] = getattr(torch.backends.cudnn, name)
    return flags


def restore_precision_flags(flags: dict[str, object]) -> None:
    """Put back the settings `precision_flags()` returned: the legacy ones first (setting
    one also sets per-backend precisions), then the per-backend ones, parents first (setting
    a parent sets its children). Only what differs is set: torch warns on some legacy
    setters, and a restore that changes nothing should say nothing."""
    for name, (get, set_) in _legacy_flags().items():
        if name in flags and _read(get) != flags[name]:
            set_(flags[name])
    for backend, op in _FP32_PRECISION:
        key = f"{backend}.{op}"
        if key in flags and torch._C._get_fp32_precision_getter(backend, op) != flags[key]:
            torch._C._set_fp32_precision_setter(backend, op, flags[key])
    for name in _REDUCED:
        setattr(torch.backends.cuda.matmul, name, flags[f"cuda.matmul.{name}"])
    for name in _CUDNN:
        setattr(torch.backends.cudnn, name, flags[f"cudnn.{name}"])


def _read(get) -> object:
    """A legacy setting's value; None when torch refuses to read it (the APIs disagree)."""
    try:
        return get()
    except RuntimeError:
        return None


@contextlib.contextmanager
def kept_precision_flags() -> Iterator[None]:
    """Inside, change torch's precision settings at will; on leaving, they are as before."""
    saved = precision_flags()
    try:
        yield
    finally:
        if precision_flags() != saved:
            restore_precision_flags(saved)
