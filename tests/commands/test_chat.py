"""CPU chat (`python -m atom_train.chat`): loading every checkpoint kind, reproducible replies,
clean refusals, UTF-8-safe streaming, and the interactive loop over a pipe.

The checkpoints come from a tiny run of the real trainer (built once per session).
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO
from safetensors.torch import save as st_save

from atom_train.chat import Printer, Utf8Streamer, displayable, load_model, main
from atom_train.data.atomizer import Atomizer
from atom_train.model.sampling import generate, sample_byte
from atom_train.trainer.checkpoint_file import load_checkpoint, save_checkpoint

PROG_ERROR = "[chat] error:"
CORPUS = (
    "Bonjour, ça va ? Très bien, merci. Le café est prêt : il coûte 2 € l'été.\n"
    "Où est la bibliothèque ? À gauche, après l'église. 😀\n"
) * 20


def run_chat(*args: str, stdin: bytes | None = None, env: dict | None = None):
    return subprocess.run(
        [sys.executable, "-m", "atom_train.chat", *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    """A finished tiny training run: rolling (tick 32), snapshots 32 and 64, final (64)."""
    root = tmp_path_factory.mktemp("chatrun")
    (root / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    out = root / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "atom_train.train",
            "--data",
            str(root / "corpus.txt"),
            "-B",
            "4",
            "--total-ticks",
            "64",
            "--ckpt-every",
            "32",
            "--snapshot-every",
            "32",
            "--n-modes",
            "8",
            "--threads",
            "1",
            "--loader-threads",
            "1",
            "--output-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert r.returncode == 0, f"the trainer failed:\n{r.stdout}\n{r.stderr}"
    return out


@pytest.fixture(scope="session")
def ckpts(run_dir: Path) -> dict[str, Path]:
    files = {
        "rolling": run_dir / "ckpt-rolling.safetensors",
        "snapshot": sorted(run_dir.glob("snapshot-*.safetensors"))[0],
        "final": run_dir / "ckpt-final.safetensors",
    }
    for kind, path in files.items():
        assert load_checkpoint(path).meta["kind"] == kind
    return files


@pytest.fixture
def one_thread():
    """The chat command runs torch on one thread; in-process comparisons do the same."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def expected_stdout(reply: bytes) -> str:
    text = displayable(reply.decode("utf-8", errors="replace"))
    return text if text.endswith("\n") else text + "\n"


# ---- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["rolling", "snapshot", "final"])
def test_each_checkpoint_kind_loads_and_chats(ckpts, kind, one_thread):
    path = ckpts[kind]
    flags = ["--max-bytes", "24", "--temperature", "0.9", "--top-k", "30", "--seed", "11"]
    r = run_chat("--checkpoint", str(path), "--prompt", "Bonjour", *flags)
    assert r.returncode == 0, r.stderr.decode()
    assert b"Traceback" not in r.stderr
    assert f"({kind}, tick" in r.stderr.decode()
    # What the command prints is exactly the model's reply, as the library samples it.
    model, _ = load_model(path)
    reply = generate(model, b"Bonjour", 24, temperature=0.9, top_k=30, seed=11)
    assert len(reply) == 24
    assert r.stdout.decode("utf-8") == expected_stdout(reply)


def test_load_model_gives_the_saved_weights_on_cpu(ckpts):
    ck = load_checkpoint(ckpts["final"])
    model, meta = load_model(ckpts["final"])
    assert meta["path"] == str(ckpts["final"]) and meta["kind"] == "final"
    assert not model.training
    for name, t in model.state_dict().items():
        assert t.device.type == "cpu" and t.dtype == torch.float32
        assert torch.equal(t, ck.tensors[f"model/{name}"]), name


def test_checkpoint_recording_a_cuda_device_loads_on_cpu(ckpts, tmp_path):
    # The metadata of a CUDA run says device "cuda:0"; loading must not act on it (the tensors
    # are CPU tensors in the file whatever trained them). A real CUDA-trained checkpoint is
    # chatted with in tests/scenarios/test_cuda.py (skipped without a GPU).
    ck = load_checkpoint(ckpts["final"])
    meta = json.loads(json.dumps(ck.meta))
    meta["training"]["device"] = "cuda:0"
    path = save_checkpoint(tmp_path / "ckpt-final.safetensors", ck.tensors, meta)
    model, meta = load_model(path)
    assert meta["training"]["device"] == "cuda:0"
    assert all(t.device.type == "cpu" for t in model.state_dict().values())
    assert len(generate(model, b"Bonjour", 8, seed=0)) == 8


def test_run_folder_means_its_newest_valid_checkpoint(run_dir, tmp_path):
    _, meta = load_model(run_dir)
    assert meta["training"]["tick"] == 64
    # Truncate every tick-64 checkpoint: the folder falls back to a valid tick-32 one, warning.
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    newest = []
    for p in copy.glob("*.safetensors"):
        if load_checkpoint(p).meta["training"]["tick"] == 64:
            p.write_bytes(p.read_bytes()[:1000])
            newest.append(p.name)
    assert newest
    warnings: list[str] = []
    _, meta = load_model(copy, warn=warnings.append)
    assert meta["training"]["tick"] == 32
    assert Path(meta["path"]).name not in newest
    assert sorted(n for n in newest if any(n in w for w in warnings)) == sorted(newest)


# ---- reproducibility -------------------------------------------------------------------------


def test_same_seed_same_reply_other_seed_other_reply(ckpts):
    args = ["--checkpoint", str(ckpts["final"]), "--prompt", "Le café", "--max-bytes", "40"]
    a = run_chat(*args, "--seed", "5")
    b = run_chat(*args, "--seed", "5")
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout and len(a.stdout) > 0
    model, _ = load_model(ckpts["final"])
    five = generate(model, "Le café".encode(), 40, seed=5)
    six = generate(model, "Le café".encode(), 40, seed=6)
    assert five == generate(model, "Le café".encode(), 40, seed=5)
    assert five != six  # 40 bytes from a barely trained model: equal only by a fluke


def test_an_unseeded_reply_can_be_repeated_with_its_reported_seed(ckpts, capsys, one_thread):
    args = ["--checkpoint", str(ckpts["final"]), "--prompt", "Bonjour", "--max-bytes", "12"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    seed = int(err.rsplit("; seed ", 1)[1].split()[0])
    assert main([*args, "--seed", str(seed)]) == 0
    again, err = capsys.readouterr()
    assert f"; seed {seed}" in err
    assert again == out and len(out) > 1


# ---- refusals --------------------------------------------------------------------------------


def _rewrite(src: Path, dst: Path, edit) -> Path:
    ck = load_checkpoint(src)
    meta = json.loads(json.dumps(ck.meta))
    edit(meta)
    return save_checkpoint(dst, ck.tensors, meta)


def _bad_checkpoint(case: str, ckpts, tmp: Path) -> Path:
    final = ckpts["final"]
    if case == "missing file":
        return tmp / "nope.safetensors"
    if case == "folder without checkpoint":
        (tmp / "empty").mkdir()
        (tmp / "empty" / "notes.txt").write_text("no checkpoints here")
        return tmp / "empty"
    if case == "folder with only a corrupt checkpoint":
        (tmp / "run").mkdir()
        (tmp / "run" / "ckpt-rolling.safetensors").write_bytes(final.read_bytes()[:5000])
        return tmp / "run"
    if case == "truncated file":
        p = tmp / "t.safetensors"
        p.write_bytes(final.read_bytes()[:-1000])
        return p
    if case == "flipped byte":
        data = bytearray(final.read_bytes())
        data[-100] ^= 0x01  # inside the tensor payload: only the checksum can see it
        p = tmp / "f.safetensors"
        p.write_bytes(bytes(data))
        return p
    if case == "text file":
        p = tmp / "notes.safetensors"
        p.write_text("Bonjour, ceci n'est pas un checkpoint.\n" * 10)
        return p
    if case == "foreign safetensors":
        p = tmp / "other.safetensors"
        p.write_bytes(st_save({"w": torch.zeros(3)}, metadata={"format": "pt"}))
        return p
    if case == "newer format version":
        from atom_train.trainer.checkpoint_file import FORMAT_VERSION

        p = tmp / "newer.safetensors"
        newer = {"format": "atom.checkpoint", "format_version": str(FORMAT_VERSION + 1)}
        p.write_bytes(st_save({"w": torch.zeros(3)}, metadata=newer))
        return p

    def set_prov(key, value):
        def edit(meta):
            meta["provenance"][key] = value
            meta["model_config"][key] = value

        return edit

    if case == "unknown pack mode":
        return _rewrite(final, tmp / "pm.safetensors", set_prov("pack_mode", "utf16"))
    if case == "unknown feature version":
        return _rewrite(final, tmp / "fv.safetensors", set_prov("feature_version", 2))
    if case == "no provenance":
        return _rewrite(final, tmp / "np.safetensors", lambda m: m.pop("provenance"))
    raise AssertionError(case)


REFUSALS = {
    "missing file": "no such checkpoint file",
    "folder without checkpoint": "holds no valid checkpoint",
    "folder with only a corrupt checkpoint": "holds no valid checkpoint",
    "truncated file": "truncated or corrupt",
    "flipped byte": "checksum mismatch",
    "text file": "is a text file, not a checkpoint",
    "foreign safetensors": "not an atom checkpoint",
    "newer format version": "upgrade atom",
    "unknown pack mode": "pack mode 'utf16'; this atom knows utf8, plain",
    "unknown feature version": "features version 2; this atom computes version 1: upgrade atom",
    "no provenance": "refusing to guess",
}


def assert_one_error_line(rc: int, out: str, err: str, expect: str) -> None:
    assert rc == 2
    assert "Traceback" not in err and out == ""
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    assert errors[0].startswith(PROG_ERROR) and expect in errors[0], err
    others = [line for line in err.splitlines() if "error:" not in line]
    assert len(err.splitlines()) <= 2, err
    assert all(line.startswith("[chat] warning:") for line in others), err


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refuses_bad_checkpoints_with_one_clear_line(case, ckpts, tmp_path, capsys):
    path = _bad_checkpoint(case, ckpts, tmp_path)
    rc = main(["--checkpoint", str(path), "--prompt", "Bonjour", "--seed", "0"])
    out, err = capsys.readouterr()
    assert_one_error_line(rc, out, err, REFUSALS[case])
    if case == "folder with only a corrupt checkpoint":
        assert "warning: skipping checkpoint" in err


@pytest.mark.parametrize(
    ("flags", "expect"),
    [
        (["--temperature", "-1"], "--temperature must be >= 0"),
        (["--temperature", "nan"], "--temperature must be >= 0"),
        (["--temperature", "warm"], "argument --temperature: invalid float value"),
        (["--top-k", "-3"], "--top-k must be >= 0"),
        (["--max-bytes", "0"], "--max-bytes must be at least 1"),
        (["--seed", "-4"], "--seed must be in"),
        (["--stop", "period"], "argument --stop: invalid choice"),
    ],
)
def test_refuses_bad_flags_with_one_clear_line(flags, expect, ckpts, capsys):
    rc = main(["--checkpoint", str(ckpts["final"]), "--prompt", "x", *flags])
    out, err = capsys.readouterr()
    assert_one_error_line(rc, out, err, expect)


def test_refusal_from_the_command_line_has_no_traceback(ckpts, tmp_path):
    path = _bad_checkpoint("unknown pack mode", ckpts, tmp_path)
    r = run_chat("--checkpoint", str(path), "--prompt", "Bonjour")
    assert_one_error_line(r.returncode, r.stdout.decode(), r.stderr.decode(), "pack mode 'utf16'")


# ---- UTF-8 streaming -------------------------------------------------------------------------


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_streamer_emits_a_character_only_when_complete(char):
    s = Utf8Streamer()
    data = char.encode()
    pieces = [s.push(b) for b in data]
    assert pieces == [""] * (len(data) - 1) + [char]
    assert s.flush() == ""


def test_streamer_replaces_invalid_and_truncated_bytes():
    s = Utf8Streamer()
    pieces = [s.push(b) for b in b"a\xff\xe2\x82Z\xc3"]
    assert "".join(pieces) == "a\ufffd\ufffdZ"
    assert s.flush() == "\ufffd"  # the dangling lead byte of a cut reply


def test_streamer_matches_the_whole_string_decode_on_random_bytes():
    rng = random.Random(0)
    alphabet = [*"aé€😀\n".encode(), 0x80, 0xBF, 0xC0, 0xE2, 0xF0, 0xF5, 0xFF]
    for _ in range(200):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        s = Utf8Streamer()
        pieces = [s.push(b) for b in data] + [s.flush()]
        for p in pieces:
            p.encode("utf-8")  # strict: no lone surrogate, i.e. never half a character
        assert "".join(pieces) == data.decode("utf-8", errors="replace")


class _Recorder:
    """A text stream whose binary layer records every chunk written to it."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.chunks: list[bytes] = []
        self.buffer = self

    def write(self, data):
        self.chunks.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass


def test_printer_writes_whole_characters_as_they_complete():
    rec = _Recorder("utf-8")
    printer = Printer(rec)  # type: ignore[arg-type]
    for b in "é€😀".encode() + b"\xff" + b"a\x1b" + b"\xf0\x9f":
        printer.push(b)
    printer.finish()
    assert [c.decode("utf-8") for c in rec.chunks] == ["é", "€", "😀", "\ufffd", "a", "␛", "\ufffd"]


def test_printer_survives_a_non_utf8_terminal():
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    printer = Printer(stream)
    for b in "Très €!".encode():
        printer.push(b)
    printer.finish()
    assert raw.getvalue() == b"Tr?s ?!"


def test_control_characters_are_shown_not_obeyed():
    assert displayable("a\tb\nc\x1b[2Jd\re\x7f\x85") == "a\tb\nc␛[2Jd␍e␡\ufffd"


# ---- interactive mode ------------------------------------------------------------------------


def replay_conversation(
    model, lines: list[bytes], max_bytes: int, seed: int, fresh_turns: bool = False
) -> list[bytes]:
    """The chat as one continuous text, written out with the model API: each line + newline is
    fed, a reply is sampled (top-k 40, T 0.8) to a newline or max_bytes, closed by a newline.
    fresh_turns: start each turn from the reset state instead (independent completions)."""
    gen, logits = torch.Generator().manual_seed(seed), None

    def feed(b: int):
        nonlocal tick, logits
        model.apply_schedule(state, tick)
        logits = model.tick(state, torch.from_numpy(atomizer.push(b))).logits
        tick += 1

    replies = []
    with torch.no_grad():
        for i, line in enumerate(lines):
            if i == 0 or fresh_turns:
                atomizer, state, tick = Atomizer(model.config.pack_mode), model.new_state(), 0
            for b in line + b"\n":
                feed(b)
            reply = bytearray()
            while len(reply) < max_bytes and not reply.endswith(b"\n"):
                reply.append(sample_byte(logits, 0.8, 40, gen))
                feed(reply[-1])
            if not reply.endswith(b"\n"):
                feed(ord("\n"))
            replies.append(bytes(reply))
    return replies


def test_interactive_chat_over_a_pipe_is_one_conversation(ckpts, one_thread):
    stdin = "Bonjour\n\nÇa va ?\r\n/quit\nnever read\n".encode()
    r = run_chat(
        "--checkpoint", str(ckpts["final"]), "--seed", "3", "--max-bytes", "16", stdin=stdin
    )
    assert r.returncode == 0, r.stderr.decode()
    assert b"Traceback" not in r.stderr and b"> " not in r.stdout + r.stderr  # not a terminal
    model, _ = load_model(ckpts["final"])
    # Two turns (the empty line is skipped, /quit ends), each reply continuing the same text.
    replies = replay_conversation(model, [b"Bonjour", "Ça va ?".encode()], 16, seed=3)
    assert r.stdout.decode("utf-8") == "".join(expected_stdout(x) for x in replies)
    # Had each turn started from a fresh stream, the second reply would differ.
    fresh = replay_conversation(model, [b"Bonjour", "Ça va ?".encode()], 16, 3, fresh_turns=True)
    assert fresh[0] == replies[0] and fresh[1] != replies[1]
