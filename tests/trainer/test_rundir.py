"""The run folder (atom_train.trainer.rundir): opening it under its lock cleans up what a
killed trainer left behind, and nothing else."""

from __future__ import annotations

from atom_train.trainer.rundir import open_run_dir


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
