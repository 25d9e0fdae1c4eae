"""`python -m atom_train.bench`: bytes per second of the loader alone and of the training step.

Every configuration runs in its own subprocess (a fresh interpreter, thread pool and peak
memory), warms up, then is measured for `--seconds` in repeated intervals: the report gives
min / median / max bytes/s, how long each was measured and whether the spread is wide,
because short timings lie. Results go to `--out` (JSON) and a PNG plot of
bytes/s vs B (log-log, with the loader's ceiling and each point's spread) beside it (`--plot`,
default: `--out` with .png). Bytes = ticks x B.

    python -m atom_train.bench loader                    # Rust vs Python oracle vs fill ceiling
    python -m atom_train.bench loader -B 256,1024 --threads 2 --seconds 10
    python -m atom_train.bench step --seconds 20         # isolated step vs the trainer's window
    python -m atom_train.bench step -B 32,128,512 --threads 1,2 --legacy --seconds 300
    python -m atom_train.bench step --device cuda -B 1024,4096 --max-mem-gb 80
    python -m atom_train.bench all --out runs/bench/cpu.json      # and runs/bench/cpu.png
    python -m atom_train.bench logs --days 7 --steps-per-s 300   # what the logs cost over days

`loader` measures, for each B: the Rust loader's dense `next_window(K)` (and the compact
`next_window_ids(K)`) with each thread count; the Python Atomizer oracle (`encode_bytes`,
single-threaded, independent of B); and the write-bandwidth ceiling, numpy's `fill` of the
same `[K, B, 320]` float32 buffer.

`step` measures, for each B and thread count, the trainer's window step in two modes side by
side (`atom_train.bench.step`): ``isolated`` (the step on windows prepared in memory) and
``trainer`` (the Rust loader feeding the step through the prefetch thread: the trainer's loop
on the trainer's plan of the configuration; its loader thread's own share of the time is
reported), plus with `--legacy` the single-stream reference trained tick by tick. `--recurrence native,fused` measures each field
loop in turn at every B, thread count and mode (interleaved, so the machine's drift hits
them alike) and reports their ratios, the ratio to the reference (with `--legacy`) and, for
the isolated step on a CPU, the share of this machine's GEMM ceiling: one thread's rate on a
large float32 GEMM divided by the step's matmul FLOPs per byte (`bench.step.gemm_ceiling`). Memory per stream comes from a fit of peak
memory vs B (fixed + per stream at the K used); `--max-mem-gb G` then measures (in
subprocesses, doubling B, then bisecting) the largest B that fits G on this device at K and
at 2K. On a GPU a B fits when what its step needed from the device, torch's peak
*reserved* memory plus what the device holds outside torch's allocator (CUDA context,
library workspaces, Triton's kernels), leaves `common.measure.SAFETY_MARGIN` of G free (a long run's
allocator fragments more than a short probe's); a probe that times out or fails otherwise
ends the search there, reported as such, not as "does not fit".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atom_train.common.atomic import atomic_write_json
from atom_train.common.cli import (
    CORPUS_HELP,
    ArgumentParser,
    UserError,
    add_shared,
    counted,
    set_command,
    user_error_exit,
)
from atom_train.common.figures import finish, log_scale, pyplot, save_figure, ticks_at
from atom_train.common.measure import measure, peak_rss_mb, usable_memory_mb
from atom_train.data.sources import open_corpus
from atom_train.data.synthetic import write_synthetic_corpus
from atom_train.trainer.text_sources import check_held_out, open_built_corpus

# --- one configuration, in a child process --------------------------------------------------


def measure_loader(config: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    impl, B, K, seconds = config["impl"], config["B"], config["K"], config["seconds"]
    if impl in ("rust", "rust_ids"):
        from atom_train.data.loader import BatchedByteStream, ByteCorpus

        corpus = ByteCorpus(config["data"], resident=config.get("resident", False))
        stream = BatchedByteStream(corpus, B, offsets=0, threads=config["threads"])
        call = stream.next_window if impl == "rust" else stream.next_window_ids

        def work() -> int:
            call(K)
            return K * B

    elif impl == "oracle":
        from atom_train.data.atomizer import Atomizer

        with open(config["data"][0], "rb") as f:
            data = f.read(4096)
        atom = Atomizer()

        def work() -> int:
            atom.encode_bytes(data)
            return len(data)

    elif impl == "fill":
        feats = np.empty((K, B, 320), np.float32)

        def work() -> int:
            feats.fill(0.0)
            return K * B

    else:
        raise ValueError(f"unknown loader impl {impl!r}")
    return {
        **measure(work, seconds, intervals=config.get("intervals", 5)),
        "peak_rss_mb": peak_rss_mb(),
    }


def run_one(config: dict[str, Any]) -> dict[str, Any]:
    if config["kind"] == "loader":
        return measure_loader(config)
    if config["kind"] == "step":
        from atom_train.bench.step import measure_step

        return measure_step({k: v for k, v in config.items() if k != "kind"})
    raise ValueError(f"unknown configuration kind {config['kind']!r}")


# --- the parent: configurations, subprocesses, report --------------------------------------


def run_in_subprocess(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "atom_train.bench", "_one", json.dumps(config)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {**config, "error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**config, "error": tail[0]}
    return {**config, **json.loads(proc.stdout.strip().splitlines()[-1])}


def loader_configs(args: argparse.Namespace, data: list[str]) -> list[dict[str, Any]]:
    base = {"kind": "loader", "K": args.bptt, "seconds": args.seconds, "data": data}
    configs = []
    for B in args.B:
        for threads in args.threads:
            for impl in ("rust", "rust_ids"):
                configs.append({**base, "impl": impl, "B": B, "threads": threads})
        configs.append({**base, "impl": "fill", "B": B, "threads": 1})
        configs.append({**base, "impl": "oracle", "B": B, "threads": 1})
    return configs


def recurrences(args: argparse.Namespace) -> list[str]:
    """The field loops of `--recurrence`, a comma-separated list (one is the usual)."""
    return [r.strip() for r in str(args.recurrence).split(",") if r.strip()] or ["auto"]


def step_configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    base = {
        "kind": "step",
        "K": args.bptt,
        "seconds": args.seconds,
        "n_modes": args.n_modes,
        "device": args.device,
        "transport": args.transport,
    }
    recs = recurrences(args)
    configs = []
    for threads in args.threads:
        if args.legacy:
            configs.append(
                {**base, "mode": "legacy", "B": 1, "threads": threads, "recurrence": recs[0]}
            )
        for B in args.B:
            for mode in args.modes:
                loader_threads = args.loader_threads or threads
                for i, rec in enumerate(recs):
                    configs.append(
                        {
                            **base,
                            "mode": mode,
                            "B": B,
                            "threads": threads,
                            "loader_threads": loader_threads,
                            "recurrence": rec,
                            # The ceiling does not depend on the loop: measured once.
                            "ceiling": mode == "isolated" and args.device == "cpu" and i == 0,
                        }
                    )
    return configs


def _fmt(x: float | None) -> str:
    if x is None or x != x:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def _spread(r: dict[str, Any]) -> str:
    flag = " WIDE" if r.get("wide_spread") else ""
    return (
        f"{_fmt(r.get('bytes_per_s_min'))}/{_fmt(r.get('bytes_per_s_median'))}/"
        f"{_fmt(r.get('bytes_per_s_max'))}{flag}"
    )


def loader_table(results: list[dict[str, Any]]) -> str:
    def get(impl, B, threads=None):
        for r in results:
            if (r.get("impl"), r["B"]) == (impl, B) and threads in (None, r["threads"]):
                return r
        return {}

    lines = [
        f"{'B':>5} {'thr':>3} {'rust B/s':>9} {'ids B/s':>9} {'fill B/s':>9} {'oracle B/s':>10} "
        f"{'rust/fill':>9} {'rust/oracle':>11} {'rust min/med/max':>22} {'RSS MB':>7} "
        f"{'measured s':>10}"
    ]
    for r in results:
        if r.get("impl") != "rust" or "error" in r:
            continue
        B, t = r["B"], r["threads"]
        ids, fill, oracle = get("rust_ids", B, t), get("fill", B), get("oracle", B)
        rust = r.get("bytes_per_s")
        ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"  # noqa: E731
        lines.append(
            f"{B:>5} {t:>3} {_fmt(rust):>9} {_fmt(ids.get('bytes_per_s')):>9} "
            f"{_fmt(fill.get('bytes_per_s')):>9} {_fmt(oracle.get('bytes_per_s')):>10} "
            f"{ratio(rust, fill.get('bytes_per_s')):>9} "
            f"{ratio(rust, oracle.get('bytes_per_s')):>11} {_spread(r):>22} "
            f"{r.get('peak_rss_mb', 0):>7.0f} {r.get('measured_s', 0):>10.1f}"
        )
    return "\n".join(lines)


def step_table(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{'mode':>9} {'B':>5} {'thr':>3} {'loop':>9} {'bytes/s':>9} {'bytes/cpu-s':>11} "
        f"{'min/med/max':>22} {'loader':>6} {'RSS MB':>7} {'dev MB':>7} {'measured s':>10}"
    ]
    for r in results:
        if "error" in r:
            lines.append(f"{r['mode']:>9} {r['B']:>5} {r['threads']:>3} error: {r['error']}")
            continue
        wait = r.get("loader_share")
        dev = r.get("peak_device_mb")
        lines.append(
            f"{r['mode']:>9} {r['B']:>5} {r['threads']:>3} {r.get('recurrence') or '-':>9} "
            f"{_fmt(r['bytes_per_s']):>9} {_fmt(r['bytes_per_cpu_s']):>11} {_spread(r):>22} "
            f"{'-' if wait is None else f'{100 * wait:.1f}%':>6} {r['peak_rss_mb']:>7.0f} "
            f"{'-' if dev is None else f'{dev:.0f}':>7} {r['measured_s']:>10.1f}"
        )
    lines += _loop_ratios(results)
    pairs = []
    for r in results:
        if r.get("mode") in ("trainer", "eval") and "error" not in r:
            iso = [
                x
                for x in results
                if x.get("mode") == "isolated"
                and "error" not in x
                and (x["B"], x["threads"], x.get("recurrence"))
                == (r["B"], r["threads"], r.get("recurrence"))
            ]
            if iso:
                ratio = r["bytes_per_s"] / iso[0]["bytes_per_s"]
                pairs.append(f"B={r['B']} thr={r['threads']}: {r['mode']}/isolated {ratio:.2f}")
    if pairs:
        lines.append("  " + "; ".join(pairs))
    return "\n".join(lines)


def _loop_ratios(results: list[dict[str, Any]]) -> list[str]:
    """Bytes per CPU-second of each field loop against the others at the same mode, B and
    threads; against the single-stream reference at the same threads; as a share of the
    GEMM ceiling; and each loop's 2-thread / 1-thread wall rate."""
    ok = [r for r in results if "error" not in r]
    legacy = {r["threads"]: r["bytes_per_cpu_s"] for r in ok if r["mode"] == "legacy"}
    ceiling = {
        (r["B"], r["threads"]): r["ceiling_bytes_per_cpu_s"]
        for r in ok
        if r.get("ceiling_bytes_per_cpu_s")
    }
    rows = [r for r in ok if r["mode"] != "legacy"]
    out = []
    for r in rows:
        parts = []
        others = [
            x
            for x in rows
            if (x["mode"], x["B"], x["threads"]) == (r["mode"], r["B"], r["threads"])
            and x.get("recurrence") != r.get("recurrence")
        ]
        for x in others:
            ratio = r["bytes_per_cpu_s"] / x["bytes_per_cpu_s"]
            parts.append(f"{ratio:.2f}x {x.get('recurrence')}")
        if r["threads"] in legacy:
            parts.append(f"{r['bytes_per_cpu_s'] / legacy[r['threads']]:.0f}x the reference")
        cap = ceiling.get((r["B"], r["threads"]))
        if cap and r["mode"] == "isolated":
            parts.append(f"{r['bytes_per_cpu_s'] / cap:.2f} of the GEMM ceiling ({_fmt(cap)})")
        one = [
            x["bytes_per_s"]
            for x in rows
            if (x["mode"], x["B"], x.get("recurrence"), x["threads"])
            == (r["mode"], r["B"], r.get("recurrence"), 1)
        ]
        if r["threads"] > 1 and one:
            parts.append(f"{r['bytes_per_s'] / one[0]:.2f}x its 1-thread bytes/s")
        if parts:
            head = f"{r['mode']} B={r['B']} thr={r['threads']} {r.get('recurrence')}"
            out.append(f"  {head}: " + ", ".join(parts))
    return out


def memory_fit(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Least-squares fit of peak memory (device MB on a GPU, else RSS MB) vs B over the
    isolated step results: fixed MB + per-stream MB x B (at their K)."""
    rows = [r for r in results if r.get("mode") == "isolated" and "error" not in r]
    if len({r["B"] for r in rows}) < 2:
        return None
    key = "peak_device_mb" if rows[0].get("peak_device_mb") is not None else "peak_rss_mb"
    xs, ys = [r["B"] for r in rows], [r[key] for r in rows]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    return {
        "memory": key,
        "K": rows[0]["K"],
        "fixed_mb": my - slope * mx,
        "per_stream_mb": slope,
        "per_stream_per_tick_kb": slope * 1024 / rows[0]["K"],
        "points": [[x, y] for x, y in zip(xs, ys, strict=True)],
    }


def probe_memory_mb(r: dict[str, Any]) -> float | None:
    """The memory a probe's step needed: on a GPU its peak reserved memory plus the memory
    outside torch's allocator (the peak allocation alone would not fit in practice); on a
    CPU its peak RSS."""
    if r.get("peak_device_reserved_mb") is not None:
        return r["peak_device_reserved_mb"] + r.get("device_outside_allocator_mb", 0.0)
    return r.get("peak_rss_mb")


def probe_outcome(r: dict[str, Any], usable_mb: float) -> str:
    """ "fits", "too big" (over the budget, or out of memory), "timeout" or "error"."""
    error = r.get("error")
    if error is None:
        used = probe_memory_mb(r)
        return "fits" if used is not None and used <= usable_mb else "too big"
    if error.startswith("timed out"):
        return "timeout"
    return "too big" if "out of memory" in error.lower() else "error"


def max_batch(args: argparse.Namespace, K: int, timeout: float) -> dict[str, Any]:
    """The largest B whose isolated step fits `args.max_mem_gb` at this K, measured: B
    doubles from the largest -B until a probe does not fit, then bisects. A probe that
    times out or fails for another reason is an upper bound of the search, recorded as
    ``stopped_by`` (so ``largest_B`` is then a lower bound)."""
    budget_mb = args.max_mem_gb * 1024
    usable_mb = usable_memory_mb(budget_mb)
    base = {
        "kind": "step",
        "mode": "isolated",
        "K": K,
        "seconds": min(args.seconds, 2.0),
        "n_modes": args.n_modes,
        "device": args.device,
        "recurrence": recurrences(args)[0],
        "transport": args.transport,
        "threads": max(args.threads),
        "intervals": 1,
    }
    probes: list[dict[str, Any]] = []
    stopped_by: list[str] = []

    def fits(B: int) -> bool:
        r = run_in_subprocess({**base, "B": B}, timeout)
        used = probe_memory_mb(r)
        outcome = probe_outcome(r, usable_mb)
        probes.append({"B": B, "outcome": outcome, "used_mb": used, "error": r.get("error")})
        if outcome in ("timeout", "error"):
            stopped_by.append(f"{outcome} at B={B}: {r['error']}")
        said = "does not fit" if outcome == "too big" else outcome
        print(
            f"  max-mem probe K={K} B={B}: {said} "
            f"({'-' if used is None else f'{used:.0f} of {usable_mb:.0f} usable MB'})",
            flush=True,
        )
        return outcome == "fits"

    lo, hi = 0, None
    B = max(args.B)
    while hi is None and B <= 1 << 20:
        if fits(B):
            lo, B = B, B * 2
        else:
            hi = B
    if lo == 0 and hi is not None:  # even the first probe is too big: search below it
        lo_b = 1
        while lo_b < hi and not fits(lo_b):
            lo_b *= 2
        lo = lo_b if lo_b < hi else 0
    while hi is not None and lo and hi - lo > max(1, lo // 10):
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return {
        "K": K,
        "budget_gb": args.max_mem_gb,
        "usable_mb": usable_mb,
        "largest_B": lo or None,
        "stopped_by": stopped_by or None,
        "probes": probes,
    }


def plot(results: list[dict[str, Any]], path: str) -> None:
    """The figure of `results` (`figure`) into `path`, when one finished."""
    fig = figure(results)
    if fig is not None:
        save_figure(fig, Path(path))


def figure(results: list[dict[str, Any]]):
    """Bytes/s against B, a panel per kind of bench (the loader; the training step, with the
    loader's ceiling), a line per configuration, a tick at every B measured; None without a
    finished measurement."""
    kinds = sorted({r["kind"] for r in results if "error" not in r})
    if not kinds:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 4.5), squeeze=False)
    ceiling = {}
    for r in results:
        if r["kind"] == "loader" and r.get("impl") in ("rust", "rust_ids") and "error" not in r:
            ceiling[r["B"]] = max(ceiling.get(r["B"], 0), r["bytes_per_s"])
    for ax, kind in zip(axes[0], kinds, strict=True):
        series: dict[str, list[tuple[int, float, float, float]]] = {}
        for r in results:
            if r["kind"] != kind or "error" in r:
                continue
            if kind == "loader":
                label = {"rust": "Rust dense", "rust_ids": "Rust ids"}.get(r["impl"], r["impl"])
                if r["impl"].startswith("rust"):
                    label += f", {counted(r['threads'], 'thread')}"
                elif r["impl"] == "fill":
                    label = "numpy fill (write ceiling)"
                else:
                    label = "Python oracle"
            else:
                label = f"{r['mode']}, {counted(r['threads'], 'thread')}"
                if r.get("recurrence"):
                    label += f", {r['recurrence']}"
            lo = r.get("bytes_per_s_min", r["bytes_per_s"])
            hi = r.get("bytes_per_s_max", r["bytes_per_s"])
            series.setdefault(label, []).append((r["B"], r["bytes_per_s"], lo, hi))
        for label, points in series.items():
            points.sort()
            xs = [p[0] for p in points]
            ys = [p[1] for p in points]
            # (the whole measurement's rate can fall outside its intervals' min-max by a
            # hair: a bar is never negative)
            err = [
                [max(y - p[2], 0.0) for y, p in zip(ys, points, strict=True)],
                [max(p[3] - y, 0.0) for y, p in zip(ys, points, strict=True)],
            ]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
        if kind == "step" and ceiling:
            xs = sorted(ceiling)
            ax.plot(xs, [ceiling[x] for x in xs], "k--", lw=1, label="loader ceiling (Rust)")
        log_scale(ax, "x")
        log_scale(ax, "y")
        ticks_at(ax, "x", [p[0] for points in series.values() for p in points])
        ax.set(xlabel="B (streams)", ylabel="bytes/s")
        ax.set_title("loader only" if kind == "loader" else "training step (bars: min-max)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return finish(fig)


def run_bench(args: argparse.Namespace) -> int:
    started = time.time()
    results: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    timeout = args.timeout or args.seconds * 3 + 180
    plot_to = args.plot or str(Path(args.out).with_suffix(".png"))
    for path in (args.out, plot_to):  # (runs/ is outside version control)
        Path(path).parent.mkdir(parents=True, exist_ok=True)

    def save(more: list[dict[str, Any]] = ()) -> None:
        """The JSON as it stands, replaced atomically after every configuration: a bench cut
        short (a time limit, a machine taken back) leaves every configuration it finished."""
        report = {
            "command": ["python", "-m", "atom_train.bench", *sys.argv[1:]],
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "host": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
            },
            "results": results + list(more),
            **extra,
        }
        atomic_write_json(args.out, report)

    with tempfile.TemporaryDirectory(prefix="atom-bench-") as tmp:
        if args.command in ("loader", "all"):
            data = args.data
            if args.corpus:
                if data:
                    raise UserError("give --corpus DIR or --data GLOB, not both")
                data = [str(p) for p in open_built_corpus(args.corpus).train]
            elif data:
                data = _data_files(data)
            if not data:
                path = os.path.join(tmp, "corpus.txt")
                write_synthetic_corpus(path, args.corpus_mb << 20)
                data = [path]
            configs = loader_configs(args, data)
            print(f"loader: {len(configs)} configurations, K={args.bptt}, {args.seconds} s each")
            for config in configs:
                results.append(run_in_subprocess(config, timeout))
                save()
                r = results[-1]
                print(
                    f"  {r['impl']:>8} B={r['B']:<5} threads={r['threads']}: "
                    + (f"error: {r['error']}" if "error" in r else f"{_fmt(r['bytes_per_s'])}B/s"),
                    flush=True,
                )
            print(loader_table([r for r in results if r["kind"] == "loader"]))
        if args.command in ("step", "all"):
            configs = step_configs(args)
            print(f"step: {len(configs)} configurations, K={args.bptt}, {args.seconds} s each")
            step_results = []
            for config in configs:
                step_results.append(run_in_subprocess(config, timeout))
                save(step_results)
                r = step_results[-1]
                print(
                    f"  {r['mode']:>9} B={r['B']:<5} threads={r['threads']}: "
                    + (
                        f"error: {r['error']}"
                        if "error" in r
                        else f"{_fmt(r['bytes_per_s'])}B/s ({_spread(r)})"
                    ),
                    flush=True,
                )
            results += step_results
            print(step_table(step_results))
            fit = memory_fit(step_results)
            if fit:
                extra["memory_fit"] = fit
                print(
                    f"memory ({fit['memory']}): {fit['fixed_mb']:.0f} MB fixed + "
                    f"{fit['per_stream_mb']:.3f} MB per stream at K={fit['K']} "
                    f"({fit['per_stream_per_tick_kb']:.2f} KB per stream per tick)"
                )
            if args.max_mem_gb:
                extra["max_batch"] = [
                    max_batch(args, K, timeout) for K in (args.bptt, 2 * args.bptt)
                ]
                for m in extra["max_batch"]:
                    print(
                        f"largest B that fits {m['budget_gb']} GB at K={m['K']}: "
                        f"{m['largest_B']} (measured, {m['usable_mb']:.0f} MB usable)"
                        + (
                            f"; search stopped by {'; '.join(m['stopped_by'])}"
                            if m["stopped_by"]
                            else ""
                        )
                    )
    save()
    plot(results, plot_to)
    print(f"wrote {args.out} and {plot_to}")
    return 1 if any("error" in r for r in results) else 0


def _data_files(globs: list[str]) -> list[str]:
    """--data's files, checked as the trainer checks them (a built corpus's held-out val
    among them is refused)."""
    files = list(open_corpus(globs, "--data", resident=False).shards)
    check_held_out(files, "--data")
    return files


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of ints, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected ints >= 1, got {text!r}")
    return values


def _mode_list(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("isolated", "trainer", "eval")]
    if not modes or bad:
        raise argparse.ArgumentTypeError(f"modes are isolated, trainer and eval, got {text!r}")
    return modes


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m atom_train.bench",
        description=__doc__.split("\n\n")[0],
        epilog="examples:\n" + __doc__.split("\n\n")[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=ArgumentParser
    )
    common = ArgumentParser(add_help=False)
    add_shared(
        common,
        "seconds",
        type=float,
        default=3.0,
        help="how long to measure each configuration after a warm-up; 300 and more for "
        "figures to plan a long run with (default: %(default)s)",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a configuration may take, start-up and warm-up included, before it is "
        "recorded as timed out (default: 3 x --seconds + 180)",
    )
    add_shared(
        common, "bptt", type=int, default=64, metavar="K", help="ticks per window (default: 64)"
    )
    add_shared(
        common,
        "out",
        default="runs/bench/bench.json",
        metavar="FILE.json",
        help="JSON results (default: %(default)s)",
    )
    add_shared(
        common,
        "plot",
        default=None,
        metavar="FILE.png",
        help="PNG plot (default: --out with .png)",
    )
    loader = ArgumentParser(add_help=False)
    add_shared(
        loader, "data", action="append", metavar="GLOB", help="corpus (default: synthetic text)"
    )
    add_shared(loader, "corpus", metavar="DIR", help=f"{CORPUS_HELP}: its train shards")
    loader.add_argument(
        "--corpus-mb",
        type=int,
        default=32,
        help="size of the synthetic corpus in MiB (default: %(default)s)",
    )
    step = ArgumentParser(add_help=False)
    add_shared(
        step, "n_modes", type=int, default=32, help="model n_modes for the step (default: 32)"
    )
    add_shared(
        step, "device", choices=("cpu", "cuda"), default="cpu", help="step device (default: cpu)"
    )
    add_shared(
        step,
        "recurrence",
        default="auto",
        help="field loop, or a comma-separated list measured side by side: auto, native, "
        "fused, autograd, compiled or triton (default: auto)",
    )
    add_shared(
        step,
        "transport",
        choices=("auto", "dense", "ids"),
        default="auto",
        help="features to the model as the trainer sends them (default: auto)",
    )
    step.add_argument(
        "--modes",
        type=_mode_list,
        default=["isolated", "trainer"],
        help="step modes, comma-separated: isolated, trainer, eval (scoring without "
        "gradients, as validation and atom_train.eval run it) (default: isolated,trainer)",
    )
    add_shared(
        step,
        "loader_threads",
        type=int,
        default=None,
        metavar="N",
        help="loader threads of the step configurations (default: as --threads)",
    )
    step.add_argument(
        "--legacy",
        action="store_true",
        help="also the single-stream reference trained tick by tick (the baseline batching is measured against)",
    )
    step.add_argument(
        "--max-mem-gb",
        type=float,
        default=None,
        metavar="G",
        help="measure the largest B (at K and 2K) whose step fits G GB on this device",
    )
    for name, parents, b_default, help_text in (
        ("loader", [common, loader], "1,64,256,1024", "loader only: Rust vs oracle vs fill"),
        ("step", [common, step], "32,128,512", "training step: isolated vs trainer window"),
        ("all", [common, loader, step], "32,128,512", "loader, then step"),
    ):
        p = sub.add_parser(name, parents=parents, help=help_text, description=help_text)
        add_shared(
            p,
            "B",
            type=_int_list,
            default=_int_list(b_default),
            metavar="LIST",
            help=f"comma-separated stream counts (default: {b_default})",
        )
        add_shared(
            p,
            "threads",
            type=_int_list,
            default=[1, 2],
            metavar="LIST",
            help="comma-separated thread counts (default: 1,2)",
        )
    # (listed for --help; `main` hands `logs ...` to atom_train.bench.logs, with its flags)
    sub.add_parser("logs", help="what a run's logs cost over days: logs --help")
    one = sub.add_parser("_one")  # internal: one configuration, JSON in and out
    one.add_argument("config")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    set_command("bench")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["logs"]:  # its own flags: atom_train.bench.logs
        from atom_train.bench.logs import main as logs_main

        return logs_main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
        if args.command == "_one":
            print(json.dumps(run_one(json.loads(args.config))))
            return 0
        if args.seconds <= 0 or args.bptt < 1:
            raise UserError("--seconds must be > 0 and --bptt >= 1")
        if args.timeout is not None and args.timeout <= args.seconds:
            raise UserError(
                "--timeout must be longer than --seconds (it includes start-up and warm-up)"
            )
        if getattr(args, "max_mem_gb", None) is not None and args.max_mem_gb <= 0:
            raise UserError("--max-mem-gb must be > 0")
        if args.command in ("step", "all"):
            from atom_train.model.field_loops import RECURRENCES

            bad = [r for r in recurrences(args) if r not in ("auto", *RECURRENCES)]
            if bad:
                raise UserError(
                    f"--recurrence: {', '.join(bad)}: use auto or {', '.join(RECURRENCES)}"
                )
        return run_bench(args)
    except UserError as e:  # (a bad flag, a --corpus that is not a finished corpus, ...)
        return user_error_exit(e)


if __name__ == "__main__":
    sys.exit(main())
