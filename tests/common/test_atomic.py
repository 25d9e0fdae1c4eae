"""Atomic replacement of a file (atom_train.common.atomic): the new file or the old one,
never a torn one, and no temp file left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atom_train.common import atomic


def test_atomic_write_replaces_or_keeps(tmp_path):
    p = tmp_path / "f.bin"
    atomic.atomic_write(p, b"one")
    assert p.read_bytes() == b"one"
    atomic.atomic_write(p, b"two", keep_previous_as=tmp_path / "f.prev")
    assert p.read_bytes() == b"two" and (tmp_path / "f.prev").read_bytes() == b"one"

    def refuse(tmp: Path) -> None:
        assert tmp.read_bytes() == b"three"  # verify sees what is on disk
        raise ValueError("no")

    with pytest.raises(ValueError):
        atomic.atomic_write(p, b"three", verify=refuse)
    assert p.read_bytes() == b"two"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f.bin", "f.prev"]  # no temp left
    with pytest.raises(FileExistsError):
        atomic.atomic_write(p, b"four", exclusive=True)
    assert p.read_bytes() == b"two"
    atomic.atomic_write_json(tmp_path / "s.json", {"b": 1, "a": [1, 2]})
    assert (tmp_path / "s.json").read_text() == '{\n "a": [\n  1,\n  2\n ],\n "b": 1\n}\n'


def test_stale_temp_files_are_removed(tmp_path):
    (tmp_path / ".x.safetensors.tmp-123").write_bytes(b"partial")
    (tmp_path / ".status.json.tmp-9").write_bytes(b"partial")
    (tmp_path / "keep.safetensors").write_bytes(b"whole")
    removed = atomic.remove_stale_temp_files(tmp_path, ".safetensors")
    assert [p.name for p in removed] == [".x.safetensors.tmp-123"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".status.json.tmp-9", "keep.safetensors"]


def test_the_new_file_takes_the_name_in_one_rename(tmp_path, monkeypatch):
    """What makes a crash leave the old file or the new one: the data goes to a temp file,
    fsynced, which then takes the name by one rename, and the folder is fsynced after it. A
    copy onto the target (into the old file's inode) would let a crash tear it: a reader
    holding the old file sees it whole, and the name points at the temp file's inode."""
    p = tmp_path / "f.bin"
    atomic.atomic_write(p, b"old contents")
    seen: dict = {}

    def verify(tmp: Path) -> None:
        seen["tmp"], seen["inode"] = tmp, tmp.stat().st_ino

    steps = []
    real_replace, real_fsync_dir = atomic.os.replace, atomic.fsync_dir

    def replace(a, b):
        steps.append(("rename", Path(a), Path(b)))
        real_replace(a, b)

    def fsync_dir(d):
        steps.append(("fsync", Path(d)))
        real_fsync_dir(d)

    monkeypatch.setattr(atomic.os, "replace", replace)
    monkeypatch.setattr(atomic, "fsync_dir", fsync_dir)
    with p.open("rb") as held:
        atomic.atomic_write(p, b"new contents, longer", verify=verify)
        assert held.read() == b"old contents", "the old file was written into"
    assert p.stat().st_ino == seen["inode"]
    assert steps == [("rename", seen["tmp"], p), ("fsync", tmp_path)]
    assert p.read_bytes() == b"new contents, longer" and not seen["tmp"].exists()


def test_a_plain_write_does_not_pause_and_is_readable_by_all(tmp_path, monkeypatch):
    pauses = []
    monkeypatch.setattr(atomic.time, "sleep", pauses.append)
    old = os.umask(0o022)
    try:
        p = atomic.atomic_write(tmp_path / "f.bin", b"x" * 100)
    finally:
        os.umask(old)
    assert pauses == [] and p.read_bytes() == b"x" * 100
    assert p.stat().st_mode & 0o777 == 0o644


def test_every_stale_temp_file_goes_and_one_that_cannot_go_is_left(tmp_path):
    (tmp_path / ".x.safetensors.tmp-123").write_bytes(b"partial")
    (tmp_path / ".status.json.tmp-9").write_bytes(b"partial")
    (tmp_path / ".d.json.tmp-7").mkdir()  # not a file: unlink fails, the others still go
    (tmp_path / "keep.json").write_bytes(b"whole")
    removed = atomic.remove_stale_temp_files(tmp_path)
    assert sorted(p.name for p in removed) == [".status.json.tmp-9", ".x.safetensors.tmp-123"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".d.json.tmp-7", "keep.json"]
