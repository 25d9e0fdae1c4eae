"""The run folder (atom_train.trainer.rundir): opening it under its lock cleans up what a
killed trainer left behind, and nothing else."""

from __future__ import annotations

from atom_train.trainer.run_logs import read_progress
from atom_train.trainer.rundir import PROGRESS_COLUMNS, ProgressTable, open_run_dir


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


def test_a_launch_with_other_columns_writes_its_header_again(tmp_path):
    """A run resumed by a trainer whose progress columns differ (a column added) heads its
    rows with its own header, so a reader takes every row by the right names; the same
    columns write no second header."""
    path = tmp_path / "progress.tsv"
    old = [c for c in PROGRESS_COLUMNS if c not in ("gpu_wait_pct", "allreduce_s")]
    path.write_text("\t".join(old) + "\n" + "\t".join(["16", "64", *["1"] * (len(old) - 2)]) + "\n")
    table = ProgressTable(path)
    table.row(tick=32, bytes_seen=128, loss=2.0)
    table.close()
    ProgressTable(path).close()  # the same columns: nothing written
    lines = path.read_text().splitlines()
    assert [x.split("\t")[0] for x in lines] == ["tick", "16", "tick", "32"]
    progress = read_progress(path)
    assert progress.get("tick") == [16, 32] and progress.skipped == 0
    assert progress.get("loss") == [1, 2]
