"""The field model's config, parameters and single-stream reference."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from atom_train.data.atomizer import Atomizer
from atom_train.model.config import UNIMPLEMENTED_OPTIONS, ModelConfig, UnsupportedOption
from atom_train.model.reference import ReferenceModel

TEXT = "Le chat dort sur le tapis. Où est-il? À côté de l'hôtel!\nIl fait beau. ".encode() * 8


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def small_config(**kw) -> ModelConfig:
    base = dict(n_modes=8, jl_dim=16, mlp_hidden=24, atom_dim=4)
    base.update(kw)
    return ModelConfig(**base)


def feats_and_targets(config: ModelConfig, data: bytes = TEXT):
    feats = torch.from_numpy(Atomizer(config.pack_mode).encode_bytes(data[:-1]))
    return feats, torch.tensor(list(data[1:]))


# ---- config ----


def test_config_defaults_are_the_spec():
    c = ModelConfig()
    assert (c.n_modes, c.jl_dim, c.mlp_hidden, c.atom_dim) == (32, 64, 128, 16)
    assert (c.n_atoms_max, c.atom_flush_every, c.dt, c.field_leak) == (64, 32, 1.0, 0.05)
    assert (c.field_max_rms, c.amp_target, c.amp_rate) == (4.0, 1.0, 0.01)
    assert (c.persist_rate, c.consolidate_threshold, c.last_atom_dropout) == (0.9, 1.0, 0.5)
    assert (c.max_len, c.episode_length, c.pack_mode, c.feature_version) == (4, 4096, "utf8", 1)


def test_config_json_roundtrip_and_errors():
    c = small_config(learnable_leak=True, field_leak=0.2, pack_mode="plain")
    again = ModelConfig.from_json(json.dumps(c.to_dict()))
    assert again == c
    assert ModelConfig.from_dict({"dt": 1}).dt == 1.0  # an int where a float is expected
    assert ModelConfig.from_dict({}) == ModelConfig()  # a missing key takes its default
    with pytest.raises(ValueError, match=r"unknown model config key.*'n_mode'"):
        ModelConfig.from_dict({"n_mode": 3})
    with pytest.raises(ValueError, match="'n_modes' must be int"):
        ModelConfig.from_dict({"n_modes": "8"})
    with pytest.raises(ValueError, match="learnable_leak' must be bool"):
        ModelConfig.from_dict({"learnable_leak": 1})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"atom_flush_every": 0}, "atom_flush_every must be >= 1"),
        ({"episode_length": 0}, "episode_length must be >= 1"),
        ({"last_atom_dropout": 1.0}, "last_atom_dropout must be in"),
        ({"field_leak": 1.0}, "field_leak must be in"),
        ({"field_leak": 0.0, "learnable_leak": True}, "field_leak must be in \\(0, 1\\)"),
        ({"dt": 0.0}, "dt must be > 0"),
        ({"pack_mode": "latin1"}, "pack_mode must be one of"),
        ({"feature_version": 2}, "feature_version 2 is not supported"),
    ],
)
def test_config_validate(change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**change).validate()
    with pytest.raises(ValueError, match=message):
        ReferenceModel(ModelConfig(**change))


# ---- parameters ----


def test_parameters_are_real_named_and_shaped():
    c = small_config()
    m = ReferenceModel(c)
    n, shapes = c.n_modes, {k: tuple(v.shape) for k, v in m.named_parameters()}
    assert shapes == {
        "compile.weight": (2 * n, 320),
        "compile.bias": (2 * n,),
        "gamma": (n,),
        "omega": (n,),
        "C_re": (n, n),
        "C_im": (n, n),
        "atom.weight": (c.atom_dim, 320),
        "atom.bias": (c.atom_dim,),
        "alpha": (),
        "mlp.0.weight": (c.mlp_hidden, c.jl_dim),
        "mlp.0.bias": (c.mlp_hidden,),
        "mlp.2.weight": (256, c.mlp_hidden),
        "mlp.2.bias": (256,),
        "last_atom.weight": (256, c.atom_dim),
        "last_atom.bias": (256,),
        "len_head.weight": (c.max_len, c.jl_dim),
        "len_head.bias": (c.max_len,),
    }
    assert all(not p.is_complex() for p in m.parameters())
    buffers = {k: tuple(v.shape) for k, v in m.named_buffers()}
    assert buffers == {"R": (c.jl_dim, 2 * n), "W0": (256, c.jl_dim)}
    assert set(m.state_dict()) == set(shapes) | set(buffers)  # buffers are saved
    leaky = ReferenceModel(small_config(learnable_leak=True, field_leak=0.2))
    assert torch.allclose(torch.sigmoid(leaky.field_leak_logit), torch.full((n,), 0.2))


def test_same_config_builds_identical_models():
    c = small_config()
    a, b = ReferenceModel(c).state_dict(), ReferenceModel(c).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    other_init = ReferenceModel(dataclasses.replace(c, init_seed=1)).state_dict()
    assert not torch.equal(a["C_re"], other_init["C_re"])
    assert torch.equal(a["R"], other_init["R"]) and torch.equal(a["W0"], other_init["W0"])
    other_jl = ReferenceModel(dataclasses.replace(c, jl_seed=7)).state_dict()
    assert not torch.equal(a["R"], other_jl["R"])
    assert torch.equal(a["C_re"], other_jl["C_re"])


def test_unimplemented_options_are_rejected_by_the_reference():
    for name, (off, _) in UNIMPLEMENTED_OPTIONS.items():
        on = {int: 2, float: 0.5, str: "soft", bool: True}[type(off)]
        with pytest.raises(UnsupportedOption, match=name):
            ReferenceModel(ModelConfig(**{name: on}))


# ---- the reference tick ----


def test_tick_applies_phase_sync_cap_and_controller():
    c = small_config(field_max_rms=0.5)  # low enough that the cap is active
    m = ReferenceModel(c)
    feats, tgt = feats_and_targets(c)
    s = m.new_state()
    capped = 0
    with torch.no_grad():
        for t in range(40):
            m.apply_schedule(s, t)
            g_before = float(s.g)
            m.tick(s, feats[t], int(tgt[t]))
            total = s.z.sum()
            assert abs(float(total.imag)) <= 1e-5 * abs(total) and float(total.real) > 0
            rms = float((s.z.abs() ** 2).mean().sqrt())
            assert rms <= c.field_max_rms * (1 + 1e-5)
            capped += rms > c.field_max_rms * (1 - 1e-5)
            # The controller moves g toward amp_target / RMS, within [0.1, 10].
            step = float(s.g) / g_before
            assert (step <= 1) == (min(rms, c.field_max_rms) >= c.amp_target)
            assert 0.1 <= float(s.g) <= 10
    assert capped > 0


def test_schedule_reset_flush_and_full_buffer():
    c = small_config(atom_flush_every=6, n_atoms_max=4, episode_length=20, consolidate_threshold=0)
    m = ReferenceModel(c)
    feats, tgt = feats_and_targets(c)
    s = m.new_state()
    counts, persist = [], []
    with torch.no_grad():
        for t in range(22):
            m.apply_schedule(s, t)
            if t == 20:  # episode reset before the byte
                assert float(s.z.abs().max()) == 0 and float(s.P.abs().max()) == 0
                assert (float(s.E), float(s.g), s.n_atoms) == (0.0, 1.0, 0)
            m.tick(s, feats[t], int(tgt[t]))
            counts.append(s.n_atoms)
            persist.append(s.P.clone())
    # Atoms after each tick: a full buffer (4) consolidates at once; flushes at 6, 12, 18.
    assert counts[:8] == [1, 2, 3, 0, 1, 2, 1, 2]
    assert float(persist[2].abs().max()) == 0 and float(persist[3].abs().max()) > 0
    assert not torch.equal(persist[5], persist[6])  # the flush at tick 6 consolidated
    assert counts[20] == 1 and float(persist[20].abs().max()) == 0  # reset clears P


def test_consolidation_rule():
    c = small_config(consolidate_threshold=1.0, persist_rate=0.75)
    m = ReferenceModel(c)
    s = m.new_state()
    h = torch.zeros(3, c.n_modes, dtype=torch.complex64)
    h[0], h[1], h[2] = 2.0, 0.5j, 1 + 1j  # energies mean|h|^2: 4, 0.25, 2
    s.h_buf[:3], s.n_atoms, s.E = h, 3, torch.tensor(1.5)
    s.P = torch.full((c.n_modes,), 1j, dtype=torch.complex64)
    m.flush_stream(s)
    expect = 0.75 * 1j + 0.25 * (h[0] + h[2]) / 2  # atoms 0 and 2 pass 1.0 * E
    assert torch.allclose(s.P, expect) and s.n_atoms == 0
    s.h_buf[:1], s.n_atoms, s.E = 0.1, 1, torch.tensor(5.0)
    before = s.P.clone()
    m.flush_stream(s)  # nothing passes the threshold: P unchanged, buffer emptied
    assert torch.equal(s.P, before) and s.n_atoms == 0


def test_loss_parts_and_persistence_term():
    c = small_config()
    m = ReferenceModel(c)
    feats, tgt = feats_and_targets(c)
    s = m.new_state()
    out = m.tick(s, feats[0], int(tgt[0]), mask=1.0)
    a_hat = m.R @ torch.cat([s.z.real, s.z.imag])
    len_ce = torch.nn.functional.cross_entropy(m.len_head(a_hat), torch.tensor(0))
    # P = 0: the persistence term is exactly 0, not 0.05 * (1 - 0).
    assert out.loss.item() == pytest.approx((out.byte_ce + len_ce).item(), abs=1e-6)
    s.P = s.z.detach() * 2  # any non-zero P
    out2 = m.tick(s, feats[1], int(tgt[1]), mask=0.0)
    v = torch.cat([s.z.real, s.z.imag])
    p = torch.cat([s.P.real, s.P.imag])
    a_hat = m.R @ v
    len_ce = torch.nn.functional.cross_entropy(m.len_head(a_hat), torch.tensor(0))
    cos = (v @ p / (v.norm() * p.norm())).item()
    expect = (out2.byte_ce + len_ce).item() + 0.05 * (1 - cos)
    assert out2.loss.item() == pytest.approx(expect, abs=1e-5)
    # mask = 0 removes the last-atom readout from the logits
    logits0 = m.W0 @ a_hat + m.alpha * m.mlp(a_hat)
    assert torch.allclose(out2.logits, logits0, atol=1e-5)


def test_reference_window_draws_one_mask_per_tick():
    c = small_config()
    m = ReferenceModel(c)
    feats, tgt = feats_and_targets(c)
    gen = torch.Generator().manual_seed(3)
    m.reference_window(m.new_state(), feats[:10], tgt[:10], 0, generator=gen)
    expect = torch.Generator().manual_seed(3)
    for _ in range(10):
        torch.rand(1, generator=expect)
    assert torch.equal(gen.get_state(), expect.get_state())
    # inference: m = 1 and no draws
    gen2 = torch.Generator().manual_seed(3)
    with torch.no_grad():
        m.reference_window(m.new_state(), feats[:10], tgt[:10], 0, training=False, generator=gen2)
    assert torch.equal(gen2.get_state(), torch.Generator().manual_seed(3).get_state())


def _directional_check(loss_fn, params, directions=4, eps=1e-6, seed=0):
    """max relative error of autograd's directional derivative vs central differences."""
    loss = loss_fn()
    grads = torch.autograd.grad(loss, params)
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    for _ in range(directions):
        vs = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
        analytic = sum(float((g * v).sum()) for g, v in zip(grads, vs, strict=True))
        with torch.no_grad():
            for p, v in zip(params, vs, strict=True):
                p.add_(v, alpha=eps)
            up = float(loss_fn())
            for p, v in zip(params, vs, strict=True):
                p.add_(v, alpha=-2 * eps)
            down = float(loss_fn())
            for p, v in zip(params, vs, strict=True):
                p.add_(v, alpha=eps)
        numeric = (up - down) / (2 * eps)
        worst = max(worst, abs(numeric - analytic) / max(abs(numeric), 1e-8))
    return worst


def no_grad_state_frozen_config(**kw) -> ModelConfig:
    """A tiny config whose no-gradient runtime state (g, E, P) cannot depend on the
    parameters: amp_rate = 0 keeps g, persist_rate = 1 keeps P. Finite differences then
    measure exactly what autograd differentiates (only z carries gradient)."""
    base = dict(
        n_modes=3, jl_dim=4, mlp_hidden=5, atom_dim=2, n_atoms_max=3, atom_flush_every=4,
        field_max_rms=0.6, learnable_leak=True, episode_length=7, amp_rate=0.0,
        persist_rate=1.0,
    )  # fmt: skip
    base.update(kw)
    return ModelConfig(**base)


def test_reference_gradient_matches_finite_differences_float64():
    c = no_grad_state_frozen_config()
    m = ReferenceModel(c).double()
    feats, tgt = feats_and_targets(c)
    masks = torch.tensor([1.0, 0.0] * 6)

    def loss():
        # Ticks 1..12: an episode reset at 7, flushes at 4, 8, 12, a full buffer at 3.
        s = m.new_state()
        s.g = torch.tensor(1.5, dtype=torch.float64)
        s.P = torch.linspace(-1, 1, c.n_modes, dtype=torch.float64) * (1 + 0.5j)
        return m.reference_window(s, feats[:12].double(), tgt[:12], 1, masks=masks).loss

    params = [p for _, p in m.named_parameters()]
    assert _directional_check(loss, params) < 1e-6
