"""The training device, named one way.

`normalize_device("cuda")` is ``cuda:<current index>``: tensors report their device's
index, so a device named without one compares unequal to the device they are on, and every
"already there?" check would copy (or dispatch a no-op ``aten::to``) for nothing. What
compares devices (the run plan, the runtime state, the prefetcher, the checkpoint's state)
holds the normalised form.
"""

from __future__ import annotations

import torch


def normalize_device(device: torch.device | str) -> torch.device:
    """`device` as tensors on it report theirs: ``cuda`` -> ``cuda:<current index>``,
    ``cpu:0`` -> ``cpu``; other devices as given."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if d.type == "cpu":
        return torch.device("cpu")
    return d
