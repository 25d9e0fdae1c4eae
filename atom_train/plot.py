"""Plot training runs side by side: loss, cross-entropy (bits/byte) and throughput against
bytes seen, with every fork and pivot marked, and a summary line per run.

Reads each RUN's progress.tsv (tab-separated, a header line `tick bytes_seen loss
train_bpb val_bpb grad_norm lr leak bytes_per_s elapsed_s ...`; val_bpb is empty on rows
without validation; runs written before these names, with byte_ce_bpb and val_ce_bpb, read
the same) and the lifecycle events of its loss.jsonl, and writes one PNG with three panels:
the training loss, train_bpb and val_bpb (bits per byte), and bytes per second; and a
fourth, the gradient noise scale b_simple beside the run's B, when a run measured it
(--noise-scale-every). A resumed run may repeat the header and some ticks: the last row written for a tick wins. A torn last line
(a crash mid-write) is skipped with a warning.

Several runs share the bytes-seen axis, one colour each, each named by its folder (by its
path where two folders share a name, as eval names them). A fork (its loss.jsonl begins
with a ``fork`` event) is drawn from its source's point at the tick it was forked, when the
source is one of the runs plotted; a run initialised from a checkpoint (``--init``) starts at
0 with its origin marked, its val_bpb from the validation of those weights at tick 0 (a
``val`` event: `run_logs.read_run` adds it to the rows); every ``pivot`` event is a dashed line labelled with what changed
(``lr 0.002 -> 0.001``). Each run gets a summary line on stdout (last val_bpb, best val_bpb and
its tick, bytes seen, training time, origin). With several runs: which settings differ, and
which has the lowest last val_bpb, when their val_bpb compare (the same val text scored the
same way; otherwise it says what each scores instead of ranking them).

``--tensorboard DIR`` converts the runs instead (DIR/<run folder name>/, one TensorBoard run
each; `atom_train.trainer.tensorboard_log`), so a run trained without ``--tensorboard`` can be
viewed there too.

Examples:
    python -m atom_train.plot runs/demo
    python -m atom_train.plot runs/demo --out /tmp/demo.png
    python -m atom_train.plot runs/demo/progress.tsv
    python -m atom_train.plot runs/demo runs/demo-audit --out compare.png   # a run and its fork
    python -m atom_train.plot runs/demo runs/demo-audit --tensorboard tb/   # then: tensorboard --logdir tb
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from atom_train.common.cli import (
    ArgumentParser,
    UserError,
    add_shared,
    format_duration,
    reader_went_away,
    set_command,
    user_error_exit,
)
from atom_train.common.figures import finish, log_scale, pyplot, save_figure, si
from atom_train.trainer.run_logs import (
    Run,
    describe_changes,
    describe_val_record,
    read_run,
    run_names,
    val_differences,
    val_key,
)

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")


def fork_source(run: Run, runs: list[Run]) -> tuple[Run, int] | None:
    """The plotted run a fork continues (its source checkpoint's folder) and the tick."""
    fork = run.fork
    if fork is None or not fork.get("source"):
        return None
    folder = Path(fork["source"]).parent.resolve()
    for other in runs:
        if other is not run and other.folder.resolve() == folder:
            return other, int(fork.get("source_tick", fork.get("tick", 0)))
    return None


# ---- the summary ---------------------------------------------------------------------------


def summary(run: Run) -> str:
    """One line: last val, best val and its tick, bytes seen, training time, origin."""
    p = run.progress
    c = p.columns
    parts = [f"{len(p) - p.added} rows"]
    val = [(t, v) for t, v in zip(c["tick"], c.get("val_bpb", []), strict=False)]
    val = [(t, v) for t, v in val if not math.isnan(v)]
    if val:
        t_last, v_last = val[-1]
        t_best, v_best = min(val, key=lambda tv: (tv[1], tv[0]))
        parts.append(f"last val_bpb {v_last:.4f} at tick {t_last:,.0f}")
        parts.append(f"best val_bpb {v_best:.4f} at tick {t_best:,.0f}")
    else:
        train = [v for v in c.get("train_bpb", []) if not math.isnan(v)]
        parts.append("no val" + (f", last train_bpb {train[-1]:.4f}" if train else ""))
    parts.append(f"{si(c['bytes_seen'][-1])} bytes seen")
    noise = run.progress.points("b_simple")
    if noise:
        parts.append(f"last b_simple {noise[-1][1]:,.3g} streams (-B {run.B})")
    elapsed = [v for v in c.get("elapsed_s", []) if not math.isnan(v)]
    if elapsed:
        parts.append(f"elapsed {format_duration(elapsed[-1])}")
    fork = run.fork
    if fork is not None:
        src = Path(str(fork.get("source", "?")))
        tick = int(fork.get("source_tick", fork.get("tick", 0)))
        parts.append(f"fork of {src.parent.name}/{src.name} at tick {tick:,}")
    init = run.init
    if init is not None:
        parts.append(f"a new run initialised from {_origin(init)}")
    for e in run.pivots:
        what = f"{e['auto']} (automatic pivot)" if e.get("auto") else "pivot"
        parts.append(f"{what} at tick {int(e['tick']):,}: {describe_changes(e['changes'])}")
    return f"{run.name}: " + "; ".join(parts)


def _origin(init: dict) -> str:
    """Where an --init run's weights came from: ``a/ckpt-final.safetensors (tick 2,000)``."""
    src = Path(str(init.get("init")))
    tick = init.get("init_tick")
    return f"{src.parent.name}/{src.name}" + (f" (tick {int(tick):,})" if tick is not None else "")


def winner(runs: list[Run]) -> str | None:
    """Which run has the lowest last val_bpb (None without val, or with one run); when the
    runs' val_bpb score different texts or settings, what each scores instead."""
    last = {}
    for r in runs:
        pts = r.progress.points("val_bpb")
        if pts:
            last[r.name] = pts[-1][1]
    if len(runs) < 2 or not last:
        return None
    records = {r.name: r.val_record() for r in runs if r.name in last}
    if val_differences(records):
        # Rank the runs that score the same val, name the others with what they score.
        groups: dict[tuple | None, list[str]] = {}
        for n, (ok, rec) in records.items():
            groups.setdefault(val_key(rec) if ok else None, []).append(n)
        parts = []
        for key, names in groups.items():
            if key is not None and len(names) > 1:
                best = min(names, key=last.get)
                parts.append(f"lowest last val_bpb of {', '.join(names)} (the same val): "
                             f"{best} ({last[best]:.4f})")  # fmt: skip
        alone = [
            n for key, names in groups.items() if key is None or len(names) == 1 for n in names
        ]
        others = "; ".join(
            f"{n}: {describe_val_record(records[n][1]) if records[n][0] else 'val not recorded'}"
            for n in alone
        )
        if not parts:
            return f"no ranking: {val_differences(records)}"
        return "; ".join(parts) + f"; not ranked (another val): {others}"
    name = min(last, key=last.get)
    unknown = [r.name for r in runs if r.name in last and not r.val_record()[0]]
    note = (
        f" (the val text of {', '.join(unknown)} is not recorded: check they score the same)"
        if unknown
        else ""
    )
    return f"lowest last val_bpb: {name} ({last[name]:.4f}){note}"


# Periods of what a run reports, not of what it trains: left out of the comparison.
_REPORTING = {"log_every", "val_every", "sample_every"}


def setting_differences(runs: list[Run]) -> str | None:
    """The settings (B and the training policy at the end) that differ between the runs."""
    if len(runs) < 2:
        return None
    settings = [r.settings() for r in runs]
    keys = [k for k in settings[0] if all(k in s for s in settings) and k not in _REPORTING]
    diffs = []
    for k in keys:
        values = [s[k] for s in settings]
        if any(v != values[0] for v in values):
            each = ", ".join(f"{r.name} {v}" for r, v in zip(runs, values, strict=True))
            diffs.append(f"{k} ({each})")
    return f"settings that differ: {'; '.join(diffs)}" if diffs else None


# ---- drawing -------------------------------------------------------------------------------


def figure(runs: list[Run], title: str):
    """The three panels (loss; train and val CE; bytes/s) for these runs, as a matplotlib
    Figure: each line's label is ``<run> <series>`` (one run: the series alone, as before)."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    # A fourth panel, the noise scale, for runs that measured it (--noise-scale-every).
    noise = any(r.progress.get("b_simple") for r in runs)
    fig, axes = plt.subplots(3 + noise, 1, figsize=(9, 9 + 2.5 * noise), sharex=True)
    ax_loss, ax_ce, ax_speed = axes[:3]
    single = len(runs) == 1
    labels: list[tuple[float, str, str]] = []
    for i, run in enumerate(runs):
        color = f"C{i % 10}"
        source = fork_source(run, runs)

        def draw(ax, name, what, run=run, source=source, **style) -> bool:
            pts = run.progress.points(name)
            if not pts:
                return False
            if source is not None:
                # The branch leaves its source at the fork tick: start the line there.
                src, tick = source
                v = src.value_at(name, tick)
                if v is not None and tick * src.B < pts[0][0]:
                    pts = [(tick * src.B, v), *pts]
            label = what if single else f"{run.name} {what}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
            return True

        if single:
            styles = {"train": {"color": "C0"}, "val": {"color": "C3"}, "speed": {"color": "C2"}}
        else:
            styles = {k: {"color": color} for k in ("train", "val", "speed")}
        draw(ax_loss, "loss", "loss", lw=1, **styles["train"])
        draw(ax_ce, "train_bpb", "train_bpb", lw=1, alpha=1 if single else 0.6, **styles["train"])
        draw(ax_ce, "val_bpb", "val_bpb", lw=1.5, marker="o", ms=3, **styles["val"])
        draw(ax_speed, "bytes_per_s", "bytes/s", lw=1, **styles["speed"])
        if noise and draw(axes[3], "b_simple", "b_simple", lw=1.5, **styles["train"]):
            # The run's own B beside its noise scale: above it, steps are the limit.
            label = f"-B {run.B}" if single else f"{run.name} -B {run.B}"
            axes[3].axhline(run.B, ls="--", lw=1, label=label, **styles["val"])
        labels += _mark_events(
            axes, run, "k" if single else color, "" if single else f"{run.name} "
        )
    if not any(ax_loss.get_lines()):
        ax_loss.text(0.5, 0.5, "no loss column", ha="center", transform=ax_loss.transAxes)
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(title)
    if ax_ce.get_lines():
        ax_ce.legend(loc="upper right", fontsize=8 if not single else None)
    ax_ce.set_ylabel("byte CE (bits/byte)")
    ax_speed.set_ylabel("bytes/s")
    ax_speed.yaxis.set_major_formatter(FuncFormatter(si))
    ax_speed.set_ylim(bottom=0)
    axes[-1].set_xlabel("bytes seen")
    axes[-1].xaxis.set_major_formatter(FuncFormatter(si))
    if noise:
        axes[3].set_ylabel("noise scale (streams)")
        log_scale(axes[3], "y")
        axes[3].legend(loc="upper left", fontsize=8)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    _label_events(ax_loss, labels)  # once every line is drawn: the x range is final
    return finish(fig)


def _mark_events(axes, run: Run, color: str, prefix: str) -> list[tuple[float, str, str]]:
    """A fork (dotted) and every pivot (dashed) of `run`: a vertical line on each panel at
    its bytes seen; returns their labels (x, text, colour) for `_label_events`."""
    marks = []
    init = run.init
    if init is not None:  # a new run at tick 0, from another run's weights
        marks.append((0, "-.", f"{prefix}init from {_origin(init)}"))
    fork = run.fork
    if fork is not None:
        text = f"{prefix}fork at tick {int(fork.get('source_tick', fork.get('tick', 0))):,}"
        if fork.get("changes"):
            text += f": {describe_changes(fork['changes'])}"
        marks.append((int(fork.get("tick", 0)), ":", text))
    for e in run.pivots:  # (a divergence guard's rewind is an automatic pivot, named so)
        what = e.get("auto") or "pivot"
        marks.append((int(e["tick"]), "--", f"{prefix}{what}: {describe_changes(e['changes'])}"))
    labels = []
    for tick, style, text in marks:
        x = tick * run.B
        for ax in axes:
            ax.axvline(x, color=color, ls=style, lw=1, alpha=0.8, gid="event")
        labels.append((x, text, color))
    return labels


def _label_events(ax, labels: list[tuple[float, str, str]]) -> None:
    """Each event's label at the top of `ax`, one line each, beside its line: to the right of
    it in the left half of the panel, to the left in the right half (so it stays inside)."""
    lo, hi = ax.get_xlim()
    for row, (x, text, color) in enumerate(labels):
        right_half = x > (lo + hi) / 2
        ax.annotate(
            text,
            xy=(x, 1),
            xycoords=("data", "axes fraction"),
            xytext=(-3 if right_half else 3, -3 - 10 * row),
            textcoords="offset points",
            ha="right" if right_half else "left",
            va="top",
            fontsize=7,
            color=color,
            gid="event",
        ).set_in_layout(False)  # a long label must not squeeze the panels


# ---- the command line ----------------------------------------------------------------------


def _default_out(runs: list[Run]) -> Path:
    first = runs[0].folder
    return first / ("training.png" if len(runs) == 1 else "compare.png")


def _check_out(out: Path) -> None:
    if not out.parent.is_dir():
        raise UserError(f"folder {out.parent} does not exist: check --out")
    if out.suffix.lower() not in FIGURE_SUFFIXES:
        raise UserError(f"--out {out}: use a .png (or .svg, .pdf) file name")


def convert(runs: list[Run], tb_root: Path) -> list[Path]:
    """`--tensorboard DIR`: each run into DIR/<its name>/ (UserError: two runs, one name)."""
    from atom_train.trainer.tensorboard_log import check_available, convert_run

    check_available("--tensorboard")
    names = [r.folder.resolve().name for r in runs]  # (a folder name: a path would nest)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(
            f"--tensorboard: several runs are named {', '.join(dupes)}: convert them one at a "
            "time into different folders"
        )
    return [convert_run(r, tb_root / n) for r, n in zip(runs, names, strict=True)]


def build_parser() -> argparse.ArgumentParser:
    parts = __doc__.split("\n\n")
    ap = ArgumentParser(
        prog="python -m atom_train.plot",
        description=parts[0],
        epilog="\n\n".join(parts[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="a run's --output-dir (or its progress.tsv); several: side by side",
    )
    add_shared(
        ap,
        "out",
        default=None,
        metavar="FILE",
        help="PNG to write (default: RUN/training.png; several runs: the first RUN's compare.png)",
    )
    ap.add_argument(
        "--tensorboard",
        metavar="DIR",
        default=None,
        help="instead of a PNG, write the runs as TensorBoard event files in DIR/<run name>/",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    set_command("plot")
    try:
        return _main(argv)
    except BrokenPipeError:
        return reader_went_away()


def _main(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
        paths = [Path(r) for r in args.runs]
        folders = [p.parent if p.is_file() else p for p in paths]
        runs = [read_run(p, n) for p, n in zip(paths, run_names(folders), strict=True)]
        if args.tensorboard is not None:
            for path in convert(runs, Path(args.tensorboard)):
                print(f"wrote {path}")
        if args.tensorboard is None or args.out is not None:
            out = Path(args.out) if args.out else _default_out(runs)
            _check_out(out)
            title = runs[0].name if len(runs) == 1 else " vs ".join(r.name for r in runs)
            save_figure(figure(runs, title), out)
            print(f"wrote {out}")
    except UserError as e:
        return user_error_exit(e)
    except BrokenPipeError:
        raise
    except OSError as e:
        return user_error_exit(f"cannot write: {e}")
    for run in runs:
        print(summary(run))
    for line in (setting_differences(runs), winner(runs)):
        if line:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
