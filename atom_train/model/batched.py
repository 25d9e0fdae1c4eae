"""The batched tick: B byte streams of the field model in lockstep.

`BatchedByteTick(model, B)` holds the runtime state of B streams and runs windows of K ticks:

    bt = BatchedByteTick(model, B=128)
    out = bt.run_window(feats, tgt, tick0)   # feats [K,B,320] f32 (or ids [K,B,17] i16)
    out.loss.backward(); opt.step(); opt.zero_grad(); bt.detach_state()

It computes what `ReferenceModel.tick` computes for each stream (parity tests hold them
together within float32 rounding), organised for speed:

- the field is stored as real pairs `[Re z | Im z]` (2n floats per stream);
- everything that does not depend on the recurrent state runs once per window, as big
  matmuls over K*B rows: the compile of all drives, the atom embeddings, the readout and
  the losses over the stored fields (`ByteCE`: the byte CE and its gradient, chunk by
  chunk, without ever materialising the [K*B, 256] logits);
- only leak, RK4, phase sync, RMS cap and the amplitude controller run per tick, in one
  of the field loops of `atom_train.model.field_loops` (chosen by `recurrence`);
- atoms, consolidation and persistence do not feed back into the field, so they run after
  the loop, as a pass over the stored fields that touches only the ticks where something
  happens (a flush, a reset, a full buffer).

`recurrence` picks the field loop: "fused" (hand-written backward), "autograd" (the
readable cross-check), "compiled" (torch.compile of the fused steps), "triton" (one kernel
per window; the CUDA default), "native" (the loop in Rust; the CPU default). The window's lockstep schedule comes
from `atom_train.model.lockstep`, the byte CE from `atom_train.model.byte_ce`. docs/model.md has the
design, the measurements and the tolerances.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from atom_train.data.atomizer import FEATURE_DIM
from atom_train.model.byte_ce import CHUNK_ROWS, ByteCE
from atom_train.model.config import (
    COS_EPS,
    N_BYTES,
    PERSIST_LOSS_WEIGHT,
    FieldConsts,
    ModelConfig,
    UnsupportedOption,
    unimplemented_options,
)
from atom_train.model.devices import normalize_device
from atom_train.model.field_loops import LOOPS, RECURRENCES
from atom_train.model.lockstep import tick_events
from atom_train.model.reference import ReferenceModel, StreamState, draw_masks


def _on(x: Tensor, device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
    """`x` on `device` (and in `dtype`): a no-op without an operator when it already is."""
    if x.device == device and (dtype is None or x.dtype == dtype):
        return x
    return x.to(device=device, dtype=dtype, non_blocking=True)


class BatchedUnsupported(UnsupportedOption):
    """The config asks for an option that the batched tick does not implement."""


def check_batched_supported(config: ModelConfig) -> None:
    """Raise BatchedUnsupported naming every option set in `config` that the batched tick
    does not implement (nothing is silently ignored)."""
    problems = unimplemented_options(config)
    if problems:
        raise BatchedUnsupported("the batched tick does not implement: " + "; ".join(problems))


@dataclass
class WindowResult:
    loss: Tensor  # scalar with graph: mean over ticks and streams
    byte_ce: Tensor  # mean byte CE over the window, nats (0-dim, detached: no host sync)
    ticks: int
    logits: Tensor | None = None  # (K, B, 256), detached (return_details)
    len_logits: Tensor | None = None  # (K, B, max_len), detached (return_details)
    _ce: Tensor | None = field(default=None, repr=False)  # (K, B) byte CE per tick, detached
    _rest: Tensor | None = field(default=None, repr=False)  # (K, B) length CE + persistence
    _len: Tensor | None = field(default=None, repr=False)  # (K, B) length CE

    @property
    def tick_loss(self) -> Tensor:
        """(K, B) loss of each tick and stream, detached (computed when asked for: training
        does not need it)."""
        return self._ce + self._rest.detach()

    @property
    def len_ce(self) -> Tensor:
        """Mean length-head CE over the window, nats (0-dim, detached; computed when asked
        for)."""
        return self._len.detach().mean()

    @property
    def per_stream_loss(self) -> Tensor:
        """(B,) mean loss of each stream over the window's ticks, detached."""
        return self.tick_loss.mean(0)


class BatchedByteTick:
    """Runtime state of B streams and the windowed forward (see the module docstring).

    State (real pairs [Re | Im] for complex quantities): z [B,2n] (the only part carrying
    gradient), P [B,2n], E [B], g [B], e_buf [B,A,atom_dim], h_buf [B,A,2n], n_atoms [B].
    """

    def __init__(
        self,
        model: ReferenceModel,
        B: int,
        device: torch.device | str | None = None,
        recurrence: str = "fused",
    ) -> None:
        check_batched_supported(model.config)
        if B < 1:
            raise ValueError(f"B must be >= 1, got {B}")
        if recurrence not in RECURRENCES:
            raise ValueError(f"recurrence must be one of {RECURRENCES}, got {recurrence!r}")
        self.model = model
        self.config = model.config
        self.B = B
        self.recurrence = recurrence
        p = next(model.parameters())
        # As tensors name it ("cuda:0", not "cuda"), so that `_on` skips what is already there.
        self.device = normalize_device(device if device is not None else p.device)
        self.dtype = p.dtype
        # Rows per chunk of the byte CE: cache-sized on a CPU, launch-saving on a GPU.
        self.ce_chunk_rows = CHUNK_ROWS.get(self.device.type, CHUNK_ROWS["cpu"])
        cfg = self.config
        self._consts = FieldConsts.of(cfg)
        D, A = 2 * cfg.n_modes, cfg.n_atoms_max
        kw = {"dtype": self.dtype, "device": self.device}
        self.z = torch.zeros(B, D, **kw)
        self.P = torch.zeros(B, D, **kw)
        self.E = torch.zeros(B, **kw)
        self.g = torch.ones(B, **kw)
        self.e_buf = torch.zeros(B, A, cfg.atom_dim, **kw)
        self.h_buf = torch.zeros(B, A, D, **kw)
        # Atom counts live on the host: the post-pass decides on them without a device sync.
        self._n_atoms = np.zeros(B, dtype=np.int64)
        self._scalar_keep: Tensor | None = None  # 1 - leak for a scalar (config) leak
        self._w0r: tuple | None = None  # (buffer identity, W0 @ R)
        self._len_y: Tensor | None = None  # the length head's targets: all class 0
        self._pad_row: Tensor | None = None  # the embedding-bag table's padding row

    # ---- state management ----

    @property
    def n_atoms(self) -> Tensor:
        return torch.from_numpy(self._n_atoms.copy())

    def _mask(self, mask) -> np.ndarray:
        if mask is None:
            return np.ones(self.B, dtype=bool)
        m = np.asarray(mask.detach().cpu() if isinstance(mask, Tensor) else mask)
        if m.shape != (self.B,) or m.dtype != np.bool_:
            raise ValueError(
                f"mask must be a bool array of shape ({self.B},), got {m.dtype} {m.shape}"
            )
        return m

    def reset_state(self, mask=None) -> None:
        """Episode reset of the masked streams (all if None): z, P, E = 0, g = 1, atoms
        cleared without consolidation."""
        m = self._mask(mask)
        dm = torch.from_numpy(m).to(self.device)
        col = dm.unsqueeze(1)
        self.z = torch.where(col, 0.0, self.z)
        self.P = torch.where(col, 0.0, self.P)
        self.E = torch.where(dm, 0.0, self.E)
        self.g = torch.where(dm, 1.0, self.g)
        self._n_atoms[m] = 0

    def flush_atoms(self, mask=None) -> None:
        """Atom flush of the masked streams (all if None): consolidate the live atoms, then
        n_atoms = 0."""
        self._consolidate(self._mask(mask), self.E)

    def detach_state(self) -> None:
        """Cut the graph after the optimizer step (the end of a BPTT window). The field kept
        is a copy: `z` is a view of the window's last tick in Zs [K,B,2n], and a view would
        hold the whole of Zs (K times its own size: ~1 GB at B = 16384, K = 64, n = 128)
        alive until the next window has made its own."""
        self.z = self.z.detach().clone()

    def substreams(self, lo: int, hi: int) -> BatchedByteTick:
        """A new runtime over the same model holding a copy of streams [lo, hi)'s state
        (detached): it can run this runtime's next window on those streams without changing
        anything here (the gradient of a subset of the streams, for the noise scale)."""
        if not 0 <= lo < hi <= self.B:
            raise ValueError(f"streams [{lo}, {hi}) are not within [0, {self.B})")
        sub = BatchedByteTick(self.model, hi - lo, device=self.device, recurrence=self.recurrence)
        # (Every one is a copy: a window replaces z, P, E, g and writes into the buffers.)
        for name in ("z", "P", "E", "g", "e_buf", "h_buf"):
            setattr(sub, name, getattr(self, name)[lo:hi].detach().clone())
        sub._n_atoms = self._n_atoms[lo:hi].copy()
        return sub

    @torch.no_grad()
    def _consolidate(self, m: np.ndarray, E: Tensor) -> None:
        """Consolidate the masked streams with live atoms, using the energy EMA E [B]."""
        m = m & (self._n_atoms > 0)
        if not m.any():
            return
        cfg = self.config
        counts = self._n_atoms[m]
        L = int(counts.max())
        h = self.h_buf[:, :L]
        energy = (h * h).sum(-1) / cfg.n_modes  # mean |h|^2 over the modes
        chosen = energy >= cfg.consolidate_threshold * E.unsqueeze(1)
        if not (m.all() and (counts == L).all()):
            # Streams out of lockstep (masked resets or flushes): only the masked streams'
            # live atoms count. In training every stream has L atoms and this is skipped.
            live = np.arange(L)[None, :] < np.where(m, self._n_atoms, 0)[:, None]
            chosen &= torch.from_numpy(live).to(self.device)
        k = chosen.sum(1, keepdim=True, dtype=h.dtype)
        c = (h * chosen.unsqueeze(2)).sum(1) / k.clamp(min=1)
        rate = cfg.persist_rate
        self.P = torch.where(k > 0, rate * self.P + (1 - rate) * c, self.P)
        self._n_atoms[m] = 0

    @torch.no_grad()
    def _append(self, Zd: Tensor, ed: Tensor, a: int, b: int) -> None:
        """Append the atoms of window ticks [a, b) to every stream's buffers."""
        L = b - a
        if L <= 0:
            return
        n0 = self._n_atoms
        if (n0 == n0[0]).all():  # lockstep: one slice for all streams
            s = int(n0[0])
            self.h_buf[:, s : s + L] = Zd[a:b].transpose(0, 1)
            self.e_buf[:, s : s + L] = ed[a:b].transpose(0, 1)
        else:
            pos = torch.from_numpy(n0[:, None] + np.arange(L)[None, :]).to(self.device)
            rows = torch.arange(self.B, device=self.device).unsqueeze(1)
            self.h_buf[rows, pos] = Zd[a:b].transpose(0, 1)
            self.e_buf[rows, pos] = ed[a:b].transpose(0, 1)
        self._n_atoms += L

    def _atoms_pass(self, Zd: Tensor, ed: Tensor, Es: Tensor, E_in: Tensor, sched) -> Tensor:
        """Step 7 for a whole window, after the field loop (atoms never feed back into the
        field): append the atoms, apply the schedule's resets and flushes and the full-buffer
        consolidations, and return P after step 7 of every tick [K,B,2n].

        Zd, ed: the detached fields and atom embeddings of the window's ticks; Es: E after
        each tick; E_in: E entering the window; sched[t] = (reset, flush) before tick t."""
        K = Zd.shape[0]
        A = self.config.n_atoms_max
        everyone = np.ones(self.B, dtype=bool)
        segments = []  # (first tick, end tick, P): P after step 7 of those ticks
        p_from = 0
        pending = 0  # first tick whose atom is not yet in the buffers
        for t in range(K):
            reset, flush = sched[t]
            if reset or flush:
                self._append(Zd, ed, pending, t)
                pending = t
                segments.append((p_from, t, self.P))
                p_from = t
                if reset:  # clears the atoms without consolidating them
                    self.P = torch.zeros_like(self.P)
                    self._n_atoms[:] = 0
                if flush:  # uses E before this tick
                    self._consolidate(everyone, Es[t - 1] if t > 0 else E_in)
            if int(self._n_atoms.max()) + (t + 1 - pending) >= A:
                # Some buffer is full after this tick's append: consolidate it with E after
                # step 6 of this tick; the loss of this tick already sees the new P.
                self._append(Zd, ed, pending, t + 1)
                pending = t + 1
                segments.append((p_from, t, self.P))
                p_from = t
                self._consolidate(self._n_atoms >= A, Es[t])
        self._append(Zd, ed, pending, K)
        segments.append((p_from, K, self.P))
        parts = [P.unsqueeze(0).expand(b - a, -1, -1) for a, b, P in segments if b > a]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 0)

    # ---- the window ----

    def _field_coeffs(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """a = ar + i ai and C = Cr + i Ci, as the field loops take them."""
        m = self.model
        return -F.softplus(m.gamma), m.omega, m.C_re, m.C_im

    def _frozen_W0R(self) -> Tensor:
        """W0 @ R: both are frozen buffers, so the product is made once (again only if a
        buffer is replaced, e.g. by load_state_dict)."""
        m = self.model
        key = (m.W0.data_ptr(), m.R.data_ptr(), m.W0._version, m.R._version)
        if self._w0r is None or self._w0r[0] != key:
            self._w0r = (key, (m.W0 @ m.R).detach())
        return self._w0r[1]

    def _keep(self) -> Tensor:
        """keep = 1 - leak: a 0-dim tensor (scalar leak; made once, not per window), or [2n]."""
        m = self.model
        if m.field_leak_logit is None:
            if self._scalar_keep is None:
                self._scalar_keep = 1 - m.leak()
            return self._scalar_keep
        keep = 1 - m.leak()
        return torch.cat([keep, keep])

    def _inputs(self, feats: Tensor) -> tuple[Tensor, Tensor]:
        """Drives before the gain [K,B,2n] and atom embeddings [K,B,atom_dim] for the whole
        window: one matmul (dense features) or one embedding-sum (feature ids)."""
        m, D = self.model, 2 * self.config.n_modes
        K, B = feats.shape[:2]
        weight = torch.cat([m.compile.weight, m.atom.weight])  # [2n + atom_dim, 320]
        bias = torch.cat([m.compile.bias, m.atom.bias])
        if feats.dtype.is_floating_point:
            if feats.shape[2] != FEATURE_DIM:
                raise ValueError(f"feats must be [K,B,{FEATURE_DIM}], got {tuple(feats.shape)}")
            x = _on(feats, self.device, self.dtype)
            out = F.linear(x.reshape(K * B, FEATURE_DIM), weight, bias)
        else:
            # Compact ids: the indices of the features equal to 1, padded with 320.
            ids = _on(feats, self.device).reshape(K * B, -1).long()
            if self._pad_row is None:  # the row of the padding id 320: zeros, made once
                self._pad_row = weight.new_zeros(1, weight.shape[0])
            table = torch.cat([weight.t(), self._pad_row])
            out = F.embedding_bag(ids, table, mode="sum", padding_idx=FEATURE_DIM) + bias
        U = out[:, :D].reshape(K, B, D)
        e = torch.tanh(out[:, D:]).reshape(K, B, -1)
        return U, e

    def _masks(self, K, training, masks, generator) -> Tensor:
        B = self.B
        if masks is not None:
            masks = torch.as_tensor(masks)
            if tuple(masks.shape) != (K, B):
                raise ValueError(f"masks must be [K,B] = [{K},{B}], got {tuple(masks.shape)}")
        elif training:
            masks = draw_masks(torch.empty(K, B), self.config.last_atom_dropout, generator)
        else:
            return torch.ones(K, B, dtype=self.dtype, device=self.device)
        return _on(masks, self.device, self.dtype)

    def run_window(
        self,
        feats: Tensor,
        tgt: Tensor,
        tick0: int,
        training: bool = True,
        masks: Tensor | None = None,
        generator: torch.Generator | None = None,
        return_details: bool = False,
    ) -> WindowResult:
        """K ticks for the B streams: global ticks tick0 ... tick0 + K - 1, the lockstep
        schedule applied before each (reset if t % episode_length == 0, then flush if
        t % atom_flush_every == 0).

        feats: [K,B,320] float, or [K,B,J] integer feature ids padded with 320; tgt: [K,B]
        next bytes. Last-atom masks: explicit `masks` [K,B] (0/1) if given, else in training
        K draws of `torch.rand(B, generator=generator) >= last_atom_dropout` (generator: a CPU
        generator; None = torch's global one), else 1. The result's loss carries the graph;
        after backward and the optimizer step, call `detach_state()`.
        """
        cfg, model = self.config, self.model
        if feats.dim() != 3 or feats.shape[1] != self.B:
            raise ValueError(f"feats must be [K,{self.B},...], got {tuple(feats.shape)}")
        K, B, D = feats.shape[0], self.B, 2 * cfg.n_modes
        if K < 1:
            raise ValueError("a window needs at least one tick")
        if tuple(tgt.shape) != (K, B):
            raise ValueError(f"tgt must be [K,B] = [{K},{B}], got {tuple(tgt.shape)}")
        sched = tick_events(tick0, K, cfg.episode_length, cfg.atom_flush_every)
        m = self._masks(K, training, masks, generator)
        U, e = self._inputs(feats)
        resets = tuple(r for r, _ in sched)
        E_in = self.E
        ar, ai, Cr, Ci = self._field_coeffs()
        Zs, Es, g, E = LOOPS[self.recurrence](
            U, self.z, self._keep(), ar, ai, Cr, Ci, self.g, self.E, resets, self._consts
        )
        self.z, self.g, self.E = Zs[-1], g, E
        P_seq = self._atoms_pass(Zs.detach(), e.detach(), Es, E_in, sched)

        # Readout and losses for all K*B (tick, stream) pairs at once. a_hat = R v only feeds
        # linear maps (W0, the MLP's first layer, the length head): when jl_dim >= 2n it is
        # cheaper to fold R into them than to compute a_hat (the same map, other rounding).
        lin1, act, lin2 = model.mlp
        v = Zs.reshape(K * B, D)
        R = model.R
        if cfg.jl_dim >= D:
            x_in, W0, W1, W_len = v, self._frozen_W0R(), lin1.weight @ R, model.len_head.weight @ R
        else:
            x_in, W0, W1, W_len = v @ R.t(), model.W0, lin1.weight, model.len_head.weight
        hidden = act(F.linear(x_in, W1, lin1.bias))
        # logits = W0 a + alpha (W2 h + b2) + m (U e + c) as ONE matmul: the [K*B, 256]
        # logits are the biggest tensors here, and every pass over them costs.
        mf = m.reshape(K * B, 1)
        X = torch.cat([x_in, hidden, e.reshape(K * B, -1) * mf, mf], 1)
        W_out = torch.cat(
            [
                W0.t(),
                model.alpha * lin2.weight.t(),
                model.last_atom.weight.t(),
                model.last_atom.bias.unsqueeze(0),
            ]
        )
        y = _on(tgt, self.device).reshape(K * B).long()
        logits = X.new_empty(K * B, N_BYTES) if return_details else None
        need_grad = torch.is_grad_enabled() and (X.requires_grad or W_out.requires_grad)
        ce_mean, ce = ByteCE.apply(
            X,
            W_out,
            model.alpha * lin2.bias,
            y,
            1 / (K * B),
            x_in.shape[1],
            need_grad,
            logits,
            self.ce_chunk_rows,
        )
        len_logits = F.linear(x_in, W_len, model.len_head.bias)
        if self._len_y is None or self._len_y.numel() != K * B:
            self._len_y = torch.zeros(K * B, dtype=torch.long, device=self.device)
        len_y = self._len_y  # span 1: every target is class 0
        len_ce = F.cross_entropy(len_logits, len_y, reduction="none").view(K, B)
        live = (P_seq != 0).any(-1)  # the persistence term is exactly 0 while P = 0
        norms = torch.linalg.vector_norm(Zs, dim=-1) * torch.linalg.vector_norm(P_seq, dim=-1)
        cos = (Zs * P_seq).sum(-1) / norms.clamp(min=COS_EPS)
        persist = torch.where(live, PERSIST_LOSS_WEIGHT * (1 - cos), 0.0)
        rest = len_ce + persist
        out = WindowResult(
            loss=ce_mean + rest.mean(),
            byte_ce=ce.mean(),
            ticks=K,
            _ce=ce.view(K, B),
            _rest=rest,
            _len=len_ce,  # (detached when read: no operator in a training window)
        )
        if return_details:
            out.logits = logits.view(K, B, N_BYTES)
            out.len_logits = len_logits.detach().view(K, B, -1)
        return out

    # ---- runtime state (de)serialisation ----

    def state_dict(self) -> dict[str, Tensor]:
        """Everything needed to resume exactly, as plain contiguous CPU tensors (safetensors
        ready): z, P [B,2n] ([Re | Im]), E, g [B], n_atoms [B] int64, and the atom buffers
        e_buf [B,L,atom_dim], h_buf [B,L,2n] trimmed to the longest live prefix L."""
        L = int(self._n_atoms.max())

        def cpu(t: Tensor) -> Tensor:
            return t.detach().to("cpu", copy=True).contiguous()

        return {
            "z": cpu(self.z),
            "P": cpu(self.P),
            "E": cpu(self.E),
            "g": cpu(self.g),
            "n_atoms": torch.from_numpy(self._n_atoms.copy()),
            "e_buf": cpu(self.e_buf[:, :L]),
            "h_buf": cpu(self.h_buf[:, :L]),
        }

    def load_state_dict(self, d: dict[str, Tensor]) -> None:
        """Restore `state_dict()` output (tensors on any device; the CPU ones a checkpoint
        holds need no round trip); validates keys, B and shapes with a clear error."""
        cfg, B = self.config, self.B
        D, A = 2 * cfg.n_modes, cfg.n_atoms_max
        keys = {"z", "P", "E", "g", "n_atoms", "e_buf", "h_buf"}
        if set(d) != keys:
            raise ValueError(
                f"runtime state keys {sorted(d)} != expected {sorted(keys)} "
                "(was it saved by BatchedByteTick.state_dict?)"
            )
        if d["z"].dim() < 1 or d["z"].shape[0] != B:
            raise ValueError(
                f"runtime state is for B = {d['z'].shape[0] if d['z'].dim() else '?'} streams, "
                f"this BatchedByteTick has B = {B}"
            )
        L = d["h_buf"].shape[1] if d["h_buf"].dim() == 3 else -1
        want = {
            "z": (B, D),
            "P": (B, D),
            "E": (B,),
            "g": (B,),
            "n_atoms": (B,),
            "e_buf": (B, L, cfg.atom_dim),
            "h_buf": (B, L, D),
        }
        for k, shape in want.items():
            if tuple(d[k].shape) != shape:
                raise ValueError(
                    f"runtime state {k!r} has shape {tuple(d[k].shape)}, expected {shape} "
                    f"(B={B}, n_modes={cfg.n_modes}, atom_dim={cfg.atom_dim})"
                )
        n = d["n_atoms"].to("cpu", torch.int64).numpy()  # kept on the host (see __init__)
        if not 0 <= L <= A or (n < 0).any() or (n > L).any():
            raise ValueError(
                f"runtime state atom counts must lie in [0, {L}] with buffer length "
                f"L = {L} <= n_atoms_max = {A}"
            )
        kw = {"dtype": self.dtype, "device": self.device}
        self.z, self.P = d["z"].to(**kw), d["P"].to(**kw)
        self.E, self.g = d["E"].to(**kw), d["g"].to(**kw)
        self.e_buf = torch.zeros(B, A, cfg.atom_dim, **kw)
        self.h_buf = torch.zeros(B, A, D, **kw)
        self.e_buf[:, :L] = d["e_buf"].to(**kw)
        self.h_buf[:, :L] = d["h_buf"].to(**kw)
        self._n_atoms = n.copy()

    def stream_state(self, b: int) -> StreamState:
        """Stream b's state in the reference's form (complex, detached)."""
        n, A = self.config.n_modes, self.config.n_atoms_max
        ct = self.model.complex_dtype()

        def cx(t: Tensor) -> Tensor:
            return torch.complex(t[..., :n], t[..., n:]).to(ct)

        return StreamState(
            z=cx(self.z[b].detach()).clone(),
            P=cx(self.P[b]).clone(),
            E=self.E[b].clone(),
            g=self.g[b].clone(),
            e_buf=self.e_buf[b].clone(),
            h_buf=cx(self.h_buf[b, :A]).clone(),
            n_atoms=int(self._n_atoms[b]),
        )
