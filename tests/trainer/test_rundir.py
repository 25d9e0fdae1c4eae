"""The run folder (atom_train.trainer.rundir): opening it under its lock cleans up what a
killed trainer left behind, and nothing else."""

from __future__ import annotations

from atom_train.trainer.run_logs import read_progress
from atom_train.trainer.rundir import PROGRESS, PROGRESS_COLUMNS, ProgressTable, open_run_dir


def test_opening_a_run_folder_removes_every_stale_temp_file(tmp_path):
    """A kill -9 can land inside any atomic write: a checkpoint's or status.json's."""
    (tmp_path / ".ckpt-rolling.safetensors.tmp-123").write_bytes(b"partial")
    (tmp_path / ".status.json.tmp-456").write_bytes(b"partial")
    (tmp_path / "status.json").write_text("{}")
    (tmp_path / ".trainer-exit-code").write_text("0\n")  # the supervisor's: not a temp file
    said: list[str] = []
    lock = open_run_dir(tmp_path, said.append)
    try:
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == [".lock", ".trainer-exit-code", "status.json"]
        assert said == [
            "removed .ckpt-rolling.safetensors.tmp-123, left by a checkpoint write that was "
            "interrupted"
        ]
    finally:
        lock.release()


def test_progress_table_writes_its_header_again_when_the_columns_changed(tmp_path):
    """A run resumed by a trainer with other progress.tsv columns (older rows, newer
    columns): the header again, so each row is read by the header above it."""
    path = tmp_path / PROGRESS
    old = [c for c in PROGRESS_COLUMNS if c != "b_simple"]
    path.write_text(
        "\t".join(old) + "\n" + "\t".join("1" if c == "tick" else "5" for c in old) + "\n"
    )
    table = ProgressTable(path)
    table.row(tick=2, bytes_seen=10, b_simple=7.5)
    table.close()
    again = ProgressTable(path)  # the same columns: no second header
    again.close()
    lines = path.read_text().splitlines()
    assert [x.split("\t")[0] for x in lines] == ["tick", "1", "tick", "2"]
    p = read_progress(path)
    assert p.columns["tick"] == [1.0, 2.0] and p.columns["b_simple"][1] == 7.5
