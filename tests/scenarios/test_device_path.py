"""The trainer's device path without a GPU: resume and fork restore onto the `meta` device,
and windows train there.

A meta tensor has a device and a shape but no data: reading one on the host (numpy,
.item(), a copy to the CPU) raises, and so does an operator mixing it with a CPU tensor.
So a run whose state lives on `meta` goes through the code a CUDA run takes (device
placement, the atom counts kept on the host, the prefetcher's copies) and fails on the two
bugs a CPU run cannot show: a device tensor handed to the host, and a tensor left on the
wrong device. Also here: the device named once (`cuda` -> `cuda:<index>`) and the order in
which saved CUDA generator states are restored.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.trainer_kit import args, run

from atom_train import train
from atom_train.model.batched import BatchedByteTick, _on
from atom_train.model.config import ModelConfig
from atom_train.model.devices import normalize_device
from atom_train.model.reference import ReferenceModel
from atom_train.trainer.checkpoint_file import FINAL, load_checkpoint
from atom_train.trainer.plan import resolve_command
from atom_train.trainer.prefetch import MaskDrawer, WindowPrefetcher
from atom_train.trainer.train_state import RNG_CUDA, RUNTIME, cuda_rng_states

META = torch.device("meta")
# Loading real weights into a meta model copies nothing, and torch says so each time.
pytestmark = pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")


@pytest.fixture(scope="module")
def half(corpus, tmp_path_factory):
    """A run stopped at tick 32 (its final checkpoint holds live atoms and AdamW state)."""
    out = tmp_path_factory.mktemp("half")
    assert run(corpus, out, 32, "--ckpt-every", "16") == 0
    return out


def meta_trainer(argv: list[str]) -> train.Trainer:
    """The trainer for `argv`, planned as for the CPU, built on the meta device (with the
    fused loop: the native one runs on CPU tensors only, and `auto` picks a torch loop on any
    other device)."""
    plan = resolve_command(argv, warn=lambda m: None, every_flag_given=True)
    on_meta = dataclasses.replace(plan, device=META, recurrence="fused")
    return train.Trainer(on_meta, train.Signals())


@pytest.mark.parametrize("mode", ["resume", "fork"])
def test_resume_and_fork_restore_onto_a_device_and_train_there(corpus, half, tmp_path, mode):
    ck = load_checkpoint(half / FINAL)
    if mode == "resume":
        argv = args(corpus, half, 64, "--ckpt-every", "16")
    else:
        (tmp_path / "fork").mkdir()  # (the trainer's command makes it before building)
        argv = args(corpus, tmp_path / "fork", 64, "--ckpt-every", "16", "--fork", str(ck.path))
    trainer = meta_trainer(argv)
    try:
        st = trainer.state
        rt = st.runtime
        assert st.device == rt.device == META
        for name in ("z", "P", "E", "g", "e_buf", "h_buf"):
            assert getattr(rt, name).device == META, name
        for p in st.model.parameters():
            assert p.device == META and st.optimizer.state[p]["exp_avg"].device == META
        # The atom counts stay on the host, exactly as saved.
        saved = ck.group(RUNTIME)["n_atoms"].numpy()
        assert saved.max() > 0 and np.array_equal(rt._n_atoms, saved)
        assert (
            st.counters.tick == 32
            and trainer.stream.positions == ck.tensors["loader/positions"].tolist()
        )
        assert st.origin["mode"] == ("new" if mode == "resume" else "fork")

        # Two windows of the trainer's step: a host read of a device value, or an operator
        # given tensors on two devices, would raise here.
        plan = trainer.plan
        sched = plan.window_schedule
        drawer = MaskDrawer(st.dropout_gen, plan.config.last_atom_dropout, plan.B, 0, plan.B)
        pf = WindowPrefetcher(
            trainer.stream, 32, 64, sched.cut, max_K=sched.K, device=META, masks=drawer
        )
        try:
            for tick0 in (32, 48):
                w = pf.get()
                assert w.tick0 == tick0 and w.feats.device == w.masks.device == META
                stats = trainer.train_window(w, 1e-3)
                pf.release(w)
                assert stats.loss.device == META and rt.z.device == META
        finally:
            pf.close()
        assert st.counters.tick == 64
        assert st.loader_state_dict()["positions"].tolist() == trainer.stream.positions
    finally:
        trainer.close()


def test_runtime_state_from_any_device_loads_with_its_counts_on_the_host():
    config = ModelConfig(n_modes=4, jl_dim=8, mlp_hidden=8, atom_dim=4, n_atoms_max=6)
    src = BatchedByteTick(ReferenceModel(config), 3)
    src._n_atoms[:] = [2, 0, 1]
    state = src.state_dict()
    bt = BatchedByteTick(ReferenceModel(config).to(META), 3, device=META)
    bt.load_state_dict(state)
    assert bt.z.device == META and bt._n_atoms.tolist() == [2, 0, 1]
    assert bt._n_atoms is not state["n_atoms"].numpy()  # its own copy
    # A state already on the device would have to come back to the host for its counts.
    with pytest.raises((NotImplementedError, RuntimeError)):
        bt.load_state_dict({k: v.to(META) for k, v in state.items()})


def test_the_device_is_named_as_its_tensors_name_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert normalize_device("cuda") == torch.device("cuda", 1)
    assert normalize_device(torch.device("cuda:0")) == torch.device("cuda", 0)
    assert normalize_device("cpu:0") == normalize_device("cpu") == torch.device("cpu")
    assert normalize_device("meta") == META
    # "cpu:0" stands for "cuda" here: both differ from the device their tensors report.
    assert torch.device("cpu:0") != torch.zeros(1, device="cpu:0").device
    config = ModelConfig(n_modes=4, jl_dim=8, mlp_hidden=8, atom_dim=4)
    bt = BatchedByteTick(ReferenceModel(config), 2, device="cpu:0")
    x = torch.zeros(3)
    assert bt.device == x.device and _on(x, bt.device) is x  # already there: no copy


def test_cuda_generator_states_are_restored_in_device_order():
    tensors = {f"{RNG_CUDA}/{i}": torch.tensor([i]) for i in (0, 1, 2, 10, 11)}
    tensors["rng/torch_cpu"] = torch.tensor([-1])
    assert [int(t) for t in cuda_rng_states(tensors)] == [0, 1, 2, 10, 11]
