"""A newcomer's first day: the run says what it does, and refuses what cannot be meant.

Each test is a user-level check (exit code, message, what the run folder records) of one
behaviour; the numbers are those of the first-day review (docs/flags.md, README).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from helpers.trainer_kit import TINY, args, copy_run, run

from atom_train import export, train
from atom_train.trainer.checkpoint_file import FINAL, load_checkpoint
from atom_train.trainer.train_state import run_config_of


def events(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "loss.jsonl").read_text().splitlines() if '"event"' in x]


@pytest.fixture(scope="module")
def pivoted(corpus, tmp_path_factory) -> Path:
    """A run of 32 ticks, then pivoted to --lr 1e-3 up to tick 48 (final checkpoint)."""
    out = tmp_path_factory.mktemp("pivoted")
    assert run(corpus, out, 32, "--val", str(corpus / "val.txt"), "--val-bytes", "256",
               "--val-streams", "4") == 0  # fmt: skip
    assert train.main(["--output-dir", str(out), "--total-ticks", "48", "--lr", "1e-3"]) == 0
    return out


# 1. Resume by folder; a rerun that would undo a pivot says so first.


def test_output_dir_alone_resumes_with_what_is_in_force(pivoted, tmp_path, capsys):
    out = copy_run(pivoted, tmp_path)
    assert train.main(["--output-dir", str(out), "--total-ticks", "64"]) == 0
    err = capsys.readouterr().err
    assert "pivot" not in err and "resumed from" in err
    meta = load_checkpoint(out / FINAL).meta
    saved = run_config_of(meta)
    assert saved.value("lr") == 1e-3 and saved.value("val").endswith("val.txt")
    assert saved.value("B") == 4 and saved.model.n_modes == meta["model_config"]["n_modes"] == 8
    assert events(out)[-1]["event"] == "resume" and "changed" not in events(out)[-1]


def test_the_original_command_would_undo_the_pivot_and_is_refused(
    corpus, pivoted, tmp_path, capsys
):
    out = copy_run(pivoted, tmp_path)
    before = (out / "loss.jsonl").read_bytes()
    original = args(corpus, out, 64, "--val", str(corpus / "val.txt"), "--val-bytes", "256",
                    "--val-streams", "4", "--lr", "2e-3")  # fmt: skip
    assert train.main(original) == 2
    err = capsys.readouterr().err
    assert "would undo an earlier pivot" in err and "lr 0.001 -> 0.002" in err
    assert f"--output-dir {out}" in err and "--revert-ok" in err
    assert (out / "loss.jsonl").read_bytes() == before, "a refusal writes nothing"
    assert train.main([*original, "--revert-ok"]) == 0
    assert events(out)[-1]["event"] == "pivot"
    assert events(out)[-1]["changes"]["lr"] == [1e-3, 2e-3]


# 2. A changed free flag is printed and recorded; a finished run keeps no stale val.


def test_turning_val_off_on_a_resume_is_said_and_recorded(pivoted, tmp_path, capsys):
    out = copy_run(pivoted, tmp_path)
    assert train.main(["--output-dir", str(out), "--total-ticks", "64", "--val", "",
                       "--threads", "2"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert (
        "changed since the last launch:" in err and "-> (none)" in err and "threads 1 -> 2" in err
    )
    resume = [e for e in events(out) if e["event"] == "resume"][-1]
    assert resume["changed"]["val"][1] == "" and resume["changed"]["threads"] == [1, 2]
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "completed" and status["val_bpb"] is None


# 3. A val file that is also a training shard.


def test_val_among_the_training_files_is_refused(corpus, tmp_path, capsys):
    same = args(corpus, tmp_path / "a", 16, "--val", str(corpus / "train-0.txt"))
    assert train.main(same) == 2
    assert "is also a training file" in capsys.readouterr().err
    twin = tmp_path / "copy-of-train-1.txt"
    twin.write_bytes((corpus / "train-1.txt").read_bytes())
    assert train.main(args(corpus, tmp_path / "b", 16, "--val", str(twin))) == 2
    assert "is also a training file" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# 4. Compressed or binary "text".


def test_gzipped_shards_are_refused_unless_allowed(corpus, tmp_path, capsys):
    gz = tmp_path / "data"
    gz.mkdir()
    (gz / "train.txt.gz").write_bytes(gzip.compress((corpus / "train-0.txt").read_bytes()))
    argv = args(corpus, tmp_path / "o", 16)
    argv[argv.index("--data") + 1] = str(gz / "*")
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert "gzip-compressed" in err and "atom_train.corpus build" in err and "--allow-binary" in err
    assert train.main([*argv, "--allow-binary"]) == 0


def test_several_bad_files_are_named_in_one_line(corpus, tmp_path, capsys):
    """A glob over several compressed files: one refusal names them all (not one per run)."""
    gz = tmp_path / "data"
    gz.mkdir()
    for i in range(8):
        (gz / f"log-{i}.txt.gz").write_bytes(gzip.compress(b"changelog entry\n" * 50))
    argv = args(corpus, tmp_path / "o", 16)
    argv[argv.index("--data") + 1] = str(gz / "*")
    assert train.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert (
        f"--data: {gz / 'log-0.txt.gz'} is gzip-compressed (and 7 more: log-1.txt.gz, "
        "log-2.txt.gz, log-3.txt.gz, log-4.txt.gz, log-5.txt.gz, ...): "
    ) in err, err


# 5. Sizes that cannot be what the user meant; the passes over the data.


def test_tiny_val_and_tiny_corpus_are_warned_about_and_passes_are_shown(tmp_path, capsys):
    (tmp_path / "val.txt").write_bytes(b"Bonjour. 12")
    (tmp_path / "small.txt").write_bytes(b"Petit texte." * 5)  # 60 bytes
    argv = ["--data", str(tmp_path / "small.txt"), "--val", str(tmp_path / "val.txt"),
            "--output-dir", str(tmp_path / "o"), "--total-ticks", "32", *TINY,
            "--val-bytes", "64", "--val-streams", "4"]  # fmt: skip
    assert train.main(argv) == 0
    err = capsys.readouterr().err
    assert "the val slice (--val-bytes 64) is larger than the val text (11 bytes)" in err
    assert "smaller than one window of all streams (-B 4 x K 16 = 64 bytes)" in err
    assert "the run reads 128 bytes (2.13 passes)" in err
    assert json.loads((tmp_path / "o" / "status.json").read_text())["planned_passes"] == (
        pytest.approx(128 / 60)
    )


# 6. A finished run rerun with a smaller length: tested in test_train
#    (test_rerun_of_a_completed_run_reports_and_exits: nothing appended).

# 7, 8, 10. Numbers with their meaning.


def test_the_banner_says_what_val_scores_and_what_loss_is(corpus, tmp_path, capsys):
    argv = args(corpus, tmp_path / "o", 16, "--val", str(corpus / "val.txt"), "--val-bytes",
                "256", "--val-streams", "4")  # fmt: skip
    assert train.main(argv) == 0
    err = capsys.readouterr().err
    size = (corpus / "val.txt").stat().st_size
    assert f"val: 256 bytes of {corpus / 'val.txt'} (" in err
    assert "read as 4 streams of 64 bytes from fresh state" in err
    assert f"to score all of it: --val-bytes {size}" in err
    assert "loss = byte CE (nats) + length CE" in err and "every 64 ticks" in err
    status = json.loads((tmp_path / "o" / "status.json").read_text())
    assert status["time_iso"].startswith("20") and "T" in status["checkpoint_time_iso"]


def test_the_banner_does_not_advise_what_was_given(corpus, tmp_path, capsys):
    """All of the val text asked for (--val-bytes its size): the banner says which bytes are
    left out (whole ticks of every stream), never "to score all of it" with the value given."""
    size = (corpus / "val.txt").stat().st_size
    argv = args(corpus, tmp_path / "o", 16, "--val", str(corpus / "val.txt"), "--val-bytes",
                str(size), "--val-streams", "3")  # fmt: skip
    assert train.main(argv) == 0
    err = capsys.readouterr().err
    scored = size // 3 * 3
    assert f"val: {scored:,} bytes of {corpus / 'val.txt'} (" in err
    assert "to score all of it" not in err
    assert scored < size  # (the text's size is not a multiple of 3 streams)
    assert f"its last {size - scored:,} bytes are left out" in err


# 11: every default in --help (test_flags). 12: argparse errors are short, with a hint.


def test_an_unquoted_glob_gets_one_line_and_a_hint(corpus, tmp_path, capsys):
    # What the shell passes for --data data/train-*.txt unquoted: the second file is stray.
    argv = args(corpus, tmp_path / "o", 16)
    argv[argv.index("--data") + 1 : argv.index("--data") + 2] = [
        str(corpus / "train-0.txt"), str(corpus / "train-1.txt")]  # fmt: skip
    assert train.main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[train] error: unrecognized arguments:")
    assert "quote it" in lines[0] and "(see --help)" in lines[0]


# 13. --init needs the same model shape, and says which fields differ.


def test_init_with_another_model_shape_names_the_fields(corpus, pivoted, tmp_path, capsys):
    argv = args(corpus, tmp_path / "i", 16, "--init", str(pivoted / FINAL))
    argv[argv.index("--n-modes") + 1] = "16"
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert "the weights need the same model shape" in err
    assert "n_modes 8 (checkpoint) vs 16 (--n-modes)" in err
    assert "size mismatch" not in err and err.count("error:") == 1


# 14. --init says what it loaded and scores the weights before the first step.


def test_init_says_what_it_loaded_and_validates_at_tick_0(corpus, pivoted, tmp_path, capsys):
    out = tmp_path / "i"
    argv = args(corpus, out, 16, "--init", str(pivoted / FINAL), "--keep-optimizer", "--val",
                str(corpus / "val.txt"), "--val-bytes", "256", "--val-streams", "4")  # fmt: skip
    assert train.main(argv) == 0
    err = capsys.readouterr().err
    assert f"initialised from {pivoted / FINAL} (tick 48 of its run, B 4)" in err
    assert "AdamW m, v and step" in err and "tick 0: val_bpb" in err
    val0 = [e for e in events(out) if e["event"] == "val"]
    assert val0 and val0[0]["tick"] == 0 and val0[0]["val_bpb"] > 0


# 15. export and chat say what is wrong with the path they were given.


def test_export_into_a_missing_folder_and_chat_on_an_export(pivoted, tmp_path, capsys):
    from atom_train import chat

    assert export.main([str(pivoted / FINAL), str(tmp_path / "no" / "such" / "out.bin")]) == 2
    err = capsys.readouterr().err
    assert f"the folder {tmp_path / 'no' / 'such'} does not exist" in err and ".tmp-" not in err
    assert export.main([str(pivoted / FINAL), str(tmp_path / "out.bin")]) == 0
    assert chat.main(["--checkpoint", str(tmp_path / "out.bin"), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "is an export" in err and "not a checkpoint" in err and "header" not in err


# 16. Messages about a built corpus point the right way.


def _built(tmp_path: Path, corpus: Path) -> Path:
    from atom_train.corpus.command import main as corpus_main

    built = tmp_path / "built"
    assert corpus_main(["build", str(corpus / "train-0.txt"), str(corpus / "train-1.txt"),
                        "--out", str(built), "--val-bytes", "2000", "--workers", "1"]) == 0  # fmt: skip
    return built


def test_corpus_messages_point_the_right_way(corpus, tmp_path, capsys):
    built = _built(tmp_path, corpus)
    shard = built / "train-000.txt"
    out = tmp_path / "run"
    base = ["--output-dir", str(out), "--total-ticks", "16", *TINY]
    # --corpus given a file: not "build a corpus with --out <that file>".
    assert train.main(["--corpus", str(shard), *base]) == 2
    err = capsys.readouterr().err
    assert (
        f"{shard} is a file, not a corpus folder: give the folder a build wrote (`python -m "
        f"atom_train.corpus build INPUT... --out DIR`), or read the file as it is with --data {shard}"
    ) in err
    assert "--out " + str(shard) not in err
    # The run's corpus is gone on a resume (a disk not mounted): put it back, not build one.
    assert train.main(["--corpus", str(built), *base]) == 0
    built.rename(tmp_path / "unmounted")
    capsys.readouterr()
    assert train.main(["--output-dir", str(out), "--total-ticks", "32"]) == 2
    err = capsys.readouterr().err
    assert f"this run trains on the corpus in {built}, which is not there now" in err
    assert "put it back at that path and rerun" in err and "build INPUT" not in err
    (tmp_path / "unmounted").rename(built)
    assert train.main(["--output-dir", str(out), "--total-ticks", "32"]) == 0


def test_the_readme_quotes_what_a_resume_on_other_data_prints(corpus, tmp_path, capsys):
    """README's troubleshooting names the loader's message as the code prints it."""
    from helpers import REPO

    out = tmp_path / "run"
    assert run(corpus, out, 16) == 0
    other = tmp_path / "other.txt"
    other.write_text("un autre texte, tout à fait différent.\n" * 50)
    argv = args(corpus, out, 32)
    argv[argv.index("--data") + 1] = str(other)
    capsys.readouterr()
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    quoted = "it was saved on a different corpus ("
    assert quoted in err
    assert f"`cannot resume …: {quoted}…)`" in (REPO / "README.md").read_text()
