"""What the GPU compiler makes of the field loop's Triton kernels, without a GPU.

Compiles every kernel variant the trainer can launch (forward and backward; scalar or
per-mode leak; resets as two scalars or as a table; float32, and float64 for the tests) at
the streams per program the launcher chooses, for a named GPU target, with the installed
Triton, and prints per variant whether it compiled, the registers per thread, spill stores
and loads, stack and shared memory (from ptxas's own log and the compiled metadata), and per
-B and SM count the launch the trainer makes: its grid, the programs an SM holds at once
(from registers, shared memory and threads), the waves, and the busy share of the SMs in the
least-filled wave (`fill`). Needs neither a GPU nor torch: the kernels compile from their
source with the arguments the launcher passes (tensors as stand-ins with a dtype and an
aligned address), so a side environment with nothing but an older Triton can run it.

    python -m atom_train.kernel_report                        # the table, sm_90, 132 SMs
    python -m atom_train.kernel_report -B 1024,4096 --sm 132 --n-modes 32,64
    python -m atom_train.kernel_report --variants quick -B 1024,4096 --json > report.json
    python -m atom_train.kernel_report --target sm_80 --sm 108   # an A100

Exit status: 0, 1 if any variant failed to compile (the error is in the report), 2 for a
usage error. The binaries do not depend on B or the window length K (neither is specialized
on: see field_kernels), so each variant is compiled once and every launch figure reuses it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from atom_train.common.cli import (
    ArgumentParser,
    UserError,
    add_shared,
    positive_ints,
    set_command,
    user_error_exit,
)
from atom_train.model.config import FieldConsts, ModelConfig

# Per-SM limits by target: registers, threads, shared memory (bytes, per SM and per block),
# resident blocks. CUDA reserves 1 KiB of shared memory per block on these targets.
TARGETS = {
    "sm_80": {"regs": 65536, "threads": 2048, "smem": 167936, "smem_block": 166912, "blocks": 32},
    "sm_89": {"regs": 65536, "threads": 1536, "smem": 102400, "smem_block": 101376, "blocks": 24},
    "sm_90": {"regs": 65536, "threads": 2048, "smem": 233472, "smem_block": 232448, "blocks": 32},
}
SMEM_RESERVED = 1024
LEAKS = ("scalar", "per-mode")
RESETS = ("scalars", "table")
DTYPES = ("float32", "float64")
# all: every variant; trainer: what a training run launches; quick: the trainer's at every n
# and block, and at n = 32 and the smallest block three of the tests' variants that between
# them set every other switch both ways (float64 with the table and the learnable leak,
# float64 with neither, float32 with the table): what `make test` compiles with each Triton.
VARIANT_SETS = ("all", "trainer", "quick")
QUICK_EXTRAS = {
    ("per-mode", "table", "float64"),
    ("scalar", "scalars", "float64"),
    ("scalar", "table", "float32"),
}
QUICK_TEST_N = 32


@dataclass(frozen=True)
class Variant:
    kernel: str  # "fwd" | "bwd"
    n: int
    leak: str  # "scalar" | "per-mode"
    resets: str  # "scalars" | "table"
    dtype: str  # "float32" | "float64"
    block: int  # streams per program

    @property
    def name(self) -> str:
        return f"{self.leak}-leak,reset-{self.resets}"

    @property
    def trainer(self) -> bool:
        """What a training run launches: float32, and the lockstep schedule's periodic
        resets (the table is for irregular patterns, which only the tests make)."""
        return self.dtype == "float32" and self.resets == "scalars"


def variants(n_modes, blocks_of, which: str = "all") -> list[Variant]:
    """The variants of the set `which` (VARIANT_SETS) at each n, at each block in
    blocks_of(n)."""
    out = []
    for n in n_modes:
        blocks = blocks_of(n)
        for block in blocks:
            for kernel in ("fwd", "bwd"):
                for dtype in DTYPES:
                    for resets in RESETS:
                        for leak in LEAKS:
                            v = Variant(kernel, n, leak, resets, dtype, block)
                            quick = (
                                n == QUICK_TEST_N
                                and block == min(blocks)
                                and (leak, resets, dtype) in QUICK_EXTRAS
                            )
                            if which == "all" or v.trainer or (which == "quick" and quick):
                                out.append(v)
    return out


# ---- compiling one variant ---------------------------------------------------------------


class _Stand:
    """A tensor as the launcher's argument binder sees one: a dtype and an address (256-byte
    aligned, like torch's allocations)."""

    def __init__(self, dtype: str):
        self.dtype = dtype

    def data_ptr(self) -> int:
        return 1 << 20


def launch_arguments(v: Variant, B: int = 1024, K: int = 64, u_width: int | None = None) -> dict:
    """The kernel's arguments by name as TritonFieldLoop passes them for contiguous tensors of
    this variant (strides and sizes as ints, tensors as stand-ins, constexprs from
    field_kernels.compile_constants: the one builder both use); `u_width`: U as the first 2n
    columns of rows that wide (the batched tick's drive matmul), default contiguous."""
    from atom_train.model.field_kernels import compile_constants

    n, D = v.n, 2 * v.n
    # The trainer's default model at n modes: the compile-time values of a real launch
    # (model.config needs no torch, so the report computes them as the trainer does).
    c = FieldConsts.of(ModelConfig(n_modes=n))
    consts = compile_constants(
        v.kernel,
        c,
        block=v.block,
        keep_scalar=v.leak == "scalar",
        reset_table=v.resets == "table",
        f64=v.dtype == "float64",
        need_keep=v.leak == "per-mode",  # the learnable leak is the one with a gradient
    )
    ints = {
        "s_uk": B * (u_width or D),
        "s_ub": u_width or D,
        "s_zb": D,
        "s_w0": 1,  # C^T as a view of the contiguous C: strides (1, n)
        "s_w1": n,
        "s_gk": B * D,
        "s_gb": D,
        "F": 2 * n * n + 2 * n + (D if v.leak == "per-mode" else 0),
        "B": B,
        "K": K,
        "r0": 0,
        "period": K,
    }
    fn = _kernel(v.kernel)
    args = {}
    for name in fn.arg_names:
        if name in consts:
            args[name] = consts[name]
        elif name in ints:
            args[name] = ints[name]
        else:  # a tensor; the reset table is int32
            args[name] = _Stand("int32" if name == "RST" else v.dtype)
    return args


def _kernel(kernel: str):
    from atom_train.model import field_kernels

    return {"fwd": field_kernels.field_fwd_kernel, "bwd": field_kernels.field_bwd_kernel}[kernel]


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILLS = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)


def parse_ptxas(log: str) -> dict:
    """Registers, stack and spills from ptxas -v's log (one kernel per log)."""
    regs, spills = _PTXAS_REGS.search(log), _PTXAS_SPILLS.search(log)
    if regs is None or spills is None:
        raise ValueError(f"no register or spill figures in the ptxas log: {log[:400]!r}")
    stack, store, load = (int(x) for x in spills.groups())
    return {
        "regs": int(regs.group(1)),
        "stack_bytes": stack,
        "spill_store_bytes": store,
        "spill_load_bytes": load,
    }


def compile_variant(v: Variant, target: str) -> dict:
    """Compile `v` for `target` the way the runtime would at a launch: the binder's
    specialization of the launch arguments, then triton.compile of that source. One row of
    the report's "variants"."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    from atom_train.model.field_kernels import launch_options

    options = launch_options(v.kernel, v.block, v.n)
    warps = options["num_warps"]
    row = {
        "kernel": v.kernel,
        "n": v.n,
        "variant": v.name,
        "dtype": v.dtype,
        "streams_per_program": v.block,
        "warps": warps,
        "ok": False,
        "error": None,
        "regs": None,
        "spill_store_bytes": None,
        "spill_load_bytes": None,
        "stack_bytes": None,
        "smem_bytes": None,
        "compile_s": None,
    }
    t0 = time.perf_counter()
    try:
        gpu = GPUTarget("cuda", int(target.removeprefix("sm_")), 32)
        backend = make_backend(gpu)
        fn = _kernel(v.kernel)
        kwargs = {**launch_arguments(v), **options}
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, specialization, options = binder(**kwargs)
        options, signature, constexprs, attrs = fn._pack_args(
            backend, kwargs, bound, specialization, options
        )
        src = ASTSource(fn, signature, constexprs, attrs)
        triton.knobs.nvidia.dump_ptxas_log = True  # ptxas -v's log, printed on stdout
        triton.knobs.compilation.always_compile = True  # a cached binary prints no log
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(src, target=gpu, options=options.__dict__)
        row.update(parse_ptxas(log.getvalue()))
        row["smem_bytes"] = int(compiled.metadata.shared)
        row["ok"] = True
    except Exception as e:
        first = str(e).strip().splitlines()
        row["error"] = f"{type(e).__name__}: {' '.join(first[:6])[:600]}"
    # What one compile costs (one process, one core): what a first launch on a GPU pays.
    row["compile_s"] = round(time.perf_counter() - t0, 2)
    return row


# ---- from a compiled kernel to a launch ----------------------------------------------------


def programs_per_sm(regs: int, smem: int, warps: int, target: str) -> int:
    """Programs an SM holds at once: the least of what its registers (allocated per warp in
    units of 256, i.e. regs rounded up to 8 per thread), threads, shared memory (plus the
    1 KiB a block reserves) and block slots allow; 0 if one program does not fit."""
    lim = TARGETS[target]
    per_warp = math.ceil(regs * 32 / 256) * 256
    by_regs = lim["regs"] // (per_warp * warps)
    by_threads = lim["threads"] // (32 * warps)
    if smem > lim["smem_block"]:
        return 0
    by_smem = lim["smem"] // (smem + SMEM_RESERVED)
    return max(0, min(by_regs, by_threads, by_smem, lim["blocks"]))


def waves_and_fill(grid: int, sm: int, per_sm: int) -> tuple[int | None, float]:
    """(waves, fill): a wave is up to sm * per_sm programs; fill is the busy share of the SMs
    in the least-filled wave (every full wave keeps every SM busy; the last one keeps
    min(its programs, sm) SMs busy)."""
    if per_sm < 1:
        return None, 0.0
    slots = sm * per_sm
    waves = -(-grid // slots)
    last = grid - (waves - 1) * slots
    return waves, min(last, sm) / sm


def launches(rows: list[dict], Bs, n_modes, sm: int, target: str) -> list[dict]:
    """The trainer's launch at each B and n: the launcher's streams per program, and waves and
    fill for the kernel with the fewest programs per SM among the trainer's variants (the
    slowest of the window's launches to fill the GPU)."""
    from atom_train.model.field_kernels import launch_plan

    out = []
    for n in n_modes:
        for B in Bs:
            block, _warps = launch_plan(B, n, sm)
            grid = -(-B // block)
            fits = [
                programs_per_sm(r["regs"], r["smem_bytes"], r["warps"], target)
                for r in rows
                if r["n"] == n
                and r["streams_per_program"] == block
                and r["dtype"] == "float32"
                and r["variant"].endswith("reset-scalars")
                and r["ok"]
            ]
            per_sm = min(fits) if fits else 0
            waves, fill = waves_and_fill(grid, sm, per_sm)
            out.append(
                {
                    "B": B,
                    "n": n,
                    "sm": sm,
                    "streams_per_program": block,
                    "grid": grid,
                    "programs_per_sm": per_sm,
                    "waves": waves,
                    "fill": round(fill, 4),
                }
            )
    return out


def report(
    Bs=(256, 1024, 4096, 16384),
    n_modes=(16, 32, 64, 128),
    sm: int = 132,
    target: str = "sm_90",
    which: str = "all",
    jobs: int | None = None,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """The whole report as one JSON-able object (see the module docstring). Variants are
    compiled in `jobs` processes (default: one per CPU), each at the blocks the launcher
    chooses for Bs. `progress(partial report)` is called after every compiled variant (in
    the order they were started), so a report cut short keeps what it compiled."""
    import triton

    from atom_train.model.field_kernels import launch_plan

    def blocks_of(n):
        return sorted({launch_plan(B, n, sm)[0] for B in Bs})

    todo = variants(n_modes, blocks_of, which)
    # The backward takes several times the forward's compile: start those first.
    todo.sort(key=lambda v: (v.kernel != "bwd", -v.n))
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
    key = {"fwd": 0, "bwd": 1}
    rows: list[dict] = []

    def whole() -> dict:
        rows.sort(
            key=lambda r: (
                r["n"], key[r["kernel"]], r["dtype"], r["streams_per_program"], r["variant"]
            )
        )  # fmt: skip
        return {
            "triton": triton.__version__,
            "target": target,
            "variants": rows,
            "launches": launches(rows, Bs, n_modes, sm, target),
            "complete": len(rows) == len(todo),
        }

    with tempfile.TemporaryDirectory(prefix="kernel-report-") as cache:
        # A private Triton cache: the compiles neither read nor fill the user's.
        os.environ["TRITON_CACHE_DIR"] = cache
        os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the runtime's default
        with contextlib.ExitStack() as stack:
            if jobs == 1:
                done = (compile_variant(v, target) for v in todo)
            else:
                pool = stack.enter_context(ProcessPoolExecutor(jobs))
                done = pool.map(compile_variant, todo, [target] * len(todo))
            for row in done:
                rows.append(row)
                if progress is not None:
                    progress(whole())
    return whole()


def format_report(rep: dict) -> str:
    """The report as two plain tables."""
    lines = [
        f"Triton {rep['triton']}, target {rep['target']}: registers and spills from ptxas -v",
        f"{'kernel':>6} {'n':>4} {'dtype':>7} {'block':>5} {'warps':>5} {'variant':<28} "
        f"{'regs':>4} {'spill st/ld B':>14} {'stack':>6} {'smem':>7}  status",
    ]
    for r in rep["variants"]:
        head = (
            f"{r['kernel']:>6} {r['n']:>4} {r['dtype']:>7} {r['streams_per_program']:>5} "
            f"{r['warps']:>5} {r['variant']:<28} "
        )
        if r["ok"]:
            spills = f"{r['spill_store_bytes']}/{r['spill_load_bytes']}"
            lines.append(
                head + f"{r['regs']:>4} {spills:>14} {r['stack_bytes']:>6} {r['smem_bytes']:>7}  ok"
            )
        else:
            lines.append(head + f"{'-':>4} {'-':>14} {'-':>6} {'-':>7}  FAILED: {r['error']}")
    lines.append("")
    lines.append("launches (the variant with the fewest programs per SM):")
    lines.append(
        f"{'B':>6} {'n':>4} {'SMs':>4} {'block':>5} {'grid':>5} {'per SM':>6} {'waves':>5} {'fill':>5}"
    )
    for x in rep["launches"]:
        waves = "-" if x["waves"] is None else x["waves"]
        lines.append(
            f"{x['B']:>6} {x['n']:>4} {x['sm']:>4} {x['streams_per_program']:>5} {x['grid']:>5} "
            f"{x['programs_per_sm']:>6} {waves:>5} {x['fill']:>5.2f}"
        )
    return "\n".join(lines)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m atom_train.kernel_report",
        description=__doc__.split("\n\n")[0],
        epilog="examples:\n  "
        + "\n  ".join(
            line.strip() for line in __doc__.splitlines() if line.strip().startswith("python -m")
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_shared(
        p,
        "B",
        default="256,1024,4096,16384",
        help="streams for the launch figures, comma-separated (default: %(default)s)",
    )
    p.add_argument("--sm", type=int, default=132, help="SMs of the GPU (default: %(default)s)")
    add_shared(
        p,
        "n_modes",
        default="16,32,64,128",
        help="field modes n, comma-separated (default: %(default)s)",
    )
    p.add_argument(
        "--target",
        default="sm_90",
        choices=sorted(TARGETS),
        help="GPU architecture to compile for (default: %(default)s)",
    )
    p.add_argument(
        "--variants",
        default="all",
        choices=VARIANT_SETS,
        help="all (with the tests' float64 and reset-table variants), trainer (float32, "
        f"periodic resets) or quick (trainer, and the tests' at n = {QUICK_TEST_N}) "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--jobs", type=int, default=None, help="compiler processes (default: one per CPU)"
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument(
        "--out",
        default=None,
        metavar="PATH",
        help="also write the report as JSON here, rewritten after every compiled variant "
        '(a report cut short keeps what it compiled; "complete" says whether it finished)',
    )
    return p


def main(argv: list[str] | None = None) -> int:
    set_command("kernel_report")
    try:
        a = build_parser().parse_args(argv)
        Bs, n_modes = positive_ints(a.B, "-B"), positive_ints(a.n_modes, "--n-modes")
        if a.sm < 1:
            raise UserError(f"--sm must be >= 1, got {a.sm}")
        try:
            import triton  # noqa: F401
        except ImportError:
            raise UserError("Triton is not installed here: pip install triton") from None
    except UserError as e:
        return user_error_exit(e)
    save = None
    if a.out:
        from atom_train.common.atomic import atomic_write_json

        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)

        def save(partial: dict) -> None:
            atomic_write_json(a.out, partial)

    rep = report(Bs, n_modes, a.sm, a.target, a.variants, a.jobs, save)
    print(json.dumps(rep, indent=1) if a.json else format_report(rep))
    return 0 if all(r["ok"] for r in rep["variants"]) else 1


if __name__ == "__main__":
    sys.exit(main())
