"""The byte cross-entropy of a whole window, fused with its gradient (`ByteCE`).

The [K*B, 256] logits are the largest tensors of a window; `ByteCE` never materialises them
whole (see its docstring). Used by `atom_train.model.batched.BatchedByteTick.run_window`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Rows per chunk. On a CPU, [512, 256] float32 logits stay in cache (measured: the chunked
# CE took a step from 52k to 61k bytes/CPU-s, docs/model.md); on a GPU the cost is launches,
# so a window goes in as few chunks as memory allows ([65536, 256] float32 = 64 MiB).
CHUNK_ROWS = {"cpu": 512, "cuda": 1 << 16}


class ByteCE(torch.autograd.Function):
    """scale * sum over rows of CE(X W + b, y), and the per-row CE (no gradient).

    The [rows, 256] logits are the largest tensors of a window, and every pass over them
    costs memory bandwidth. So the forward never materialises them whole: chunk by chunk it
    computes the logits, the CE and (when a gradient is wanted) the gradients of X, W and b,
    while the chunk is in cache; the backward only scales those by the incoming gradient
    (a no-op for the usual loss.backward()). Rows [0, frozen) of W (the frozen W0) get no
    gradient."""

    @staticmethod
    def forward(
        ctx, X, W, b, y, scale: float, frozen: int, need_grad: bool, logits_out, chunk: int
    ):
        N = X.shape[0]
        whole = chunk >= N  # one chunk: no slicing (on a GPU, the usual case: fewer launches)
        ce = None if whole else X.new_empty(N)
        if need_grad:
            gX = None if whole else torch.empty_like(X)
            gW, gb = torch.zeros_like(W), torch.zeros_like(b)
            WT_scaled = W.t() * scale
        for r0 in range(0, N, chunk):
            r1 = min(N, r0 + chunk)
            Xc, yc = (X, y) if whole else (X[r0:r1], y[r0:r1])
            yc = yc.unsqueeze(1)
            L = torch.addmm(b, Xc, W)
            if logits_out is not None:
                logits_out[r0:r1] = L
            L = F.log_softmax(L, 1)
            nll = L.gather(1, yc).squeeze(1)
            if whole:
                ce = nll.neg_()
            else:
                torch.neg(nll, out=ce[r0:r1])
            if need_grad:
                P = L.exp_()  # softmax; dCE/dlogits = softmax - onehot(y)
                P.scatter_add_(1, yc, P.new_full(yc.shape, -1.0))
                if whole:
                    gX = torch.mm(P, WT_scaled)
                else:
                    torch.mm(P, WT_scaled, out=gX[r0:r1])
                gW[frozen:].addmm_(Xc[:, frozen:].t(), P)
                gb.add_(P.sum(0))
        if need_grad:
            ctx.save_for_backward(gX, gW.mul_(scale), gb.mul_(scale))
        ctx.mark_non_differentiable(ce)
        return ce.sum() * scale, ce

    @staticmethod
    def backward(ctx, g, _gce):
        grads = ctx.saved_tensors
        # Usually g = 1 (loss.backward()): skip the scaling on a CPU, where reading g costs
        # nothing; on a GPU reading it would stall the stream, so scale unconditionally.
        if g.device.type != "cpu" or bool(g != 1):
            grads = [t * g for t in grads]
        return *grads, None, None, None, None, None, None
