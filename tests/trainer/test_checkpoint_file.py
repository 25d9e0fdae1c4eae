"""Checkpoint files: safe format, checksum, atomic writes, and failure without loss."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch
from helpers.unprivileged import can_drop_privileges, run_unprivileged

from atom_train.common import atomic
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
    assert meta["format_version"] == "2"
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


# ---- what the mutation check found unheld (make mutants, docs/testing.md) ------------------


def test_what_reaches_the_disk_is_verified_before_it_replaces_anything(tmp_path, monkeypatch):
    """A write that lands wrong on disk (a byte flipped on its way) is caught by reading the
    temp file back: the save fails naming the checksum, and the previous file stays."""
    cur = save_checkpoint(tmp_path / "ckpt-rolling.safetensors", _tensors(1.0), _meta(1))
    real_write = os.write

    def flip_last_byte(fd, data):
        data = bytearray(data)
        data[-1] ^= 0x01
        return real_write(fd, bytes(data))

    monkeypatch.setattr(atomic.os, "write", flip_last_byte)
    with pytest.raises(CheckpointError) as e:
        save_checkpoint(cur, _tensors(2.0), _meta(2))
    monkeypatch.undo()
    assert str(e.value) == (
        f"could not write checkpoint {cur} ({tmp_path}/.{cur.name}.tmp-{os.getpid()}: "
        "checksum mismatch (the file is corrupt)); the previous checkpoint "
        "ckpt-rolling.safetensors is intact"
    )
    assert load_checkpoint(cur).meta["training"]["tick"] == 1
    assert os.listdir(tmp_path) == [cur.name]


def test_the_bytes_are_a_function_of_the_content(tmp_path):
    """The metadata is written with sorted keys: the same content in another key order has
    the same checksum (which names the content, e.g. in fork events)."""
    a = save_checkpoint(tmp_path / "a.safetensors", _tensors(), {"x": 1, "training": {"tick": 3}})
    b = save_checkpoint(tmp_path / "b.safetensors", _tensors(), {"training": {"tick": 3}, "x": 1})
    assert load_checkpoint(a).sha256 == load_checkpoint(b).sha256
    header = json.loads(a.read_bytes()[8 : 8 + int.from_bytes(a.read_bytes()[:8], "little")])
    assert header["__metadata__"]["atom"] == '{"training": {"tick": 3}, "x": 1}'


def test_every_refusal_names_the_file_and_the_problem(tmp_path):
    def refused(data: bytes) -> str:
        p = tmp_path / "x.safetensors"
        p.write_bytes(data)
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(p)
        return str(e.value)

    p = tmp_path / "x.safetensors"
    good = save_checkpoint(tmp_path / "good.safetensors", _tensors(), _meta(1)).read_bytes()
    n = int.from_bytes(good[:8], "little")
    header = json.loads(good[8 : 8 + n])
    assert refused(b"1234567") == (
        f"{p} is a text file, not a checkpoint: give a checkpoint (*.safetensors, written by "
        "python -m atom_train.train) or a run folder"
    )
    assert refused(b"\x07\x00\x00").startswith(f"{p}: truncated or corrupt (safetensors says: ")
    assert refused(good[:8]).startswith(f"{p}: truncated or corrupt (safetensors says: ")

    def with_metadata(meta: dict) -> bytes:
        h = json.dumps({**header, "__metadata__": meta}).encode()
        h += b" " * (-len(h) % 8)
        return len(h).to_bytes(8, "little") + h + good[8 + n :]

    m = header["__metadata__"]
    assert refused(with_metadata({**m, "format": "other"})) == (
        f"{p}: not an atom checkpoint (format 'other', expected 'atom.checkpoint')"
    )
    assert refused(with_metadata({**m, "format_version": "one"})) == (
        f"{p}: malformed format_version 'one' in the header"
    )
    no_version = {k: v for k, v in m.items() if k != "format_version"}
    assert load_checkpoint(_write(p, with_metadata(no_version))).meta == _meta(1)  # means 1
    no_sum = {k: v for k, v in m.items() if k != "payload_sha256"}
    assert refused(with_metadata(no_sum)) == f"{p}: no atom metadata or checksum in the header"
    no_meta = {k: v for k, v in m.items() if k != "atom"}
    assert refused(with_metadata(no_meta)) == f"{p}: no atom metadata or checksum in the header"
    with pytest.raises(CheckpointError, match=r"x.safetensors: no atom metadata in the header$"):
        read_metadata(_write(p, with_metadata(no_meta)))
    with pytest.raises(CheckpointError, match=r"x.safetensors: malformed format_version 'v2'"):
        read_metadata(_write(p, with_metadata({**m, "format_version": "v2"})))
    assert read_metadata(_write(p, with_metadata(no_version))) == _meta(1)


def _write(p, data: bytes):
    p.write_bytes(data)
    return p


def test_an_export_is_named_as_one_when_given_as_a_checkpoint(tmp_path):
    """An export (int32 step, int32 n, then 3 x n float32) given where a checkpoint belongs
    is named for what it is, by load_checkpoint and by read_metadata alike."""
    n = 5
    export = tmp_path / "w.bin"
    export.write_bytes((7).to_bytes(4, "little") + n.to_bytes(4, "little") + bytes(12 * n))
    message = (
        f"{export} is an export (raw weights + AdamW moments, written by atom_train.export), "
        f"not a checkpoint: give the .safetensors checkpoint it was exported from (its sidecar "
        f"w.bin.json names it)"
    )
    for read in (load_checkpoint, read_metadata):
        with pytest.raises(CheckpointError) as e:
            read(export)
        assert str(e.value) == message
    # Not an export: one byte off the size n announces, or n = 0, or n negative.
    for data in (
        (7).to_bytes(4, "little") + n.to_bytes(4, "little") + bytes(12 * n + 1),
        (7).to_bytes(4, "little") + (0).to_bytes(4, "little"),
        (7).to_bytes(4, "little") + (-1).to_bytes(4, "little", signed=True) + bytes(12 * 0),
    ):
        export.write_bytes(data)
        for read in (load_checkpoint, read_metadata):
            with pytest.raises(CheckpointError) as e:
                read(export)
            assert "is an export" not in str(e.value)
    export.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"w.bin: not a readable checkpoint \("):
        read_metadata(export)


def test_a_slow_write_is_cut_into_eight_chunks_with_a_pause_after_each(tmp_path, monkeypatch):
    """The test hook that lands kills inside a write (ATOM_TEST_SLOW_CKPT_WRITE): the data in
    8 chunks (9 when it does not divide), a pause of the given seconds after each; unset, one
    write and no pause."""
    writes, pauses = [], []
    real_write = os.write
    monkeypatch.setattr(
        atomic.os, "write", lambda fd, b: writes.append(len(b)) or real_write(fd, b)
    )
    monkeypatch.setattr(atomic.time, "sleep", pauses.append)
    p = save_checkpoint(tmp_path / "a.safetensors", _tensors(), _meta(1))
    assert len(writes) == 1 and writes[0] == p.stat().st_size and pauses == []
    writes.clear()
    monkeypatch.setenv("ATOM_TEST_SLOW_CKPT_WRITE", "0.25")
    p = save_checkpoint(tmp_path / "b.safetensors", _tensors(), _meta(1))
    size = p.stat().st_size
    assert writes[:-1] == [size // 8] * (len(writes) - 1) and sum(writes) == size
    assert len(writes) == 8 + bool(size % 8) and pauses == [0.25] * len(writes)


def test_a_failed_write_says_why_and_what_to_do(tmp_path, monkeypatch):
    cur = tmp_path / "ckpt-rolling.safetensors"

    def failing(err: OSError):
        def write(fd, data):
            raise err

        return write

    cases = [
        (OSError(errno.ENOSPC, "No space left on device"),
         "No space left on device: free some space (or move --output-dir) and resume"),
        (OSError(errno.EROFS, "Read-only file system"),
         "Read-only file system: make the output folder writable and resume"),
        (OSError(errno.EIO, "Input/output error"), "Input/output error"),
        (OSError(errno.EIO), f"{errno.EIO}"),  # no strerror: the error as it prints
    ]  # fmt: skip
    for err, said in cases:
        monkeypatch.setattr(atomic.os, "write", failing(err))
        with pytest.raises(CheckpointError) as e:
            save_checkpoint(cur, _tensors(), _meta(1))
        close = said.index(":") if ":" in said else len(said)
        # No previous checkpoint: nothing is said about one.
        assert str(e.value) == f"could not write checkpoint {cur} ({said[:close]}){said[close:]}"
    monkeypatch.undo()
    save_checkpoint(cur, _tensors(), _meta(1))
    monkeypatch.setattr(atomic.os, "write", failing(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(CheckpointError) as e:
        save_checkpoint(cur, _tensors(), _meta(2))
    assert str(e.value) == (
        f"could not write checkpoint {cur} (No space left): free some space (or move "
        "--output-dir) and resume; the previous checkpoint ckpt-rolling.safetensors is intact"
    )


def test_a_snapshot_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    snap = save_checkpoint(tmp_path / "snapshot-000000000001.safetensors", _tensors(), _meta(1))
    monkeypatch.setattr(atomic.os, "write", lambda fd, b: pytest.fail("written"))
    with pytest.raises(CheckpointError) as e:
        save_checkpoint(snap, _tensors(2.0), _meta(2), exclusive=True)
    assert str(e.value) == f"refusing to overwrite {snap}: snapshots are permanent"


def test_the_newest_valid_checkpoint_is_found_past_several_bad_ones(tmp_path):
    save_checkpoint(tmp_path / "snapshot-000000000005.safetensors", _tensors(), _meta(5))
    for name, tick in [("ckpt-rolling.prev.safetensors", 10), ("ckpt-rolling.safetensors", 20)]:
        p = save_checkpoint(tmp_path / name, _tensors(), _meta(tick))
        raw = bytearray(p.read_bytes())
        raw[-3] ^= 0xFF
        p.write_bytes(bytes(raw))
    save_checkpoint(tmp_path / "ckpt-final.safetensors", _tensors(), {"training": {}})
    # (binary garbage: a header length past the file; a text file is refused as text)
    (tmp_path / "snapshot-000000000009.safetensors").write_bytes(b"\xff" * 8 + b"garbage!")
    warnings: list[str] = []
    c = latest_valid_checkpoint(tmp_path, warn=warnings.append)
    assert c is not None and c.meta["training"]["tick"] == 5
    assert sorted(warnings) == sorted(
        [
            f"skipping checkpoint {tmp_path}/ckpt-final.safetensors: no training tick in its "
            "metadata",
            f"skipping checkpoint {tmp_path}/snapshot-000000000009.safetensors: not a readable "
            f"checkpoint ({_safetensors_error(tmp_path / 'snapshot-000000000009.safetensors')})",
            f"skipping checkpoint {tmp_path}/ckpt-rolling.safetensors: checksum mismatch (the "
            "file is corrupt)",
            f"skipping checkpoint {tmp_path}/ckpt-rolling.prev.safetensors: checksum mismatch "
            "(the file is corrupt)",
        ]
    )


def _safetensors_error(path) -> str:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt"):
            pass
    except (SafetensorError, OSError, ValueError) as e:
        return str(e)
    raise AssertionError("expected an error")


def test_a_folder_and_an_unreadable_file_are_named(tmp_path, monkeypatch):
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path)
    assert str(e.value) == (
        f"{tmp_path} is a folder: give a checkpoint file, or use latest_valid_checkpoint()"
    )
    p = save_checkpoint(tmp_path / "a.safetensors", _tensors(), _meta(1))
    monkeypatch.setattr(
        type(p), "read_bytes", lambda self: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error"))
    )
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(p)
    assert str(e.value) == f"{p}: cannot read (I/O error)"


def test_a_loaded_checkpoint_knows_its_path_and_checksum(tmp_path):
    p = save_checkpoint(tmp_path / "a.safetensors", _tensors(), _meta(1))
    c = load_checkpoint(p)
    meta_json = json.dumps(_meta(1), sort_keys=True)
    assert c.path == p and c.sha256 == ck.payload_digest(meta_json, _tensors())
    assert len(c.sha256) == 64 and int(c.sha256, 16) >= 0


def test_the_smallest_export_is_named_too(tmp_path):
    one = tmp_path / "one.bin"
    one.write_bytes((3).to_bytes(4, "little") + (1).to_bytes(4, "little") + bytes(12))
    with pytest.raises(CheckpointError, match=r"one.bin is an export"):
        load_checkpoint(one)


def test_metadata_of_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError) as e:
        read_metadata(tmp_path / "gone.safetensors")
    assert str(e.value).startswith(f"{tmp_path}/gone.safetensors: not a readable checkpoint (")


def test_a_snapshot_that_appears_during_the_write_is_not_overwritten(tmp_path, monkeypatch):
    """The check before writing is not the only guard: a snapshot created by someone else
    while ours is being written is kept (the new file takes the name only if it is free)."""
    snap = tmp_path / "snapshot-000000000001.safetensors"
    real_fsync = os.fsync

    def someone_else_writes_it(fd):
        if not snap.exists():
            snap.write_bytes(b"theirs")
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", someone_else_writes_it)
    with pytest.raises(CheckpointError) as e:
        save_checkpoint(snap, _tensors(), _meta(1), exclusive=True)
    assert str(e.value) == f"refusing to overwrite {snap}: snapshots are permanent"
    assert snap.read_bytes() == b"theirs" and os.listdir(tmp_path) == [snap.name]


def test_a_file_without_a_tick_is_skipped_and_the_search_goes_on(tmp_path, monkeypatch):
    no_tick = save_checkpoint(tmp_path / "ckpt-final.safetensors", _tensors(), {"training": {}})
    good = save_checkpoint(tmp_path / "ckpt-rolling.safetensors", _tensors(), _meta(4))
    monkeypatch.setattr(ck, "list_checkpoints", lambda d: [no_tick, good])  # this order
    c = latest_valid_checkpoint(tmp_path, warn=lambda m: None)
    assert c is not None and c.path == good


def test_an_unreadable_file_is_skipped_and_the_search_goes_on(tmp_path, monkeypatch):
    bad = tmp_path / "ckpt-final.safetensors"
    bad.write_bytes(b"not a checkpoint at all")
    good = save_checkpoint(tmp_path / "ckpt-rolling.safetensors", _tensors(), _meta(4))
    monkeypatch.setattr(ck, "list_checkpoints", lambda d: [bad, good])  # this order
    c = latest_valid_checkpoint(tmp_path, warn=lambda m: None)
    assert c is not None and c.path == good
