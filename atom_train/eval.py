"""Score checkpoints on text: ``python -m atom_train.eval TARGET... --data GLOB``.

Each TARGET is a checkpoint file or a run folder; a folder means every valid checkpoint in
it (snapshots, rolling, final), in tick order; a damaged one is skipped with a warning, as
a resume skips it. Every checkpoint is scored with the trainer's own validation
(`atom_train.model.scoring.score_text`) on the identical slice of the text, read from the same
offsets, without randomness: bits per byte (the byte cross-entropy), the length CE and the
loss the trainer logs, and how many bytes were scored. By default the whole text is scored,
read by 64 parallel streams; with the trainer's ``--val-bytes`` and ``--val-streams`` the
number is exactly the validation the trainer logged at that tick (on a CPU).

Examples::

    # every snapshot of a run on a built corpus's held-out val: the scaling curve of one run
    python -m atom_train.eval runs/fr --corpus data/fr --plot runs/fr/scaling.png
    # two branches side by side (a run and its fork), saved as JSON
    python -m atom_train.eval runs/fr runs/fr-audit --corpus data/fr --out eval.json
    # one checkpoint, exactly as its trainer validated it
    python -m atom_train.eval runs/fr/ckpt-final.safetensors --corpus data/fr \\
        --val-bytes 65536 --val-streams 64
    # any text files; a CUDA-trained run scored on a GPU (or on the CPU: --device cpu)
    python -m atom_train.eval runs/fr --data 'notes/*.txt' --device cuda

Output: one row per checkpoint (run, checkpoint, tick, bytes seen, val_bpb, the change from
the run's previous row, length CE, loss, bytes scored, seconds), a checkpoint holding the
same weights as one already scored (a rolling file and the snapshot of its tick) is named
in that row instead of being scored twice; ``--out FILE.json`` or ``FILE.tsv`` keeps the
rows, ``--plot FILE.png`` draws val_bpb against bytes seen, one line per run. A run is named
by its folder (by its path where two folders share a name, as the plot names them). Notes
after the table say where the runs' own validations differ from each other or from this
scoring (their logged val_bpb then differ from these numbers), and which runs were
initialised from another's checkpoint (``--init``).

Exit status: 0 = scored; 2 = a user error (a missing, corrupt or foreign target, features
this atom does not compute, an empty text, a bad flag), one line on stderr saying why.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from atom_train.common.atomic import atomic_write
from atom_train.common.cli import (
    CORPUS_HELP,
    ArgumentParser,
    UserError,
    add_shared,
    counted,
    lines_above,
    reader_went_away,
    say,
    set_command,
    some_of,
    user_error_exit,
    warn,
)
from atom_train.common.figures import finish, pyplot, save_figure, si
from atom_train.data.sources import open_corpus
from atom_train.model.backend import choose_backend
from atom_train.model.batched import BatchedUnsupported
from atom_train.model.scoring import Score, describe_val, score_text
from atom_train.trainer.checkpoint_file import (
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    read_metadata,
)
from atom_train.trainer.flags import BY_DEST
from atom_train.trainer.run_logs import (
    describe_val_record,
    last_val_record,
    read_loss_log,
    run_names,
    val_differences,
    val_key,
)
from atom_train.trainer.rundir import FINAL, ROLLING, ROLLING_PREV, SNAPSHOT_RE
from atom_train.trainer.text_sources import check_held_out, open_built_corpus
from atom_train.trainer.train_state import check_provenance, load_model, run_config_of

PROG = "python -m atom_train.eval"
OUT_SUFFIXES = (".json", ".tsv")
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def scaling_figure(
    series: dict[str, list[tuple[float, float]]],
    title: str,
    starts: dict[str, tuple[float, float]] | None = None,
):
    """Bits/byte against bytes seen, one line per run, each scored checkpoint a point
    (`atom_train.eval --plot`); `starts[run]`: a point the run's line begins from (a fork's
    source checkpoint), joined by a dotted segment."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (run, pts) in enumerate(series.items()):
        color = f"C{i % 10}"
        line = sorted(pts)
        start = (starts or {}).get(run)
        if start is not None:
            ax.plot(*zip(start, line[0], strict=True), color=color, ls=":", lw=1, gid="fork")
        ax.plot([p[0] for p in line], [p[1] for p in line], marker="o", color=color, label=run)
    ax.set_xlabel("bytes seen")
    ax.set_ylabel("val_bpb (bits/byte)")
    ax.xaxis.set_major_formatter(FuncFormatter(si))
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return finish(fig)


# ---- what to score ---------------------------------------------------------------------------


@dataclass
class Target:
    """One checkpoint file to score, read from its header (the weights are read when it is
    scored)."""

    path: Path
    folder: Path  # the run folder it belongs to, as the user named it
    meta: dict
    in_folder: bool  # found in a run folder (damage skips it) rather than named itself
    run: str = ""  # the run's label (`run_logs.run_names`: the table's and the plot's)

    @property
    def tick(self) -> int:
        return int(self.meta["training"]["tick"])

    @property
    def bytes_seen(self) -> int:
        tr = self.meta["training"]
        return int(tr.get("bytes_seen", self.tick * int(tr.get("B", 0))))

    @property
    def bptt(self) -> int | None:
        if not isinstance(self.meta.get("config") or self.meta.get("args"), dict):
            return None  # (not a trainer's checkpoint)
        return run_config_of(self.meta).schedule.bptt


def _name_rank(name: str) -> int:
    """Which of several files at one tick names the row: a permanent snapshot first, then the
    final checkpoint, then the rolling ones (they hold the same state of a run)."""
    if SNAPSHOT_RE.match(name):
        return 0
    return {FINAL: 1, ROLLING: 2, ROLLING_PREV: 3}.get(name, 4)


def _with_tick(meta: dict, path: Path) -> dict:
    """`meta`, checked to hold a training tick (CheckpointError otherwise: what a resume
    skips)."""
    try:
        int(meta["training"]["tick"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{path}: no training tick in its metadata") from None
    return meta


def find_targets(names: list[str]) -> list[Target]:
    """The checkpoints the command line names, in order: each run (a folder, or the folder of
    a file) once, its checkpoints in tick order. A missing or unreadable file, a folder
    without a valid checkpoint, or foreign features are UserErrors; a damaged file inside a
    folder is skipped with a warning (as a resume skips it)."""
    by_run: dict[str, list[Target]] = {}  # by resolved folder
    seen: set[Path] = set()
    for name in names:
        p = Path(name)
        if p.is_dir():
            found = []
            for f in list_checkpoints(p):
                try:
                    meta = _with_tick(read_metadata(f), f)  # the header only, for now
                    found.append(Target(f, p, meta, in_folder=True))
                except CheckpointError as e:
                    warn(f"skipping checkpoint {e}")
            if not found:
                raise UserError(
                    f"{p} holds no valid checkpoint (*.safetensors): give checkpoint files "
                    "or the output folders of training runs"
                )
        elif p.exists():
            # A file named on the command line is verified now (its checksum too): a bad
            # one is refused before anything is scored.
            meta = _with_tick(load_checkpoint(p).meta, p)
            found = [Target(p, p.parent, meta, in_folder=False)]
        else:
            raise UserError(f"{p}: no such checkpoint file or run folder")
        for t in found:
            # Features this atom does not compute are no damage: refused, not skipped.
            check_provenance(t.meta, t.path)
            if t.path.resolve() not in seen:
                seen.add(t.path.resolve())
                by_run.setdefault(str(t.folder.resolve()), []).append(t)
    out = []
    groups = list(by_run.values())
    for targets, name in zip(groups, run_names([g[0].folder for g in groups]), strict=True):
        for t in targets:
            t.run = name
        out += sorted(targets, key=lambda t: (t.tick, _name_rank(t.path.name), t.path.name))
    return out


# ---- scoring ---------------------------------------------------------------------------------


@dataclass
class Row:
    """One scored checkpoint: what `--out` writes and the table prints."""

    run: str
    checkpoint: str  # the file's name
    kind: str
    tick: int
    bytes_seen: int
    val_bpb: float
    delta_bpb: float | None  # change from the run's previous row (None: the first)
    len_ce: float
    loss: float
    bytes_scored: int
    K: int  # ticks per window
    seconds: float
    same_weights: list[str] = field(default_factory=list)  # other files holding these weights
    origin: dict = field(default_factory=dict)  # how the run began (a fork names its source)
    folder: str = ""  # the run folder (resolved)

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_scored / max(self.seconds, 1e-9)


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of a model's tensors: files with equal digests score the same."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Settings:
    """What every checkpoint is scored on: the same slice, streams and device for all."""

    n_bytes: int
    streams: int
    device: torch.device
    recurrence: str
    bptt: int | None  # None: each checkpoint's own --bptt (as its validation ran)


def score_targets(
    targets: list[Target], corpus, s: Settings, progress=None, emit=print
) -> list[Row]:
    """Score each target (the rows, in order); `progress(n)` hears of the bytes scored (the
    bar), `emit(line)` prints the table, a row as soon as it is scored."""
    rows: list[Row] = []
    scored: dict[str, Row] = {}  # weights digest -> the row that scored them
    per_target = s.n_bytes // s.streams * s.streams
    emit(table_line([name for name, _ in _COLUMNS]))
    for t in targets:
        try:
            model, meta = load_model(t.path)
        except CheckpointError as e:
            if not t.in_folder:
                raise
            # A folder's file whose header read fine but whose payload does not verify (a
            # bad checksum): skipped, as a resume skips it.
            warn(f"skipping checkpoint {e}")
            model = None
        digest = weights_digest(model) if model is not None else None
        if digest in scored:
            scored[digest].same_weights.append(t.path.name)
            say(f"{t.path}: the same weights as {scored[digest].checkpoint}, not scored again")
        if model is None or digest in scored:
            if progress is not None:
                progress(per_target)  # the bar counted it
            continue
        bptt = s.bptt if s.bptt is not None else t.bptt
        # --bptt 0 trains windows of one tick (schedule.WindowSchedule.K).
        K = max(1, int(bptt if bptt is not None else BY_DEST["bptt"].default))
        t0 = time.perf_counter()
        try:
            score = score_text(
                model.to(s.device),
                corpus,
                streams=s.streams,
                n_bytes=s.n_bytes,
                K=K,
                device=s.device,
                recurrence=s.recurrence,
                progress=progress,
            )
        except BatchedUnsupported as e:
            raise UserError(f"{t.path}: {e}") from None
        seconds = time.perf_counter() - t0
        prev = next((r for r in reversed(rows) if r.run == t.run), None)
        row = make_row(t, meta, score, K, seconds, prev)
        rows.append(row)
        scored[digest] = row
        emit(row_line(row))
    return rows


def make_row(t: Target, meta: dict, score: Score, K: int, seconds: float, prev: Row | None):
    return Row(
        run=t.run,
        checkpoint=t.path.name,
        kind=str(meta.get("kind", "?")),
        tick=t.tick,
        bytes_seen=t.bytes_seen,
        val_bpb=score.val_bpb,
        delta_bpb=None if prev is None else score.val_bpb - prev.val_bpb,
        len_ce=score.len_ce,
        loss=score.loss,
        bytes_scored=score.bytes_scored,
        K=K,
        seconds=seconds,
        origin=meta.get("origin") if isinstance(meta.get("origin"), dict) else {},
        folder=str(t.folder.resolve()),
    )


# ---- output ----------------------------------------------------------------------------------

_COLUMNS = (
    ("run", "<24"),
    ("checkpoint", "<34"),
    ("tick", ">10"),
    ("bytes seen", ">14"),
    ("val_bpb", ">10"),
    ("delta", ">8"),
    ("len CE", ">8"),
    ("loss", ">8"),
    ("scored", ">11"),
    ("s", ">7"),
)


def table_line(cells: list[str]) -> str:
    return " ".join(f"{c:{fmt}}" for c, (_, fmt) in zip(cells, _COLUMNS, strict=True)).rstrip()


def row_line(r: Row) -> str:
    return table_line(
        [
            r.run,
            r.checkpoint,
            f"{r.tick:,}",
            f"{r.bytes_seen:,}",
            f"{r.val_bpb:.4f}",
            "-" if r.delta_bpb is None else f"{r.delta_bpb:+.4f}",
            f"{r.len_ce:.4f}",
            f"{r.loss:.4f}",
            f"{r.bytes_scored:,}",
            f"{r.seconds:.1f}",
        ]
    )


def _record(r: Row) -> dict:
    d = asdict(r)
    d["bytes_per_s"] = r.bytes_per_s
    return d


def write_out(path: Path, rows: list[Row], settings: dict) -> None:
    """`--out`: JSON (the settings and the rows, exact floats) or TSV (one line per row)."""
    records = [_record(r) for r in rows]
    if path.suffix.lower() == ".json":
        data = json.dumps({**settings, "rows": records}, indent=1) + "\n"
    else:
        keys = [k for k in records[0] if k != "origin"] if records else []
        lines = ["\t".join(keys)] + ["\t".join(_cell(rec[k]) for k in keys) for rec in records]
        data = "\n".join(lines) + "\n"
    atomic_write(path, data.encode())


def _cell(v: object) -> str:
    """A TSV cell: floats in full (repr round-trips), lists comma-joined, None empty."""
    if v is None:
        return ""
    if isinstance(v, list):
        return ",".join(map(str, v))
    return repr(v) if isinstance(v, float) else str(v)


def fork_sources(rows: list[Row]) -> dict[str, tuple[str, int]]:
    """For each run that is a fork of another run among these rows: (that run, the tick it
    was forked at); the plot draws the fork from its source's point."""
    folders = {r.folder: r.run for r in rows}
    out = {}
    for r in rows:
        o = r.origin
        if o.get("mode") == "fork" and o.get("source"):
            src = folders.get(str(Path(o["source"]).parent.resolve()))
            if src is not None and src != r.run:
                out[r.run] = (src, int(o.get("source_tick", 0)))
    return out


def figure(rows: list[Row], title: str):
    """`--plot`'s figure: val_bpb against bytes seen, one line per run, each checkpoint a
    point; a fork's line starts from its source's point at the tick it was forked; a run
    initialised from a checkpoint names its origin in the legend."""

    def label(run: str) -> str:
        origin = next((r.origin for r in rows if r.run == run), {})
        return f"{run} (init from {_origin_text(origin)})" if origin.get("mode") == "init" else run

    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        series.setdefault(label(r.run), []).append((r.bytes_seen, r.val_bpb))
    starts = {}
    for run, (src, tick) in fork_sources(rows).items():
        at = [(r.bytes_seen, r.val_bpb) for r in rows if r.run == src and r.tick == tick]
        if at:
            starts[label(run)] = at[0]
    return scaling_figure(series, title=title, starts=starts)


def _origin_text(origin: dict) -> str:
    """An --init run's source: ``a/ckpt-final.safetensors (tick 2,000)``."""
    src = Path(str(origin.get("source", "?")))
    tick = origin.get("source_tick")
    return f"{src.parent.name}/{src.name}" + (f" (tick {int(tick):,})" if tick is not None else "")


def notes(rows: list[Row], scored: dict) -> list[str]:
    """What the table alone does not say: runs whose own validations scored different texts
    or settings (their logged val_bpb do not compare with each other, or with these), and
    runs initialised from another run's checkpoint. `scored`: this scoring's val record."""
    out = []
    records: dict[str, tuple[bool, dict | None]] = {}
    for r in rows:
        if r.run not in records:
            events = read_loss_log(Path(r.folder)).events
            records[r.run] = last_val_record(events, r.tick)
    differ = val_differences(records)
    if differ:
        out.append(f"the runs' own validations differ: {differ.split(': ', 1)[1]}")
    key = val_key(scored)
    apart = [
        n for n, (ok, rec) in records.items() if ok and rec is not None and val_key(rec) != key
    ]
    if apart:
        out.append(
            f"scored here: {describe_val_record(scored)}; {', '.join(apart)} validated on "
            "other text or settings, so their logged val_bpb differ from these numbers"
        )
    for run in dict.fromkeys(r.run for r in rows):
        origin = next(r.origin for r in rows if r.run == run)
        if origin.get("mode") == "init":
            out.append(f"{run}: a new run initialised from {_origin_text(origin)}")
    return out


# ---- the command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parts = __doc__.split("\n\n")
    p = ArgumentParser(
        prog=PROG,
        description=parts[0],
        epilog="\n\n".join(parts[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "targets",
        nargs="+",
        metavar="TARGET",
        help="a checkpoint file, or a run folder (all its valid checkpoints)",
    )
    add_shared(
        p,
        "data",
        action="append",
        metavar="GLOB",
        help="the text to score: a file or glob (repeatable; shards read as one circular text)",
    )
    add_shared(p, "corpus", metavar="DIR", help=f"{CORPUS_HELP}: score its held-out val")
    add_shared(
        p,
        "val_bytes",
        type=int,
        default=None,
        metavar="N",
        help="score the first N bytes of the text, as the trainer's --val-bytes (default: "
        "all of it)",
    )
    add_shared(
        p,
        "val_streams",
        type=int,
        default=BY_DEST["val_streams"].default,
        metavar="S",
        help="streams reading the text in parallel, evenly spaced, as the trainer's "
        "--val-streams (default: %(default)s)",
    )
    add_shared(
        p,
        "bptt",
        type=int,
        default=None,
        metavar="K",
        help="ticks per window (default: each checkpoint's own --bptt, as its validation "
        "ran; without gradients it only regroups the sums)",
    )
    add_shared(
        p,
        "device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where to score (any checkpoint, trained on either) (default: %(default)s)",
    )
    add_shared(p, "threads", type=int, default=None, metavar="N", help="torch CPU threads")
    add_shared(
        p,
        "recurrence",
        default="auto",
        help="the field loop, as the trainer's --recurrence (default: auto: triton on CUDA, "
        "native on a CPU)",
    )
    add_shared(p, "out", metavar="FILE", help="write the rows to FILE.json or FILE.tsv")
    add_shared(p, "plot", metavar="FILE", help="draw val_bpb against bytes seen into FILE.png")
    return p


def _check_output(path: str | None, flag: str, suffixes: tuple[str, ...]) -> Path | None:
    if path is None:
        return None
    p = Path(path)
    if p.suffix.lower() not in suffixes:
        raise UserError(f"{flag} {p}: use a {' or '.join(suffixes)} file name")
    if not p.parent.is_dir():
        raise UserError(f"{flag} {p}: folder {p.parent} does not exist")
    return p


def _check_args(a: argparse.Namespace) -> None:
    if a.corpus:
        if a.data:
            raise UserError("give --corpus DIR or --data GLOB, not both")
        built = open_built_corpus(a.corpus)
        if built.val is None:
            raise UserError(
                f"--corpus {a.corpus} has no val (built with --val-bytes 0): pass --data"
            )
        a.data = [str(built.val)]
    if not a.data:
        raise UserError("no text to score: pass --data GLOB (a file, 'folder/*.txt', ...)")
    for flag, v in (("--val-streams", a.val_streams), ("--val-bytes", a.val_bytes)):
        if v is not None and v < 1:
            raise UserError(f"{flag} must be >= 1 (got {v})")
    if a.bptt is not None and a.bptt < 0:
        raise UserError(f"--bptt must be >= 0 (got {a.bptt})")
    if a.threads is not None and a.threads < 1:
        raise UserError(f"--threads must be >= 1 (got {a.threads})")


def run(a: argparse.Namespace) -> list[Row]:
    """Check everything, then score (UserError for anything the user can fix)."""
    _check_args(a)
    out = _check_output(a.out, "--out", OUT_SUFFIXES)
    plot_to = _check_output(a.plot, "--plot", PLOT_SUFFIXES)
    if a.threads:
        torch.set_num_threads(a.threads)
    # (One device and loop for checkpoints of several models: no fit check, no self-check.)
    backend = choose_backend(a.device, a.recurrence, warn=None, prove=False)
    device, recurrence = backend.device, backend.recurrence
    corpus = open_corpus(a.data, "--data", resident=False)
    check_held_out(corpus.shards, "--data", val_alone_ok=True)
    n_bytes = corpus.size if a.val_bytes is None else a.val_bytes
    if n_bytes < a.val_streams:
        raise UserError(
            f"{n_bytes:,} bytes to score cannot feed --val-streams {a.val_streams} streams one "
            "byte each: lower --val-streams (or score more text)"
        )
    try:
        targets = find_targets(a.targets)
    except CheckpointError as e:
        raise UserError(str(e)) from None
    settings = Settings(n_bytes, a.val_streams, device, recurrence, a.bptt)
    say(describe_val(corpus, n_bytes, a.val_streams, flag="--data"))
    say(f"{counted(len(targets), 'checkpoint')}, device {device}, recurrence {recurrence}")
    bar = _bar(len(targets) * (n_bytes // a.val_streams) * a.val_streams)
    t0 = time.perf_counter()
    try:
        if bar is None:
            rows = score_targets(
                targets, corpus, settings, emit=lambda line: print(line, flush=True)
            )
        else:  # the rows and every message go above the bar, not through it
            with lines_above(lambda line: bar.write(line, file=sys.stderr)):
                rows = score_targets(
                    targets,
                    corpus,
                    settings,
                    progress=bar.update,
                    emit=lambda line: bar.write(line, file=sys.stdout),
                )
    except CheckpointError as e:
        raise UserError(str(e)) from None
    finally:
        if bar is not None:
            bar.close()
    scored = {
        "files": [str(Path(f).resolve()) for f in corpus.shards],
        "signature": corpus.signature,
        "size": corpus.size,
        "val_bytes": n_bytes,
        "val_streams": a.val_streams,
    }
    for line in notes(rows, scored):
        print(f"note: {line}")
    total = sum(r.bytes_scored for r in rows)
    elapsed = time.perf_counter() - t0
    say(
        f"scored {counted(len(rows), 'checkpoint')}, {total:,} bytes in {elapsed:.1f} s "
        f"({total / max(elapsed, 1e-9):,.0f} bytes/s, threads {torch.get_num_threads()})"
    )
    if out is not None:
        write_out(
            out,
            rows,
            {
                "data": corpus.shards,
                "text_bytes": corpus.size,
                "val_bytes": n_bytes,
                "val_streams": a.val_streams,
                "device": str(device),
                "recurrence": recurrence,
                "threads": torch.get_num_threads(),
            },
        )
        say(f"wrote {out}")
    if plot_to is not None:
        save_figure(figure(rows, f"bits/byte on {some_of(corpus.shards)}"), plot_to)
        say(f"wrote {plot_to}")
    return rows


def _bar(total: int):
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, dynamic_ncols=True, leave=False)


def main(argv: list[str] | None = None) -> int:
    set_command("eval")
    try:
        run(build_parser().parse_args(argv))
    except UserError as e:
        return user_error_exit(e)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return reader_went_away()
    return 0


if __name__ == "__main__":
    sys.exit(main())
