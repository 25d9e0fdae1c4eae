"""Checkpoint files: safe format, checksum, atomic writes, and failure without loss."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch
from helpers.unprivileged import can_drop_privileges, run_unprivileged

from atom_train.trainer import checkpoint_file as ck
from atom_train.trainer.checkpoint_file import (
    CheckpointError,
    latest_valid_checkpoint,
    load_checkpoint,
    read_metadata,
    save_checkpoint,
)


def _tensors(seed: float = 1.0) -> dict[str, torch.Tensor]:
    return {
        "model/w": torch.arange(12, dtype=torch.float32).reshape(3, 4) * seed,
        "optim/w/step": torch.tensor(3.0),
        "runtime/n_atoms": torch.tensor([1, 2], dtype=torch.int64),
        "rng/dropout": torch.Generator().manual_seed(5).get_state(),
    }


def _meta(tick: int) -> dict:
    return {"training": {"tick": tick}, "model_config": {"n_modes": 4}}


def test_round_trip_exact(tmp_path):
    p = save_checkpoint(tmp_path / "a.safetensors", _tensors(), _meta(7))
    c = load_checkpoint(p)
    assert c.meta == _meta(7)
    for k, v in _tensors().items():
        assert c.tensors[k].dtype == v.dtype
        assert torch.equal(c.tensors[k], v)
    assert c.group("model").keys() == {"w"}
    assert read_metadata(p) == _meta(7)


def test_file_is_plain_safetensors_without_pickle(tmp_path):
    p = save_checkpoint(tmp_path / "a.safetensors", _tensors(), _meta(1))
    raw = p.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    meta = header["__metadata__"]
    assert meta["format"] == "atom.checkpoint"
    assert meta["format_version"] == "1"
    assert len(meta["payload_sha256"]) == 64
    assert b"\x80\x04" not in raw[:16]  # no pickle protocol header


@pytest.mark.parametrize("where", ["data", "header_json"])
def test_flipped_bit_is_detected(tmp_path, where):
    p = save_checkpoint(tmp_path / "a.safetensors", _tensors(), _meta(1))
    raw = bytearray(p.read_bytes())
    if where == "data":
        raw[-5] ^= 0x01
    else:
        i = raw.index(b'"tick')
        raw[i + 9] ^= 0x01  # a digit of the tick inside the metadata JSON
    p.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"checksum|garbled|truncated or corrupt"):
        load_checkpoint(p)


def test_truncated_file_is_detected(tmp_path):
    p = save_checkpoint(tmp_path / "a.safetensors", _tensors(), _meta(1))
    raw = p.read_bytes()
    for cut in (3, 20, len(raw) // 2, len(raw) - 1):
        p.write_bytes(raw[:cut])
        with pytest.raises(CheckpointError):
            load_checkpoint(p)


def test_missing_and_foreign_files(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "nope.safetensors")
    with pytest.raises(CheckpointError, match="is a folder"):
        load_checkpoint(tmp_path)
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(CheckpointError, match="not an atom checkpoint"):
        load_checkpoint(tmp_path / "other.safetensors")


def test_newer_format_version_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(ck, "FORMAT_VERSION", 99)
    p = save_checkpoint(tmp_path / "a.safetensors", _tensors(), _meta(1))
    monkeypatch.setattr(ck, "FORMAT_VERSION", 1)
    with pytest.raises(CheckpointError, match="newer than this atom"):
        load_checkpoint(p)


def test_snapshot_never_overwritten(tmp_path):
    p = tmp_path / "snapshot-000000000010.safetensors"
    save_checkpoint(p, _tensors(1.0), _meta(10), exclusive=True)
    before = p.read_bytes()
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        save_checkpoint(p, _tensors(2.0), _meta(10), exclusive=True)
    assert p.read_bytes() == before
    assert [q.name for q in tmp_path.iterdir()] == [p.name]  # no temp file left


def test_rolling_keeps_previous(tmp_path):
    cur, prev = tmp_path / "ckpt-rolling.safetensors", tmp_path / "ckpt-rolling.prev.safetensors"
    save_checkpoint(cur, _tensors(1.0), _meta(1), keep_previous_as=prev)
    assert not prev.exists()
    save_checkpoint(cur, _tensors(2.0), _meta(2), keep_previous_as=prev)
    assert load_checkpoint(cur).meta["training"]["tick"] == 2
    assert load_checkpoint(prev).meta["training"]["tick"] == 1


def _fail_writes_after(monkeypatch, n_ok: int, err: int):
    real_write = os.write
    calls = {"n": 0}

    def write(fd, data):
        if ".tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
            calls["n"] += 1
            if calls["n"] > n_ok:
                raise OSError(err, os.strerror(err))
        return real_write(fd, data)

    monkeypatch.setattr(ck.os, "write", write)


def test_disk_full_keeps_previous_and_removes_temp(tmp_path, monkeypatch):
    cur, prev = tmp_path / "ckpt-rolling.safetensors", tmp_path / "ckpt-rolling.prev.safetensors"
    save_checkpoint(cur, _tensors(1.0), _meta(1), keep_previous_as=prev)
    good = cur.read_bytes()
    monkeypatch.setattr(ck, "_CHUNK", 64)  # several writes, the disk fills after the first
    _fail_writes_after(monkeypatch, 1, errno.ENOSPC)
    with pytest.raises(CheckpointError, match=r"No space left.*free some space.*intact"):
        save_checkpoint(cur, _tensors(2.0), _meta(2), keep_previous_as=prev)
    assert cur.read_bytes() == good
    assert load_checkpoint(cur).meta["training"]["tick"] == 1
    assert sorted(q.name for q in tmp_path.iterdir()) == [cur.name]


def test_unwritable_folder_is_a_clear_error(tmp_path, monkeypatch):
    cur = tmp_path / "ckpt-rolling.safetensors"
    save_checkpoint(cur, _tensors(1.0), _meta(1))
    real_open = os.open

    def deny(path, *a, **k):
        if ".tmp-" in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(ck.os, "open", deny)
    with pytest.raises(CheckpointError, match=r"Permission denied.*writable.*intact"):
        save_checkpoint(cur, _tensors(2.0), _meta(2))
    monkeypatch.undo()
    assert load_checkpoint(cur).meta["training"]["tick"] == 1


@pytest.mark.skipif(not can_drop_privileges(), reason="no user namespaces: root ignores modes")
def test_read_only_folder_for_real(tmp_path):
    cur = tmp_path / "ckpt-rolling.safetensors"
    save_checkpoint(cur, _tensors(1.0), _meta(1))
    tmp_path.chmod(0o555)

    def save_new() -> str:
        with pytest.raises(CheckpointError, match=r"Permission denied.*intact") as e:
            save_checkpoint(cur, _tensors(2.0), _meta(2))
        return str(e.value)

    try:
        # As an unprivileged user (even under root, as CI runs): the folder's mode is real.
        message = run_unprivileged(save_new)
    finally:
        tmp_path.chmod(0o755)
    assert "make the output folder writable" in message
    assert load_checkpoint(cur).meta["training"]["tick"] == 1
    assert os.listdir(tmp_path) == [cur.name]  # no temp file left behind


def test_latest_valid_skips_corrupt_with_warning(tmp_path):
    save_checkpoint(tmp_path / "snapshot-000000000005.safetensors", _tensors(), _meta(5))
    save_checkpoint(tmp_path / "ckpt-rolling.prev.safetensors", _tensors(), _meta(10))
    newest = save_checkpoint(tmp_path / "ckpt-rolling.safetensors", _tensors(), _meta(20))
    raw = bytearray(newest.read_bytes())
    raw[-3] ^= 0xFF
    newest.write_bytes(bytes(raw))
    (tmp_path / ".ckpt-rolling.safetensors.tmp-123").write_bytes(b"partial")
    warnings: list[str] = []
    c = latest_valid_checkpoint(tmp_path, warn=warnings.append)
    assert c is not None and c.meta["training"]["tick"] == 10
    assert len(warnings) == 1 and "ckpt-rolling.safetensors" in warnings[0]
    assert "checksum" in warnings[0]


def test_latest_valid_on_empty_or_missing_folder(tmp_path):
    assert latest_valid_checkpoint(tmp_path) is None
    assert latest_valid_checkpoint(tmp_path / "missing") is None


def test_the_last_step_is_one_rename_not_a_copy_over_the_old_file(tmp_path):
    """A crash leaves the old file or the new one only if the new file takes the name in one
    step (a rename): a copy onto the target writes into the old file's inode, which a crash
    leaves torn. A reader holding the old file sees it whole, and the name now points at
    another inode, the one written as the temp file."""
    cur = tmp_path / "ckpt-rolling.safetensors"
    save_checkpoint(cur, _tensors(1.0), _meta(1))
    old_bytes, old_inode = cur.read_bytes(), cur.stat().st_ino
    with cur.open("rb") as held:
        save_checkpoint(cur, _tensors(2.0), _meta(2))
        assert held.read() == old_bytes, "the old file was written into"
    assert cur.stat().st_ino != old_inode
    assert load_checkpoint(cur).meta["training"]["tick"] == 2
    assert os.listdir(tmp_path) == [cur.name]
