"""Turn your own text into train shards and a held-out val file: `python -m atom_train.corpus`.

    python -m atom_train.corpus build books/ --out data/books
    python -m atom_train.corpus build 'dump/*.jsonl.gz' --text-field content --out data/dump \\
        --val-bytes 20000000 --shard-mb 512
    python -m atom_train.corpus build wiki/*.txt.xz --split-on blank-lines --language fr \\
        --min-chars 200 --out data/wiki --on-error skip
    python -m atom_train.corpus build crawl/ --near-dup 0.8 --language fr,ca --out data/web
    python -m atom_train.corpus check data/books            # re-hash every file
    python -m atom_train.corpus check data/books --quick    # sizes only
    python -m atom_train.corpus stats data/books
    python -m atom_train.train --corpus data/books ...      # train on it

INPUT: files, folders (recursive; names starting with "." skipped; --glob filters names) or
globs, of plain text, .jsonl / .ndjson (the string in --text-field), .html / .htm / .xhtml
(the page's main text, by trafilatura: pip install 'atom-train[html]'), each possibly
compressed: .gz, .bz2, .xz, or .zst (pip install 'atom-train[zstd]'). Files that are not
text by their content (images, PDFs, archives, NUL bytes, XML metadata) are skipped and
counted (--on-binary fail stops instead).

A document is a file, a JSONL record, or with --split-on blank-lines a block of lines
between blank lines (default: a file or a record). Documents are cleaned (invalid UTF-8,
Unicode normal form, newlines, control characters, blank lines at either end), filtered
(--min-chars, --language: pip install 'atom-train[language]'), de-duplicated exactly by
content (and with --near-dup, near duplicates: pip install 'atom-train[neardup]'), and
ordered by a hash of their content: the output is the same whatever the order or grouping of the inputs. Val takes the
documents with the smallest hashes (--val-fraction, default 1%, or --val-bytes), so no
document is on both sides. Train shards hold whole documents, one seam (--separator,
default a blank line) after each; a document larger than --shard-mb is a shard of its own.

DIR gets train-000.txt ..., val.txt and manifest.json (inputs, options, counts, SHA-256 of
every file; docs/corpus.md). An interrupted build leaves no manifest and resumes when
rerun; rerunning a finished build is a no-op; other options or inputs are refused unless
--force. Mistakes are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atom_train.common import cli
from atom_train.corpus.build import MB, BuildOptions, build, default_workers
from atom_train.corpus.inputs import FORMATS, ON_BINARY_CHOICES, SPLIT_CHOICES
from atom_train.corpus.manifest import (
    CorpusDir,
    file_problems,
    files_of,
    open_corpus_dir,
    read_manifest,
    summary,
)
from atom_train.corpus.normalize import (
    CONTROL_CHOICES,
    INVALID_UTF8_CHOICES,
    NEWLINE_CHOICES,
    UNICODE_CHOICES,
)

__all__ = ["CorpusDir", "main", "open_corpus_dir"]
PROG = "python -m atom_train.corpus"


def _separator(text: str) -> str:
    """--separator with backslash escapes (\\n, \\t, \\x04, \\u2028) read as characters."""
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError as e:
        raise cli.UserError(f"--separator {text!r}: bad escape ({e.reason})") from None


def _parser() -> cli.ArgumentParser:
    d = BuildOptions()
    ap = cli.ArgumentParser(prog=PROG, description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="command", required=True, parser_class=cli.ArgumentParser)

    b = sub.add_parser("build", help="build a corpus folder from INPUT files",
                       description="Build a corpus folder (see python -m atom_train.corpus --help).")  # fmt: skip
    b.add_argument("inputs", nargs="+", metavar="INPUT", help="files, folders or globs")
    b.add_argument("--out", required=True, metavar="DIR", help="the corpus folder to write")
    g = b.add_argument_group("reading")
    g.add_argument(
        "--format",
        choices=FORMATS,
        default=d.format,
        help="input format; auto = by file suffix (default: %(default)s)",
    )
    g.add_argument(
        "--glob",
        default=d.glob,
        metavar="PATTERN",
        help="file names to take from INPUT folders (default: %(default)s)",
    )
    g.add_argument(
        "--text-field",
        default=d.text_field,
        metavar="NAME",
        help="JSONL field holding the text (default: %(default)s)",
    )
    g.add_argument(
        "--split-on",
        choices=SPLIT_CHOICES,
        default=d.split_on,
        help="what a document is in a text file: the whole file, or each block "
        "between blank lines (default: %(default)s; a JSONL record is always one)",
    )
    g.add_argument(
        "--on-error",
        choices=("stop", "skip"),
        default=d.on_error,
        help="a bad file or JSONL record: stop the build, or skip it and count it "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--on-binary",
        choices=ON_BINARY_CHOICES,
        default=d.on_binary,
        help="a file that is not text (an image, a PDF, an archive, XML metadata: by its "
        "content): skip it and count it by kind, or stop the build (default: %(default)s)",
    )
    c = b.add_argument_group("cleaning (each change is counted in the manifest)")
    c.add_argument(
        "--invalid-utf8",
        choices=INVALID_UTF8_CHOICES,
        default=d.invalid_utf8,
        help="bytes that are not UTF-8: replace with U+FFFD, drop the document, or "
        "read the text as cp1252 (legacy files) (default: %(default)s)",
    )
    c.add_argument(
        "--unicode",
        choices=UNICODE_CHOICES,
        default=d.unicode,
        help="Unicode normal form (default: %(default)s)",
    )
    c.add_argument(
        "--newlines",
        choices=NEWLINE_CHOICES,
        default=d.newlines,
        help="lf: CRLF and CR become LF (default: %(default)s)",
    )
    c.add_argument(
        "--control",
        choices=CONTROL_CHOICES,
        default=d.control,
        help="control characters other than tab and newline (default: %(default)s)",
    )
    c.add_argument(
        "--min-chars",
        type=int,
        default=d.min_chars,
        metavar="N",
        help="drop documents shorter than N characters after cleaning "
        "(default: %(default)s: only empty ones)",
    )
    c.add_argument(
        "--language",
        default=None,
        metavar="CODES",
        help="keep only documents identified as one of these languages, e.g. fr or fr,ca "
        "(ISO 639-1 codes; py3langid, 139 languages; default: no filter)",
    )
    c.add_argument(
        "--language-threshold",
        type=float,
        default=d.language_threshold,
        metavar="P",
        help="... identified with at least this confidence (default: %(default)s)",
    )
    c.add_argument(
        "--no-dedup",
        action="store_true",
        help="keep exact duplicate documents (default: keep one copy)",
    )
    c.add_argument(
        "--near-dup",
        type=float,
        default=None,
        metavar="THRESHOLD",
        help="drop documents whose word 5-grams overlap a kept one's by at least THRESHOLD "
        "(Jaccard, by MinHash LSH), e.g. 0.8 (default: off)",
    )
    o = b.add_argument_group("output")
    v = o.add_mutually_exclusive_group()
    v.add_argument(
        "--val-fraction",
        type=float,
        default=None,
        metavar="F",
        help=f"val share of the kept text (default: {d.val_fraction})",
    )
    v.add_argument(
        "--val-bytes", type=int, default=None, metavar="N", help="val size in bytes (0: no val)"
    )
    o.add_argument(
        "--shard-mb",
        type=float,
        default=d.shard_bytes / MB,
        metavar="MB",
        help="train shard budget in MB of 10^6 bytes (default: %(default)g)",
    )
    o.add_argument(
        "--max-train-mb",
        type=float,
        default=None,
        metavar="MB",
        help="stop train at this many MB (default: no cap)",
    )
    o.add_argument(
        "--separator",
        default="\\n\\n",
        metavar="TEXT",
        help="the seam after every document, backslash escapes allowed, e.g. "
        "'\\x04' (default: '\\n\\n', a blank line)",
    )
    r = b.add_argument_group("running")
    r.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help=f"processes (default: the CPUs available, here {default_workers()}); "
        "does not change the output",
    )
    r.add_argument(
        "--force",
        action="store_true",
        help="replace a corpus (or unfinished build) made with other options or inputs",
    )

    ch = sub.add_parser("check", help="verify a corpus folder against its manifest")
    ch.add_argument("dir", metavar="DIR")
    ch.add_argument("--quick", action="store_true", help="compare sizes only, no re-hash")
    st = sub.add_parser("stats", help="print a corpus folder's figures")
    st.add_argument("dir", metavar="DIR")
    return ap  # fmt: skip


def options_from(args) -> BuildOptions:
    val_fraction = args.val_fraction
    if args.val_bytes is None and val_fraction is None:
        val_fraction = BuildOptions().val_fraction
    return BuildOptions(
        split_on=args.split_on,
        text_field=args.text_field,
        format=args.format,
        glob=args.glob,
        invalid_utf8=args.invalid_utf8,
        unicode=args.unicode,
        newlines=args.newlines,
        control=args.control,
        min_chars=args.min_chars,
        language=_languages(args.language),
        language_threshold=args.language_threshold,
        dedup=not args.no_dedup,
        near_dup=args.near_dup,
        val_bytes=args.val_bytes,
        val_fraction=None if args.val_bytes is not None else val_fraction,
        shard_bytes=round(args.shard_mb * MB),
        max_train_bytes=round(args.max_train_mb * MB) if args.max_train_mb is not None else None,
        separator=_separator(args.separator),
        on_error=args.on_error,
        on_binary=args.on_binary,
    )


def _languages(text: str | None) -> tuple[str, ...] | None:
    """--language fr,ca -> ("ca", "fr") (sorted: the same set is the same option)."""
    if text is None:
        return None
    return tuple(sorted({c.strip().lower() for c in text.split(",") if c.strip()}))


def _check(root: Path, quick: bool) -> int:
    man = read_manifest(root)
    problems = file_problems(root, man, quick=quick)
    n = len(files_of(man))
    for p in problems:
        print(f"  {p}")
    if problems:
        raise cli.UserError(
            f"{root}: {len(problems)} of {n} files differ from the manifest: restore them or "
            "rebuild with `python -m atom_train.corpus build ... --force`"
        )
    print(f"{root}: {n} files match the manifest ({'sizes' if quick else 'sizes and SHA-256'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        if args.command == "build":
            if args.workers is not None and args.workers < 1:
                raise cli.UserError("--workers must be >= 1")
            result = build(Path(args.out), args.inputs, options_from(args), force=args.force,
                           workers=args.workers)  # fmt: skip
            print(summary(Path(args.out), result.manifest))
        elif args.command == "check":
            return _check(Path(args.dir), args.quick)
        else:
            root = Path(args.dir)
            man = read_manifest(root)  # (refused before anything is printed)
            print(f"{root}:")
            print(summary(root, man))
    except cli.UserError as e:
        return cli.user_error_exit(e, PROG)
    except KeyboardInterrupt:  # Ctrl-C: one line, not the tracebacks of every process
        print(cli.message("interrupted; rerun the same command to resume", command=PROG),
              file=sys.stderr)  # fmt: skip
        return 130
    except BrokenPipeError:  # `corpus stats DIR | head`
        return cli.reader_went_away()
    except OSError as e:  # disk full, a folder we may not write: the same one line
        return cli.user_error_exit(f"{e}; check that --out is writable and has free space", PROG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
