"""`python -m atom_train.bench`: bytes per second of the loader alone and of the training step.

Every configuration runs in its own subprocess (a fresh interpreter, thread pool and peak
RSS), measured for `--seconds` after a warm-up; the report says how long each was measured,
because short timings lie. Results go to `--out` (JSON) and a PNG plot of bytes/s vs B.
Bytes = ticks x B.

    python -m atom_train.bench loader                    # Rust vs Python oracle vs fill ceiling
    python -m atom_train.bench loader -B 256,1024 --threads 2 --seconds 10
    python -m atom_train.bench step --seconds 20         # full training step (atom_train.bench_step)
    python -m atom_train.bench all --out bench.json --plot bench.png

`loader` measures, for each B: the Rust loader's dense `next_window(K)` (and the compact
`next_window_ids(K)`) with each thread count; the Python Atomizer oracle (`encode_bytes`,
single-threaded, independent of B); and the write-bandwidth ceiling, numpy's `fill` of the
same `[K, B, 320]` float32 buffer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

# Synthetic text for the loader: French-like words, punctuation, accents, newlines.
_TEXT = (
    "le la les un une des et est dans pour que qui sur avec pas plus son au chat maison "
    "temps jour monde vie homme femme enfant pays ville travail année été être avoir faire "
    "très bien où déjà après même français élève côté fenêtre Paris Québec « » — €"
)
_WORDS = _TEXT.split()


def synthetic_corpus(path: str, n_bytes: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    ends = [" "] * 12 + [". ", ", ", "! ", "?\n", "\n"]
    with open(path, "wb") as f:
        written = 0
        while written < n_bytes:  # in 1 MiB blocks: the parent stays small
            block = "".join(rng.choice(_WORDS) + rng.choice(ends) for _ in range(100_000))
            data = block.encode()[: min(1 << 20, n_bytes - written)]
            f.write(data)
            written += len(data)


# --- one configuration, in a child process --------------------------------------------------


def peak_rss_mb() -> float:
    """Peak RSS of this process. VmHWM, because ru_maxrss survives exec: a child would report
    its parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(run, seconds: float, bytes_per_call: int) -> dict[str, float]:
    """Call `run` until `seconds` have passed (after one warm-up call)."""
    run()
    calls = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while True:
        run()
        calls += 1
        wall = time.perf_counter() - wall0
        if wall >= seconds:
            break
    cpu = time.process_time() - cpu0
    n = calls * bytes_per_call
    return {
        "bytes_per_s": n / wall,
        "bytes_per_cpu_s": n / cpu if cpu > 0 else float("nan"),
        "measured_s": wall,
        "calls": calls,
    }


def measure_loader(config: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    impl, B, K, seconds = config["impl"], config["B"], config["K"], config["seconds"]
    if impl in ("rust", "rust_ids"):
        from atom_train.data import BatchedByteStream, ByteCorpus

        corpus = ByteCorpus(config["data"], resident=config.get("resident", False))
        stream = BatchedByteStream(corpus, B, offsets=0, threads=config["threads"])
        call = stream.next_window if impl == "rust" else stream.next_window_ids
        result = _timed(lambda: call(K), seconds, K * B)
    elif impl == "oracle":
        from atom_train.atomizer import Atomizer

        with open(config["data"][0], "rb") as f:
            data = f.read(1 << 16)
        atom = Atomizer()
        result = _timed(lambda: atom.encode_bytes(data[:4096]), seconds, 4096)
    elif impl == "fill":
        feats = np.empty((K, B, 320), np.float32)
        result = _timed(lambda: feats.fill(0.0), seconds, K * B)
    else:
        raise ValueError(f"unknown loader impl {impl!r}")
    return {**result, "peak_rss_mb": peak_rss_mb()}


def measure_step(config: dict[str, Any]) -> dict[str, Any]:
    from atom_train.bench_step import measure_step as step  # written alongside the model

    return step(
        config["mode"],
        config["B"],
        config["K"],
        config["threads"],
        config["n_modes"],
        config["seconds"],
        compile=config.get("compile", False),
        device=config.get("device", "cpu"),
    )


def run_one(config: dict[str, Any]) -> dict[str, Any]:
    if config["kind"] == "loader":
        return measure_loader(config)
    if config["kind"] == "step":
        return measure_step(config)
    raise ValueError(f"unknown configuration kind {config['kind']!r}")


# --- the parent: configurations, subprocesses, report --------------------------------------


def run_in_subprocess(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "atom_train.bench", "_one", json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**config, "error": tail[0]}
    return {**config, **json.loads(proc.stdout.strip().splitlines()[-1])}


def loader_configs(args: argparse.Namespace, data: list[str]) -> list[dict[str, Any]]:
    base = {"kind": "loader", "K": args.K, "seconds": args.seconds, "data": data}
    configs = []
    for B in args.B:
        for threads in args.threads:
            for impl in ("rust", "rust_ids"):
                configs.append({**base, "impl": impl, "B": B, "threads": threads})
        configs.append({**base, "impl": "fill", "B": B, "threads": 1})
        configs.append({**base, "impl": "oracle", "B": B, "threads": 1})
    return configs


def step_configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    base = {
        "kind": "step",
        "K": args.K,
        "seconds": args.seconds,
        "n_modes": args.n_modes,
        "device": args.device,
        "compile": args.compile,
    }
    configs = []
    for threads in args.threads:
        configs.append({**base, "mode": "reference", "B": 1, "threads": threads})
        for B in args.B:
            configs.append({**base, "mode": "batched", "B": B, "threads": threads})
    return configs


def _fmt(x: float | None) -> str:
    if x is None or x != x:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def loader_table(results: list[dict[str, Any]]) -> str:
    def get(impl, B, threads=None):
        for r in results:
            if (r.get("impl"), r["B"]) == (impl, B) and threads in (None, r["threads"]):
                return r
        return {}

    lines = [
        f"{'B':>5} {'thr':>3} {'rust B/s':>9} {'ids B/s':>9} {'fill B/s':>9} {'oracle B/s':>10} "
        f"{'rust/fill':>9} {'rust/oracle':>11} {'RSS MB':>7} {'measured s':>10}"
    ]
    for r in results:
        if r.get("impl") != "rust":
            continue
        B, t = r["B"], r["threads"]
        ids, fill, oracle = get("rust_ids", B, t), get("fill", B), get("oracle", B)
        rust = r.get("bytes_per_s")
        ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"  # noqa: E731
        lines.append(
            f"{B:>5} {t:>3} {_fmt(rust):>9} {_fmt(ids.get('bytes_per_s')):>9} "
            f"{_fmt(fill.get('bytes_per_s')):>9} {_fmt(oracle.get('bytes_per_s')):>10} "
            f"{ratio(rust, fill.get('bytes_per_s')):>9} "
            f"{ratio(rust, oracle.get('bytes_per_s')):>11} "
            f"{r.get('peak_rss_mb', 0):>7.0f} {r.get('measured_s', 0):>10.1f}"
        )
    return "\n".join(lines)


def step_table(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{'mode':>9} {'B':>5} {'thr':>3} {'bytes/s':>9} {'bytes/cpu-s':>11} {'RSS MB':>7} "
        f"{'measured s':>10}"
    ]
    for r in results:
        if "error" in r:
            lines.append(f"{r['mode']:>9} {r['B']:>5} {r['threads']:>3} error: {r['error']}")
            continue
        lines.append(
            f"{r['mode']:>9} {r['B']:>5} {r['threads']:>3} {_fmt(r['bytes_per_s']):>9} "
            f"{_fmt(r['bytes_per_cpu_s']):>11} {r['peak_rss_mb']:>7.0f} {r['measured_s']:>10.1f}"
        )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({r["kind"] for r in results if "error" not in r})
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 4.5), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        series: dict[str, list[tuple[int, float]]] = {}
        for r in results:
            if r["kind"] != kind or "error" in r:
                continue
            if kind == "loader":
                label = {"rust": "Rust dense", "rust_ids": "Rust ids"}.get(r["impl"], r["impl"])
                if r["impl"].startswith("rust"):
                    label += f", {r['threads']} thread(s)"
                elif r["impl"] == "fill":
                    label = "numpy fill (write ceiling)"
                else:
                    label = "Python oracle"
            else:
                label = f"{r['mode']}, {r['threads']} thread(s)"
            series.setdefault(label, []).append((r["B"], r["bytes_per_s"]))
        for label, points in series.items():
            points.sort()
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="B (streams)", ylabel="bytes/s")
        ax.set_title("loader only" if kind == "loader" else "full training step")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_bench(args: argparse.Namespace) -> int:
    started = time.time()
    results: list[dict[str, Any]] = []
    timeout = args.seconds * 3 + 120
    with tempfile.TemporaryDirectory(prefix="atom-bench-") as tmp:
        if args.command in ("loader", "all"):
            data = args.data
            if not data:
                path = os.path.join(tmp, "corpus.txt")
                synthetic_corpus(path, args.corpus_mb << 20)
                data = [path]
            configs = loader_configs(args, data)
            print(f"loader: {len(configs)} configurations, K={args.K}, {args.seconds} s each")
            for config in configs:
                results.append(run_in_subprocess(config, timeout))
                r = results[-1]
                print(
                    f"  {r['impl']:>8} B={r['B']:<5} threads={r['threads']}: "
                    + (f"error: {r['error']}" if "error" in r else f"{_fmt(r['bytes_per_s'])}B/s"),
                    flush=True,
                )
            print(loader_table([r for r in results if r["kind"] == "loader"]))
        if args.command in ("step", "all"):
            configs = step_configs(args)
            print(f"step: {len(configs)} configurations, K={args.K}, {args.seconds} s each")
            step_results = []
            for config in configs:
                step_results.append(run_in_subprocess(config, timeout))
                r = step_results[-1]
                print(
                    f"  {r['mode']:>9} B={r['B']:<5} threads={r['threads']}: "
                    + (f"error: {r['error']}" if "error" in r else f"{_fmt(r['bytes_per_s'])}B/s"),
                    flush=True,
                )
            results += step_results
            print(step_table(step_results))
    report = {
        "command": ["python", "-m", "atom_train.bench", *sys.argv[1:]],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "host": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    plot(results, args.plot)
    print(f"wrote {args.out} and {args.plot}")
    return 1 if any("error" in r for r in results) else 0


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m atom_train.bench",
        description=__doc__.split("\n\n")[0],
        epilog="examples:\n" + __doc__.split("\n\n")[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--seconds",
        type=float,
        default=3.0,
        help="how long to measure each configuration after a warm-up (default: %(default)s)",
    )
    common.add_argument("-K", type=int, default=64, help="ticks per window (default: 64)")
    common.add_argument("--out", default="bench.json", help="JSON results (default: %(default)s)")
    common.add_argument("--plot", default="bench.png", help="PNG plot (default: %(default)s)")
    loader = argparse.ArgumentParser(add_help=False)
    loader.add_argument(
        "--data", action="append", metavar="GLOB", help="corpus (default: synthetic text)"
    )
    loader.add_argument(
        "--corpus-mb",
        type=int,
        default=32,
        help="size of the synthetic corpus in MiB (default: %(default)s)",
    )
    step = argparse.ArgumentParser(add_help=False)
    step.add_argument(
        "--n-modes", type=int, default=32, help="model n_modes for the step (default: 32)"
    )
    step.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="step device (default: cpu)"
    )
    step.add_argument("--compile", action="store_true", help="torch.compile the batched field loop")
    for name, parents, b_default, help_text in (
        ("loader", [common, loader], "1,64,256,1024", "loader only: Rust vs oracle vs fill"),
        ("step", [common, step], "1,8,32,128,256", "full training step vs B, and the baseline"),
        ("all", [common, loader, step], "1,8,32,128,256", "loader, then step"),
    ):
        p = sub.add_parser(name, parents=parents, help=help_text, description=help_text)
        p.add_argument(
            "-B",
            type=_int_list,
            default=_int_list(b_default),
            metavar="LIST",
            help=f"comma-separated stream counts (default: {b_default})",
        )
        p.add_argument(
            "--threads",
            type=_int_list,
            default=[1, 2],
            metavar="LIST",
            help="comma-separated thread counts (default: 1,2)",
        )
    one = sub.add_parser("_one")  # internal: one configuration, JSON in and out
    one.add_argument("config")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "_one":
        print(json.dumps(run_one(json.loads(args.config))))
        return 0
    if args.seconds <= 0 or args.K < 1:
        parser.error("--seconds must be > 0 and -K >= 1")
    return run_bench(args)


if __name__ == "__main__":
    sys.exit(main())
