"""The constants every field loop reads (`FieldConsts`), in a module of their own.

The torch loops (`field_loops`) and the Triton loop (`field_triton`) both take them; keeping
them here, below both, lets `field_loops` import `field_triton` (the registry) without an
import circle. Imports nothing of the project.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldConsts:
    """What a window's field loop needs besides tensors: the modes `n`, the RK4 step `dt`,
    the RMS cap, log of the amplitude target and the controller's rate."""

    n: int
    dt: float
    max_rms: float
    log_target: float
    amp_rate: float
