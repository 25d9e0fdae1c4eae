"""The shared command-line plumbing (`atom_train.common.cli`) word for word, in process: the
one-line style of messages and where they go, durations at their unit edges, exit codes
through the file torchrun cannot lose, argparse's mistakes with their hints, comma lists of
integers, and the run folder read from a trainer's command line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from atom_train.common import cli


@pytest.fixture
def command():
    """The running command's name, put back after the test."""
    before = cli._command
    yield cli.set_command
    cli.set_command(before)


def test_messages_name_the_command_and_their_kind(command, capsys):
    command("train")
    assert cli.message("started") == "[train] started"
    assert cli.message("slow", "warning") == "[train] warning: slow"
    assert cli.message("bad", "error", "python -m atom_train.eval") == "[eval] error: bad"
    assert cli.message("ok", None, "tune") == "[tune] ok"
    cli.say("one")
    cli.say("two", "[corpus]")
    cli.warn("three")
    assert cli.user_error_exit(cli.UserError("four")) == 2
    assert cli.user_error_exit("five", "python -m atom_train.plot") == 2
    assert capsys.readouterr() == ("", "[train] one\n[corpus] two\n[train] warning: three\n"
                                   "[train] error: four\n[plot] error: five\n")  # fmt: skip


def test_lines_go_above_a_progress_bar_while_it_is_on_screen(command, capsys):
    command("eval")
    above: list[str] = []
    with cli.lines_above(above.append):
        cli.say("inside")
        with cli.lines_above(lambda line: above.append("inner " + line)):
            cli.warn("nested")
        cli.say("again")
    cli.say("after")
    assert above == ["[eval] inside", "inner [eval] warning: nested", "[eval] again"]
    assert capsys.readouterr().err == "[eval] after\n"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0.0s"), (9.94, "9.9s"), (10, "10s"), (59.4, "59s"), (59.6, "1m00s"), (60, "1m00s"),
     (3599, "59m59s"), (3600, "1h00m"), (7_140, "1h59m"), (86_399, "23h59m"), (86_400, "1d00h"),
     (90_000, "1d01h"), (90_061, "1d01h")],
)  # fmt: skip
def test_durations_at_their_unit_edges(seconds, text):
    assert cli.format_duration(seconds) == text


def test_a_path_is_quoted_only_when_the_shell_needs_it():
    assert cli.quote("runs/a") == "runs/a"
    assert cli.quote(Path("my runs/a")) == "'my runs/a'"
    assert cli.quote("it's") == "'it'\"'\"'s'"


def test_the_exit_code_goes_to_the_file_named_in_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "code"
    monkeypatch.setenv(cli.EXIT_CODE_FILE_ENV, str(path))
    cli.write_exit_code(3)
    assert path.read_text() == "3\n" and cli.read_exit_code(path) == 3
    monkeypatch.setenv(cli.EXIT_CODE_FILE_ENV, str(tmp_path / "no" / "code"))
    cli.write_exit_code(1)  # (best effort: a folder that does not exist is no error)
    monkeypatch.delenv(cli.EXIT_CODE_FILE_ENV)
    cli.write_exit_code(2)
    assert path.read_text() == "3\n"
    assert cli.read_exit_code(tmp_path / "missing") is None
    (tmp_path / "bad").write_text("two\n")
    assert cli.read_exit_code(tmp_path / "bad") is None
    assert cli.EXIT_CODE_FILE_ENV == "ATOM_EXIT_CODE_FILE"


def test_a_reader_that_went_away_leaves_stdout_on_dev_null(tmp_path, monkeypatch):
    out = open(tmp_path / "out", "w")  # noqa: SIM115 (closed below)
    monkeypatch.setattr(sys, "stdout", out)
    assert cli.reader_went_away() == 0
    out.write("lost")
    out.close()
    assert (tmp_path / "out").read_text() == ""


def _parser() -> cli.ArgumentParser:
    p = cli.ArgumentParser(prog="x")
    p.add_argument("--alpha")
    p.add_argument("--beta-rate")
    p.add_argument("--mode", choices=("fast", "slow"))
    return p


def test_a_parser_names_its_flags_and_its_subcommands_flags():
    p = _parser()
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("go", prog="x go").add_argument("--gamma", "-g")
    assert p.option_names() == ["--alpha", "--beta-rate", "--gamma", "--help", "--mode", "-g",
                                "-h"]  # fmt: skip


def _error(argv: list[str]) -> str:
    with pytest.raises(cli.UserError) as e:
        _parser().parse_args(argv)
    return str(e.value)


def test_argparse_mistakes_are_one_line_with_a_hint(tmp_path):
    assert _error(["--alpah", "1"]) == (
        "unrecognized arguments: --alpah 1 (did you mean --alpha?) (see --help)"
    )
    assert _error(["--alpah=1", "--beta-rat", "2"]) == (
        "unrecognized arguments: --alpah=1 --beta-rat 2 (did you mean --alpha for --alpah, "
        "--beta-rate for --beta-rat?) (see --help)"
    )
    assert _error(["--zzzzzz"]) == "unrecognized arguments: --zzzzzz (see --help)"
    assert _error(["--alpha", "1", "-5"]) == "unrecognized arguments: -5 (see --help)"
    assert _error(["--mode", "fsat"]) == (
        "argument --mode: invalid choice: 'fsat' (choose from 'fast', 'slow') (did you mean "
        "fast?) (see --help)"
    )
    assert _error(["--mode", "zzzz"]) == (
        "argument --mode: invalid choice: 'zzzz' (choose from 'fast', 'slow') (see --help)"
    )
    assert _error(["--alph", "1"]).startswith("unrecognized arguments: --alph 1")  # no abbrev
    assert _error(["--alpah=a=b"]) == (  # (the flag is what comes before the first "=")
        "unrecognized arguments: --alpah=a=b (did you mean --alpha?) (see --help)"
    )
    assert _error(["--alpha"]) == "argument --alpha: expected one argument (see --help)"
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("x")
    b.write_text("y")
    assert _error(["--alpha", "x", str(a), str(b)]) == (
        f"unrecognized arguments: {a} {b}: they are files, so the shell expanded a glob: quote "
        "it, e.g. --data 'data/train-*.txt' (see --help)"
    )
    assert _error(["--alpha", "x", str(a), "nofile"]) == (
        f"unrecognized arguments: {a} nofile (see --help)"
    )


def test_what_counts_as_a_flag():
    assert [cli._looks_like_flag(x) for x in ("--x", "-x", "-", "-5", "-1e3", "x", "-.5")] == [
        True, True, False, False, False, False, False,
    ]  # fmt: skip


def test_comma_separated_positive_integers():
    assert cli.positive_ints("256,1024", "--b") == (256, 1024)
    assert cli.positive_ints(" 1, 2,", "--b") == (1, 2)
    for text, message in (
        ("a,2", "--b takes comma-separated integers, got 'a,2'"),
        ("", "--b takes positive integers, got ''"),
        ("4,0", "--b takes positive integers, got '4,0'"),
        (" , ", "--b takes positive integers, got ' , '"),
    ):
        with pytest.raises(cli.UserError) as e:
            cli.positive_ints(text, "--b")
        assert str(e.value) == message
        assert e.value.__cause__ is None


def test_the_run_folder_of_a_trainer_command_line_word_for_word():
    assert cli.output_dir_from(["--data", "x", "--output-dir", "runs/a"]) == Path("runs/a")
    for abbreviated in ("--outp", "--output-di"):
        with pytest.raises(cli.UserError) as e:
            cli.output_dir_from([abbreviated, "runs/a"])
        assert str(e.value) == (
            f"write --output-dir in full in the train args (got {abbreviated!r})"
        )
    for abbreviated in ("--ou", "--outp=runs/a=b"):
        with pytest.raises(cli.UserError) as e:
            cli.output_dir_from([abbreviated, "x"])
        assert str(e.value) == (
            f"write --output-dir in full in the train args (got {abbreviated.partition('=')[0]!r})"
        )
    # The trainer's own -h is not the reader's: the folder is still read.
    assert cli.output_dir_from(["-h", "--output-dir", "runs/a"]) == Path("runs/a")
    with pytest.raises(cli.UserError) as e:
        cli.output_dir_from(["--o", "runs/a"])  # (too short to be taken for it)
    assert str(e.value) == (
        "no --output-dir in the train args: name the run's folder with --output-dir, e.g. "
        "--output-dir runs/fr-b64 (a new folder starts a run; a run's folder resumes it)"
    )
    with pytest.raises(cli.UserError) as e:
        cli.output_dir_from(["--output-dir", ""])
    assert str(e.value) == "--output-dir in the train args is empty"


def test_a_shared_flag_is_stored_under_its_own_name_whatever_its_spellings():
    p = cli.ArgumentParser("prog-given-first")
    assert p.prog == "prog-given-first"  # (arguments pass through to argparse, in order)
    cli.add_shared(p, "B", type=int)  # -B, --streams: stored as B, not streams
    cli.add_output_dir_argument(p)
    assert vars(p.parse_args(["--streams", "4"])) == {"B": 4, "output_dir": None}
    text = " ".join(p.format_help().split())
    assert (
        "--output-dir DIR the run's folder (required: a new folder starts a run, a run's "
        "folder resumes it)" in text
    )
