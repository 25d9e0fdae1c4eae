"""The corpus builder end to end: a generated mixed input, the properties the output must
have, determinism, resumption after a kill, refusals and bad inputs.

Every document the generator writes is a line of words without a blank line, so the output
splits back into documents at the seams and each one can be traced to what was injected.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import json
import lzma
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO
from helpers.unprivileged import can_drop_privileges, run_unprivileged

from atom_train.common.cli import UserError
from atom_train.corpus import build as corpus_build
from atom_train.corpus import inputs as corpus_inputs
from atom_train.corpus.build import BuildOptions, build
from atom_train.corpus.command import main
from atom_train.corpus.manifest import MANIFEST_NAME, open_corpus_dir
from atom_train.trainer.train_state import run_config_of

_VOCABULARY = (
    "le la les un une des et est dans pour avec sur maison rue fenêtre été où déjà élève "
    "naïve cœur the of and to"
)
WORDS = _VOCABULARY.split()
SHARD = 6000  # a small shard budget, so a few KB make several shards
BIG = 3 * SHARD  # the one document larger than a shard


def _doc(rng: random.Random, i: int, n_words: int | None = None) -> str:
    n = n_words or rng.randint(8, 90)
    return f"doc{i:05d} " + " ".join(rng.choice(WORDS) for _ in range(n)) + "."


def make_mixed_input(root: Path, seed: int = 0) -> dict:
    """Plain text (one document per file), .gz, .xz, .bz2, JSONL (plain and .gz), with exact
    duplicates across formats, invalid UTF-8 and one document larger than a shard.
    Returns what a correct build must produce: the distinct documents and the duplicates."""
    rng = random.Random(seed)
    root.mkdir(parents=True)
    docs: list[str] = []  # every document written, duplicates included, as cleaned
    i = 0

    def new() -> str:
        nonlocal i
        i += 1
        return _doc(rng, i)

    for k in range(12):
        d = new()
        (root / "plain" / f"{k:02d}.txt").parent.mkdir(exist_ok=True)
        (root / "plain" / f"{k:02d}.txt").write_text(d + "\n")
        docs.append(d)
    for k, (suffix, opener) in enumerate(
        [(".gz", gzip.open), (".xz", lzma.open), (".bz2", bz2.open)] * 3
    ):
        d = new()
        with opener(root / f"packed-{k}.txt{suffix}", "wb") as f:
            f.write(d.encode() + b"\r\n")  # CRLF: the newline step removes it with the rest
        docs.append(d)
    records = [new() for _ in range(150)]
    with (root / "records.jsonl").open("w") as f:
        for r in records[:100]:
            f.write(json.dumps({"id": 1, "text": r}, ensure_ascii=False) + "\n")
    with gzip.open(root / "more.jsonl.gz", "wt") as f:
        for r in records[100:]:
            f.write(json.dumps({"text": r}) + "\n")
    docs += records
    # Injected duplicates: a JSONL record again as a plain file, a plain file again as a
    # .gz, and a record twice in another JSONL file.
    dups = [records[3], docs[0], records[120], records[120]]
    (root / "plain" / "dup-a.txt").write_text(dups[0])
    with gzip.open(root / "dup-b.txt.gz", "wt") as f:
        f.write(dups[1])
    with (root / "dups.jsonl").open("w") as f:
        f.write(json.dumps({"text": dups[2]}) + "\n" + json.dumps({"text": dups[3]}) + "\n")
    # Invalid UTF-8: replaced by U+FFFD by default.
    (root / "latin1.txt").write_bytes(b"doc-latin1 caf\xe9 cr\xe8me " + b"mot " * 20)
    docs.append("doc-latin1 caf\ufffd cr\ufffdme " + "mot " * 19 + "mot")
    big = _doc(rng, 99999, n_words=BIG // 5)
    assert len(big.encode()) > SHARD
    (root / "big.txt").write_text(big)
    docs.append(big)
    return {"distinct": set(docs), "duplicates": len(dups), "big": big}


def documents_of(out: Path, man: dict) -> tuple[list[str], list[str]]:
    """(train documents, val documents) read back from the files at the seams."""

    def read(entries):
        found = []
        for e in entries:
            data = (out / e["file"]).read_text("utf-8")
            assert data.endswith("\n\n") and not data.endswith("\n\n\n")
            parts = data[:-2].split("\n\n")
            assert len(parts) == e["documents"]
            found += parts
        return found

    return read(man["train"]), read([man["val"]] if man["val"] else [])


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


OPTIONS = BuildOptions(shard_bytes=SHARD, val_fraction=0.1)


@dataclass
class Mixed:
    """The generated input (root/in), what it must give, and its build (out, manifest)."""

    root: Path
    expected: dict
    out: Path
    man: dict


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Mixed:
    root = tmp_path_factory.mktemp("mixed")
    expected = make_mixed_input(root / "in")
    out = root / "out"
    result = build(out, [str(root / "in")], OPTIONS, workers=1, log=lambda m: None)
    return Mixed(root, expected, out, result.manifest)


def test_every_kept_document_once_and_val_disjoint(mixed):
    train, val = documents_of(mixed.out, mixed.man)
    assert sorted(train + val) == sorted(mixed.expected["distinct"])  # each exactly once
    assert set(train).isdisjoint(val) and len(set(train)) == len(train)
    c = mixed.man["counts"]
    assert c["duplicates"] == mixed.expected["duplicates"]
    assert c["documents_read"] == len(mixed.expected["distinct"]) + mixed.expected["duplicates"]
    assert c["seams"] == len(train) + len(val) == c["documents_kept"]
    assert c["changed"]["invalid_utf8"] == 1 and c["changed"]["newlines"] >= 9
    # Val is about a tenth of the text, over several documents.
    total = sum(e["bytes"] for e in mixed.man["train"]) + mixed.man["val"]["bytes"]
    assert 0.1 * total <= mixed.man["val"]["bytes"] <= 0.1 * total + SHARD
    assert len(val) >= 4


def test_shards_respect_the_budget_and_the_big_document_is_alone(mixed):
    big_shards = [e for e in mixed.man["train"] if e["bytes"] > SHARD]
    assert len(big_shards) == 1 and big_shards[0]["documents"] == 1
    assert (mixed.out / big_shards[0]["file"]).read_text() == mixed.expected["big"] + "\n\n"
    assert len(mixed.man["train"]) >= 4
    assert [e["file"] for e in mixed.man["train"]] == [
        f"train-{i:03d}.txt" for i in range(len(mixed.man["train"]))
    ]


def test_manifest_records_inputs_options_and_hashes(mixed):
    assert mixed.man["format"] == "atom-corpus" and mixed.man["version"] == 1
    paths = [i["path"] for i in mixed.man["inputs"]]
    assert paths == sorted(paths) and all(Path(p).is_absolute() for p in paths)
    assert all(i["bytes"] == Path(i["path"]).stat().st_size for i in mixed.man["inputs"])
    assert mixed.man["options"]["shard_bytes"] == SHARD
    import hashlib

    for e in [*mixed.man["train"], mixed.man["val"]]:
        assert hashlib.sha256((mixed.out / e["file"]).read_bytes()).hexdigest() == e["sha256"]
    assert not (mixed.out / ".build").exists()


def test_another_input_order_and_grouping_give_identical_output(mixed, tmp_path):
    files = sorted(str(p) for p in (mixed.root / "in").rglob("*") if p.is_file())
    other = tmp_path / "reversed"
    # Reversed order, as files and a glob, through the process pool.
    not_plain = [f for f in files if "/plain/" not in f]
    patterns = [*reversed(not_plain), str(mixed.root / "in" / "plain" / "*.txt"), files[0]]
    build(other, patterns, OPTIONS, workers=2, log=lambda m: None)
    assert snapshot(other) == snapshot(mixed.out)  # the manifest included
    # The same texts in other files (regrouped, renamed): the same shards.
    moved = tmp_path / "moved"
    shutil.copytree(mixed.root / "in", moved / "b")
    for p in sorted((moved / "b" / "plain").iterdir()):
        p.rename(moved / f"z-{p.name}")
    regrouped = tmp_path / "regrouped"
    build(regrouped, [str(moved)], OPTIONS, workers=1, log=lambda m: None)
    a, b = snapshot(mixed.out), snapshot(regrouped)
    assert a.keys() == b.keys()
    assert all(a[k] == b[k] for k in a if k != MANIFEST_NAME)


def test_the_input_files_in_reverse_order_give_identical_shards_and_val(mixed, tmp_path):
    """The output is a function of the documents, not of where they come from: the same
    files renamed so that their path order (the order the builder reads them in) is reversed
    give the same train shards and the same val, byte for byte."""
    files = sorted(p for p in (mixed.root / "in").rglob("*") if p.is_file())
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for i, p in enumerate(files):
        shutil.copyfile(p, renamed / f"{len(files) - 1 - i:03d}-{p.name}")
    order = sorted(renamed.iterdir())
    assert [p.name.split("-", 1)[1] for p in order] == [p.name for p in reversed(files)]
    out = tmp_path / "out"
    build(out, [str(renamed)], OPTIONS, workers=1, log=lambda m: None)
    a, b = snapshot(mixed.out), snapshot(out)
    assert a.keys() == b.keys() and "val.txt" in a
    differ = [k for k in a if k != MANIFEST_NAME and a[k] != b[k]]
    assert not differ, f"another input order changed {differ}"


def test_rerun_is_a_noop_and_other_options_are_refused(mixed, capsys):
    before = snapshot(mixed.out)
    args = [
        str(mixed.root / "in"),
        "--out",
        str(mixed.out),
        "--shard-mb",
        str(SHARD / 1e6),
        "--val-fraction",
        "0.1",
    ]
    assert main(["build", *args, "--workers", "1"]) == 0
    assert "already built" in capsys.readouterr().err
    assert snapshot(mixed.out) == before
    assert main(["build", *args, "--min-chars", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--min-chars 1 -> 5" in err and "--force" in err
    # Each option as its flag reads: the shard budget is --shard-mb, in MB.
    assert main(["build", *args[:-4], "--shard-mb", "0.012", *args[-2:], "--no-dedup"]) == 2
    err = capsys.readouterr().err
    assert f"(--no-dedup added; --shard-mb {SHARD / 1e6:g} -> 0.012)" in err, err
    assert main(["stats", str(mixed.out)]) == 0
    assert "duplicates" in capsys.readouterr().out
    assert main(["check", str(mixed.out)]) == 0


def test_kill_mid_shard_then_rerun_gives_the_same_result(mixed, tmp_path):
    target = tmp_path / "killed"
    marker = tmp_path / "mid-shard"
    # The build runs in a child whose shard writer stops half-way through the second file.
    script = f"""
import sys, time
from atom_train.corpus import build as b
b.WRITE_BUFFER_BYTES = 500
calls, flush = [0], b._flush
def slow(fd, buf, sha):
    calls[0] += 1
    n = flush(fd, buf, sha)
    if calls[0] == 20:
        open({str(marker)!r}, "w").close()
        time.sleep(600)
    return n
b._flush = slow
from atom_train.corpus.command import main
sys.exit(main(sys.argv[1:]))
"""
    args = [str(mixed.root / "in"), "--out", str(target), "--shard-mb", str(SHARD / 1e6),
            "--val-fraction", "0.1", "--workers", "1"]  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", script, "build", *args], cwd=REPO)
    try:
        for _ in range(600):
            if marker.exists() or child.poll() is not None:
                break
            time.sleep(0.05)
        assert marker.exists(), "the build never reached the second shard"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # Nothing finished-looking: no manifest, no shard under its final name.
    assert not (target / MANIFEST_NAME).exists()
    assert not list(target.glob("train-*.txt"))
    with pytest.raises(UserError, match="not a finished corpus"):
        open_corpus_dir(target)
    assert main(["build", *args]) == 0
    assert snapshot(target) == snapshot(mixed.out)


def test_ctrl_c_mid_build_is_one_line_and_a_rerun_resumes(mixed, tmp_path):
    """Ctrl-C (SIGINT to the terminal's whole process group, workers included) while the
    pool is up: one line naming the fix, no traceback from any process, exit 130; the same
    command again resumes and gives the same corpus."""
    target, marker = tmp_path / "interrupted", tmp_path / "pass-1-done"
    # The main process stops after pass 1 (the two workers idle in the pool) until the signal.
    script = f"""
import sys, time
from atom_train.corpus import build as b
def wait(d):
    open({str(marker)!r}, "w").close()
    time.sleep(600)
b._counts_of = wait
from atom_train.corpus.command import main
sys.exit(main(sys.argv[1:]))
"""
    args = [str(mixed.root / "in"), "--out", str(target), "--shard-mb", str(SHARD / 1e6),
            "--val-fraction", "0.1", "--workers", "2"]  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", script, "build", *args], cwd=REPO,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        for _ in range(1200):
            if marker.exists() or child.poll() is not None:
                break
            time.sleep(0.05)
        assert marker.exists(), "the build never finished pass 1"
        os.killpg(child.pid, signal.SIGINT)
        err = child.communicate(timeout=60)[1]
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.splitlines()[-1] == "[corpus] interrupted; rerun the same command to resume"
    assert main(["build", *args]) == 0
    assert snapshot(target) == snapshot(mixed.out)


def test_open_corpus_dir(mixed, tmp_path):
    c = open_corpus_dir(mixed.out)
    assert [p.name for p in c.train] == [e["file"] for e in mixed.man["train"]]
    assert (
        c.val == mixed.out / "val.txt"
        and c.train_bytes + c.val_bytes == mixed.man["counts"]["bytes_written"]
    )
    copy = tmp_path / "copy"
    shutil.copytree(mixed.out, copy)
    with (copy / "train-001.txt").open("ab") as f:
        f.write(b"x")
    with pytest.raises(UserError, match=r"train-001.txt: .* the manifest says .*--force"):
        open_corpus_dir(copy)
    m = json.loads((copy / MANIFEST_NAME).read_text())
    m["version"] = 99
    (copy / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(UserError, match="format version 99"):
        open_corpus_dir(copy)
    (copy / MANIFEST_NAME).unlink()
    with pytest.raises(UserError, match="corpus build"):
        open_corpus_dir(copy)


def test_check_rehashes_and_quick_compares_sizes(mixed, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(mixed.out, copy)
    data = bytearray((copy / "val.txt").read_bytes())
    data[0] ^= 1
    (copy / "val.txt").write_bytes(bytes(data))
    assert main(["check", str(copy), "--quick"]) == 0
    assert main(["check", str(copy)]) == 2
    captured = capsys.readouterr()
    assert "val.txt: content differs" in captured.out and "1 of" in captured.err


# ---- folders --------------------------------------------------------------------------------


def test_a_folder_holding_other_files_is_refused(tmp_path):
    (tmp_path / "in.txt").write_text("un document")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    with pytest.raises(UserError, match="not a corpus folder"):
        build(out, [str(tmp_path / "in.txt")], workers=1, log=lambda m: None)
    with pytest.raises(UserError, match="not a corpus folder"):
        build(out, [str(tmp_path / "in.txt")], force=True, workers=1, log=lambda m: None)
    assert (out / "notes.md").read_text() == "mine"
    # Shard-like files with no manifest and no build state: not provably ours either.
    (out / "notes.md").unlink()
    (out / "train-000.txt").write_text("my own shard")
    with pytest.raises(UserError, match=r"train-000\.txt but no manifest\.json"):
        build(out, [str(tmp_path / "in.txt")], force=True, workers=1, log=lambda m: None)
    assert (out / "train-000.txt").read_text() == "my own shard"


def test_force_replaces_and_inputs_inside_the_output_are_ignored(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for k in range(6):
        (src / f"{k}.txt").write_text(f"document {k} " * 30)
    out = src / "corpus"  # inside the input folder: its shards must not become inputs
    opts = BuildOptions(val_fraction=0.2)
    m1 = build(out, [str(src)], opts, workers=1, log=lambda m: None).manifest
    (src / "6.txt").write_text("document 6 " * 30)
    with pytest.raises(UserError, match=r"the inputs \(1 added, 0 removed, 0 changed\).*--force"):
        build(out, [str(src)], opts, workers=1, log=lambda m: None)
    m2 = build(out, [str(src)], opts, force=True, workers=1, log=lambda m: None).manifest
    assert len(m2["inputs"]) == len(m1["inputs"]) + 1 == 7
    assert m2["counts"]["documents_read"] == 7


# ---- cleaning and splitting options -----------------------------------------------------------


def test_blank_line_documents_language_min_chars_and_separator(tmp_path):
    text = (
        "\n\nLe premier paragraphe est dans une maison avec la rue.\n  indenté\n\n \n"
        "The second paragraph is in English and it is not kept by the filter.\n\n"
        "Court.\n\n\nLe troisième est aussi en français, pour la suite des tests.   \n"
    )
    (tmp_path / "a.txt").write_text(text)
    opts = BuildOptions(split_on="blank-lines", language=("fr",), min_chars=10, val_fraction=0.0,
                        separator="\x04\n")  # fmt: skip
    man = build(
        tmp_path / "out", [str(tmp_path / "a.txt")], opts, workers=1, log=lambda m: None
    ).manifest
    data = (tmp_path / "out" / "train-000.txt").read_text()
    docs = data.split("\x04\n")[:-1]
    assert sorted(docs) == sorted([
        "Le premier paragraphe est dans une maison avec la rue.\n  indenté",
        "Le troisième est aussi en français, pour la suite des tests.",
    ])  # fmt: skip
    assert man["counts"]["dropped"]["language"] == 1
    # What the identifier said of each document it judged (the one too short never was).
    assert man["counts"]["language"]["detected"] == {"fr": 2, "en": 1}
    assert sum(man["counts"]["language"]["confidence"].values()) == 3
    assert man["counts"]["dropped"]["too_short"] == 1
    assert man["val"] is None


def test_invalid_utf8_drop_and_cp1252(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"caf\xe9 au lait, deux fois " * 4)
    (tmp_path / "b.txt").write_text("un texte valide et assez long pour rester. " * 4)
    inputs = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    opts = BuildOptions(invalid_utf8="drop", val_fraction=0.0)
    man = build(tmp_path / "drop", inputs, opts, workers=1, log=lambda m: None).manifest
    assert man["counts"]["dropped"]["invalid_utf8"] == 1 and man["counts"]["train_documents"] == 1
    opts = BuildOptions(invalid_utf8="cp1252", val_fraction=0.0)
    build(tmp_path / "cp", inputs, opts, workers=1, log=lambda m: None)
    assert "café au lait" in (tmp_path / "cp" / "train-000.txt").read_text()


def test_a_document_longer_than_a_piece_is_cleaned_as_a_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_inputs, "PIECE_BYTES", 64)
    line = "e\u0301t\u00e9\r\n" + "x" * 150 + "\x07\n\n  \n"  # a line longer than a piece
    text = "\n\n" + line * 30 + "   \n\n"
    (tmp_path / "a.txt").write_bytes(text.encode())
    opts = BuildOptions(val_fraction=0.0)
    build(tmp_path / "out", [str(tmp_path / "a.txt")], opts, workers=1, log=lambda m: None)
    expected = ("\u00e9t\u00e9\n" + "x" * 150 + "\n\n  \n") * 30
    assert (tmp_path / "out" / "train-000.txt").read_text() == expected.rstrip() + "\n\n"


# ---- bad inputs -----------------------------------------------------------------------------


def _run_cli(args, capsys) -> tuple[int, str]:
    rc = main(["build", *args, "--workers", "1"])
    return rc, capsys.readouterr().err.strip()


def test_no_file_matched(tmp_path, capsys):
    rc, err = _run_cli([str(tmp_path / "nothing-*.txt"), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "no file matches" in err and "nothing-*.txt" in err


def _truncated_gzip() -> bytes:
    rng = random.Random(1)
    data = gzip.compress(" ".join(rng.choice(WORDS) for _ in range(5000)).encode())
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.jsonl", b'{"text": "ok"}\n{"text": "ok too"}\n{not json\n', r"bad.jsonl: line 3: not JSON \(Expecting property name enclosed in double quotes at column 2\)$"),
        # (a raw tab in a string: the decoder's own message ends in "at", its place apart)
        ("ctrl.jsonl", b'{"text": "ok"}\n{"text": "a\tb"}\n', r"ctrl.jsonl: line 2: not JSON \(Invalid control character at column 12\)$"),
        ("field.jsonl", b'{"text": "ok"}\n{"body": "x"}\n', r"field.jsonl: line 2: no field 'text' \(fields: body\); set --text-field"),
        ("cut.txt.gz", _truncated_gzip(), r"cut.txt.gz: after [\d,]+ bytes: corrupt gzip data"),
    ],
)  # fmt: skip
def test_bad_input_stops_or_is_skipped(tmp_path, capsys, name, content, message):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_bytes(content)
    (tmp_path / "in" / "good.txt").write_text("un bon document, assez long pour rester là. " * 5)
    out = tmp_path / "out"
    rc, err = _run_cli([str(tmp_path / "in"), "--out", str(out), "--val-bytes", "0"], capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert __import__("re").search(message, err), err
    assert not (out / MANIFEST_NAME).exists() and not list(out.glob("*.txt"))
    rc, err = _run_cli([str(tmp_path / "in"), "--out", str(out), "--val-bytes", "0",
                        "--on-error", "skip"], capsys)  # fmt: skip
    assert rc == 0, err
    man = json.loads((out / MANIFEST_NAME).read_text())
    skipped = man["counts"]["skipped"]
    assert skipped == (
        {"files": 1, "records": 0, "binary": {}}
        if name.endswith(".gz")
        else {"files": 0, "records": 1, "binary": {}}
    )
    assert "skipped:" in err
    kept = man["counts"]["train_documents"]
    assert kept == (1 if name.endswith(".gz") else 2 + (name == "bad.jsonl"))


def test_unreadable_file(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "good.txt").write_text("un document " * 10)
    (tmp_path / "in" / "gone.txt").symlink_to(tmp_path / "missing")
    rc, err = _run_cli([str(tmp_path / "in" / "*.txt"), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and "gone.txt: cannot read" in err and len(err.splitlines()) == 1


@pytest.mark.skipif(not can_drop_privileges(), reason="no user namespaces: root ignores modes")
def test_a_file_without_read_permission_is_one_clear_error(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "good.txt").write_text("un document " * 10)
    locked = tmp_path / "in" / "locked.txt"
    locked.write_text("secret")
    locked.chmod(0)

    def build_it() -> tuple[int, str]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(
                ["build", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--workers", "1"]
            )
        return rc, err.getvalue().strip()

    # As an unprivileged user (even under root, as CI runs): the mode is real.
    rc, err = run_unprivileged(build_it)
    assert rc == 2 and "locked.txt: cannot read" in err and len(err.splitlines()) == 1, err


def test_zstd_needs_the_optional_package(tmp_path, capsys, monkeypatch):
    (tmp_path / "a.txt.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    monkeypatch.setattr(corpus_inputs, "_zstandard", lambda: None)
    rc, err = _run_cli([str(tmp_path / "a.txt.zst"), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and "pip install 'atom-train[zstd]'" in err and "a.txt.zst" in err


def test_zstd_input(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    text = "un document compressé avec zstd, " * 40
    (tmp_path / "a.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    build(tmp_path / "o", [str(tmp_path / "a.txt.zst")], BuildOptions(val_fraction=0.0), workers=1,
          log=lambda m: None)  # fmt: skip
    assert (tmp_path / "o" / "train-000.txt").read_text() == text.rstrip() + "\n\n"


def test_val_larger_than_half_is_refused(tmp_path):
    (tmp_path / "a.txt").write_text("peu de texte")
    with pytest.raises(UserError, match="more than half"):
        build(tmp_path / "o", [str(tmp_path / "a.txt")], BuildOptions(val_bytes=1000), workers=1,
              log=lambda m: None)  # fmt: skip
    assert corpus_build.BUILD_DIR in os.listdir(tmp_path / "o")  # unfinished, not finished-looking
    assert not (tmp_path / "o" / MANIFEST_NAME).exists()


def test_the_trainer_trains_on_a_built_corpus(mixed, tmp_path, capsys):
    """--corpus DIR: the manifest's train shards are the data, its val the val; a resume by
    folder reads them again; a shard that changed after the build is refused at start."""
    from helpers.trainer_kit import TINY

    from atom_train import train
    from atom_train.trainer.checkpoint_file import FINAL, load_checkpoint

    corpus = tmp_path / "corpus"
    shutil.copytree(mixed.out, corpus)
    out = tmp_path / "run"
    argv = ["--corpus", str(corpus), "--output-dir", str(out), "--total-ticks", "32", *TINY,
            "--val-bytes", "256", "--val-streams", "4"]  # fmt: skip
    assert train.main(argv) == 0
    saved = run_config_of(load_checkpoint(out / FINAL).meta).flat()
    assert saved["data"] == [str(corpus / e["file"]) for e in mixed.man["train"]]
    assert saved["val"] == str(corpus / "val.txt") and saved["corpus"] == str(corpus)
    assert "val: 256 bytes of " + str(corpus / "val.txt") in capsys.readouterr().err
    assert train.main(["--output-dir", str(out), "--total-ticks", "48"]) == 0
    # Edited in place to the same size: the content check (SHA-256 at every launch) sees it.
    shard = corpus / "train-000.txt"
    original = shard.read_bytes()
    with shard.open("r+b") as f:
        f.seek(len(original) // 2)
        f.write(b"Z" if original[len(original) // 2 : len(original) // 2 + 1] != b"Z" else b"Y")
    capsys.readouterr()
    assert train.main(["--output-dir", str(out), "--total-ticks", "64"]) == 2
    err = capsys.readouterr().err
    assert "train-000.txt: content differs from its sha256 in the manifest" in err
    assert "the corpus changed after it was built" in err
    shard.write_bytes(original)
    with shard.open("ab") as f:
        f.write(b"x")
    assert train.main(["--output-dir", str(out), "--total-ticks", "64"]) == 2
    assert "the corpus changed after it was built" in capsys.readouterr().err
    assert train.main([*argv, "--data", str(corpus / "val.txt")]) == 2
    assert "give --corpus DIR or --data GLOB, not both" in capsys.readouterr().err
