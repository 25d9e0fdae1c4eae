"""The field model's parameters and its single-stream reference (the oracle); the config is
`atom_train.model.config`.

`ReferenceModel` owns the parameters and the frozen buffers. Two implementations run it:

- the **reference** in this module: one stream, complex dtype, one tick at a time, written to
  be read beside docs/design.md#the-model-one-tick-steps-1-9. It is the oracle for the fast
  path and the path chat uses;
- the **batched tick** (`atom_train.model.batched.BatchedByteTick`): B streams in lockstep, windows
  of K ticks, the field stored as real pairs. Parity tests hold the two together.

Example (train the reference on one window of text, tick by tick)::

    from atom_train.data.atomizer import Atomizer
    cfg = ModelConfig(n_modes=8)
    model = ReferenceModel(cfg)
    data = b"hello world. " * 4
    feats = torch.from_numpy(Atomizer(cfg.pack_mode).encode_bytes(data[:-1]))
    tgt = torch.tensor(list(data[1:]))
    state = model.new_state()
    out = model.reference_window(state, feats, tgt, tick0=0, generator=torch.Generator())
    out.loss.backward()
    state.detach()
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from atom_train.data.atomizer import FEATURE_DIM
from atom_train.model.config import (
    AMP_LOG_FLOOR,
    COS_EPS,
    DRIVE_BIAS_INIT,
    ENERGY_DECAY,
    GAIN_MAX,
    GAIN_MIN,
    MAX_ACTIVE_FEATURES,
    N_BYTES,
    PERSIST_LOSS_WEIGHT,
    PHASE_SYNC_MIN,
    ModelConfig,
    UnsupportedOption,
    unimplemented_options,
)
from atom_train.model.lockstep import is_flush, is_reset


def draw_masks(
    out: Tensor, p: float, generator: torch.Generator | None, B_all: int | None = None, lo: int = 0
) -> Tensor:
    """Fill `out` [K, B] with the last-atom masks m of K ticks (readout, step 8) and return it.

    Per tick, in tick order, one draw ``torch.rand(B_all, generator=generator) >= p`` on the
    CPU (generator None: torch's global one), of which `out` takes the columns [lo, lo + B):
    CPU and CUDA runs, a B = 1 stream and the reference, and the ranks of a distributed run
    (each taking its own streams' columns of the global draw) all see the same masks."""
    K, B = out.shape
    B_all = B if B_all is None else B_all
    for k in range(K):
        out[k].copy_((torch.rand(B_all, generator=generator) >= p)[lo : lo + B])
    return out


@dataclass
class StreamState:
    """Runtime state of one stream. Only `z` carries gradient."""

    z: Tensor  # complex (n,): the field
    P: Tensor  # complex (n,): persistence
    E: Tensor  # real scalar: energy EMA
    g: Tensor  # real scalar: amplitude gain
    e_buf: Tensor  # (n_atoms_max, atom_dim): atom embeddings
    h_buf: Tensor  # complex (n_atoms_max, n): the field at each atom
    n_atoms: int = 0

    def detach(self) -> None:
        """Cut the graph at the end of a BPTT window."""
        self.z = self.z.detach()


@dataclass
class TickOutput:
    logits: Tensor  # (256,)
    len_logits: Tensor  # (max_len,)
    loss: Tensor | None  # scalar: byte CE + length CE + persistence term (target given)
    byte_ce: Tensor | None  # scalar, nats


@dataclass
class ReferenceWindow:
    loss: Tensor  # mean over the window's ticks, with graph
    byte_ce: float  # mean byte CE in nats, detached
    losses: Tensor  # (K,) per-tick loss, detached
    logits: Tensor  # (K, 256), detached


class ReferenceModel(nn.Module):
    """Parameters and frozen buffers of the field model, plus the single-stream reference.

    All parameters are real tensors. Initialisation draws from a `torch.Generator` seeded with
    `config.init_seed` (parameters) and `config.jl_seed` (the frozen `R`, `W0`), so two models
    built from one config are identical.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        config.validate()
        bad = unimplemented_options(config)
        if bad:
            raise UnsupportedOption("the field model does not implement: " + "; ".join(bad))
        self.config = config
        n, cfg = config.n_modes, config
        self.compile = nn.Linear(FEATURE_DIM, 2 * n)  # drive u: [real | imag]
        self.gamma = nn.Parameter(torch.empty(n))  # decay: Re a = -softplus(gamma)
        self.omega = nn.Parameter(torch.empty(n))  # frequency: Im a = omega
        self.C_re = nn.Parameter(torch.empty(n, n))
        self.C_im = nn.Parameter(torch.empty(n, n))
        if cfg.learnable_leak:
            self.field_leak_logit = nn.Parameter(torch.empty(n))
        else:
            self.register_parameter("field_leak_logit", None)
        self.atom = nn.Linear(FEATURE_DIM, cfg.atom_dim)
        self.alpha = nn.Parameter(torch.empty(()))
        self.mlp = nn.Sequential(
            nn.Linear(cfg.jl_dim, cfg.mlp_hidden), nn.GELU(), nn.Linear(cfg.mlp_hidden, N_BYTES)
        )
        self.last_atom = nn.Linear(cfg.atom_dim, N_BYTES)
        self.len_head = nn.Linear(cfg.jl_dim, cfg.max_len)
        self.register_buffer("R", torch.empty(cfg.jl_dim, 2 * n))
        self.register_buffer("W0", torch.empty(N_BYTES, cfg.jl_dim))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        cfg, n = self.config, self.config.n_modes
        gen = torch.Generator().manual_seed(cfg.init_seed)

        def uniform_(t: Tensor, bound: float) -> None:
            t.copy_((torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound)

        # Input layers see at most MAX_ACTIVE_FEATURES ones: that is their real fan-in.
        uniform_(self.compile.weight, 0.5 / math.sqrt(MAX_ACTIVE_FEATURES))
        # A coherent real drive in every mode keeps the sum of the modes away from 0, where
        # the phase-sync angle (step 4 of the tick) is ill-conditioned and amplifies rounding.
        self.compile.bias.zero_()
        self.compile.bias[:n] = DRIVE_BIAS_INIT
        # Decay rates log-spaced over [0.05, 0.5] per tick (several memory time scales), small
        # random frequencies, small coupling: the field is stable under RK4 with dt = 1.
        decay = torch.logspace(math.log10(0.05), math.log10(0.5), n, dtype=torch.float64)
        self.gamma.copy_(torch.log(torch.expm1(decay)))  # softplus^-1
        uniform_(self.omega, 0.5)
        uniform_(self.C_re, 0.1 / math.sqrt(n))
        uniform_(self.C_im, 0.1 / math.sqrt(n))
        if self.field_leak_logit is not None:
            lam = cfg.field_leak
            self.field_leak_logit.fill_(math.log(lam / (1 - lam)))
        uniform_(self.atom.weight, 1 / math.sqrt(MAX_ACTIVE_FEATURES))
        self.atom.bias.zero_()
        self.alpha.fill_(1.0)
        for lin in (self.mlp[0], self.mlp[2], self.last_atom, self.len_head):
            bound = 1 / math.sqrt(lin.in_features)
            uniform_(lin.weight, bound)
            uniform_(lin.bias, bound)
        jl = torch.Generator().manual_seed(cfg.jl_seed)
        self.R.copy_(torch.randn(self.R.shape, generator=jl, dtype=torch.float64))
        self.R.div_(math.sqrt(cfg.jl_dim))
        self.W0.copy_(torch.randn(self.W0.shape, generator=jl, dtype=torch.float64))
        self.W0.div_(math.sqrt(cfg.jl_dim))

    @property
    def compile(self) -> nn.Linear:  # type: ignore[override]
        """The compile layer W_u, b_u (parameters `compile.weight`, `compile.bias`).

        This shadows `nn.Module.compile` (in-place torch.compile), which this model does not
        offer: use `torch.compile(model)` if ever needed."""
        return self._modules["compile"]  # type: ignore[return-value]

    # ---- field coefficients (shared by both implementations) ----

    def leak(self) -> Tensor:
        """lambda: a 0-dim tensor (scalar config value), or (n,) sigmoid(field_leak_logit).
        The scalar is filled on its device (`torch.full`: a kernel), not copied from the host:
        a copy from host memory to a GPU waits for it, and a runtime made per window (the
        noise probe's) asks for it every window."""
        if self.field_leak_logit is not None:
            return torch.sigmoid(self.field_leak_logit)
        return torch.full(
            (), self.config.field_leak, dtype=self.gamma.dtype, device=self.gamma.device
        )

    def complex_dtype(self) -> torch.dtype:
        return torch.complex128 if self.gamma.dtype == torch.float64 else torch.complex64

    # ---- the reference: one stream, complex dtype ----

    def new_state(self) -> StreamState:
        """A stream in the reset state."""
        cfg, n, ct = self.config, self.config.n_modes, self.complex_dtype()
        dev, rt = self.gamma.device, self.gamma.dtype
        return StreamState(
            z=torch.zeros(n, dtype=ct, device=dev),
            P=torch.zeros(n, dtype=ct, device=dev),
            E=torch.zeros((), dtype=rt, device=dev),
            g=torch.ones((), dtype=rt, device=dev),
            e_buf=torch.zeros(cfg.n_atoms_max, cfg.atom_dim, dtype=rt, device=dev),
            h_buf=torch.zeros(cfg.n_atoms_max, n, dtype=ct, device=dev),
            n_atoms=0,
        )

    def reset_stream(self, s: StreamState) -> None:
        """Episode reset: z, P, E = 0, g = 1, atoms cleared WITHOUT consolidation."""
        fresh = self.new_state()
        s.z, s.P, s.E, s.g, s.n_atoms = fresh.z, fresh.P, fresh.E, fresh.g, 0

    @torch.no_grad()
    def consolidate(self, s: StreamState) -> None:
        """Atoms with energy mean|h|^2 >= threshold * E are averaged into c; if any,
        P <- rate * P + (1 - rate) * c. Then the buffer is emptied."""
        h = s.h_buf[: s.n_atoms]
        energy = (h.real**2 + h.imag**2).mean(dim=-1)
        chosen = h[energy >= self.config.consolidate_threshold * s.E]
        if len(chosen) > 0:
            rate = self.config.persist_rate
            s.P = rate * s.P + (1 - rate) * chosen.mean(dim=0)
        s.n_atoms = 0

    def flush_stream(self, s: StreamState) -> None:
        """Atom flush: consolidate the live atoms, then n_atoms = 0."""
        if s.n_atoms > 0:
            self.consolidate(s)

    def apply_schedule(self, s: StreamState, tick: int) -> None:
        """The lockstep schedule (`atom_train.model.lockstep`), before the byte of global tick
        `tick`."""
        if is_reset(tick, self.config.episode_length):
            self.reset_stream(s)
        if is_flush(tick, self.config.atom_flush_every):
            self.flush_stream(s)

    def tick(
        self, s: StreamState, x: Tensor, target: int | Tensor | None = None, mask: float = 1.0
    ) -> TickOutput:
        """One tick, steps 1-9 of docs/design.md, for features `x` (320,); updates `s` in place.

        `mask` is the last-atom readout mask m (0 or 1). The schedule is not applied here:
        call `apply_schedule` first.
        """
        cfg, n = self.config, self.config.n_modes
        x = x.to(self.gamma.dtype)
        # 1. compile: u = g * (W_u x + b_u) as C^n (g from before this tick's update).
        w = self.compile(x)
        u = s.g * torch.complex(w[:n], w[n:])
        # 2. leak.
        z = s.z * (1 - self.leak())
        # 3. one RK4 step of f(z) = a z + u + C phi(z).
        a = torch.complex(-F.softplus(self.gamma), self.omega)
        C = torch.complex(self.C_re, self.C_im)

        def f(z: Tensor) -> Tensor:
            return a * z + u + C @ (z / (1 + z.abs()))

        h = cfg.dt
        k1 = f(z)
        k2 = f(z + h / 2 * k1)
        k3 = f(z + h / 2 * k2)
        k4 = f(z + h * k3)
        z = z + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        # 4. phase sync.
        total = z.sum()
        if total.abs() > PHASE_SYNC_MIN:
            z = z * total.conj() / total.abs()
        # 5. RMS cap.
        r = (z.real**2 + z.imag**2).mean().sqrt()
        if r > cfg.field_max_rms:
            z = z * (cfg.field_max_rms / r)
        s.z = z
        # 6. amplitude controller (no gradient), with r' the RMS after the cap.
        with torch.no_grad():
            r_cap = r.detach().clamp(max=cfg.field_max_rms)
            step = cfg.amp_rate * (math.log(cfg.amp_target) - r_cap.clamp(min=AMP_LOG_FLOOR).log())
            s.g = (s.g * step.exp()).clamp(GAIN_MIN, GAIN_MAX)
            s.E = ENERGY_DECAY * s.E + (1 - ENERGY_DECAY) * r_cap**2
        # 7. atom: append (e, z), consolidate when the buffer is full.
        e = torch.tanh(self.atom(x))
        with torch.no_grad():
            s.e_buf[s.n_atoms] = e
            s.h_buf[s.n_atoms] = z
            s.n_atoms += 1
            if s.n_atoms == cfg.n_atoms_max:
                self.consolidate(s)
        # 8. hard readout.
        v = torch.cat([z.real, z.imag])
        a_hat = self.R @ v
        logits = self.W0 @ a_hat + self.alpha * self.mlp(a_hat) + mask * self.last_atom(e)
        len_logits = self.len_head(a_hat)
        if target is None:
            return TickOutput(logits, len_logits, None, None)
        # 9. loss: byte CE + length CE + persistence (exactly 0 while P = 0).
        target = torch.as_tensor(target, device=logits.device).long()
        byte_ce = F.cross_entropy(logits, target)
        len_target = torch.zeros((), dtype=torch.long, device=logits.device)  # span 1: class 0
        loss = byte_ce + F.cross_entropy(len_logits, len_target)
        p = torch.cat([s.P.real, s.P.imag])
        if bool((p != 0).any()):
            norms = torch.linalg.vector_norm(v) * torch.linalg.vector_norm(p)
            cos = (v @ p) / norms.clamp(min=COS_EPS)
            loss = loss + PERSIST_LOSS_WEIGHT * (1 - cos)
        return TickOutput(logits, len_logits, loss, byte_ce)

    def reference_window(
        self,
        s: StreamState,
        feats: Tensor,
        targets: Tensor,
        tick0: int,
        training: bool = True,
        generator: torch.Generator | None = None,
        masks: Tensor | None = None,
    ) -> ReferenceWindow:
        """K ticks of one stream, tick by tick: the schedule, then the tick, for global ticks
        tick0 ... tick0 + K - 1. Returns the mean loss with its graph; the caller does the
        backward, the optimizer step and `s.detach()`.

        Last-atom masks: explicit `masks` (K,), else in training `draw_masks` for one stream
        (the batched tick draws B per tick: the same numbers at B = 1); at inference m = 1.
        """
        K = feats.shape[0]
        if masks is None and training:
            masks = draw_masks(torch.empty(K, 1), self.config.last_atom_dropout, generator)
        losses, logits, ces = [], [], []
        for k in range(K):
            self.apply_schedule(s, tick0 + k)
            m = float(masks[k]) if masks is not None else 1.0
            out = self.tick(s, feats[k], int(targets[k]), mask=m)
            losses.append(out.loss)
            ces.append(out.byte_ce.detach())
            logits.append(out.logits.detach())
        loss = torch.stack(losses).mean()
        return ReferenceWindow(
            loss=loss,
            byte_ce=float(torch.stack(ces).mean()),
            losses=torch.stack(losses).detach(),
            logits=torch.stack(logits),
        )
