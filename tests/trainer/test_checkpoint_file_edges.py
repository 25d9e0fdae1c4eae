"""The checkpoint file's edges (`atom_train.trainer.checkpoint_file`): what a file that is
not a checkpoint is named as, from its head only (a text file, an export, neither), at the
bounds of the sniffing."""

from __future__ import annotations

import struct

import pytest

from atom_train.trainer.checkpoint_file import (
    HEAD_BYTES,
    CheckpointError,
    load_checkpoint,
    read_metadata,
)


def _refusal(read, path) -> str:
    with pytest.raises(CheckpointError) as e:
        read(path)
    return str(e.value)


@pytest.mark.parametrize("read", [read_metadata, load_checkpoint])
def test_a_byte_that_is_not_utf8_inside_the_head_is_not_text(tmp_path, read):
    """Only a character cut at the head's very end (its last 3 bytes) is forgiven: an
    invalid byte before them, near the start or 4 bytes from the end, makes it binary."""
    p = tmp_path / "notes.safetensors"
    for head in (
        b"abc\xff" + b"x" * (HEAD_BYTES - 4),  # near the start
        b"a" * (HEAD_BYTES - 4) + b"\xffbcd",  # 4 bytes from the end
    ):
        p.write_bytes(head + b"y" * 100)
        assert "text file" not in _refusal(read, p)
    # A 3-byte character cut after its first 2 bytes at the head's end: text.
    p.write_bytes(b"a" * (HEAD_BYTES - 2) + "€ and more".encode())
    assert _refusal(read, p).startswith(f"{p} is a text file, not a checkpoint")


def test_only_the_head_of_a_file_is_sniffed_for_text(tmp_path):
    """read_metadata reads a file's first HEAD_BYTES to name it, not the whole file: text at
    its head with binary after it is named a text file."""
    p = tmp_path / "log.safetensors"
    p.write_bytes(b"step 1 loss 2.5\n" * 8 + b"\x00\x01" * 100)
    assert _refusal(read_metadata, p).startswith(f"{p} is a text file, not a checkpoint")


def _export(step: int, n: int, values: list[float] | None = None) -> bytes:
    values = values if values is not None else [1.5 + i for i in range(3 * n)]
    return struct.pack("<ii", step, n) + struct.pack(f"<{3 * n}f", *values)


@pytest.mark.parametrize("read", [read_metadata, load_checkpoint])
def test_an_export_with_real_weights_is_named_as_one(tmp_path, read):
    """The count is bytes 4-8 exactly (the weights after it are not zero in a real export)."""
    p = tmp_path / "w.bin"
    p.write_bytes(_export(7, 5))
    assert _refusal(read, p).startswith(f"{p} is an export (raw weights + AdamW moments")


def test_a_negative_count_is_not_an_export_whatever_the_size(tmp_path):
    """int32 n = -1 read unsigned is 2**32 - 1: a (sparse) file of the size such an export
    would have is still not named an export."""
    p = tmp_path / "neg.bin"
    with open(p, "wb") as f:
        f.write(struct.pack("<ii", 7, -1) + bytes(HEAD_BYTES - 8))
        f.truncate(8 + 12 * (2**32 - 1))
    try:
        said = _refusal(read_metadata, p)
    finally:
        p.unlink()
    assert said.startswith(f"{p}: not a readable checkpoint (") and "export" not in said
