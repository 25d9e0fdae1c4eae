"""One training window (`atom_train.train_step`) on a stand-in runtime whose loss and
gradients are known in closed form: the order of its parts (backward, reduction across
ranks, clipping, AdamW, the cut of the graph) and what each one does."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from atom_train.trainer.step import StepStats, WindowStep, clip_grad_norm, make_optimizer


class LinearRuntime:
    """loss = sum(w * feats) + 0 * b: the gradient of w is `feats`, b gets a zero gradient,
    and `frozen` (requires_grad False) none. Records its calls."""

    def __init__(self) -> None:
        self.model = torch.nn.Module()
        self.model.w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
        self.model.b = torch.nn.Parameter(torch.tensor([0.5]))
        self.model.frozen = torch.nn.Parameter(torch.tensor([7.0]), requires_grad=False)
        self.calls: list[str] = []

    def run_window(self, feats, tgt, tick0, training, masks):
        self.calls.append(f"window tick0={tick0} training={training} tgt={tgt} masks={masks}")
        loss = (self.model.w * feats).sum() + 0.0 * self.model.b.sum()
        return SimpleNamespace(loss=loss, byte_ce=loss.detach() * 2)

    def detach_state(self) -> None:
        self.calls.append("detach")


def test_the_optimizer_is_adamw_with_the_runs_rate_and_decay():
    model = torch.nn.Linear(2, 2)
    opt = make_optimizer(model, 3e-3, 0.05)
    assert isinstance(opt, torch.optim.AdamW)
    (group,) = opt.param_groups
    assert group["lr"] == 3e-3 and group["weight_decay"] == 0.05
    assert group["fused"] or group["foreach"]
    assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]


def test_clipping_is_torchs_arithmetic_and_returns_the_norm_before_it():
    torch.manual_seed(0)
    params = [torch.zeros(5, requires_grad=True), torch.zeros(2, 3, requires_grad=True)]
    grads = [torch.randn(5) * 3, torch.randn(2, 3) * 3]
    ours = [p.clone().detach().requires_grad_() for p in params]
    for p, q, g in zip(params, ours, grads, strict=True):
        p.grad, q.grad = g.clone(), g.clone()
    want = torch.nn.utils.clip_grad_norm_(params, 1.0)
    got = clip_grad_norm(ours, 1.0)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    assert got.item() == pytest.approx(torch.cat([g.reshape(-1) for g in grads]).norm().item())
    for p, q in zip(params, ours, strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-6, atol=0)
    # Under the bound the gradients are left as they are (coefficient clamped at 1).
    small = torch.zeros(2, requires_grad=True)
    small.grad = torch.tensor([0.3, 0.4])
    assert clip_grad_norm([small], 1.0).item() == pytest.approx(0.5)
    assert small.grad.tolist() == pytest.approx([0.3, 0.4])


def test_a_window_reduces_then_clips_then_steps_at_the_given_rate():
    rt = LinearRuntime()
    opt = make_optimizer(rt.model, 1.0, 0.0)
    seen = {}

    def reduce_grads():  # a world of two whose other rank had twice these gradients
        seen["grad_at_reduce"] = rt.model.w.grad.clone()
        rt.model.w.grad.mul_(1.5)
        rt.calls.append("reduce")

    step = WindowStep(rt, opt, grad_clip=1.0, reduce_grads=reduce_grads)
    assert [id(p) for p in step.params] == [id(rt.model.w), id(rt.model.b)]
    feats = torch.tensor([3.0, 0.0, -4.0])
    w0 = rt.model.w.detach().clone()
    stats = step(feats, "the targets", 32, "the masks", lr=0.01)
    assert isinstance(stats, StepStats)
    window = "window tick0=32 training=True tgt=the targets masks=the masks"
    assert rt.calls == [window, "reduce", "detach"]
    assert seen["grad_at_reduce"].tolist() == [3.0, 0.0, -4.0]  # the backward came first
    # The norm is taken after the reduction (1.5 x 5) and before clipping.
    assert stats.grad_norm.item() == pytest.approx(7.5)
    assert rt.model.w.grad.norm().item() == pytest.approx(1.0, rel=1e-5)  # clipped to 1
    assert all(g["lr"] == 0.01 for g in opt.param_groups)
    # AdamW's first step moves each weight by lr against the sign of its gradient (the
    # moments' ratio is +-1; 0 where the gradient is 0).
    assert (rt.model.w.detach() - w0).tolist() == pytest.approx([-0.01, 0.0, 0.01], abs=1e-6)
    assert stats.loss.item() == pytest.approx(3.0 * 1 + (-4.0) * 3) and not stats.loss.requires_grad
    assert stats.byte_ce.item() == pytest.approx(2 * stats.loss.item())
    assert rt.model.frozen.item() == 7.0 and rt.model.frozen.grad is None


def test_the_rate_is_set_on_every_window_and_clipping_can_be_off():
    rt = LinearRuntime()
    opt = make_optimizer(rt.model, 5.0, 0.0)
    opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})
    step = WindowStep(rt, opt, grad_clip=0.0)
    feats = torch.tensor([30.0, 0.0, -40.0])
    stats = step(feats, None, 0, None, lr=0.25)
    assert stats.grad_norm is None
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.25]
    assert rt.model.w.grad.tolist() == [30.0, 0.0, -40.0]  # not clipped
    step.set_lr(0.125)
    assert [g["lr"] for g in opt.param_groups] == [0.125, 0.125]


def test_a_window_measures_the_noise_scale_only_when_asked_and_only_with_a_probe():
    rt = LinearRuntime()
    step = WindowStep(rt, make_optimizer(rt.model, 1e-3, 0.0), grad_clip=1.0)
    feats = torch.tensor([1.0, 2.0, 3.0])
    with pytest.raises(ValueError) as e:
        step(feats, None, 0, None, lr=1e-3, measure=True)
    assert str(e.value) == "measure=True needs a NoiseProbe"
    step.forward_backward(feats, None, 0, None)  # (no measurement unless asked)
    step.update()
    assert step.take_noise() is None
    assert step(feats, None, 0, None, lr=1e-3).noise is None


def test_without_the_fused_kernel_the_optimizer_is_the_multi_tensor_adamw(monkeypatch):
    real = torch.optim.AdamW

    def no_fused(params, **kw):
        if kw.get("fused"):
            raise RuntimeError("fused AdamW is not supported here")
        return real(params, **kw)

    monkeypatch.setattr(torch.optim, "AdamW", no_fused)
    model = torch.nn.Linear(2, 2)
    opt = make_optimizer(model, 3e-3, 0.05)
    (group,) = opt.param_groups
    assert group["lr"] == 3e-3 and group["weight_decay"] == 0.05
    assert group["foreach"] is True and not group["fused"]
    assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]


def test_a_norm_at_the_bound_is_scaled_by_torchs_coefficient():
    """coef = max_norm / (norm + 1e-6), clamped at 1: a norm of exactly the bound is scaled
    down by 1 / (1 + 1e-6), as torch does."""
    p = torch.zeros(2, requires_grad=True)
    p.grad = torch.tensor([0.6, 0.8])
    q = p.detach().clone().requires_grad_()
    q.grad = p.grad.clone()
    torch.nn.utils.clip_grad_norm_([q], 1.0)
    clip_grad_norm([p], 1.0)
    assert torch.equal(p.grad, q.grad) and p.grad[1].item() < 0.8


def test_a_parameter_unused_in_a_window_is_not_stepped_in_it():
    """Gradients are freed between windows (set to None, not zeroed): a parameter the next
    window does not use has no gradient there, and AdamW leaves it (and its moments) alone
    instead of moving it on its momentum."""

    class Alternating(LinearRuntime):
        def run_window(self, feats, tgt, tick0, training, masks):
            loss = (self.model.w * feats).sum()
            if tick0 == 0:  # b is used in the first window only
                loss = loss + 3.0 * self.model.b.sum()
            return SimpleNamespace(loss=loss, byte_ce=loss.detach())

    rt = Alternating()
    opt = make_optimizer(rt.model, 0.1, 0.01)
    step = WindowStep(rt, opt, grad_clip=0.0)
    feats = torch.tensor([1.0, 1.0, 1.0])
    step(feats, None, 0, None, lr=0.1)
    b_after_first = rt.model.b.detach().clone()
    step(feats, None, 16, None, lr=0.1)
    assert rt.model.b.grad is None
    assert torch.equal(rt.model.b.detach(), b_after_first)
    assert int(opt.state[rt.model.b]["step"]) == 1 and int(opt.state[rt.model.w]["step"]) == 2


# ---- no host sync in a window, proven on the meta device ----------------------------------


def _stub_triton_launches(monkeypatch):
    """The Triton loop's host code as it runs on a GPU, its two launches made no-ops (meta
    tensors have no memory for a kernel): what remains is everything the host does per
    window around them."""
    from atom_train.model import field_triton as ft

    class NoLaunch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    monkeypatch.setattr(ft, "field_fwd_kernel", NoLaunch())
    monkeypatch.setattr(ft, "field_bwd_kernel", NoLaunch())
    monkeypatch.setattr(ft, "INTERPRETED", True)  # (the launcher's device check: not CUDA)


@pytest.mark.parametrize("recurrence", ["triton", "fused"])
@pytest.mark.parametrize("leak", ["scalar", "learnable"])
def test_a_window_on_a_device_never_makes_the_host_wait_for_it(recurrence, leak, monkeypatch):
    """The trainer's window (`WindowStep` with the noise probe measuring: the half batch's
    own runtime, forward, backward, the estimate, clipping) on the meta device, under
    `HostTraffic`: no operator that would make the host wait for a GPU (a value read back, a
    blocking copy from or to host memory, a data-dependent size), in either leak mode, with
    the Triton loop (its launches stubbed) and the fused one (auto's fallback on CUDA).
    Windows cross an episode reset and atom flushes. (AdamW's own step is the fused CUDA
    kernel, which meta tensors cannot run: tests/scenarios/test_cuda.py covers it.)"""
    pytest.importorskip("triton")
    from helpers.host_traffic import HostTraffic

    from atom_train.model.batched import BatchedByteTick
    from atom_train.model.config import ModelConfig
    from atom_train.model.reference import ReferenceModel
    from atom_train.trainer.step import NoiseProbe

    if recurrence == "triton":
        _stub_triton_launches(monkeypatch)
    config = ModelConfig(
        n_modes=8, jl_dim=16, mlp_hidden=32, atom_dim=8, learnable_leak=leak == "learnable",
        episode_length=16, atom_flush_every=4,
    )  # fmt: skip
    meta = torch.device("meta")
    model = ReferenceModel(config).to(meta)
    B, K = 6, 8
    runtime = BatchedByteTick(model, B, device=meta, recurrence=recurrence)
    optimizer = make_optimizer(model, 1e-3, 0.01)
    monkeypatch.setattr(optimizer, "step", lambda: None)
    step = WindowStep(runtime, optimizer, 1.0, probe=NoiseProbe(runtime, B))
    ids = torch.zeros(K, B, 17, dtype=torch.int32, device=meta)  # the CUDA transport
    tgt = torch.zeros(K, B, dtype=torch.uint8, device=meta)
    masks = torch.ones(K, B, device=meta)
    for tick0 in (0, 8, 16, 24):  # (a reset at 16; flushes every 4)
        with HostTraffic() as traffic:
            stats = step(ids, tgt, tick0, masks, 1e-3, measure=True)
        assert traffic.waits == [], traffic.waits
        assert stats.noise is not None and stats.loss.device == meta
