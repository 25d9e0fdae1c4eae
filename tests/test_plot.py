"""`python -m atom_train.plot`: reading progress.tsv (resumes, gaps, torn lines) and the PNG."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from atom_train import plot
from atom_train.rundir import PROGRESS_COLUMNS

REPO = Path(__file__).resolve().parents[1]
HEADER = "\t".join(PROGRESS_COLUMNS)  # the trainer's own columns
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(tick: int, ce: float, val: str = "") -> str:
    values = {
        "tick": tick, "bytes_seen": tick * 64, "loss": f"{ce * 0.69:.4f}",
        "byte_ce_bpb": f"{ce:.4f}", "val_ce_bpb": val, "lr": 0.002, "leak": 0.01,
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
    p = plot.read_progress(_write_run(tmp_path / "run") / "progress.tsv")
    ticks = p.columns["tick"]
    assert ticks == sorted(set(ticks)) and ticks[0] == 0 and ticks[-1] == 650
    assert len(p) == 14 and p.skipped == 1
    # The resumed rows replace the first run's rows for the same ticks.
    assert p.columns["byte_ce_bpb"][ticks.index(400)] == 1.0
    val = p.columns["val_ce_bpb"]
    assert val[0] == 7.5 and math.isnan(val[1])


def test_plot_writes_a_png(tmp_path, capsys):
    run = _write_run(tmp_path / "run")
    assert plot.main([str(run)]) == 0
    png = run / "training.png"
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
    assert "wrote" in capsys.readouterr().out
    other = tmp_path / "other.png"
    assert plot.main([str(run / "progress.tsv"), "--out", str(other)]) == 0
    assert other.read_bytes()[:8] == PNG_MAGIC
    assert not list(run.glob(".*tmp*"))


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
