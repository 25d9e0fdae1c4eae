"""What torch's CUDA sync debug mode would catch, seen on any device: `HostTraffic`, a
dispatch mode that records every operator which, on a GPU, makes the host wait for it.

On CUDA those are: a value read to the host (`.item()`, `bool()`, `float()`, `if t:`:
aten._local_scalar_dense), a copy between host memory and the device that is not
`non_blocking` (torch then synchronizes the stream: a tensor copied to the CPU, or host data
copied to the device such as `torch.tensor(v, device=...)` and `x.new_tensor([...])`, which
reach the dispatcher as aten.lift_fresh of a tensor already on the device), and operators
whose output size depends on the data (nonzero, masked_select, unique: the size is read back).
On the meta device the same Python code dispatches the same operators without a GPU, so a
test that runs the trainer's window on meta tensors inside `HostTraffic` proves, on a CPU,
what tests/scenarios/test_cuda.py's sync-debug test proves on a GPU.
"""

from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# Operators whose output size is data-dependent: on CUDA they read a count back to the host.
_DATA_DEPENDENT = ("aten.nonzero", "aten.masked_select", "aten._unique", "aten.unique")


def _where() -> str:
    """The innermost frame of the project's code that dispatched the operator."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        if "/atom_train/" in frame.filename:
            return f"{frame.filename.split('/atom_train/')[-1]}:{frame.lineno} {frame.line}"
    return "?"


class HostTraffic(TorchDispatchMode):
    """Records (operator, where) for every operator that would make the host wait for a GPU,
    on tensors of any device but the CPU (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        devices = {t.device.type for t in ins + outs}
        on_device = bool(devices - {"cpu"})
        wait = False
        if name.startswith("aten._local_scalar_dense"):
            wait = on_device
        elif name.startswith(("aten.lift_fresh",)):
            wait = on_device  # host data copied to the device
        elif name.startswith(("aten._to_copy", "aten.copy_")):
            blocking = not (kwargs.get("non_blocking") or (len(args) > 2 and args[2] is True))
            wait = blocking and "cpu" in devices and on_device
        elif name.startswith(_DATA_DEPENDENT):
            wait = on_device
        if wait:
            self.waits.append((name, _where()))
        return out
