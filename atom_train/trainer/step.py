"""One training window: what the trainer runs per BPTT window, and what the step bench times.

`WindowStep` runs the batched forward over the window, the backward, the gradient
reduction across ranks (distributed runs), gradient clipping, the AdamW step and the cut of
the graph, and returns the window's loss, byte CE and gradient norm **as device tensors**:
nothing here reads a device value on the host, so on CUDA the CPU can run ahead and queue
the next window while the GPU works. The trainer reads the values at log ticks only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from atom_train.model.batched import BatchedByteTick


@dataclass
class StepStats:
    """The outcome of one window, on the training device (0-dim tensors, detached)."""

    loss: Tensor  # mean loss over the window's ticks and streams
    byte_ce: Tensor  # mean byte CE, nats
    grad_norm: Tensor | None  # total gradient norm before clipping (None: clipping off)


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over the model's parameters, fused (one kernel for all parameters, on a CPU as on
    a GPU, and no host read of the step counters) where torch offers it, else multi-tensor."""
    params = list(model.parameters())
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, ValueError):  # an older torch, or a device without the fused kernel
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> Tensor:
    """Scale the gradients so that their total norm is at most `max_norm`; return the norm
    before clipping. The arithmetic of torch.nn.utils.clip_grad_norm_ (per-tensor norms, the
    norm of those, coef = max_norm / (norm + 1e-6) clamped at 1), in five operators for all
    parameters: torch's moves each per-tensor norm to one device first, one operator each."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    coef = (max_norm / (total + 1e-6)).clamp_(max=1.0)
    torch._foreach_mul_(grads, coef)
    return total


class WindowStep:
    """Forward, backward, (all-reduce,) clip, AdamW step, detach: one BPTT window."""

    def __init__(
        self,
        runtime: BatchedByteTick,
        optimizer: torch.optim.Optimizer,
        grad_clip: float,
        reduce_grads: Callable[[], None] | None = None,
    ) -> None:
        self.runtime = runtime
        self.optimizer = optimizer
        self.grad_clip = grad_clip
        self.reduce_grads = reduce_grads  # averages the gradients across ranks, in place
        self.params = [p for p in runtime.model.parameters() if p.requires_grad]

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def forward_backward(self, feats: Tensor, tgt: Tensor, tick0: int, masks: Tensor | None):
        """The window's forward and backward; returns the WindowResult (gradients in .grad)."""
        out = self.runtime.run_window(feats, tgt, tick0, training=True, masks=masks)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        return out

    def update(self) -> Tensor | None:
        """Reduce, clip and apply the gradients; cut the graph. Returns the gradient norm."""
        self.reduce()
        return self.apply()

    def reduce(self) -> None:
        """Average the gradients across ranks (distributed runs; else nothing)."""
        if self.reduce_grads is not None:
            self.reduce_grads()

    def apply(self) -> Tensor | None:
        """Clip and apply the (reduced) gradients; cut the graph. Returns the gradient norm."""
        grad_norm = clip_grad_norm(self.params, self.grad_clip) if self.grad_clip > 0 else None
        self.optimizer.step()
        self.runtime.detach_state()
        return grad_norm

    def __call__(
        self, feats: Tensor, tgt: Tensor, tick0: int, masks: Tensor | None, lr: float
    ) -> StepStats:
        self.set_lr(lr)
        out = self.forward_backward(feats, tgt, tick0, masks)
        grad_norm = self.update()
        return StepStats(loss=out.loss.detach(), byte_ce=out.byte_ce, grad_norm=grad_norm)
