"""The precision of CUDA float32 matmuls: TF32 in the readout with the trainer's --tf32, IEEE
in the field loops whatever it says.

- `set_tf32_matmuls`: the process-wide switch (torch's two spellings of it, by version);
- `cuda_matmul_precision`: TF32 (or IEEE) inside a ``with``, the setting before restored;
- `readout_precision`: what a launch runs under (the trainer, tune, bench): TF32 on CUDA
  with --tf32, else nothing changed;
- `ieee_matmuls`: IEEE inside, on CUDA, for the field loops (phase sync divides by |sum of
  the modes|, which TF32's error would amplify from tick to tick: docs/model.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def set_tf32_matmuls(enabled: bool) -> None:
    """Allow (or forbid) TF32 in CUDA float32 matmuls: the trainer's --tf32, meant for the
    readout. The field loops forbid it for themselves (`ieee_matmuls`)."""
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):  # torch >= 2.9: mixing in the legacy flag is an error
        m.fp32_precision = "tf32" if enabled else "ieee"
    else:
        m.allow_tf32 = enabled


@contextlib.contextmanager
def cuda_matmul_precision(tf32: bool) -> Iterator[None]:
    """CUDA float32 matmuls in TF32 (or IEEE) inside; the process-wide setting before is
    restored on the way out, whatever happens inside."""
    m = torch.backends.cuda.matmul
    new = hasattr(m, "fp32_precision")
    before = m.fp32_precision if new else m.allow_tf32
    set_tf32_matmuls(tf32)
    try:
        yield
    finally:
        if new:
            m.fp32_precision = before
        else:
            m.allow_tf32 = before


def readout_precision(device: torch.device, tf32: bool) -> contextlib.AbstractContextManager:
    """A launch's process-wide precision: TF32 in the readout on CUDA with --tf32 (the field
    loops keep IEEE fp32 for themselves), restored on exit; elsewhere nothing changes."""
    if device.type == "cuda" and tf32:
        return cuda_matmul_precision(True)
    return contextlib.nullcontext()


@contextlib.contextmanager
def ieee_matmuls(device: torch.device) -> Iterator[None]:
    """IEEE float32 matmuls inside, whatever --tf32 says: phase sync divides by |sum of the
    modes|, which can be small, so TF32's ~1e-3 relative error in the loop's matmuls would be
    amplified from tick to tick (docs/model.md). A no-op off CUDA."""
    if device.type != "cuda":
        yield
        return
    with cuda_matmul_precision(False):
        yield
