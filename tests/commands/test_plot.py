"""`python -m atom_train.plot`: reading progress.tsv (resumes, gaps, torn lines) and the PNG."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from helpers.figure_reading import legend_on_a_line, tick_labels

from atom_train import plot
from atom_train.trainer import run_logs
from atom_train.trainer.rundir import PROGRESS_COLUMNS

HEADER = "\t".join(PROGRESS_COLUMNS)  # the trainer's own columns
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(tick: int, ce: float, val: str = "") -> str:
    values = {
        "tick": tick, "bytes_seen": tick * 64, "loss": f"{ce * 0.69:.4f}",
        "train_bpb": f"{ce:.4f}", "val_bpb": val, "lr": 0.002, "leak": 0.01,
        "bytes_per_s": 50000, "elapsed_s": tick / 10,
    }  # fmt: skip
    return "\t".join(str(values.get(c, "")) for c in PROGRESS_COLUMNS)


def _write_run(run: Path) -> Path:
    run.mkdir()
    lines = [HEADER]
    lines += [_row(t, 8.0 - t / 100, "7.5" if t % 200 == 0 else "") for t in range(0, 500, 50)]
    # A resume from the checkpoint at tick 400: header again, ticks 400.. written again.
    lines.append(HEADER)
    lines += [_row(t, 1.0) for t in range(400, 700, 50)]
    lines.append("700\t44800\t0.5")  # torn by a crash mid-write
    (run / "progress.tsv").write_text("\n".join(lines) + "\n")
    return run


def test_read_progress_handles_resume_gaps_and_torn_lines(tmp_path):
    p = run_logs.read_progress(_write_run(tmp_path / "run") / "progress.tsv")
    ticks = p.columns["tick"]
    assert ticks == sorted(set(ticks)) and ticks[0] == 0 and ticks[-1] == 650
    assert len(p) == 14 and p.skipped == 1
    # The resumed rows replace the first run's rows for the same ticks.
    assert p.columns["train_bpb"][ticks.index(400)] == 1.0
    val = p.columns["val_bpb"]
    assert val[0] == 7.5 and math.isnan(val[1])


def test_a_progress_tsv_written_before_the_metric_names_reads_under_todays_names(tmp_path):
    """A run from before the names were settled (byte_ce_bpb, val_ce_bpb), resumed by
    today's trainer (train_bpb, val_bpb, grad_norm): one column per metric."""
    old = ["tick", "bytes_seen", "loss", "byte_ce_bpb", "val_ce_bpb", "lr"]
    lines = ["\t".join(old), "16\t64\t5.0\t7.0\t7.5\t0.002"]
    lines += [HEADER, _row(32, 6.0, "6.5")]
    (tmp_path / "progress.tsv").write_text("\n".join(lines) + "\n")
    p = run_logs.read_progress(tmp_path / "progress.tsv")
    assert "byte_ce_bpb" not in p.columns and "val_ce_bpb" not in p.columns
    assert p.columns["train_bpb"] == [7.0, 6.0]
    assert p.columns["val_bpb"] == [7.5, 6.5]


def _series(fig, label: str) -> list[tuple[float, float]]:
    """The (x, y) points of the line labelled `label`, on any panel of the figure."""
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_label() == label:
                return [tuple(map(float, p)) for p in line.get_xydata()]
    raise AssertionError(f"no line {label!r}")


def test_the_figure_draws_the_rows_that_won(tmp_path, capsys):
    run = run_logs.read_run(_write_run(tmp_path / "run"))
    fig = plot.figure([run], "run")
    ce = _series(fig, "train_bpb")
    # One point per distinct tick, the resumed rows replacing the first launch's.
    assert [x for x, _ in ce] == [t * 64 for t in range(0, 700, 50)]
    assert ce[-1] == (650 * 64, 1.0) and ce[8] == (400 * 64, 1.0)
    # The val series skips the rows without validation instead of drawing gaps.
    assert _series(fig, "val_bpb") == [(t * 64, 7.5) for t in (0, 200)]
    assert [y for _, y in _series(fig, "bytes/s")] == [50000] * 14
    # main() writes that figure: a PNG of 9 x 9 inches at 110 dpi.
    assert plot.main([str(tmp_path / "run")]) == 0
    import matplotlib.image

    assert matplotlib.image.imread(tmp_path / "run" / "training.png").shape[:2] == (990, 990)
    assert "wrote" in capsys.readouterr().out
    other = tmp_path / "other.png"
    assert plot.main([str(tmp_path / "run" / "progress.tsv"), "--out", str(other)]) == 0
    assert other.read_bytes()[:8] == PNG_MAGIC
    assert not list((tmp_path / "run").glob(".*tmp*"))


def _write_branch(root: Path, name: str, ticks: range, ce: float, events: list[dict]) -> Path:
    """A run folder with progress rows at `ticks` (B = 64, val at every row) and `events`."""
    run = root / name
    run.mkdir()
    lines = [HEADER] + [_row(t, ce - t / 1000, f"{ce - t / 1000 + 0.1:.4f}") for t in ticks]
    (run / "progress.tsv").write_text("\n".join(lines) + "\n")
    steps = [{"step": t // 50, "tick": t, "loss": 1.0, "gnorm": 0.5} for t in ticks]
    (run / "loss.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events + steps))
    return run


def test_runs_side_by_side_mark_the_fork_and_the_pivot(tmp_path, capsys):
    main = _write_branch(
        tmp_path, "main", range(50, 450, 50), 8.0,
        [
            {"event": "start", "tick": 0, "B": 64},
            {"event": "resume", "tick": 200},
            {"event": "pivot", "tick": 200, "changes": {"lr": [0.002, 0.001]}},
        ],
    )  # fmt: skip
    source = main / "snapshot-000000000200.safetensors"
    fork = _write_branch(
        tmp_path, "audit", range(250, 450, 50), 7.0,
        [{"event": "fork", "tick": 200, "source": str(source), "source_tick": 200,
          "changes": {"lr": [0.002, 0.005]}}],
    )  # fmt: skip
    runs = [run_logs.read_run(main), run_logs.read_run(fork)]
    fig = plot.figure(runs, "t")
    # The fork's lines start at its source's point at the fork tick.
    assert _series(fig, "audit val_bpb")[0] == (200 * 64, 7.9)
    assert _series(fig, "audit val_bpb")[1] == (250 * 64, 6.85)
    assert _series(fig, "main val_bpb")[0] == (50 * 64, 8.05)
    marks = [line for line in fig.axes[1].get_lines() if line.get_gid() == "event"]
    assert sorted(m.get_xdata()[0] for m in marks) == [200 * 64, 200 * 64]
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert "main pivot: lr 0.002 -> 0.001" in labels
    assert "audit fork at tick 200: lr 0.002 -> 0.005" in labels

    out = tmp_path / "compare.png"
    assert plot.main([str(main), str(fork), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"wrote {out}"
    assert printed[1].startswith("main: 8 rows; last val_bpb 7.7000 at tick 400; best val_bpb")
    assert "pivot at tick 200: lr 0.002 -> 0.001" in printed[1]
    assert "fork of main/snapshot-000000000200.safetensors at tick 200" in printed[2]
    # (these runs' events, written by hand, do not record their val text)
    assert printed[3].startswith("lowest last val_bpb: audit (6.7000) (the val text of main,")


def test_a_rewind_is_marked_as_the_automatic_pivot_it_is(tmp_path):
    """The divergence guard's rewind: its pivot (auto) is named for it on the figure and in
    the summary (docs/divergence.md)."""
    out = _write_branch(
        tmp_path, "run", range(50, 450, 50), 8.0,
        [
            {"event": "start", "tick": 0, "B": 64},
            {"event": "rewind", "tick": 260, "to_tick": 200, "given_up": [200, 260]},
            {"event": "resume", "tick": 200},
            {"event": "pivot", "tick": 200, "changes": {"lr": [10.0, 5.0]}, "auto": "rewind",
             "skip_ticks": 60},
        ],
    )  # fmt: skip
    run = run_logs.read_run(out)
    fig = plot.figure([run], "t")
    assert "rewind: lr 10.0 -> 5.0" in [t.get_text() for t in fig.axes[0].texts]
    assert "rewind (automatic pivot) at tick 200: lr 10.0 -> 5.0" in plot.summary(run)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("", "is empty"),
        ("garbage without tabs\nmore garbage\n", "no header line"),
        (HEADER + "\n", "no readable row"),
        (HEADER + "\nx\ty\tz\n", "no readable row"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, capsys, content, message):
    run = tmp_path / "run"
    if content is not None:
        run.mkdir()
        (run / "progress.tsv").write_text(content)
    assert plot.main([str(run)]) == 2
    assert message in capsys.readouterr().err


def test_missing_progress_file_in_existing_dir(tmp_path, capsys):
    assert plot.main([str(tmp_path)]) == 2
    assert "progress.tsv not found" in capsys.readouterr().err


def test_cli_error_has_no_traceback(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "atom_train.plot", str(tmp_path / "missing")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "Traceback" not in res.stderr and "does not exist" in res.stderr


def test_a_run_that_measured_the_noise_scale_gets_its_panel(tmp_path, capsys):
    run = tmp_path / "noisy"
    run.mkdir()
    rows = []
    for t in range(50, 450, 50):
        cells = _row(t, 3.0).split("\t")
        cells[PROGRESS_COLUMNS.index("b_simple")] = str(t / 10)  # growing, as the loss falls
        rows.append("\t".join(cells))
    (run / "progress.tsv").write_text("\n".join([HEADER, *rows]) + "\n")
    fig = plot.figure([run_logs.read_run(run)], "noisy")
    assert len(fig.axes) == 4
    assert _series(fig, "b_simple") == [(t * 64, t / 10) for t in range(50, 450, 50)]
    assert _series(fig, "-B 64")[0][1] == 64  # the run's B beside it
    # Read as drawn: the legend on neither line (its first place, upper left, was on the
    # -B line above the curve), the log axis (5 to 64: little over a decade) in plain numbers.
    assert legend_on_a_line(fig.axes[3]) == []
    assert [t for _, t in tick_labels(fig.axes[3], "y")] == ["6", "10", "20", "30", "40", "60"]
    assert "last b_simple 40 streams (-B 64)" in plot.summary(run_logs.read_run(run))
    # A run without it keeps three panels.
    assert len(plot.figure([run_logs.read_run(_write_run(tmp_path / "plain"))], "p").axes) == 3


def test_the_runs_that_share_a_val_are_ranked_and_the_others_named(tmp_path, capsys):
    """Three runs, two validated on one text and one on another: the two are ranked, the
    third is named with what it scores (not "no ranking" for all three)."""

    def val(size: int) -> dict:
        return {"files": ["v.txt"], "signature": [{"name": "v.txt", "size": size}],
                "size": size, "val_bytes": 512, "val_streams": 4}  # fmt: skip

    runs = []
    for name, ce, size in (("a", 8.0, 4000), ("b", 7.0, 4000), ("c", 5.0, 900)):
        start = {"event": "start", "tick": 0, "B": 64, "val": val(size)}
        runs.append(_write_branch(tmp_path, name, range(50, 250, 50), ce, [start]))
    assert plot.main([*map(str, runs), "--out", str(tmp_path / "p.png")]) == 0
    ranking = capsys.readouterr().out.splitlines()[4]  # (b: 7.0 - 200/1000 + 0.1, its last row)
    assert ranking == (
        "lowest last val_bpb of a, b (the same val): b (6.9000); not ranked (another val): "
        "c: 512 bytes of v.txt (900 bytes) by 4 streams"
    )
