"""One training window: what the trainer runs per BPTT window, and what the step bench times.

`WindowStep` runs the batched forward over the window, the backward, the gradient
reduction across ranks (distributed runs), gradient clipping, the AdamW step and the cut of
the graph, and returns the window's loss, byte CE and gradient norm **as device tensors**:
nothing here reads a device value on the host, so on CUDA the CPU can run ahead and queue
the next window while the GPU works. The trainer reads the values at log ticks only.

On the windows it is asked to measure, `NoiseProbe` also takes the two gradients of the
gradient noise scale (`atom_train.trainer.noise_scale`): over a subset of the streams and
over all of them, without changing what the step computes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from atom_train.model.batched import BatchedByteTick
from atom_train.trainer.noise_scale import harmonic_streams


@dataclass
class GradSplit:
    """One noise-scale measurement, on the training device (float64, 0-dim): the squared
    norms of the gradient over subsets of `b_small` streams (their mean) and over all
    `b_big` streams, both before clipping (the estimator: `noise_scale.estimate`)."""

    small_sq: Tensor  # in a world of ranks: this rank's; the log averages it over ranks
    big_sq: Tensor
    b_small: float  # streams per subset (for unequal subsets: `noise_scale.harmonic_streams`)
    b_big: int


@dataclass
class StepStats:
    """The outcome of one window, on the training device (0-dim tensors, detached)."""

    loss: Tensor  # mean loss over the window's ticks and streams
    byte_ce: Tensor  # mean byte CE, nats
    grad_norm: Tensor | None  # total gradient norm before clipping (None: clipping off)
    noise: GradSplit | None = None  # a noise-scale measurement (windows asked to measure)


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


def _sq_norm(tensors: list[Tensor]) -> Tensor:
    """sum |t|^2 over the tensors, in float64 (0-dim, on their device; no host read)."""
    return torch.stack([t.double().square().sum() for t in tensors]).sum()


class NoiseProbe:
    """The noise scale's two gradients on one window (`GradSplit`), before any clipping.

    - **One process**: the gradient over the first half of the streams (h = B // 2), by an
      extra forward and backward of those streams alone (`before_forward`) from a copy of
      their state at the window's start (`BatchedByteTick.substreams`) with the window's own
      masks, taken by `torch.autograd.grad`. Nothing the step uses is touched: not the
      parameters' .grad, not the optimizer, not a random generator (the masks come with the
      window), not the runtime's state (the window's own forward runs from it afterwards,
      as without the probe). With G_a that gradient and G the whole batch's (the step's own
      .grad, `after_reduce`), the other half's is G_b = (B G - h G_a) / (B - h), so both
      halves count: |G_small|^2 is the mean of |G_a|^2 and |G_b|^2. Cost: the half
      batch's forward and backward, 0.55 to 0.95 of a plain step on a CPU (measured at
      B = 4 to 256, K = 64; docs/tuning.md).
    - **A world of N ranks**: each rank's gradient before the all-reduce is the gradient
      over its own B/N streams (`before_reduce`); the all-reduce already averages them into
      G. |G_small|^2 is the mean over the ranks of |G_r|^2 (this rank's here; the log
      averages over ranks), b_small = B/N. Cost: two squared norms.
    """

    def __init__(self, runtime: BatchedByteTick, B: int, world_size: int = 1):
        self.runtime = runtime
        self.params = [p for p in runtime.model.parameters() if p.requires_grad]
        self.B, self.world_size = B, world_size
        if world_size > 1:
            self.b_small: float = B / world_size
        else:
            if B < 2:
                raise ValueError("the noise scale needs at least 2 streams to split")
            h = B // 2
            self.b_small = harmonic_streams([h, B - h])
        self._sub: list[Tensor] | None = None  # G_a (one process)
        self._local: Tensor | None = None  # |G_r|^2 (a world)

    def before_forward(self, feats: Tensor, tgt: Tensor, tick0: int, masks: Tensor | None):
        """One process: the gradient over the first half of the streams on this window."""
        if self.world_size > 1:
            return
        if masks is None:  # (drawing them here would move a generator the run uses)
            raise ValueError("the noise probe needs the window's last-atom masks")
        h = self.B // 2
        sub = self.runtime.substreams(0, h)
        out = sub.run_window(feats[:, :h], tgt[:, :h], tick0, masks=masks[:, :h])
        # (a parameter the window does not reach has no gradient: it counts as zero)
        grads = torch.autograd.grad(out.loss, self.params, allow_unused=True)
        self._sub = [
            torch.zeros_like(p) if g is None else g for g, p in zip(grads, self.params, strict=True)
        ]

    def before_reduce(self) -> None:
        """A world: this rank's own gradient, before the all-reduce averages it away."""
        if self.world_size > 1:
            self._local = _sq_norm(self._grads())

    def after_reduce(self) -> GradSplit:
        """The measurement, from the whole batch's gradient (now in .grad)."""
        G = self._grads()
        big = _sq_norm(G)
        if self.world_size > 1:
            if self._local is None:
                raise RuntimeError("after_reduce needs before_reduce's gradient of this window")
            small, self._local = self._local, None
        else:
            if self._sub is None:
                raise RuntimeError("after_reduce needs before_forward's half-batch gradient")
            h, B = self.B // 2, self.B
            d = [a.double() - g.double() for a, g in zip(self._sub, G, strict=True)]
            self._sub = None
            dd = torch.stack([x.square().sum() for x in d]).sum()
            gd = torch.stack([(g.double() * x).sum() for g, x in zip(G, d, strict=True)]).sum()
            r = h / (B - h)
            # G_a = G + d and G_b = G - r d, expanded; in float64, since the noise the
            # estimator reads, |G_small|^2 - |G_big|^2, is a small difference of these.
            sq_a = big + 2 * gd + dd
            sq_b = big - 2 * r * gd + r * r * dd
            small = (sq_a + sq_b) / 2
        return GradSplit(small_sq=small, big_sq=big, b_small=self.b_small, b_big=self.B)

    def _grads(self) -> list[Tensor]:
        return [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]


class WindowStep:
    """Forward, backward, (all-reduce,) clip, AdamW step, detach: one BPTT window; with a
    `NoiseProbe`, a noise-scale measurement on the windows asked for (`measure`)."""

    def __init__(
        self,
        runtime: BatchedByteTick,
        optimizer: torch.optim.Optimizer,
        grad_clip: float,
        reduce_grads: Callable[[], None] | None = None,
        probe: NoiseProbe | None = None,
    ) -> None:
        self.runtime = runtime
        self.optimizer = optimizer
        self.grad_clip = grad_clip
        self.reduce_grads = reduce_grads  # averages the gradients across ranks, in place
        self.params = [p for p in runtime.model.parameters() if p.requires_grad]
        self.probe = probe
        self._measuring = False
        self._noise: GradSplit | None = None

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def forward_backward(
        self,
        feats: Tensor,
        tgt: Tensor,
        tick0: int,
        masks: Tensor | None,
        measure: bool = False,
    ):
        """The window's forward and backward; returns the WindowResult (gradients in .grad).
        `measure`: also take a noise-scale measurement (needs the probe; `take_noise`)."""
        if measure and self.probe is None:
            raise ValueError("measure=True needs a NoiseProbe")
        self._measuring = measure
        if measure:
            self.probe.before_forward(feats, tgt, tick0, masks)
        out = self.runtime.run_window(feats, tgt, tick0, training=True, masks=masks)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        return out

    def update(self) -> Tensor | None:
        """Reduce, clip and apply the gradients; cut the graph. Returns the gradient norm."""
        self.reduce()
        return self.apply()

    def reduce(self) -> None:
        """Average the gradients across ranks (distributed runs; else nothing); a window
        asked to measure the noise scale reads the gradients on both sides of it."""
        if self._measuring:
            self.probe.before_reduce()
        if self.reduce_grads is not None:
            self.reduce_grads()
        if self._measuring:
            self._noise, self._measuring = self.probe.after_reduce(), False

    def apply(self) -> Tensor | None:
        """Clip and apply the (reduced) gradients; cut the graph. Returns the gradient norm."""
        grad_norm = clip_grad_norm(self.params, self.grad_clip) if self.grad_clip > 0 else None
        self.optimizer.step()
        self.runtime.detach_state()
        return grad_norm

    def take_noise(self) -> GradSplit | None:
        """The measurement of the last update (None if it measured nothing); once."""
        noise, self._noise = self._noise, None
        return noise

    def __call__(
        self,
        feats: Tensor,
        tgt: Tensor,
        tick0: int,
        masks: Tensor | None,
        lr: float,
        measure: bool = False,
    ) -> StepStats:
        self.set_lr(lr)
        out = self.forward_backward(feats, tgt, tick0, masks, measure)
        grad_norm = self.update()
        return StepStats(
            loss=out.loss.detach(),
            byte_ce=out.byte_ce,
            grad_norm=grad_norm,
            noise=self.take_noise(),
        )
