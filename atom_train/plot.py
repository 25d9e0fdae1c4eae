"""Plot a training run's progress.tsv: loss, cross-entropy (bits/byte) and throughput.

Reads RUN_DIR/progress.tsv (tab-separated, a header line `tick bytes_seen loss byte_ce_bpb
val_ce_bpb lr leak bytes_per_s elapsed_s`; val_ce_bpb is empty on rows without validation)
and writes one PNG with three panels against bytes seen: the training loss, train and val
cross-entropy in bits per byte, and bytes per second. A resumed run may repeat the header and
some ticks: the last row written for a tick wins. A torn last line (a crash mid-write) is
skipped with a warning.

Examples:
    python -m atom_train.plot runs/demo
    python -m atom_train.plot runs/demo --out /tmp/demo.png
    python -m atom_train.plot runs/demo/progress.tsv
"""

from __future__ import annotations

import argparse
import io
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from atom_train.cli import UserError, atomic_write, user_error_exit

REQUIRED = ("tick", "bytes_seen")


@dataclass
class Progress:
    """Columns of a progress.tsv, one value per distinct tick, sorted by tick (NaN = empty)."""

    columns: dict[str, list[float]] = field(default_factory=dict)
    skipped: int = 0  # lines that could not be parsed

    def __len__(self) -> int:
        return len(self.columns.get("tick", []))

    def get(self, name: str) -> list[float] | None:
        values = self.columns.get(name)
        if values is None or all(math.isnan(v) for v in values):
            return None
        return values


def _number(text: str) -> float:
    text = text.strip()
    return float(text) if text else math.nan


def read_progress(path: Path) -> Progress:
    """Parse progress.tsv; raises UserError when it holds no usable row."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path} not found: is this a run's --output-dir?") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e}") from None
    text = raw.decode("utf-8", errors="replace")
    if not text.strip():
        raise UserError(f"{path} is empty: the run has not logged a step yet (see --log-every)")
    header: list[str] | None = None
    rows: dict[float, dict[str, float]] = {}
    names: list[str] = []
    skipped = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.rstrip("\r").split("\t")
        if fields[0].strip() == "tick":
            # A resumed run appends its header again; it may even add columns.
            header = [f.strip() for f in fields]
            names.extend(n for n in header if n not in names)
            continue
        if header is None or len(fields) != len(header):
            skipped += 1
            continue
        try:
            values = {n: _number(v) for n, v in zip(header, fields, strict=True)}
        except ValueError:
            skipped += 1
            continue
        if math.isnan(values["tick"]) or math.isnan(values.get("bytes_seen", math.nan)):
            skipped += 1
            continue
        rows[values["tick"]] = values  # a repeated tick (resume): the last one wins
    if header is None:
        raise UserError(
            f"{path} has no header line ('tick<TAB>bytes_seen<TAB>...'): "
            "not a progress.tsv written by atom_train.train"
        )
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise UserError(f"{path}: header lacks column(s) {', '.join(missing)}")
    if not rows:
        raise UserError(f"{path} has a header but no readable row ({skipped} unreadable lines)")
    ticks = sorted(rows)
    columns = {n: [rows[t].get(n, math.nan) for t in ticks] for n in names}
    return Progress(columns, skipped)


def _si(x: float, _pos: object = None) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def plot(progress: Progress, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    x = progress.columns["bytes_seen"]
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    ax_loss, ax_ce, ax_speed = axes

    def series(ax, name: str, label: str, **style) -> bool:
        y = progress.get(name)
        if y is None:
            return False
        # Rows without a value (val CE between validations) are left out, not drawn as gaps.
        pts = [(a, b) for a, b in zip(x, y, strict=True) if not math.isnan(b)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
        return True

    if not series(ax_loss, "loss", "loss", color="C0", lw=1):
        ax_loss.text(0.5, 0.5, "no loss column", ha="center", transform=ax_loss.transAxes)
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(title)

    drawn = series(ax_ce, "byte_ce_bpb", "train", color="C0", lw=1)
    drawn |= series(ax_ce, "val_ce_bpb", "val", color="C3", lw=1.5, marker="o", ms=3)
    if drawn:
        ax_ce.legend(loc="upper right")
    ax_ce.set_ylabel("cross-entropy (bits/byte)")

    series(ax_speed, "bytes_per_s", "bytes/s", color="C2", lw=1)
    ax_speed.set_ylabel("bytes/s")
    ax_speed.yaxis.set_major_formatter(FuncFormatter(_si))
    ax_speed.set_ylim(bottom=0)
    ax_speed.set_xlabel("bytes seen")
    ax_speed.xaxis.set_major_formatter(FuncFormatter(_si))
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    # Rendered in memory, then replaced atomically: a viewer never sees half a PNG.
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=110, format=out.suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)
    atomic_write(out, buf.getvalue())


def _summary(p: Progress) -> str:
    parts = [f"{len(p)} rows", f"up to {_si(p.columns['bytes_seen'][-1])} bytes"]
    for name, label in (("byte_ce_bpb", "train"), ("val_ce_bpb", "val")):
        y = p.get(name)
        if y is not None:
            last = [v for v in y if not math.isnan(v)][-1]
            parts.append(f"last {label} CE {last:.3f} bits/byte")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m atom_train.plot",
        description="Plot loss, cross-entropy (bits/byte) and bytes/s from a run's progress.tsv.",
    )
    ap.add_argument(
        "run_dir", metavar="RUN_DIR", help="the run's --output-dir (or its progress.tsv)"
    )
    ap.add_argument("--out", default=None, help="PNG to write (default: RUN_DIR/training.png)")
    args = ap.parse_args(argv)
    run = Path(args.run_dir)
    tsv = run if run.is_file() else run / "progress.tsv"
    if not run.exists():
        return user_error_exit(f"{run} does not exist: pass a run's --output-dir")
    out = Path(args.out) if args.out else tsv.parent / "training.png"
    try:
        progress = read_progress(tsv)
        if progress.skipped:
            print(
                f"warning: skipped {progress.skipped} unreadable line(s) in {tsv}", file=sys.stderr
            )
        if not out.parent.is_dir():
            raise UserError(f"folder {out.parent} does not exist: check --out")
        if out.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise UserError(f"--out {out}: use a .png (or .svg, .pdf) file name")
        plot(progress, out, title=tsv.parent.resolve().name)
    except UserError as e:
        return user_error_exit(e)
    except OSError as e:
        return user_error_exit(f"cannot write {out}: {e}")
    print(f"wrote {out} ({_summary(progress)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
