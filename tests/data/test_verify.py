"""`atomdata-rs verify`: passes on the real loader, fails loudly on a mismatch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from atom_train.data import verify
from atom_train.data.atomizer import Atomizer


def test_generated_bytes_both_modes(capsys):
    assert verify.main(["verify", "--bytes", "4000", "-B", "5", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "B = 5 (1 just before the wrap, 4 just before shard seams, 0 random), 800 ticks" in out
    assert "utf8: 4000 positions" in out and "plain: 4000 positions" in out
    assert out.strip().endswith("OK")


def test_generated_bytes_cover_every_byte_value_and_bad_utf8(tmp_path):
    paths = verify.generated_shards(str(tmp_path), seed=0)
    shards = [Path(p).read_bytes() for p in paths]
    data = b"".join(shards)
    assert set(data) == set(range(256))
    for needle in (b"\xc0\xaf", b"\xe0\x80\xaf", b" " * 200, b"\xc3a"):
        assert needle in data
    assert min(len(s) for s in shards) == 0 and 1 in [len(s) for s in shards]


def test_a_corpus_given_with_data(write_shards, capsys):
    pattern = write_shards(["Élève. ".encode() * 100, b"", b"x"])
    assert verify.main(["verify", "--data", pattern, "--bytes", "900", "-B", "3"]) == 0
    out = capsys.readouterr().out
    assert "3 shards, 901 bytes" in out and "utf8: 900 positions" in out


def test_a_mismatch_is_reported_with_stream_position_dim_and_values(monkeypatch, capsys):
    class WrongAtomizer(Atomizer):
        """The oracle with one feature flipped on the 30th byte of each stream."""

        def __init__(self, pack_mode="utf8"):
            super().__init__(pack_mode)
            self.n = 0

        def push(self, b):
            x = super().push(b)
            self.n += 1
            if self.n == 64 + 30:  # after the 64 warm-up bytes
                x = x.copy()
                x[311] = 1.0 - x[311]
            return x

    monkeypatch.setattr(verify, "Atomizer", WrongAtomizer)
    assert verify.main(["verify", "--bytes", "200", "-B", "2", "--pack-mode", "plain"]) == 1
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("MISMATCH (plain, dense path): stream 0, tick 29, corpus position ")
    assert "dim 311: rust" in line and "oracle" in line


def test_first_mismatch_picks_the_earliest_tick():
    rust = (
        np.zeros((3, 2), np.uint8),
        np.zeros((3, 2, 320), np.float32),
        np.zeros((3, 2), np.uint8),
    )
    oracle = tuple(a.copy() for a in rust)
    oracle[1][2, 0, 5] = 1.0
    oracle[2][1, 1] = 7
    m = verify.first_mismatch(rust, oracle, [10, 20], 100, 1000, "utf8", "ids")
    assert (m.stream, m.tick, m.position, m.what, m.rust, m.oracle) == (1, 101, 21, "tgt", 0, 7)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["verify", "--data", "nothing/*.bin"], "no file matches 'nothing/*.bin'"),
        (["verify", "--bytes", "0"], "--bytes must be >= 1, got 0"),
        (["verify", "-B", "0"], "-B must be >= 1, got 0"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(args, message, capsys):
    assert verify.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("[atomdata-rs] error: ") and message in err
    assert len(err.splitlines()) == 1


def test_argparse_mistakes_exit_2(capsys):
    for args, message in (
        (["verify", "--pack-mode", "bytes"], "invalid choice: 'bytes'"),
        ([], "the following arguments are required: COMMAND"),
        (["verify", "--pack-mod", "utf8"], "(did you mean --pack-mode?)"),
    ):
        assert verify.main(args) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("[atomdata-rs] error: ") and message in line


def test_runs_as_a_command():
    proc = subprocess.run(
        [sys.executable, "-m", "atom_train.data.verify", "verify", "--bytes", "500", "-B", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("OK")
