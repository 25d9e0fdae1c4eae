"""The French demo corpus: markup strippers, the paragraph filter, the build through the
corpus builder, the apt paths.

No network: packages are small .deb files built here with dpkg-deb (skipped without it), and
apt-get is replaced by scripts on PATH.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from atom_train import demo_corpus as dc
from atom_train.corpus import markup as mt
from atom_train.corpus.manifest import open_corpus_dir
from atom_train.corpus.normalize import decode_bytes

needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")


# ------------------------------------------------------------------------------ HTML


def test_html_entities_accents_and_paragraphs():
    text = mt.html_to_text(
        "<html><head><title>Titre</title><style>p{color:red}</style></head><body>"
        "<h1>R&eacute;sum&#233;</h1><p>Caf&eacute; &amp; cr\u00e8me&nbsp;: "
        "l&rsquo;&eacute;t&eacute;\n   est   l&#224;.</p>"
        "<script>var x = '<p>non</p>';</script>"
        "<p>Deuxi\u00e8me <b>paragraphe</b>.</p></body></html>"
    )
    assert text == "Résumé\n\nCafé & crème : l’été est là.\n\nDeuxième paragraphe."


def test_html_drops_navigation_code_and_keeps_list_lines():
    text = mt.html_to_text(
        '<div class="navheader"><a href="a.html">Précédent</a> <div>Suivant</div></div>'
        '<nav>menu</nav><div id="toc"><ul><li>Chapitre 1</li></ul></div>'
        "<p>Texte.</p><pre>code --option\n  ligne</pre>"
        "<ul><li>un<li>deux</ul>"
        '<div class="navfooter">Sommaire</div><p>Fin<br>ligne</p>'
    )
    assert text == "Texte.\n\n- un\n- deux\n\nFin\nligne"


def test_html_unclosed_or_void_skip_markers_do_not_swallow_the_page():
    text = mt.html_to_text(
        '<body class="book toc2"><input class="search" type="search">'
        '<p class="toc">garde<p>Suite du texte.</body>'
    )
    assert text == "garde\n\nSuite du texte."


def test_html_charset_latin1_is_read_as_cp1252():
    page = '<meta charset="iso-8859-1"><p>L\x92\xe9t\xe9 \xab ici \xbb</p>'.encode("latin-1")
    assert dc.member_to_text("usr/share/doc/x/a.html", page) == "L’été « ici »"


def test_mallard_page_keeps_text_and_drops_info():
    page = (
        '<page xmlns="http://projectmallard.org/1.0/"><info><credit>Auteur</credit>'
        "<desc>Résumé de lien</desc></info><title>Titre</title>"
        "<p>Un paragraphe.</p><steps><item><p>Étape un</p></item></steps></page>"
    )
    assert dc.member_to_text("usr/share/help/fr/x/a.page", page.encode()) == (
        "Titre\n\nUn paragraphe.\n\nÉtape un"
    )


# ------------------------------------------------------------------------------ troff

MAN_PAGE = r""".\" -*- coding: UTF-8 -*-
.\" comment line
.TH LS 1 "2022" "GNU" "Commandes"
.SH NOM
ls \- afficher le contenu d'un r\('epertoire
.SH DESCRIPTION
Afficher les \fBFICHIERs\fP \(em tri\('es
par d\('efaut. \" inline comment
.PP
Voir
.BR dir (1)
et \*(lqcoreutils\*(rq.
.TP
\fB\-a\fR, \fB\-\-all\fR
inclure les entr\('ees cach\('ees
.nf
exemple de code
  ignor\('e
.fi
.SS "Sous-section"
Texte\ ins\('ecable et \[u00E7]a.
.SH TRADUCTION
La traduction fran\(,caise de cette page a \('et\('e cr\('e\('ee par des gens.
.SS Autre
encore des cr\('edits
"""


def test_troff_to_text():
    assert mt.troff_to_text(MAN_PAGE) == (
        "NOM\n\nls - afficher le contenu d'un répertoire\n\n"
        "DESCRIPTION\n\nAfficher les FICHIERs — triés par défaut.\n\n"
        "Voir dir(1) et “coreutils”.\n\n"
        "-a, --all\ninclure les entrées cachées\n\n"
        "Sous-section\n\nTexte insécable et ça."
    )


def test_troff_redirects_and_mdoc_are_skipped():
    assert mt.troff_to_text(".so man1/ls.1\n") == ""
    assert mt.troff_to_text(".Dd January 1, 2020\n.Dt LS 1\n.Sh NAME\ntext\n") == ""


def test_latin1_man_page_gives_valid_utf8():
    src = '.\\" -*- coding: ISO-8859-1 -*-\n.SH NOM\nd\xe9j\xe0 \xab vu \xbb\n'.encode("latin-1")
    text = dc.member_to_text("usr/share/man/fr/man1/x.1.gz", gzip.compress(src))
    assert text == "NOM\n\ndéjà « vu »"
    text.encode("utf-8")  # a str from valid decoding: always encodable
    assert decode_bytes(b"\xff\xfe na\xefve") == "ÿþ naïve"


# ------------------------------------------------------------------------------ LyX

# LyX keeps the space before an inset at the end of the text line (and a continuation
# line starts with its space): the lines concatenate as they are.
LYX_DOC = "\n".join(
    [
        "#LyX 2.3 created this file.",
        r"\lyxformat 544",
        r"\begin_document",
        r"\begin_header",
        r"\textclass article",
        r"\end_header",
        r"\begin_body",
        r"\begin_layout Section",
        r"Bienvenue dans \SpecialChar LyX",
        " !",
        r"\end_layout",
        "",
        r"\begin_layout Standard",
        "Un texte ",
        r"\begin_inset Quotes cld",
        r"\end_inset",
        "",
        "cité",
        r"\begin_inset Quotes crd",
        r"\end_inset",
        "",
        " avec une formule ",
        r"\begin_inset Formula $x^{2}$",
        r"\end_inset",
        "",
        " et du ",
        r"\begin_inset Flex Code",
        "status collapsed",
        "",
        r"\begin_layout Plain Layout",
        "code",
        r"\end_layout",
        "",
        r"\end_inset",
        "",
        ", puis ",
        r"\backslash",
        " fin.",
        r"\end_layout",
        "",
        r"\begin_layout Itemize",
        "élément",
        r"\end_layout",
        "",
        r"\end_body",
        r"\end_document",
    ]
)


def test_lyx_to_text():
    assert mt.lyx_to_text(LYX_DOC) == (
        "Bienvenue dans LyX !\n\nUn texte « cité » avec une formule et du code, puis \\ fin."
        "\n\n- élément"
    )


# ------------------------------------------------------------------------------ filters, dedup


def test_clean_document_dedups_and_filters():
    dedup = dc.Deduper()
    long_fr = "Ceci est un paragraphe assez long en français, avec des accents : é, è, à."
    doc1 = "\n\n".join(["Titre", long_fr, "The file is opened and it is read by the parser."])
    doc1 += "\n\n" + "Un autre paragraphe unique au premier document, " * 8
    assert dc.clean_document(doc1, dedup) == "\n\n".join(
        ["Titre", long_fr, ("Un autre paragraphe unique au premier document, " * 8).strip()]
    )
    # The same long paragraph again: dropped, and then too little is left for a document.
    assert dc.clean_document("Titre\n\n" + long_fr, dedup) == ""
    assert dedup.dropped == 1
    # Tables of numbers and code are not prose.
    assert dc.clean_document("12 34 56 78 90 12 34 56 78 90 " * 20, dc.Deduper()) == ""


# ------------------------------------------------------------------------------ end to end


def _make_deb(tmp: Path, cache: Path, name: str, files: dict[str, bytes]) -> Path:
    root = tmp / f"root-{name}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0-1\nArchitecture: all\n"
        "Maintainer: Test <test@example.org>\nDescription: test package\n"
    )
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    cache.mkdir(parents=True, exist_ok=True)
    deb = cache / f"{name}_1.0-1_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb


def _french(i: int, n: int = 6) -> str:
    return " ".join(
        f"La phrase {j} du document {i} explique où se trouve le fichier et à quoi il sert."
        for j in range(n)
    )


SHARED = "Ce paragraphe commun revient sur toutes les pages de la FAQ, comme un pied de page."


@needs_dpkg
def test_build_end_to_end_and_cache(tmp_path, capsys):
    cache = tmp_path / "debs"
    man = {
        f"usr/share/man/fr/man1/cmd{i}.1.gz": gzip.compress(
            f".TH CMD{i} 1\n.SH NOM\ncmd{i} \\- commande\n.SH DESCRIPTION\n{_french(i)}\n".encode()
        )
        for i in range(12)
    }
    man["usr/share/man/fr/man1/lien.1.gz"] = gzip.compress(b".so man1/cmd0.1\n")
    man["usr/share/doc/manpages-fr/copyright"] = b"not a document"
    _make_deb(tmp_path, cache, "manpages-fr", man)
    html = {
        f"usr/share/doc/debian/FAQ/fr/p{i}.html": (
            f"<html><body><div class='navheader'>Précédent</div><p>{_french(100 + i)}</p>"
            f"<p>{SHARED}</p></body></html>"  # on every page: kept once
        ).encode()
        for i in range(6)
    }
    _make_deb(tmp_path, cache, "debian-faq-fr", html)

    out = tmp_path / "demo"
    # The layout this module wrote before the corpus builder: replaced, not refused.
    out.mkdir()
    (out / "train-000.txt").write_text("old")
    (out / "MANIFEST.json").write_text(
        json.dumps({"format": "atom-demo-corpus", "files": [{"file": "train-000.txt"}]})
    )
    args = ["--out", str(out), "--cache", str(cache), "--packages", "manpages-fr,debian-faq-fr"]
    args += ["--shard-mib", str(3000 / dc.MIB), "--val-kib", "2", "--workers", "1"]
    assert dc.main(args) == 0
    first, log = capsys.readouterr()
    assert "train-000.txt" in first and "non-ASCII" in first and "manpages-fr 1.0-1" in first
    assert "train with: --corpus" in first  # (its val is held out: not a --data glob)
    # Progress goes to stderr in the commands' style.
    assert log and all(line.startswith("[demo_corpus] ") for line in log.splitlines()), log
    assert not (out / "MANIFEST.json").exists()
    corpus = open_corpus_dir(out)
    man_json = corpus.manifest
    report = man_json["source"]["report"]["packages"]
    assert [p["name"] for p in report] == ["manpages-fr", "debian-faq-fr"]
    assert man_json["source"]["identity"]["packages"] == ["manpages-fr", "debian-faq-fr"]
    assert man_json["counts"]["train_documents"] + man_json["counts"]["val_documents"] == 18
    files = [*corpus.train, corpus.val]
    assert len(files) >= 3
    everything = b"".join(p.read_bytes() for p in files)
    everything.decode("utf-8")
    assert everything.count(SHARED.encode()) == 1
    assert b"Pr\xc3\xa9c\xc3\xa9dent" not in everything  # navigation dropped
    snapshot = {p.name: p.read_bytes() for p in out.iterdir()}

    # Complete: reused as is.
    assert dc.main(args) == 0
    assert "already built" in capsys.readouterr().err
    # A shard that changed size is noticed; --force rebuilds, byte for byte the same.
    (out / "val.txt").write_bytes(snapshot["val.txt"][:-1])
    assert dc.main(args) == 2
    assert "val.txt" in capsys.readouterr().err
    assert dc.main([*args, "--force"]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == snapshot
    # Other options into the same folder are refused with the fix.
    assert dc.main([*args, "--val-kib", "3"]) == 2
    assert "--force" in capsys.readouterr().err


# ------------------------------------------------------------------------------ apt paths


def _fake_bin(tmp: Path, scripts: dict[str, str]) -> Path:
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = bindir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bindir


def test_no_apt_is_a_clear_error_without_traceback(tmp_path):
    scripts = {}
    if shutil.which("dpkg-deb"):
        scripts["dpkg-deb"] = f'exec {shutil.which("dpkg-deb")} "$@"\n'
    bindir = _fake_bin(tmp_path, scripts)  # a PATH with no apt-get
    env = {**os.environ, "PATH": str(bindir)}
    res = subprocess.run(
        [sys.executable, "-m", "atom_train.demo_corpus", "--out", str(tmp_path / "demo")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert "not found on PATH" in res.stderr
    assert "Debian or Ubuntu" in res.stderr and "atom_train.corpus build" in res.stderr


def test_stale_lists_without_root_say_run_apt_get_update(tmp_path, monkeypatch):
    bindir = _fake_bin(
        tmp_path, {"apt-get": 'echo "E: Unable to locate package $2" >&2\nexit 100\n'}
    )
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(dc, "_is_root", lambda: False)
    with pytest.raises(dc.DemoCorpusError, match="sudo apt-get update"):
        dc.fetch_debs(["manpages-fr"], tmp_path / "cache", log=lambda *_: None)


def test_stale_lists_as_root_run_apt_get_update_once(tmp_path, monkeypatch):
    marker = tmp_path / "updated"
    bindir = _fake_bin(
        tmp_path,
        {
            "apt-get": f"""
if [ "$1" = update ]; then echo x >> "{marker}"; exit 0; fi
if [ -e "{marker}" ]; then echo deb > "$2_1.0_all.deb"; exit 0; fi
echo "E: Failed to fetch http://deb.debian.org/x.deb  404  Not Found" >&2; exit 100
"""
        },
    )
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(dc, "_is_root", lambda: True)
    logs: list[str] = []
    debs = dc.fetch_debs(["manpages-fr", "debian-faq-fr"], tmp_path / "cache", log=logs.append)
    assert sorted(debs) == ["debian-faq-fr", "manpages-fr"]
    assert marker.read_text() == "x\n"  # one update for the whole run
    assert any("apt-get update" in line for line in logs)


def test_network_failure_is_explained(tmp_path, monkeypatch):
    bindir = _fake_bin(
        tmp_path,
        {
            "apt-get": "echo \"E: Failed to fetch x  Temporary failure resolving 'deb'\" >&2\nexit 100\n"
        },
    )
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(dc.DemoCorpusError, match="network"):
        dc.fetch_debs(["manpages-fr"], tmp_path / "cache", log=lambda *_: None)


def test_unknown_package_is_a_usage_error(capsys):
    assert dc.main(["--packages", "default,no-such-doc-fr", "--out", "/nonexistent"]) == 2
    assert "no-such-doc-fr" in capsys.readouterr().err
