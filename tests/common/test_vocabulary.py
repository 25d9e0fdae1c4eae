"""One language for every command: each shared flag has one spelling wherever it is taken,
an unknown flag or choice gets "did you mean", and every line a command writes on stderr
has the one style (`atom_train.common.cli`). The parsers are found by walking the package:
a new command is held to the same rules without being listed here."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

import pytest
from helpers import REPO

from atom_train.common import cli

_spec = importlib.util.spec_from_file_location("layers", REPO / "scripts" / "layers.py")
layers = sys.modules.setdefault("layers", importlib.util.module_from_spec(_spec))
if not hasattr(layers, "scan"):
    _spec.loader.exec_module(layers)


def command_modules() -> list[str]:
    """Every module of the commands layer that has a `main` (what users run)."""
    out = []
    for name, m in sorted(layers.scan().items()):
        if layers.layer_of(name) == "commands" and "\ndef main(" in m.path.read_text():
            out.append(name)
    return out


def parser_of(module: str) -> argparse.ArgumentParser:
    mod = importlib.import_module(module)
    # (the corpus builder's command names its parser _parser)
    build = getattr(mod, "build_parser", None) or getattr(mod, "_parser", None)
    assert build is not None, f"{module}: a command declares its flags in build_parser()"
    return build()


def walk(parser: argparse.ArgumentParser, path: str):
    """(path, parser) for a parser and each of its subcommands, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, f"{path} {name}")


def all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    return [pair for m in command_modules() for pair in walk(parser_of(m), m)]


SHARED_NAMES = {name: dest for dest, names in cli.SHARED_FLAGS.items() for name in names}


def spelling_problems(parsers) -> list[str]:
    """Every second spelling among these parsers, one line each (see the rules below)."""
    problems = []
    spellings: dict[str, set[frozenset[str]]] = {}
    for path, p in parsers:
        names = {s for a in p._actions for s in a.option_strings}
        if "--data" in names and "--corpus" not in names:
            problems.append(f"{path}: takes --data but not --corpus")
        for a in p._actions:
            strings = frozenset(a.option_strings)
            if not strings or isinstance(a, argparse._HelpAction):
                continue
            shared = {SHARED_NAMES[s] for s in strings if s in SHARED_NAMES}
            if a.dest in cli.SHARED_FLAGS:
                shared.add(a.dest)
            for dest in shared:
                if strings != frozenset(cli.SHARED_FLAGS[dest]):
                    problems.append(
                        f"{path}: {sorted(strings)} for {dest}; its one spelling is "
                        f"{list(cli.SHARED_FLAGS[dest])}"
                    )
            negated = isinstance(a, argparse.BooleanOptionalAction)
            if len(strings) > 1 and not shared and not negated:
                problems.append(f"{path}: {sorted(strings)}: an alias that is no shared flag")
            if not a.dest.startswith("_"):
                spellings.setdefault(a.dest, set()).add(strings)
    for dest, seen in spellings.items():
        if len(seen) > 1:
            problems.append(f"{dest} is spelled {sorted(map(sorted, seen))} in different commands")
    return problems


def test_every_command_is_found_and_declares_its_flags_in_a_parser():
    found = command_modules()
    for expected in ("atom_train.train", "atom_train.tune", "atom_train.eval",
                     "atom_train.bench.command", "atom_train.data.verify",
                     "atom_train.corpus.command", "atom_train.supervise", "atom_train.chat"):  # fmt: skip
        assert expected in found, found
    for module in found:
        assert isinstance(parser_of(module), cli.ArgumentParser), module


def test_each_shared_flag_has_one_spelling_in_every_command():
    assert spelling_problems(all_parsers()) == []
    train = parser_of("atom_train.train")
    assert train.parse_args(["-K", "32"]).bptt == 32  # (was unrecognized)
    tune = parser_of("atom_train.tune")
    assert tune.parse_args(["lr", "--corpus", "d"]).corpus == "d"  # (was unrecognized)
    verify = parser_of("atom_train.data.verify")
    assert verify.parse_args(["verify", "--corpus", "d"]).corpus == "d"


@pytest.mark.parametrize(
    ("declare", "problem"),
    [
        (lambda p: p.add_argument("-K", type=int), "its one spelling is ['--bptt', '-K']"),
        (lambda p: p.add_argument("--data"), "takes --data but not --corpus"),
        (lambda p: p.add_argument("--out", "--output"), "its one spelling is ['--out']"),
        (lambda p: p.add_argument("--tick", "--ticks"), "an alias that is no shared flag"),
    ],
)
def test_a_second_spelling_is_caught(declare, problem):
    """The rules can fail: a command declaring a shared option its own way is named."""
    p = cli.ArgumentParser(prog="x")
    declare(p)
    assert any(problem in line for line in spelling_problems([("x", p)]))


def test_one_option_spelled_two_ways_in_two_commands_is_caught():
    a, b = cli.ArgumentParser(prog="a"), cli.ArgumentParser(prog="b")
    a.add_argument("--max-bytes", dest="max_bytes")
    b.add_argument("--max-byte", dest="max_bytes")
    assert any("max_bytes is spelled" in line for line in spelling_problems([("a", a), ("b", b)]))


@pytest.mark.parametrize(
    ("module", "argv", "suggestion"),
    [
        ("atom_train.train", ["--totl-ticks", "5"], "(did you mean --total-ticks?)"),
        ("atom_train.tune", ["lr", "--stpes", "5"], "(did you mean --steps?)"),
        ("atom_train.tune", ["lrr"], "(did you mean lr?)"),
        ("atom_train.eval", ["x", "--devise", "cpu"], "(did you mean --device?)"),
        ("atom_train.eval", ["x", "--device", "cdua"], "(did you mean cuda?)"),
        ("atom_train.bench.command", ["loader", "--secnds", "1"], "(did you mean --seconds?)"),
        ("atom_train.data.verify", ["verify", "--pack-mod", "utf8"], "(did you mean --pack-mode?)"),
        ("atom_train.chat", ["--checkpoint", "x", "--temprature", "1"], "(did you mean --temperature?)"),
    ],
)  # fmt: skip
def test_an_unknown_flag_or_choice_gets_did_you_mean(module, argv, suggestion):
    with pytest.raises(cli.UserError) as e:
        parser_of(module).parse_args(argv)
    assert suggestion in str(e.value)


def test_no_suggestion_when_nothing_is_close_and_abbreviations_are_refused():
    p = cli.ArgumentParser(prog="x")
    p.add_argument("--total-ticks")
    with pytest.raises(cli.UserError) as e:
        p.parse_args(["--zzz"])
    assert "did you mean" not in str(e.value)
    with pytest.raises(cli.UserError, match="did you mean --total-ticks"):
        p.parse_args(["--total", "5"])  # an abbreviation is a second spelling too


def test_files_left_by_an_unquoted_glob_get_the_quoting_hint(tmp_path):
    p = cli.ArgumentParser(prog="x")
    p.add_argument("--data")
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("x")
    b.write_text("x")
    with pytest.raises(cli.UserError, match="the shell expanded a glob: quote it"):
        p.parse_args(["--data", str(a), str(b)])
    # A folder is no glob expansion (tune lr --corpus DIR once got this hint).
    with pytest.raises(cli.UserError) as e:
        p.parse_args(["--data", str(a), str(tmp_path)])
    assert "glob" not in str(e.value)


def test_messages_have_one_style(capsys):
    cli.set_command("demo")
    try:
        cli.say("hello")
        cli.warn("careful")
        assert cli.user_error_exit(cli.UserError("bad flag: use --x")) == cli.EXIT_USER_ERROR
        assert cli.user_error_exit("boom", "python -m atom_train.corpus") == 2
        written = []
        with cli.lines_above(written.append):  # (while a bar is on screen)
            cli.say("above the bar")
    finally:
        cli.set_command("atom")
    assert capsys.readouterr().err.splitlines() == [
        "[demo] hello",
        "[demo] warning: careful",
        "[demo] error: bad flag: use --x",
        "[corpus] error: boom",
    ]
    assert written == ["[demo] above the bar"]
