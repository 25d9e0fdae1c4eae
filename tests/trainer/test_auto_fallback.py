"""`--recurrence auto` proves the Triton loop before a run trusts it, and falls back to the
fused loop when it fails; proven on the CPU with the kernels under Triton's interpreter.

On CUDA, auto picks Triton; `resolve_recurrence` is made to answer as it does there
(`as_on_cuda`; on a CPU the kernels then run under the interpreter), so the self-check
(`loop_check.check_triton_loop`: Triton against the fused loop, forward and backward, every
output and gradient within 8 times the float32 fused loop's own error from the float64 one)
runs on the interpreter, and the failures a device can have are injected into the real
kernels' launches: a wrong result (the backward's gradient of U 1e-4 too large, what no
forward check sees) and a compile error (a block of 12 streams: Triton's `arange` takes
powers of two only). tests/model/test_field_triton.py plants bugs in the kernels' source
(a wrong RMS-cap branch, wrong phase-sync branches) and sees the self-check fail on each.
Each fallback is said in one line, and the start event and status.json record the loop and
why; an explicit `--recurrence triton` is not checked and fails loudly.
"""

from __future__ import annotations

import inspect
import json
import math

import pytest

pytest.importorskip("triton")

import torch
from helpers.trainer_kit import run as run_on_cpu

from atom_train.model import backend, field_loops, loop_check
from atom_train.model.config import FieldConsts, ModelConfig
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
    resolve = backend.resolve_recurrence

    def on_cuda(name, device, config=None, warn=None):
        return "triton" if name == "auto" else resolve(name, device, config, warn)

    monkeypatch.setattr(backend, "resolve_recurrence", on_cuda)


def wrong_backward(ft, monkeypatch, factor=1 + 1e-4):
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
    good = loop_check.check_triton_loop(DEVICE, c, 4, per_mode_keep=True, u_width=24)
    # (within ERROR_RATIO of the fused loop's own error: measured 1.0-1.3 x here)
    assert good.failure is None and good.ratio <= loop_check.ERROR_RATIO
    assert good.K == loop_check.CHECK_TICKS and good.B == 4 and good.seconds > 0
    wrong_backward(ft, monkeypatch)
    bad = loop_check.check_triton_loop(DEVICE, c, 4, per_mode_keep=True, u_width=24)
    assert bad.failure.startswith("at 4 streams (checked at 4): dU is 1.0")
    assert "from the float64 loop's" in bad.failure
    assert bad.out_err < 1e-6  # the forward is right: the backward shows it


def test_fallback_check_runs_the_runs_own_kernel_variant():
    """The check's streams give the kernels the launch's variant (the launcher's block and
    warps, Triton's specialization of B and of U's stride, a partly filled last program),
    so its compile is the run's: 8 streams a program up to ~1056 streams on 132 SMs; at
    least 4 streams (every role of the check's inputs) where B allows."""
    cpu = torch.device("cpu")  # (sm_count: the report's default GPU, 132 SMs)
    for B, n, w in ((4, 8, 24), (1000, 32, 80), (1024, 32, 80), (4096, 32, 80),
                    (16384, 32, 80), (4096, 128, 272), (1001, 32, 72), (2, 8, None)):  # fmt: skip
        b = loop_check.check_streams(B, n, cpu, w)
        assert min(B, 4) <= b <= min(B, 2048), (B, n)
        assert loop_check.kernel_variant(b, n, cpu, w) == loop_check.kernel_variant(B, n, cpu, w)
        assert (b % 16 == 0) == (B % 16 == 0)  # Triton specializes on it
    assert loop_check.check_streams(1001, 32, cpu, 72) % 8 != 0  # (partial, as 1001's last)


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
        "wrong_backward": "dU is 1.0",
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


def test_the_self_checks_inputs_reach_every_branch_of_the_loop():
    """The check's window (`sample_loop_inputs`, CHECK_TICKS ticks, a reset in the middle) at
    the default model's constants, run by the float64 fused loop: the RMS cap fires and does
    not; phase sync is skipped on a live field (the quiet stream: its modes sum below
    PHASE_SYNC_MIN) and applied elsewhere; a silent stream (|y| = 0); and, replayed from the
    fields, the controller's floor and both gain clamps are reached (the replay ends at the
    loop's own final gains)."""
    from atom_train.model.config import AMP_LOG_FLOOR, GAIN_MAX, GAIN_MIN, PHASE_SYNC_MIN

    config = ModelConfig()
    c = FieldConsts.of(config)
    K, B, n = loop_check.CHECK_TICKS, 16, c.n
    args, _ = loop_check.sample_loop_inputs(K, B, c, "cpu", u_width=80)
    resets = tuple(t == K // 2 for t in range(K))
    out = loop_check.loop_results(
        field_loops.LOOPS["fused"], args, resets, c, None, dtype=torch.float64
    )
    Zs = out["Zs"]
    rms = Zs.norm(dim=2) / n**0.5
    capped = rms > c.max_rms * (1 - 1e-9)
    assert capped.any() and not capped.all()
    modes_sum = torch.complex(Zs[..., :n].sum(2), Zs[..., n:].sum(2)).abs()
    quiet = modes_sum[: K // 2, 2]  # (after the reset it is silent: no drive)
    assert (quiet < PHASE_SYNC_MIN).all() and (Zs[: K // 2, 2] != 0).any()
    assert (modes_sum > PHASE_SYNC_MIN).any()
    assert not Zs[:, 3].any()
    g = args[7].double().clone()
    hit = {"floor": False, "min": False, "max": False}
    for t in range(K):
        if resets[t]:
            g = torch.ones_like(g)
        r = rms[t].clamp(max=c.max_rms)
        hit["floor"] |= bool((r < AMP_LOG_FLOOR).any())
        step = (math.exp(c.log_target) / r.clamp(min=AMP_LOG_FLOOR)) ** c.amp_rate
        raw = g * step
        hit["min"] |= bool((raw < GAIN_MIN).any())
        hit["max"] |= bool((raw > GAIN_MAX).any())
        g = raw.clamp(GAIN_MIN, GAIN_MAX)
    assert hit == {"floor": True, "min": True, "max": True}
    assert torch.allclose(g, out["g"], rtol=1e-12, atol=0)
