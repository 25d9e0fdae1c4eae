"""The corpus builder's first pass document by document (`atom_train.corpus.scan.
DocumentAssembler`), in process: what a kept document's spooled text is (blank lines at its
start and white space at its end stripped, white space between pieces kept only when text
follows), its record (hash and size) and signature, the length filter counted in characters,
each drop reason, the cleaning counts, the language filter, and a rollback."""

from __future__ import annotations

import numpy as np
import pytest

from atom_train.corpus.neardup import SIG_BYTES, Signer
from atom_train.corpus.normalize import CleanOptions
from atom_train.corpus.scan import (
    RECORD,
    DocumentAssembler,
    ScanCounts,
    ScanOptions,
    Spool,
    content_hash,
)


def _assemble(tmp_path, docs, **options):
    spool, sigs, counts = Spool(tmp_path / "s.txt"), Spool(tmp_path / "s.sig"), ScanCounts()
    asm = DocumentAssembler(spool, ScanOptions(signatures=True, **options), counts, sigs)
    for doc in docs:
        for piece in doc:
            asm.add(piece)
        asm.end()
    spool.close()
    sigs.close()
    return asm, counts, (tmp_path / "s.txt").read_bytes(), (tmp_path / "s.sig").read_bytes()


def test_kept_documents_their_text_records_and_signatures(tmp_path):
    docs = [
        ["\n \n  Bonjour", b" le\r\nmonde  \n", "  \n", "Fin.\x07  \n\n"],  # kept, cleaned
        ["abcd"],  # 4 characters: too short
        ["   \n", "\n"],  # white space only: empty
        [b"ab\xffcdef", "more"],  # not UTF-8, dropped whole
        ["abcde"],  # 5 characters: kept
        ["\u00e9" * 4],  # 4 characters (8 bytes): too short
        ["\u00e9" * 5],  # 5 characters: kept
        ["ab", " \n", "c"],  # 5 characters with the white space between: kept
        ["abcd  \n"],  # 4 characters and trailing white space: too short
        ["\n\nabcd"],  # blank lines and 4 characters: too short
    ]
    asm, counts, text, sigs = _assemble(tmp_path, docs, min_chars=5,
                                        clean=CleanOptions(invalid_utf8="drop"))  # fmt: skip
    kept = [b"  Bonjour le\nmonde  \n  \nFin.", b"abcde", "\u00e9".encode() * 5, b"ab \nc"]
    assert text == b"".join(kept)
    records = np.frombuffer(bytes(asm.records), RECORD)
    want = b"".join(content_hash(k) + len(k).to_bytes(8, "little") for k in kept)
    assert bytes(asm.records) == want and list(records["size"]) == [len(k) for k in kept]
    signers = []
    for k in kept[:3]:  # (each a signature of its whole text)
        s = Signer()
        s.add(k.decode())
        signers.append(s.digest(content_hash(k)))
    assert sigs[: 3 * SIG_BYTES] == b"".join(signers) and len(sigs) == 4 * SIG_BYTES
    assert (counts.documents_read, counts.documents_kept) == (10, 4)
    assert counts.bytes_kept == sum(map(len, kept)) == 48
    assert counts.dropped == {"empty": 1, "too_short": 4, "invalid_utf8": 1, "language": 0}
    # Of the kept documents, the first had a CRLF and a control character changed.
    assert counts.changed == {"invalid_utf8": 0, "newlines": 1, "unicode": 0, "control": 1}


def test_each_kept_documents_cleaning_is_counted_once(tmp_path):
    docs = [["a\r\nb", "c\rd"], ["e\x07f", "g\x08h"], ["plain"], ["x\r\ny\x01z"]]
    _, counts, text, _ = _assemble(tmp_path, docs)
    assert text == b"a\nbc\ndefghplainx\nyz"
    assert counts.changed == {"invalid_utf8": 0, "newlines": 2, "unicode": 0, "control": 2}


def test_the_spool_and_records_after_a_rollback(tmp_path):
    spool, sigs, counts = Spool(tmp_path / "s.txt"), Spool(tmp_path / "s.sig"), ScanCounts()
    asm = DocumentAssembler(spool, ScanOptions(signatures=True), counts, sigs)
    for doc in ("first", "second", "third"):
        asm.add(doc)
        asm.end()
    asm.add("half a docu")  # (cut by the rollback)
    asm.rollback(len("first"), 1)
    asm.add("fourth")
    asm.end()
    spool.close()
    sigs.close()
    assert (tmp_path / "s.txt").read_bytes() == b"firstfourth"
    assert bytes(asm.records) == b"".join(
        content_hash(k) + len(k).to_bytes(8, "little") for k in (b"first", b"fourth")
    )
    assert (tmp_path / "s.sig").stat().st_size == 2 * SIG_BYTES


def test_documents_of_another_language_or_below_the_confidence_are_dropped(tmp_path):
    fr = "Bonjour tout le monde, nous allons au marché ce matin pour acheter du pain."
    en = "Good morning everyone, we are going to the market this morning to buy bread."
    docs = [[fr[:30], fr[30:]], [en]]
    _, counts, text, _ = _assemble(tmp_path, docs, language=("fr",), language_threshold=0.5)
    assert text == fr.encode()
    assert counts.dropped["language"] == 1 and counts.documents_kept == 1
    assert counts.language_detected == {"fr": 1, "en": 1}
    assert sum(counts.language_confidence.values()) == 2
    _, counts, text, _ = _assemble(tmp_path, [[fr]], language=("fr",), language_threshold=1.01)
    assert text == b"" and counts.dropped["language"] == 1  # (never that sure)
    _, counts, text, _ = _assemble(tmp_path, [[fr], [en]])  # no --language: all kept
    assert counts.documents_kept == 2 and counts.language_detected == {}


@pytest.mark.parametrize("invalid", ["replace", "cp1252"])
def test_bad_bytes_are_kept_repaired_unless_asked_to_drop(tmp_path, invalid):
    _, counts, text, _ = _assemble(tmp_path, [[b"caf\xe9 au lait"]],
                                   clean=CleanOptions(invalid_utf8=invalid))  # fmt: skip
    assert counts.documents_kept == 1 and counts.changed["invalid_utf8"] == 1
    assert text == ("caf\ufffd au lait" if invalid == "replace" else "café au lait").encode()


def test_the_language_is_judged_on_the_documents_first_characters(tmp_path, monkeypatch):
    """What the identifier is given: the first SAMPLE_CHARS characters of the document's
    text, across its pieces and no more; a confidence exactly at the threshold is enough,
    and each document's confidence is counted in its bucket (a stand-in identifier gives
    the answer, so that only the assembler is measured)."""
    from atom_train.corpus import scan
    from atom_train.corpus.language import SAMPLE_CHARS, confidence_bucket

    seen: list[str] = []

    def identify(text: str) -> tuple[str, float]:
        seen.append(text)
        return ("fr", 0.75) if text.startswith(("a", "x")) else ("en", 0.75)

    monkeypatch.setattr(scan, "identify", identify)
    S = SAMPLE_CHARS
    docs = [["a" * (S + 5)], ["x" * (S - 10), "y" * 20, "z" * 5], ["b" * 10]]
    _, counts, text, _ = _assemble(tmp_path, docs, language=("fr",), language_threshold=0.75)
    assert seen == ["a" * S, "x" * (S - 10) + "y" * 10, "b" * 10]
    assert text == b"".join("".join(d).encode() for d in docs[:2])  # (at the threshold: kept)
    assert counts.language_detected == {"fr": 2, "en": 1}
    assert counts.language_confidence == {confidence_bucket(0.75): 3}
    _, counts, text, _ = _assemble(tmp_path, docs[:1], language=("fr",), language_threshold=0.76)
    assert text == b"" and counts.dropped["language"] == 1


def test_a_kept_document_without_words_is_signed_by_its_content(tmp_path):
    """A document with no word to shingle (punctuation only) is near nothing but itself: its
    signature comes from its content hash."""
    kept = b"... !!! ???"
    _, counts, _, sigs = _assemble(tmp_path, [[kept.decode()]])
    s = Signer()
    s.add(kept.decode())
    assert counts.documents_kept == 1 and sigs == s.digest(content_hash(kept))
