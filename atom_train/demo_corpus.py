"""The French demo corpus: documentation from Debian packages, built by the corpus builder.

The demo needs real French text without a download from the open internet. Debian ships
its documentation translated into French (manuals, man pages, help systems); this module is
a document source for the corpus builder (`corpus.build`): it fetches those packages with
`apt-get download`, reads them with `dpkg-deb --fsys-tarfile` (no root needed, nothing is
installed or unpacked to disk), strips HTML, man pages (troff) and LyX manuals to plain
UTF-8 text (`corpus.markup`: on this documentation its own converters keep more than
trafilatura, the builder's HTML reader, see docs/corpus.md), keeps new French paragraphs (by
the builder's language identifier, py3langid), and hands each document to the builder,
which orders, splits, shards and records them like any corpus:

    OUT/train-000.txt, train-001.txt, ...   training text (paragraphs, blank-line separated)
    OUT/val.txt                             held-out documents, never in a train shard
    OUT/manifest.json                       options, packages and versions, counts, sha256s

The same packages give byte-identical output. A finished corpus built with the same options
is reused as is (a no-op); `--force` rebuilds. The .deb files are cached under `--cache`
(default: OUT/../.debs).

Examples:
    python -m atom_train.demo_corpus --out data/demo
    python -m atom_train.demo_corpus --out data/demo --max-mib 8 --force
    python -m atom_train.demo_corpus --out data/demo --packages manpages-fr,debian-reference-fr
    python -m atom_train.demo_corpus --out data/demo --packages default,debian-handbook
    python -m atom_train.demo_corpus --list-packages

Without apt (not Debian or Ubuntu) it stops with exit status 2 and says so: build a corpus
from your own text with `python -m atom_train.corpus build my_texts/ --out data/mine`.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from atom_train.common import cli
from atom_train.common.cli import UserError
from atom_train.corpus.build import BuildOptions, BuildResult, build
from atom_train.corpus.language import identify
from atom_train.corpus.manifest import summary
from atom_train.corpus.markup import (
    html_charset,
    html_to_text,
    lyx_to_text,
    troff_charset,
    troff_to_text,
)
from atom_train.corpus.normalize import decode_bytes
from atom_train.corpus.scan import content_hash

# Bump when extraction or cleaning changes, so a cached corpus built by older rules is rebuilt.
# 2: paragraphs judged French by py3langid instead of counts of function words.
EXTRACTOR_VERSION = 2
# The manifest this module wrote before the corpus builder existed (replaced on rebuild).
_OLD_MANIFEST = "MANIFEST.json"
_OLD_FORMAT = "atom-demo-corpus"

MIB = 1 << 20
PROG = "python -m atom_train.demo_corpus"


class DemoCorpusError(UserError):
    """A user-facing failure; the message says what to do next."""


# --------------------------------------------------------------------------------------------
# Packages
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackageSpec:
    """Which members of a package are documents. Globs match the member path (no leading ./)."""

    name: str
    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    note: str = ""


_MAN_GLOBS = ("usr/share/man/fr/man*/*",)


def _spec(name: str, *include: str, exclude: tuple[str, ...] = (), note: str = "") -> PackageSpec:
    return PackageSpec(name, include, exclude, note)


# Ordered by the French text each gives after filtering and deduplication, measured on
# Debian 12 (docs/demo_corpus.md has the figures); earlier packages win ties in dedup.
PACKAGES: dict[str, PackageSpec] = {
    s.name: s
    for s in (
        _spec("libreoffice-help-fr", "usr/share/libreoffice/help/fr/*.html",
              note="LibreOffice help: 2,500 short how-to pages"),
        _spec("manpages-fr-dev", *_MAN_GLOBS, note="man pages, sections 2-3 (C library)"),
        _spec("manpages-fr", *_MAN_GLOBS, note="man pages, sections 1, 4-8"),
        _spec("lilypond-doc-html-fr", "usr/share/doc/lilypond/html/*.fr.html",
              # The big-page files repeat the split pages; index pages are lists of names.
              exclude=("*-big-page.fr.html", "*/lilypond-index.fr.html", "*/index_toc.fr.html"),
              note="LilyPond manuals (music engraving)"),
        _spec("gimp-help-fr", "usr/share/gimp/2.0/help/fr/*.html",
              note="GIMP manual (partly untranslated: English paragraphs are dropped); 52 MB"),
        _spec("lyx-common", "usr/share/lyx/doc/fr/*.lyx", note="LyX manuals (LyX format)"),
        _spec("debian-reference-fr", "usr/share/debian-reference/*.fr.html",
              note="Debian Reference"),
        _spec("harden-doc", "usr/share/doc/harden-doc/html/fr-FR/*.html",
              note="Securing Debian Manual (French part of a multilingual package)"),
        _spec("grisbi-common", "usr/share/doc/grisbi/fr/*.html",
              note="Grisbi (personal finance) user manual"),
        _spec("gnome-user-docs", "usr/share/help/fr/*.page",
              note="GNOME help (Mallard pages; French part)"),
        _spec("developers-reference-fr", "usr/share/developers-reference/fr/*.html",
              exclude=("*/developers-reference.html",),  # the split pages, on one page
              note="Debian Developer's Reference"),
        _spec("aptitude-doc-fr", "usr/share/doc/aptitude/html/fr/*.html",
              note="aptitude manual"),
        _spec("maint-guide-fr", "usr/share/doc/maint-guide-fr/html/*.html",
              note="Debian New Maintainers' Guide"),
        _spec("debian-faq-fr", "usr/share/doc/debian/FAQ/fr/*.html", note="Debian FAQ"),
        _spec("texworks-help-fr", "usr/share/texworks-help/fr/*.html", note="TeXworks help"),
        # Not in the default set: large downloads for little French text.
        _spec("debian-handbook", "usr/share/doc/debian-handbook/html/fr-FR/*.html",
              note="extra: Debian Administrator's Handbook, partly translated; 35 MB"),
        _spec("installation-guide-amd64", "usr/share/doc/installation-guide-amd64/fr/*.html",
              note="extra: Debian installation guide; 18 MB"),
        _spec("tuxpaint-data", "usr/share/doc/tuxpaint-data/fr_FR.UTF-8/html/*.html",
              note="extra: Tux Paint documentation; 8 MB"),
        _spec("debian-edu-doc-fr", "usr/share/doc/debian-edu-doc-fr/*bookworm-manual.html",
              note="extra: Debian Edu manual; 10 MB"),
        _spec("debian-history", "usr/share/doc/debian-history/docs/*.fr.html",
              note="extra: a brief history of Debian"),
    )
}  # fmt: skip
DEFAULT_PACKAGES = tuple(name for name, s in PACKAGES.items() if not s.note.startswith("extra:"))


# --------------------------------------------------------------------------------------------
# Paragraph filter and deduplication (the demo's own cleaning, before the builder's)
# --------------------------------------------------------------------------------------------


def _letter_share(text: str) -> float:
    letters = sum(1 for c in text if c.isalpha())
    visible = sum(1 for c in text if not c.isspace())
    return letters / visible if visible else 0.0


@dataclass
class Deduper:
    """Drops a paragraph seen before, anywhere in the corpus (first occurrence wins).

    Short paragraphs (headings such as "DESCRIPTION", list labels) are never dropped: they
    carry the structure of each document. Keys are whitespace-folded content hashes. (The
    builder de-duplicates whole documents; documentation repeats paragraphs, such as a
    footer on every page, so the demo also needs this finer one.)
    """

    min_chars: int = 48
    seen: set[bytes] = field(default_factory=set)
    dropped: int = 0

    def is_new(self, paragraph: str) -> bool:
        if len(paragraph) < self.min_chars:
            return True
        key = content_hash(" ".join(paragraph.split()).encode())
        if key in self.seen:
            self.dropped += 1
            return False
        self.seen.add(key)
        return True


def is_french(paragraph: str, judged_from: int = 48) -> bool:
    """A paragraph of `judged_from` characters or more is French when the identifier says
    so; a shorter one (a heading, a list label, a command name) is too short to judge and
    is kept, as the structure of its document."""
    return len(paragraph) < judged_from or identify(paragraph, "the demo corpus")[0] == "fr"


def clean_document(text: str, dedup: Deduper, min_chars: int = 300) -> str:
    """The document's new French paragraphs, or "" when too little is left to be worth it.

    A paragraph is kept when it is French (`is_french`), mostly letters (not a table of
    numbers or a code fragment), and not a repeat (`dedup`). The document is kept when its
    long (deduplicated) paragraphs reach `min_chars`, so a page of headings alone is dropped.
    """
    kept: list[str] = []
    substance = 0
    for para in text.split("\n\n"):
        para = para.strip()
        if not para or _letter_share(para) < 0.6 or not is_french(para):
            continue
        if not dedup.is_new(para):
            continue
        kept.append(para)
        if len(para) >= dedup.min_chars:
            substance += len(para)
    if substance < min_chars:
        return ""
    return "\n\n".join(kept)


# --------------------------------------------------------------------------------------------
# Reading packages
# --------------------------------------------------------------------------------------------


def member_to_text(path: str, data: bytes) -> str:
    """Plain text of one package member, by type ("" for a type we do not read)."""
    if path.endswith(".gz"):
        data = gzip.decompress(data)
        path = path[:-3]
    if path.endswith((".html", ".htm", ".xhtml", ".page")):
        return html_to_text(decode_bytes(data, html_charset(data)))
    if path.endswith(".lyx"):
        return lyx_to_text(decode_bytes(data))
    if "/man/" in path:
        return troff_to_text(decode_bytes(data, troff_charset(data)))
    return ""


def iter_members(deb: Path, spec: PackageSpec) -> Iterator[tuple[str, bytes]]:
    """(path, bytes) of the package's regular files matching `spec`, sorted by path."""
    proc = subprocess.Popen(
        ["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    wanted: list[tuple[str, bytes]] = []
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for info in tar:
                path = info.name.removeprefix("./")
                if not info.isfile() or not any(fnmatchcase(path, g) for g in spec.include):
                    continue
                if any(fnmatchcase(path, g) for g in spec.exclude):
                    continue
                f = tar.extractfile(info)
                if f is not None:
                    wanted.append((path, f.read()))
        # Read the tar padding too, so dpkg-deb does not die of a broken pipe.
        while proc.stdout.read(MIB):
            pass
    except tarfile.TarError as e:
        proc.kill()
        raise DemoCorpusError(f"{deb}: not a readable .deb ({e}); delete it and rerun") from None
    finally:
        proc.stdout.close()
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
        rc = proc.wait()
    if rc != 0:
        raise DemoCorpusError(f"dpkg-deb failed on {deb}: {stderr.strip()}; delete it and rerun")
    yield from sorted(wanted)


def deb_field(deb: Path, name: str) -> str:
    out = subprocess.run(
        ["dpkg-deb", "--field", str(deb), name], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise DemoCorpusError(f"{deb}: not a readable .deb ({out.stderr.strip()}); delete it")
    return out.stdout.strip()


# --------------------------------------------------------------------------------------------
# Downloading
# --------------------------------------------------------------------------------------------

_NO_APT_HINT = (
    "This demo corpus is built from Debian packages and needs a Debian or Ubuntu system "
    "(apt-get and dpkg-deb). Use your own text instead: "
    "python -m atom_train.corpus build my_texts/ --out data/mine, or train on plain UTF-8 "
    "files directly with python -m atom_train.train --data 'my_texts/*.txt' ..."
)


def _dpkg_compare(a: str, b: str) -> int:
    if a == b:
        return 0
    lt = subprocess.run(["dpkg", "--compare-versions", a, "lt", b], check=False).returncode
    return -1 if lt == 0 else 1


def cached_deb(cache: Path, package: str) -> Path | None:
    """The newest cached .deb of `package`, or None."""
    found = sorted(cache.glob(f"{package}_*.deb"))
    if not found:
        return None
    if len(found) == 1 or shutil.which("dpkg") is None:
        return found[-1]
    versions = {deb_field(p, "Version"): p for p in found}
    newest = max(versions, key=functools.cmp_to_key(_dpkg_compare))
    return versions[newest]


def _apt_download(package: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["apt-get", "download", package],
        cwd=cache,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def fetch_debs(packages: Iterable[str], cache: Path, log=print) -> dict[str, Path]:
    """Path of each package's .deb, from the cache or `apt-get download`.

    A package that apt cannot find even with fresh lists is skipped with a warning (not
    every release has all of them); stale or missing package lists are refreshed when we
    are root and explained otherwise; no apt at all is an error that names the way out.
    """
    packages = list(packages)
    cache.mkdir(parents=True, exist_ok=True)
    debs: dict[str, Path] = {}
    missing = []
    for p in packages:
        hit = cached_deb(cache, p)
        if hit is not None:
            debs[p] = hit
        else:
            missing.append(p)
    if not missing:
        return debs
    if shutil.which("apt-get") is None:
        raise DemoCorpusError(f"apt-get not found on PATH. {_NO_APT_HINT}")
    updated = False
    skipped: list[str] = []
    lists_hint = False
    for p in missing:
        log(f"apt-get download {p}")
        res = _apt_download(p, cache)
        if res.returncode != 0 and _lists_problem(res.stderr) and not updated and _is_root():
            # Stale lists name versions the mirror no longer has (404); missing lists know
            # no package at all. As root we can refresh them, once.
            log("apt cannot fetch it; refreshing the package lists: apt-get update (as root)")
            upd = subprocess.run(
                ["apt-get", "update"], capture_output=True, text=True, check=False, timeout=1800
            )
            updated = True
            if upd.returncode != 0:
                raise DemoCorpusError(
                    f"apt-get update failed: {_first_error(upd.stderr)}\n"
                    "Check the network or the apt proxy settings, or use your own text "
                    "(python -m atom_train.corpus build, or the trainer's --data)."
                )
            res = _apt_download(p, cache)
        if res.returncode != 0:
            err = _first_error(res.stderr)
            if _network_problem(res.stderr):
                raise DemoCorpusError(
                    f"apt-get download {p} failed: {err}\nCannot reach the Debian mirror: "
                    "check the network or the apt proxy settings, or train on your own text "
                    "with --data."
                )
            lists_hint = lists_hint or (_lists_problem(res.stderr) and not _is_root())
            log(f"warning: skipping {p}: {err}")
            skipped.append(p)
            continue
        hit = cached_deb(cache, p)
        if hit is None:
            log(f"warning: skipping {p}: apt-get reported success but no .deb appeared")
            skipped.append(p)
            continue
        debs[p] = hit
    hint = (
        "apt's package lists look missing or out of date: run `sudo apt-get update` and rerun."
        if lists_hint
        else ""
    )
    if not debs:
        raise DemoCorpusError(
            f"none of the packages could be downloaded ({', '.join(skipped)}). "
            + (hint + " Or: " if hint else "")
            + _NO_APT_HINT
        )
    if hint:
        log(f"note: {hint}")
    return debs


def _first_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.startswith("E:")]
    return lines[0] if lines else (stderr.strip().splitlines() or ["unknown error"])[-1]


def _lists_problem(stderr: str) -> bool:
    return any(
        s in stderr
        for s in ("Unable to locate package", "has no installation candidate", "404", "Not Found")
    )


def _network_problem(stderr: str) -> bool:
    return any(
        s in stderr
        for s in ("Temporary failure resolving", "Could not connect", "Connection failed",
                  "Could not resolve", "Network is unreachable", "timed out")
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# The document source and the build
# --------------------------------------------------------------------------------------------


@dataclass
class PackageReport:
    name: str
    version: str
    deb: str
    deb_sha256: str
    members: int = 0
    documents: int = 0
    raw_text_bytes: int = 0  # after stripping, before language filter and dedup
    text_bytes: int = 0  # after filter and dedup (each document + its blank-line seam)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            h.update(chunk)
    return h.hexdigest()


class DebianDocuments:
    """The builder's document source: the cleaned documents of every package, in package
    order (earlier packages win duplicate paragraphs), each package's members sorted."""

    def __init__(self, packages: list[str], cache: Path, log=print) -> None:
        self.packages = packages
        self.cache = cache
        self.log = log
        self.reports: list[PackageReport] = []

    def identity(self) -> dict:
        # What decides the text, known before anything is downloaded: a rerun compares it.
        return {
            "name": "French documentation from Debian packages",
            "packages": self.packages,
            "extractor_version": EXTRACTOR_VERSION,
        }

    def documents(self) -> Iterator[str]:
        if shutil.which("dpkg-deb") is None:
            raise DemoCorpusError(f"dpkg-deb not found on PATH. {_NO_APT_HINT}")
        self.log(f"fetching {len(self.packages)} packages into {self.cache}")
        debs = fetch_debs(self.packages, self.cache, log=self.log)
        self.log("extracting text")
        dedup = Deduper()
        self.reports = []
        for name in self.packages:
            if name not in debs:
                continue
            deb = debs[name]
            rep = PackageReport(name, deb_field(deb, "Version"), deb.name, _sha256_file(deb))
            t0 = time.monotonic()
            for path, data in iter_members(deb, PACKAGES[name]):
                rep.members += 1
                text = member_to_text(path, data)
                if not text:
                    continue
                rep.raw_text_bytes += len(text.encode())
                text = clean_document(text, dedup)
                if text:
                    rep.documents += 1
                    rep.text_bytes += len(text.encode()) + 2
                    yield text
            self.reports.append(rep)
            self.log(
                f"{name} {rep.version}: {rep.members} files -> {rep.documents} documents, "
                f"{rep.text_bytes / MIB:.1f} MiB kept of {rep.raw_text_bytes / MIB:.1f} MiB "
                f"stripped ({time.monotonic() - t0:.1f} s)"
            )
        if not self.reports:
            raise DemoCorpusError("no package could be read: add packages with --packages")

    def report(self) -> dict:
        return {"packages": [r.to_dict() for r in self.reports]}


def build_options(max_bytes: int | None, shard_bytes: int, val_bytes: int) -> BuildOptions:
    """The builder's options for the demo: the builder's cleaning (a no-op on text that
    `clean_document` already normalised), documents separated by a blank line."""
    return BuildOptions(
        format="text",
        val_bytes=val_bytes,
        val_fraction=None,
        shard_bytes=shard_bytes,
        max_train_bytes=max_bytes,
    )


def _remove_old_format(out: Path, log=print) -> None:
    """Delete what this module wrote before it used the corpus builder (MANIFEST.json and
    the files it lists), so that the builder finds a folder it knows."""
    path = out / _OLD_MANIFEST
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(man, dict) or man.get("format") != _OLD_FORMAT:
        return  # on a case-insensitive file system this is the builder's manifest.json
    log(f"{out}: replacing a demo corpus of the previous layout ({_OLD_MANIFEST})")
    for entry in man.get("files", []):
        name = entry.get("file") if isinstance(entry, dict) else None
        if isinstance(name, str) and "/" not in name:
            (out / name).unlink(missing_ok=True)
    path.unlink()


def build_demo(
    out: Path,
    cache: Path,
    packages: list[str],
    max_bytes: int | None,
    shard_bytes: int,
    val_bytes: int,
    force: bool = False,
    workers: int | None = None,
    log=print,
) -> BuildResult:
    """Build (or find already built) the demo corpus in `out`."""
    _remove_old_format(out, log)
    source = DebianDocuments(packages, cache, log=log)
    return build(
        out,
        [],
        build_options(max_bytes, shard_bytes, val_bytes),
        source=source,
        force=force,
        workers=workers,
        log=log,
    )


def build_parser() -> cli.ArgumentParser:
    ap = cli.ArgumentParser(
        prog=PROG,
        description="Build a French plain-text demo corpus from Debian documentation packages "
        "(apt-get download + dpkg-deb; no root needed when apt's package lists exist).",
        epilog="Without apt, build a corpus from your own text: "
        "python -m atom_train.corpus build my_texts/ --out data/mine.",
    )
    ap.add_argument("--out", default="data/demo", help="output folder (default: data/demo)")
    ap.add_argument(
        "--cache",
        default=None,
        help="folder for downloaded .deb files (default: the folder .debs beside --out)",
    )
    ap.add_argument(
        "--packages",
        default="default",
        help="comma-separated Debian packages to read, in priority order; 'default' stands "
        "for the default set, e.g. 'default,debian-handbook' (see --list-packages)",
    )
    ap.add_argument(
        "--max-mib",
        type=float,
        default=40.0,
        help="cap on training text in MiB; 0 = no cap (default: 40)",
    )
    ap.add_argument(
        "--shard-mib", type=float, default=8.0, help="size of a training shard in MiB (default: 8)"
    )
    ap.add_argument(
        "--val-kib",
        type=int,
        default=512,
        help="size of the held-out val.txt in KiB (default: 512)",
    )
    ap.add_argument("--workers", type=int, default=None,
                    help="processes for writing the shards (default: the CPUs available)")  # fmt: skip
    ap.add_argument("--force", action="store_true", help="rebuild even if OUT is complete")
    ap.add_argument("--list-packages", action="store_true", help="list the known packages and exit")
    return ap


def _packages(spec: str) -> list[str]:
    packages: list[str] = []
    for p in (p.strip() for p in spec.split(",")):
        for name in DEFAULT_PACKAGES if p == "default" else [p] if p else []:
            if name not in packages:
                packages.append(name)
    unknown = [p for p in packages if p not in PACKAGES]
    if unknown or not packages:
        raise UserError(
            f"unknown package(s) {', '.join(unknown) or '(none given)'} in --packages; "
            f"known: {', '.join(PACKAGES)}"
        )
    return packages


def main(argv: list[str] | None = None) -> int:
    cli.set_command("demo_corpus")
    try:
        args = build_parser().parse_args(argv)
        if args.list_packages:
            for spec in PACKAGES.values():
                mark = "*" if spec.name in DEFAULT_PACKAGES else " "
                print(f"{mark} {spec.name:26s} {spec.note}")
            print("* = in the default set")
            return 0
        packages = _packages(args.packages)
        if args.shard_mib <= 0 or args.val_kib <= 0 or args.max_mib < 0:
            raise UserError("--shard-mib and --val-kib must be > 0, --max-mib >= 0")
        out = Path(args.out)
        cache = Path(args.cache) if args.cache else out.parent / ".debs"
        result = build_demo(
            out,
            cache,
            packages,
            max_bytes=int(args.max_mib * MIB) if args.max_mib else None,
            shard_bytes=int(args.shard_mib * MIB),
            val_bytes=args.val_kib * 1024,
            force=args.force,
            workers=args.workers,
            log=cli.say,
        )
    except UserError as e:
        return cli.user_error_exit(e)
    except OSError as e:
        return cli.user_error_exit(f"{e}; check that --out and --cache are writable")
    man = result.manifest
    print(summary(out, man))
    versions = ", ".join(f"{p['name']} {p['version']}" for p in man["source"]["report"]["packages"])
    print(f"  from {versions}")
    print(f"  train with: --corpus {cli.quote(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
