"""What the GPU compiler makes of the Triton kernels, checked on a machine without a GPU:
`python -m atom_train.kernel_report` with the .venv's Triton for sm_90 and 132 SMs (the
oldest supported Triton runs the same report in `make kernel-check-oldest`, part of `make
test`).

The report compiles the quick set (every float32 variant a training run launches at
n = 16, 32, 64, 128 and at each block the launcher chooses for B = 1024 and 4096; three of
the tests' float64 and reset-table variants at n = 32) in one subprocess: 30 compiles, about
two minutes of CPU, one minute on 2 free cores. `make kernel-report-full` compiles all.

Budgets, spill stores in bytes a thread (the measured figure in brackets, Triton 3.9):
- float32 at n = 16 and 32 (32: the default model): 0 (0), every block and leak;
- float32 at n = 64: 64 (8);
- float32 at n = 128: field_triton.SPILL_BOUND = 1024 (668: the backward, learnable leak);
- float64 (the tests' variants in the quick set, n = 32): 2048 (396: float64 doubles every
  register; the tests are not timed).
Launches: at B = 1024 every n fills >= 90% of the SMs in its one wave; at B = 4096 every
wave is >= 90% full at n <= 32 (at n = 64 and 128 only 8-stream programs fit, and the last of
four waves is 88% full: measured and stated in docs/performance.md, not hidden).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from helpers.trainer_kit import REPO

from atom_train import kernel_report as kr

BUDGETS = {16: 0, 32: 0, 64: 64, 128: 1024}
F64_BUDGET = 2048
REPORT_ARGS = ["--variants", "quick", "-B", "1024,4096", "--json"]


@pytest.fixture(scope="module")
def report() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(
        [sys.executable, "-m", "atom_train.kernel_report", *REPORT_ARGS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode in (0, 1), r.stderr[-3000:]
    return json.loads(r.stdout)


def test_every_variant_compiles(report):
    assert report["target"] == "sm_90"
    failed = [
        (v["kernel"], v["n"], v["variant"], v["dtype"], v["error"])
        for v in report["variants"]
        if not v["ok"]
    ]
    assert not failed, failed
    kinds = {(v["kernel"], v["n"], v["dtype"], v["variant"]) for v in report["variants"]}
    for n in BUDGETS:
        for kernel in ("fwd", "bwd"):
            for leak in kr.LEAKS:
                assert (kernel, n, "float32", f"{leak}-leak,reset-scalars") in kinds
    assert ("bwd", 32, "float64", "per-mode-leak,reset-table") in kinds


def test_spills_within_budgets(report):
    over = []
    for v in report["variants"]:
        budget = BUDGETS[v["n"]] if v["dtype"] == "float32" else F64_BUDGET
        if v["ok"] and v["spill_store_bytes"] > budget:
            over.append((v["kernel"], v["n"], v["dtype"], v["variant"], v["spill_store_bytes"]))
    assert not over, f"spill stores above the budgets {BUDGETS}: {over}"


def test_the_variants_that_spill_report_their_spills(report):
    """The budgets are upper bounds; this holds the figures to what ptxas measures: the
    kernels that do spill (the backward at n = 128: 668 bytes; float64: 396) report it, so a
    report that loses the spill figures (every one 0) fails here."""
    ok = [v for v in report["variants"] if v["ok"]]
    assert all(v["regs"] > 0 for v in ok)
    at_128 = [v["spill_store_bytes"] for v in ok if v["n"] == 128 and v["dtype"] == "float32"]
    f64 = [v["spill_store_bytes"] for v in ok if v["dtype"] == "float64"]
    assert at_128 and max(at_128) > BUDGETS[64], at_128
    assert f64 and max(f64) > 0, f64


def test_every_sm_busy(report):
    by = {(x["B"], x["n"]): x for x in report["launches"]}
    for n in BUDGETS:
        assert by[1024, n]["fill"] >= 0.9, by[1024, n]
        assert by[1024, n]["waves"] == 1, by[1024, n]
        if n <= 32:
            assert by[4096, n]["fill"] >= 0.9, by[4096, n]


def test_the_unfit_table_agrees_with_the_report(report):
    """field_triton.MEASURED_SPILLS (what `auto` decides from, without compiling) against
    this report's figures: within 64 bytes, and the same decision at every n."""
    ft = pytest.importorskip("atom_train.model.field_triton")
    for n in BUDGETS:
        for leak in (False, True):
            name = f"{'per-mode' if leak else 'scalar'}-leak,reset-scalars"
            worst = {
                kernel: max(
                    v["spill_store_bytes"]
                    for v in report["variants"]
                    if (v["n"], v["kernel"], v["variant"], v["dtype"])
                    == (n, kernel, name, "float32")
                )
                for kernel in ("fwd", "bwd")
            }
            table = ft.MEASURED_SPILLS[n][leak]
            assert abs(worst["fwd"] - table[0]) <= 64 and abs(worst["bwd"] - table[1]) <= 64
            fits = max(worst.values()) <= ft.SPILL_BOUND
            assert (ft.triton_unfit_reason(n, leak) is None) == fits, (n, leak, worst)


def test_triton_unfit_reason():
    ft = pytest.importorskip("atom_train.model.field_triton")
    for n in (8, 16, 32, 48, 64, 100, 128):
        assert ft.triton_unfit_reason(n) is None
        assert ft.triton_unfit_reason(n, per_mode_leak=True) is None
    why = ft.triton_unfit_reason(256, per_mode_leak=True)
    assert "n = 256" in why and "2160" in why and "1024" in why
    assert "n = 512" in ft.triton_unfit_reason(512)

    class Config:
        n_modes = 200

    assert "n = 200" in ft.triton_unfit_reason(Config())
    with pytest.raises(ValueError):
        ft.triton_unfit_reason(32, dtype="float64")


def test_the_report_compiles_with_the_trainers_constants():
    """The report's compile-time constants are those the launcher builds for the default
    model: the same FieldConsts (one object, with the loop's fixed limits), through the one
    builder."""
    import atom_train.model.config as m
    from atom_train.model.field_kernels import compile_constants

    v = kr.Variant("fwd", 16, "scalar", "scalars", "float32", 8)
    args = kr.launch_arguments(v)
    c = m.FieldConsts.of(m.ModelConfig(n_modes=16))
    assert (c.phase_sync_min, c.amp_log_floor, c.energy_decay, c.gain_min, c.gain_max) == (
        m.PHASE_SYNC_MIN, m.AMP_LOG_FLOOR, m.ENERGY_DECAY, m.GAIN_MIN, m.GAIN_MAX
    )  # fmt: skip
    want = compile_constants("fwd", c, block=8, keep_scalar=True, reset_table=False, f64=False)
    assert {k: args[k] for k in want} == want


def test_occupancy_and_waves():
    # 8 warps at 255 registers: 256 registers a thread per warp -> 65536 / (8192 * 8) = 1.
    assert kr.programs_per_sm(255, 40_000, 8, "sm_90") == 1
    assert kr.programs_per_sm(144, 10_752, 4, "sm_90") == 3  # 144 -> 18,432 per program
    assert kr.programs_per_sm(96, 3_072, 4, "sm_90") == 5
    assert kr.programs_per_sm(64, 120_000, 4, "sm_90") == 1  # shared memory bound
    assert kr.programs_per_sm(64, 240_000, 4, "sm_90") == 0  # does not fit at all
    assert kr.programs_per_sm(32, 0, 1, "sm_89") == 24  # block slots
    assert kr.waves_and_fill(128, 132, 1) == (1, 128 / 132)
    assert kr.waves_and_fill(256, 132, 1) == (2, 124 / 132)
    assert kr.waves_and_fill(256, 132, 2) == (1, 1.0)
    assert kr.waves_and_fill(1024, 132, 1) == (8, 100 / 132)
    assert kr.waves_and_fill(10, 132, 0) == (None, 0.0)


def test_parse_ptxas():
    log = """ptxas info    : Compiling entry function 'field_bwd_kernel' for 'sm_90a'
ptxas info    : Function properties for field_bwd_kernel
    240 bytes stack frame, 288 bytes spill stores, 336 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 240 bytes cumulative stack size
"""
    assert kr.parse_ptxas(log) == {
        "regs": 255,
        "stack_bytes": 240,
        "spill_store_bytes": 288,
        "spill_load_bytes": 336,
    }
    with pytest.raises(ValueError, match="no register"):
        kr.parse_ptxas("ptxas info: nothing")


def test_cli_mistakes_are_user_errors(capsys):
    assert kr.main(["-B", "a,b"]) == 2
    assert "-B takes comma-separated integers" in capsys.readouterr().err
    assert kr.main(["--n-modes", "0"]) == 2
    assert kr.main(["--sm", "0"]) == 2
    assert kr.main(["--target", "sm_70"]) == 2
    assert "see --help" in capsys.readouterr().err


def test_variant_sets():
    def blocks(n):
        return (8, 16) if n <= 32 else (8,)

    full = kr.variants((16, 64), blocks, "all")
    assert len(full) == 2 * 16 + 16
    trainer = kr.variants((16, 64), blocks, "trainer")
    assert all(v.trainer for v in trainer) and len(trainer) == 3 * 4
    quick = kr.variants((32, 64), blocks, "quick")
    extra = [v for v in quick if not v.trainer]
    assert {(v.n, v.block) for v in extra} == {(32, 8)} and len(extra) == 6


# ---- the GPU check's CPU-side pieces (scripts/gpu_check.sh, atom_train.bench.kernels) -------


def test_kernel_timing_arguments():
    from atom_train.bench import kernels as kt
    from atom_train.common.cli import UserError

    plan = kt.parse_args(["-B", "256,1024", "--n-modes", "32", "--recurrence", "triton"])
    assert plan["Bs"] == (256, 1024) and plan["n_modes"] == (32,)
    assert plan["recurrences"] == ("triton",) and plan["K"] == 64
    default = kt.parse_args([])
    assert default["Bs"] == (256, 1024, 4096, 16384) and default["n_modes"] == (32, 64, 128)
    assert default["recurrences"] == ("triton", "fused")
    for bad in (["--recurrence", "compiled"], ["-B", "0"], ["-K", "0"], ["--device", "tpu"]):
        with pytest.raises(UserError):
            kt.parse_args(bad)


def test_kernel_timing_on_the_cpu_writes_its_report(tmp_path):
    """The whole module on a CPU (host clock), fused loop, tiny sizes: rows and JSON."""
    from atom_train.bench import kernels as kt

    out = tmp_path / "t" / "timing.json"
    argv = ["--device", "cpu", "-B", "2", "--n-modes", "8", "-K", "2", "--repeat", "1"]
    assert kt.main([*argv, "--recurrence", "fused", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["device"] == "cpu" and len(rep["results"]) == 1
    row = rep["results"][0]
    assert row["error"] is None and row["runs"] == 1
    assert all(row[k] > 0 for k in kt.FIELDS) and row["bytes_per_s"] > 0
    rows = [row, {**row, "recurrence": "triton", "error": "OutOfMemoryError: x"}]
    text = kt.format_rows(rows)
    assert "error: OutOfMemoryError" in text and "fused" in text


def test_gpu_summary_reads_what_the_parts_left(tmp_path):
    """gpu_check.sh's summary from a folder where one part failed and one left nothing."""
    (tmp_path / "parts.tsv").write_text("kernel-report\t0\t40\t90\ntests\t1\t150\t200\n")
    (tmp_path / "tests.xml").write_text(
        """<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="tests.test_cuda" name="test_a" time="1.0"/>
<testcase classname="tests.test_cuda" name="test_b" time="2.0">
<failure message="assert 1e-3 &lt;= 1e-4">trace</failure></testcase>
<testcase classname="tests.test_cuda" name="test_c" time="0"><skipped message="no"/></testcase>
</testsuite></testsuites>"""
    )
    rep = {
        "triton": "3.6.0",
        "target": "sm_90",
        "variants": [
            {"ok": True, "dtype": "float32", "n": 32, "spill_store_bytes": 0},
            {"ok": False, "dtype": "float64", "n": 32, "spill_store_bytes": None},
        ],
        "launches": [
            {"B": 1024, "n": 32, "sm": 132, "streams_per_program": 8, "grid": 128}
            | {"programs_per_sm": 2, "waves": 1, "fill": 0.97}
        ],
    }
    (tmp_path / "kernel-report.json").write_text(json.dumps(rep))
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_summary.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "1/2 compiled" in r.stdout and "FAILED test_cuda::test_b" in r.stdout
    assert "failed 1, passed 1, skipped 1" in r.stdout and "timing: no results" in r.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["exit"] for p in summary["parts"]] == [0, 1]
    assert summary["kernel_report"]["failed"] == 1 and summary["timing"] is None


def test_gpu_summary_names_a_renamed_bench_key_and_reads_the_tests_of_a_killed_pytest(tmp_path):
    """A bench row without a key the summary reads is a problem, said as such (the key it
    used to read, loader_wait_share, had been renamed without anything noticing); a pytest
    killed before writing tests.xml leaves its finished tests in tests.jsonl; parts listed
    in plan.txt without a result are "not run", the one under way "running"."""
    (tmp_path / "plan.txt").write_text("install\ntests\nbench\ntiming\n")
    (tmp_path / "parts.tsv").write_text("install\t0\t3\t20\t\nbench\t0\t30\t55\t\n")
    (tmp_path / "running.tsv").write_text("tests\t1700000000\t105\n")
    row = {"mode": "trainer", "B": 1024, "recurrence": "triton", "bytes_per_s": 2e7}
    row |= {"loader_wait_share": 0.01, "step_wait_share": 0.4}  # loader_share renamed
    (tmp_path / "bench.json").write_text(json.dumps({"results": [row]}))
    lines = [
        {"test": "test_cuda::test_a", "outcome": "passed", "why": "", "seconds": 1.0},
        {"test": "test_cuda::test_b", "outcome": "failed", "why": "assert 1 == 2", "seconds": 2},
    ]
    (tmp_path / "tests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"te')
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_summary.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["problems"] == [
        "bench row (mode trainer, recurrence triton, B 1024) lacks loader_share"
    ]
    assert "PROBLEM: bench row" in r.stdout and "loader wait -" not in r.stdout
    assert [t["test"] for t in summary["tests"]] == ["test_cuda::test_a", "test_cuda::test_b"]
    assert summary["tests_from"] == "tests.jsonl" and "pytest was killed" in r.stdout
    states = [(p["part"], p["state"], p["exit"]) for p in summary["parts"]]
    assert states == [
        ("install", "done", 0),
        ("tests", "running", None),
        ("bench", "done", 0),
        ("timing", "not run", None),
    ]


def test_gpu_summary_says_cut_for_a_failure_at_the_bound_and_reads_tests_long(tmp_path):
    """A pytest part stopped at its bound (exit 124): a test that failed before the bound
    stands (FAILED), one that failed as the stop came (finished at the bound) is "cut", not
    judged; `tests-long` is read like `tests`; the error ratios the parity tests recorded
    (record_property) are listed."""
    (tmp_path / "plan.txt").write_text("tests\ntests-long\n")
    (tmp_path / "parts.tsv").write_text(
        "tests\t124\t116\t116\t\t1000\ntests-long\t0\t200\t300\t\t2000\n"
    )
    lines = [
        {"test": "test_cuda::test_a", "outcome": "passed", "why": "", "finished": 1050.0},
        {"test": "test_cuda::test_b", "outcome": "failed", "why": "x", "finished": 1010.0},
        {"test": "test_cuda::test_c", "outcome": "failed", "why": "y", "finished": 1116.2},
    ]
    (tmp_path / "tests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "tests.xml").write_text(
        """<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="tests.test_cuda" name="test_a" time="1.0"><properties>
<property name="error_ratio" value="1.2"/></properties></testcase>
<testcase classname="tests.test_cuda" name="test_b" time="2.0">
<failure message="assert a real bug">trace</failure></testcase>
<testcase classname="tests.test_cuda" name="test_c" time="9.0">
<failure message="CheckpointError: no final checkpoint">trace</failure></testcase>
</testsuite></testsuites>"""
    )
    (tmp_path / "tests-long.xml").write_text(
        """<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="tests.test_field_triton" name="test_d" time="1.0"/>
</testsuite></testsuites>"""
    )
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_summary.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    outcomes = {t["test"]: t["outcome"] for t in summary["tests"]}
    assert outcomes == {
        "test_cuda::test_a": "passed",
        "test_cuda::test_b": "failed",
        "test_cuda::test_c": "cut",
    }
    assert [t["outcome"] for t in summary["tests_long"]] == ["passed"]
    assert "FAILED test_cuda::test_b: assert a real bug" in r.stdout
    assert "CUT test_cuda::test_c: the part was stopped at its bound" in r.stdout
    assert "FAILED test_cuda::test_c" not in r.stdout and "cut at its bound" in r.stdout
    assert "tests-long: passed 1" in r.stdout and "test_a 1.20" in r.stdout


@pytest.mark.parametrize("script", ["gpu_check.sh", "kernel_check.sh"])
def test_scripts_parse(script):
    r = subprocess.run(["bash", "-n", str(REPO / "scripts" / script)], capture_output=True)
    assert r.returncode == 0, r.stderr


_SPECIALIZATIONS = """
import json, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature
from atom_train import kernel_report as kr
from atom_train.model.field_kernels import launch_options
backend = make_backend(GPUTarget("cuda", 90, 32))
out = {}
for kernel in ("fwd", "bwd"):
    v = kr.Variant(kernel, 32, "scalar", "scalars", "float32", 8)
    fn = kr._kernel(kernel)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    for B, w in json.loads(sys.argv[1]):
        kwargs = {**kr.launch_arguments(v, B=B, u_width=w), **launch_options(kernel, 8, 32)}
        out[f"{kernel} {B} {w}"] = repr(binder(**kwargs)[1])
print(json.dumps(out))
"""


def test_the_self_checks_variant_key_is_tritons_specialization():
    """loop_check.kernel_variant decides which stream counts share the run's binaries (the
    self-check proves each distinct one): at a fixed block, two launches get one binary from
    Triton's binder exactly when their B-dependent parts of kernel_variant agree."""
    import torch

    from atom_train.model.loop_check import kernel_variant

    cases = [
        (B, w) for B in (1, 2, 3, 8, 16, 24, 32, 1000, 1001, 1024, 4096) for w in (None, 72, 80)
    ]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(
        [sys.executable, "-c", _SPECIALIZATIONS, json.dumps(cases)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    triton_spec = json.loads(r.stdout)
    cpu = torch.device("cpu")
    for kernel in ("fwd", "bwd"):
        for a in cases:
            for b in cases:
                same_binary = (
                    triton_spec[f"{kernel} {a[0]} {a[1]}"] == triton_spec[f"{kernel} {b[0]} {b[1]}"]
                )
                ours = (
                    kernel_variant(a[0], 32, cpu, a[1])[2:5]
                    == kernel_variant(b[0], 32, cpu, b[1])[2:5]
                )
                if a[1] == b[1]:  # (our key is per run: the row width is the run's)
                    assert same_binary == ours, (kernel, a, b)
