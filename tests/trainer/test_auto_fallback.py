"""`--recurrence auto` proves the Triton loop before a run trusts it, and falls back to the
fused loop when it fails; proven on the CPU with the kernels under Triton's interpreter.

On CUDA, auto picks Triton; `resolve_recurrence` is made to answer as it does there
(`as_on_cuda`; on a CPU the kernels then run under the interpreter), so the self-check (`field_loops.check_triton_loop`: Triton against the fused
loop, forward and backward, outputs within 1e-4 and gradients within 1e-3 relative) runs on
the interpreter, and the failures a device can have are injected into the real kernels'
launches: a wrong result (the backward's gradient of U 1% off, what no forward check sees)
and a compile error (a block of 12 streams: Triton's `arange` takes powers of two only).
Each fallback is said in one line, and the start event and status.json record the loop and
why; an explicit `--recurrence triton` is not checked and fails loudly.
"""

from __future__ import annotations

import inspect
import json

import pytest

pytest.importorskip("triton")

import torch
from helpers.trainer_kit import run as run_on_cpu

from atom_train.model import field_loops
from atom_train.model.config import FieldConsts, ModelConfig
from atom_train.trainer import plan
from atom_train.trainer.checkpoint_file import FINAL, load_checkpoint

# On a GPU box (gpu_check.sh --long) the runs are on CUDA, the kernels compiled.
ON = ["--device", "cuda"] if torch.cuda.is_available() else []
DEVICE = torch.device("cuda" if ON else "cpu")


def run(corpus, out, total, *extra):
    return run_on_cpu(corpus, out, total, *ON, *extra)


@pytest.fixture
def ft():
    from atom_train.model import field_triton

    if not field_triton.INTERPRETED and not torch.cuda.is_available():
        pytest.skip("the Triton kernels cannot run here (no CUDA, no TRITON_INTERPRET=1)")
    return field_triton


@pytest.fixture
def as_on_cuda(monkeypatch):
    """`auto` chooses Triton, as it does on a CUDA device where Triton fits the model."""
    resolve = plan.resolve_recurrence

    def on_cuda(name, device, config=None, warn=None):
        return "triton" if name == "auto" else resolve(name, device, config, warn)

    monkeypatch.setattr(plan, "resolve_recurrence", on_cuda)


def wrong_backward(ft, monkeypatch, factor=1.01):
    """The backward kernel's gradient of U comes out `factor` times too large."""
    kernel = ft.field_bwd_kernel
    at = list(inspect.signature(kernel.fn).parameters).index("GU")

    class Wrong:
        def __getitem__(self, grid):
            launch = kernel[grid]

            def run(*args, **kwargs):
                out = launch(*args, **kwargs)
                args[at].mul_(factor)
                return out

            return run

    monkeypatch.setattr(ft, "field_bwd_kernel", Wrong())


def compile_error(ft, monkeypatch):
    """Every launch is compiled with a block of 12 streams, which Triton refuses."""
    constants = ft.compile_constants
    monkeypatch.setattr(
        ft, "compile_constants", lambda *a, **kw: constants(*a, **kw) | {"BLOCK": 12}
    )


def records(out):
    start = json.loads((out / "loss.jsonl").read_text().splitlines()[0])
    status = json.loads((out / "status.json").read_text())
    assert start["event"] == "start"
    return start, status


def test_fallback_check_passes_on_good_kernels_and_fails_on_a_wrong_gradient(ft, monkeypatch):
    c = FieldConsts.of(ModelConfig(n_modes=8))
    good = field_loops.check_triton_loop(DEVICE, c, 4, per_mode_keep=True, u_width=24)
    assert good.failure is None  # within CHECK_OUT_TOL and CHECK_GRAD_TOL (~5e-7 measured here)
    assert good.K == field_loops.CHECK_TICKS and good.B == 4 and good.seconds > 0
    wrong_backward(ft, monkeypatch)
    bad = field_loops.check_triton_loop(DEVICE, c, 4, per_mode_keep=True, u_width=24)
    assert bad.failure.startswith("gradients differ from the fused loop's by")
    assert bad.out_err <= field_loops.CHECK_OUT_TOL  # the forward is right: the backward shows it


def test_fallback_check_runs_the_runs_own_kernel_variant():
    """The check's streams give the launcher the run's block and warps (B is not compiled
    for), so its compile is the run's: 8 streams a program up to ~1056 streams on 132 SMs."""
    from atom_train.model.field_kernels import launch_plan

    cpu = torch.device("cpu")  # (sm_count: the report's default GPU, 132 SMs)
    for B, n in ((4, 8), (1000, 32), (1024, 32), (4096, 32), (16384, 32), (4096, 128)):
        b = field_loops.check_streams(B, n, cpu)
        assert b <= min(B, 2048) and launch_plan(b, n, 132) == launch_plan(B, n, 132), (B, n)
        assert (b % 16 == 0) == (B % 16 == 0)  # Triton specializes on it


def test_no_fallback_needed_auto_keeps_the_proven_triton_loop(
    ft, as_on_cuda, corpus, tmp_path, capsys
):
    assert run(corpus, tmp_path, 32) == 0
    for record in records(tmp_path):
        assert record["recurrence"] == "triton"
        assert record["recurrence_reason"].startswith(
            f"auto: Triton, proven against the fused loop on {DEVICE}"
        )
    assert load_checkpoint(tmp_path / FINAL).meta["training"]["recurrence"] == "triton"
    err = capsys.readouterr().err
    assert f"recurrence auto: Triton, proven against the fused loop on {DEVICE}" in err


@pytest.mark.parametrize("failure", ["wrong_backward", "compile_error"])
def test_fallback_to_fused_when_the_self_check_fails(
    ft, as_on_cuda, monkeypatch, corpus, tmp_path, capsys, failure
):
    {"wrong_backward": wrong_backward, "compile_error": compile_error}[failure](ft, monkeypatch)
    assert run(corpus, tmp_path, 32) == 0  # the run goes on, on the fused loop
    why = {
        "wrong_backward": "gradients differ from the fused loop's by",
        "compile_error": "arange's range must be a power of 2",
    }[failure]
    for record in records(tmp_path):
        assert record["recurrence"] == "fused"
        assert record["recurrence_reason"].startswith("auto: the Triton loop's self-check failed")
        assert why in record["recurrence_reason"]
    assert load_checkpoint(tmp_path / FINAL).meta["training"]["recurrence"] == "fused"
    said = [x for x in capsys.readouterr().err.splitlines() if "warning:" in x]
    assert len(said) == 1 and why in said[0]
    assert "] warning: --recurrence auto: the fused loop, not Triton: the Triton" in said[0]


def test_no_fallback_for_an_explicit_triton_it_fails_loudly(ft, monkeypatch, corpus, tmp_path):
    compile_error(ft, monkeypatch)
    with pytest.raises(Exception) as raised:  # the kernels' own error, not a fallback
        run(corpus, tmp_path, 32, "--recurrence", "triton")
    assert "arange's range must be a power of 2" in str(raised.value.__cause__)
