"""Time the field loop on a GPU: the forward alone, the backward alone and a whole training
window (the model's forward and backward through `BatchedByteTick`), per recurrence, n and B,
with CUDA events (wall-clock timers on a CPU, for tests). `scripts/gpu_check.sh` runs it.

    python -m atom_train.bench.kernels --out runs/t.json      # B 256..16384, n 32/64/128
    python -m atom_train.bench.kernels -B 1024 --n-modes 32 --recurrence triton
    python -m atom_train.bench.kernels --device cpu -B 4 --n-modes 8 -K 4 --recurrence fused

Each configuration runs one untimed warm-up (the Triton compile), then up to --repeat timed
runs within --seconds; a failure (out of memory, a compile error) is recorded in its row and
the next configuration runs. The loop's inputs are the model's kind
(`loop_check.sample_loop_inputs`: drive around 0.25, the default leak and coupling scale;
its few streams above the cap, quiet or silent cost what the others do), K ticks with no
reset; the JSON (--out) is rewritten after every row.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from atom_train.common.atomic import atomic_write_json
from atom_train.common.cli import (
    ArgumentParser,
    UserError,
    add_shared,
    positive_ints,
    set_command,
    user_error_exit,
)

RECURRENCES = ("triton", "fused")
FIELDS = ("fwd_ms", "bwd_ms", "window_ms")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m atom_train.bench.kernels", description=__doc__)
    add_shared(p, "B", default="256,1024,4096,16384", help="streams (default: %(default)s)")
    add_shared(p, "n_modes", default="32,64,128", help="field modes (default: %(default)s)")
    add_shared(
        p, "bptt", type=int, default=64, metavar="K", help="ticks a window (default: %(default)s)"
    )
    add_shared(
        p,
        "recurrence",
        default="triton,fused",
        help="loops to time, comma-separated, of triton and fused (default: %(default)s)",
    )
    p.add_argument("--repeat", type=int, default=5, help="timed runs (default: %(default)s)")
    add_shared(
        p, "seconds", type=float, default=6.0, help="time per configuration (default: %(default)s)"
    )
    add_shared(p, "device", default="cuda", help="cuda or cpu (default: %(default)s)")
    add_shared(p, "out", type=Path, help="write the results as JSON here")
    return p


def parse_args(argv=None) -> dict:
    """The command line as a plan (a dict); UserError names the fix."""
    a = build_parser().parse_args(argv)
    recs = tuple(r.strip() for r in a.recurrence.split(",") if r.strip())
    bad = [r for r in recs if r not in RECURRENCES]
    if bad or not recs:
        raise UserError(f"--recurrence takes {' and '.join(RECURRENCES)}, got {a.recurrence!r}")
    if a.bptt < 1 or a.repeat < 1 or a.seconds <= 0:
        raise UserError("--bptt and --repeat must be >= 1 and --seconds > 0")
    if a.device not in ("cuda", "cpu"):
        raise UserError(f"--device must be cuda or cpu, got {a.device!r}")
    return {
        "Bs": positive_ints(a.B, "-B"),
        "n_modes": positive_ints(a.n_modes, "--n-modes"),
        "K": a.bptt,
        "recurrences": recs,
        "repeat": a.repeat,
        "seconds": a.seconds,
        "device": a.device,
        "out": a.out,
    }


class _Clock:
    """Milliseconds between two points on the device's stream: CUDA events there, else the
    host's clock (a CPU runs synchronously)."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        self.torch = torch

    def time(self, fn) -> float:
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3


def time_config(recurrence: str, n: int, B: int, K: int, device, repeat: int, seconds: float):
    """One row: median milliseconds of the loop's forward, its backward, and a whole
    training window; or the error that stopped it."""
    import torch

    from atom_train.model.batched import BatchedByteTick
    from atom_train.model.config import FieldConsts, ModelConfig
    from atom_train.model.field_loops import LOOPS
    from atom_train.model.loop_check import sample_loop_inputs
    from atom_train.model.reference import ReferenceModel

    row = {"recurrence": recurrence, "n": n, "B": B, "K": K, "runs": 0, "error": None}
    row.update(dict.fromkeys(FIELDS))
    clock = _Clock(device)
    loop = LOOPS[recurrence]
    try:
        config = ModelConfig(n_modes=n)
        c = FieldConsts.of(config)
        ins, grad_of = sample_loop_inputs(K, B, c, device)
        resets = (False,) * K
        gZ = torch.randn(K, B, 2 * n, device=device)
        model = ReferenceModel(config).to(device)
        bt = BatchedByteTick(model, B, device=device, recurrence=recurrence)
        gen = torch.Generator().manual_seed(1)
        feats = (torch.rand(K, B, 320, generator=gen) < 0.05).float().to(device)
        tgt = torch.randint(0, 256, (K, B), generator=gen).to(device)
        out = {}

        def fwd():
            out["Zs"] = loop(*ins, resets, c)[0]

        def bwd():
            torch.autograd.grad(out["Zs"], [ins[i] for i in grad_of], gZ)

        def window():
            model.zero_grad(set_to_none=True)
            bt.run_window(feats, tgt, 1).loss.backward()
            bt.detach_state()

        samples = {k: [] for k in FIELDS}
        deadline = None
        for i in range(repeat + 1):  # the first run warms up (compiles), untimed
            times = (clock.time(fwd), clock.time(bwd), clock.time(window))
            if i == 0:
                deadline = time.monotonic() + seconds
                continue
            for k, t in zip(FIELDS, times, strict=True):
                samples[k].append(t)
            row["runs"] = i
            if time.monotonic() > deadline:
                break
        for k in FIELDS:
            row[k] = round(statistics.median(samples[k]), 4) if samples[k] else None
        if row["window_ms"]:
            row["bytes_per_s"] = round(K * B / (row["window_ms"] / 1e3))
    except Exception as e:
        row["error"] = (
            f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e) else ''}"
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def format_rows(rows: list[dict]) -> str:
    lines = [
        f"{'loop':>7} {'n':>4} {'B':>6} {'fwd ms':>9} {'bwd ms':>9} {'window ms':>10} "
        f"{'MB/s':>8} {'runs':>4}"
    ]
    for r in rows:
        head = f"{r['recurrence']:>7} {r['n']:>4} {r['B']:>6} "
        if r["error"]:
            lines.append(head + f"error: {r['error']}")
            continue
        mbs = r.get("bytes_per_s", 0) / 1e6
        lines.append(
            head + f"{r['fwd_ms']:>9.3f} {r['bwd_ms']:>9.3f} {r['window_ms']:>10.3f} "
            f"{mbs:>8.2f} {r['runs']:>4}"
        )
    return "\n".join(lines)


def write_report(path: Path, rows: list[dict], meta: dict) -> Path:
    """The results as one JSON object {meta..., "results": rows}, replaced atomically (a
    killed run leaves the previous file or this one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(path, {**meta, "results": rows})


def main(argv=None) -> int:
    set_command("bench.kernels")
    try:
        plan = parse_args(argv)
        import torch

        if plan["device"] == "cuda" and not torch.cuda.is_available():
            raise UserError("no CUDA device here: use --device cpu (for a check of the script)")
    except UserError as e:
        return user_error_exit(e)
    device = torch.device(plan["device"])
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    meta["torch"] = torch.__version__
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    rows = []
    for n in plan["n_modes"]:
        for B in plan["Bs"]:
            for rec in plan["recurrences"]:
                row = time_config(rec, n, B, plan["K"], device, plan["repeat"], plan["seconds"])
                rows.append(row)
                print(format_rows([row]).splitlines()[1], flush=True)
                if plan["out"]:  # after every row: a part cut short still leaves its figures
                    write_report(plan["out"], rows, meta)
    print(format_rows(rows))
    return 0 if all(r["error"] is None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
