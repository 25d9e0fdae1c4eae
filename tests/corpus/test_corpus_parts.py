"""The corpus builder's parts, without a build: layout rules, cleaning, document pieces."""

from __future__ import annotations

import io
import tempfile
import unicodedata
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atom_train.common.cli import UserError
from atom_train.corpus import inputs as corpus_inputs
from atom_train.corpus import layout
from atom_train.corpus.language import confidence_bucket, identify, languages
from atom_train.corpus.normalize import (
    CONTROL,
    INVALID_UTF8,
    NEWLINES,
    UNICODE,
    CleanOptions,
    clean_piece,
)
from atom_train.corpus.scan import DocumentAssembler, ScanCounts, ScanOptions, Spool, content_hash

# ---- layout ----------------------------------------------------------------------------------


def test_hash_order_and_dedup_keep_the_first_copy():
    h0 = np.array([5, 1, 5, 3, 1], np.uint64)
    h1 = np.array([0, 9, 0, 2, 9], np.uint64)
    order = layout.hash_order(h0, h1)
    assert order.tolist() == [1, 4, 3, 0, 2]
    keep = layout.first_of_each_hash(h0, h1, order)
    assert order[keep].tolist() == [1, 3, 0]
    # Same first word, other second word: not a duplicate.
    assert layout.first_of_each_hash(np.array([1, 1], np.uint64), np.array([1, 2], np.uint64),
                                     np.array([0, 1])).all()  # fmt: skip


def test_val_takes_small_documents_in_order_until_the_target():
    sizes = np.array([10, 500, 20, 30, 40, 50])
    # target 100: documents over 25 bytes are left to train; 10 + 20 < 100, then no more small.
    assert layout.choose_val(sizes, 100).tolist() == [True, False, True, False, False, False]
    assert layout.choose_val(sizes, 160).tolist() == [True, False, True, True, True, False]
    assert not layout.choose_val(sizes, 0).any()
    # Nothing small enough: the first document, if it is at most half of the text.
    assert layout.choose_val(np.array([300, 400, 500]), 40).tolist() == [True, False, False]
    assert not layout.choose_val(np.array([900, 100]), 40).any()


def test_val_target():
    assert layout.val_target(1000, None, 0.1) == 100
    assert layout.val_target(1000, 300, None) == 300
    assert layout.val_target(1000, None, None) == 0
    with pytest.raises(UserError, match=r"--val-bytes 600 .* more than half"):
        layout.val_target(1000, 600, None)


def test_shards_fill_to_the_budget_and_isolate_big_documents():
    sizes = np.array([40, 40, 30, 250, 10, 90, 10, 100])
    ranges = layout.shard_ranges(sizes, 100)
    assert ranges == [(0, 2), (2, 3), (3, 4), (4, 6), (6, 7), (7, 8)]
    for a, b in ranges:
        assert sizes[a:b].sum() <= 100 or b - a == 1
    assert layout.shard_ranges(np.array([5] * 10), 1000) == [(0, 10)]
    assert layout.cap_prefix(sizes, 100) == 2 and layout.cap_prefix(sizes, None) == 8


def test_shard_names_sort_as_numbers():
    assert layout.shard_names(2) == ["train-000.txt", "train-001.txt"]
    names = layout.shard_names(1001)
    assert names[-1] == "train-1000.txt" and names == sorted(names)


# ---- cleaning --------------------------------------------------------------------------------


def test_clean_piece_steps_and_flags():
    o = CleanOptions()
    assert clean_piece(b"plain text\n", o) == ("plain text\n", b"plain text\n", 0)
    text, data, flags = clean_piece(b"a\r\nb\rc\x00\x1b\x7fd", o)
    assert text == "a\nb\ncd" and flags == NEWLINES | CONTROL
    text, data, flags = clean_piece("e\u0301t\u00e9 \u0085x \u00ab".encode(), o)
    assert text == "\u00e9t\u00e9 x \u00ab" and flags == UNICODE | CONTROL and data == text.encode()
    text, _, flags = clean_piece(b"caf\xe9", o)
    assert text == "caf\ufffd" and flags == INVALID_UTF8
    assert clean_piece(b"caf\xe9", CleanOptions(invalid_utf8="drop")) is None
    assert clean_piece(b"caf\xe9 \x81", CleanOptions(invalid_utf8="cp1252"))[0] == "café "
    keep = CleanOptions(unicode="none", newlines="keep", control="keep")
    assert clean_piece(b"e\xcc\x81\r\n\x07", keep) == ("e\u0301\r\n\x07", b"e\xcc\x81\r\n\x07", 0)
    assert clean_piece("ﬁ".encode(), CleanOptions(unicode="NFKC"))[0] == "fi"


def test_language_identifier():
    assert identify("Le fichier est ouvert dans une fenêtre et il est lu.")[0] == "fr"
    lang, conf = identify("The file is opened in a window and it is read by the parser.")
    assert lang == "en" and 0.5 < conf <= 1.0
    # French's neighbours are told from it.
    assert identify("El archivo se abre en una ventana y el programa lo lee.")[0] == "es"
    assert identify("Il file viene aperto in una finestra e letto dal programma.")[0] == "it"
    assert identify("El fitxer s'obre en una finestra i el programa el llegeix.")[0] == "ca"
    assert {"fr", "en", "ca", "oc", "br"} <= set(languages())
    assert [confidence_bucket(c) for c in (0.1, 0.5, 0.93, 1.0)] == [
        "0.00-0.50", "0.50-0.80", "0.90-0.95", "0.99-1.00"]  # fmt: skip


def _assemble(pieces, options: ScanOptions | None = None) -> tuple[bytes, bytes, ScanCounts]:
    """(spooled bytes, records, counts) of documents given as (piece, ends) pairs."""
    options = options or ScanOptions()
    with tempfile.TemporaryDirectory() as d:
        spool = Spool(Path(d) / "s")
        counts = ScanCounts()
        asm = DocumentAssembler(spool, options, counts)
        for piece, ends in pieces:
            asm.add(piece)
            if ends:
                asm.end()
        spool.close()
        return (Path(d) / "s").read_bytes(), bytes(asm.records), counts


def test_document_ends_are_trimmed_and_counted():
    data, records, counts = _assemble([(b"\n \n  indented\n\n", True), (b" \n\t", True)])
    assert data == b"  indented"
    assert records[:16] == content_hash(b"  indented")
    assert int.from_bytes(records[16:24], "little") == 10
    assert counts.dropped["empty"] == 1 and counts.documents_kept == 1
    _, _, counts = _assemble([(b"short", True)], ScanOptions(min_chars=6))
    assert counts.dropped["too_short"] == 1
    # A document dropped after some of it was spooled leaves nothing behind.
    data, _, counts = _assemble([(b"ok\n", False), (b"\xff", True), (b"next", True)],
                                ScanOptions(clean=CleanOptions(invalid_utf8="drop")))  # fmt: skip
    assert data == b"next" and counts.dropped["invalid_utf8"] == 1


_ALPHABET = ["a", "b", " ", "\t", "\n", "\r", "\r\n", "é", "e\u0301", "\u0301", "\x07", "\u0085",
             "\n\n", " \n \n", "x" * 7, "ﬁ", "日本", "\u1100", "\u1161", "\u212b", "\ud800"]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(st.sampled_from(_ALPHABET), max_size=80),
    bad=st.booleans(),
    piece=st.integers(4, 40),
    split=st.sampled_from(corpus_inputs.SPLIT_CHOICES),
)
def test_pieces_clean_like_the_whole_document(parts, bad, piece, split):
    raw = "".join(parts).encode("utf-8", "surrogatepass") + (b"\xe2\x82" if bad else b"")
    f = corpus_inputs.InputFile("/x.txt", len(raw), 0, None, "text")

    def pieces(size):
        # (Whether such bytes are text at all is `sniff`'s question, tested on its own.)
        with mock.patch.object(corpus_inputs, "PIECE_BYTES", size), \
             mock.patch.object(corpus_inputs, "open_input", lambda _: io.BytesIO(raw)), \
             mock.patch.object(corpus_inputs, "sniff", lambda *_: "text"):  # fmt: skip
            return list(corpus_inputs.iter_pieces(f, split_on=split, bad_record=print))

    whole = pieces(1 << 20)
    small = pieces(piece)
    assert _assemble(small) == _assemble(whole)
    if split == "file":
        assert len(whole) == 1
        text = _assemble(whole)[0].decode()
        assert text == unicodedata.normalize("NFC", text) and "\r" not in text


def test_safe_cut():
    assert corpus_inputs.safe_cut(b"abc\r\ndef") == 3  # before the CRLF, not inside it
    assert corpus_inputs.safe_cut(b"\xc3\xa9\xc3\xa9ab\xc3\xa9") == 5  # before an ASCII character
    assert corpus_inputs.safe_cut("ééé".encode()) == 4  # a character boundary
    assert corpus_inputs.safe_cut("éé\u0301".encode()) == 2  # never before a combining mark
    assert corpus_inputs.safe_cut("\u1100\u1161".encode()) == 0  # Hangul jamo compose: nowhere
    assert corpus_inputs.safe_cut(b"\xc3\xa9\xe2\x82") == 0  # not inside a bad sequence
    assert corpus_inputs.safe_cut("\u1100\x07\u1161".encode()) == 0  # \x07 goes: they compose


# ---- the layout rules at their boundaries (what make mutants found unheld) -----------------


def test_of_equal_hashes_only_the_first_stays():
    h0, h1 = np.array([7, 7], np.uint64), np.array([1, 1], np.uint64)
    assert layout.first_of_each_hash(h0, h1, np.array([0, 1])).tolist() == [True, False]
    assert layout.first_of_each_hash(h0[:1], h1[:1], np.array([0])).tolist() == [True]


def test_val_may_be_half_of_the_text_and_no_more():
    assert layout.val_target(10, 5, None) == 5 and layout.val_target(10, None, 0.4) == 4
    assert layout.val_target(10, None, None) == 0
    with pytest.raises(UserError) as e:
        layout.val_target(10_000, 6_000, None)
    assert str(e.value) == (
        "--val-bytes 6,000 asks for 6,000 bytes of val, more than half of the 10,000 bytes "
        "of text kept: lower it"
    )
    with pytest.raises(UserError) as e:
        layout.val_target(10, None, 0.6)
    assert str(e.value).startswith("--val-fraction 0.6 asks for 6 bytes of val, more than half")


@pytest.mark.parametrize(
    ("sizes", "target", "val"),
    [
        ([1, 5], 0, [False, False]),  # no val asked for
        ([1, 5], 1, [True, False]),
        ([1], 1, [True]),
        ([2, 2, 10], 4, [True, False, False]),  # none small (<= 1): the first, as it fits
        ([1] * 8, 3, [True] * 3 + [False] * 5),  # small ones in order up to the target
        ([1, 100, 1, 1], 2, [True, False, True, False]),  # a large one is passed over
        ([1, 1, 1], 2, [True, True, False]),
        ([5, 5], 1, [True, False]),  # none small: the first is at most half: val alone
        ([6, 5], 1, [False, False]),  # ... and more than half: no val
    ],
)
def test_val_is_the_small_documents_in_hash_order_up_to_the_target(sizes, target, val):
    got = layout.choose_val(np.array(sizes), target)
    assert got.dtype == bool and got.tolist() == val


def test_the_cap_keeps_a_document_that_ends_exactly_on_it():
    assert layout.cap_prefix(np.array([3, 3, 3]), 6) == 2
    assert layout.cap_prefix(np.array([3, 3, 3]), 5) == 1
    assert layout.cap_prefix(np.array([3, 3, 3]), None) == 3


def test_the_first_shard_is_measured_from_the_first_byte():
    assert layout.shard_ranges(np.array([5, 6]), 10) == [(0, 1), (1, 2)]
    assert layout.shard_ranges(np.array([5, 5, 5]), 10) == [(0, 2), (2, 3)]
    assert layout.shard_ranges(np.array([30, 1]), 10) == [(0, 1), (1, 2)]  # alone if larger


class _CountingStream:
    """An input stream that records what is asked of it: each read's size (-1: all that is
    left) and each line iterated."""

    def __init__(self, stream) -> None:
        self.stream, self.reads, self.lines = stream, [], []

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        self.reads.append((n, len(data)))
        return data

    def peek(self, n: int) -> bytes:
        return self.stream.peek(n)

    def __iter__(self):
        for line in self.stream:
            self.lines.append(len(line))
            yield line

    def close(self) -> None:
        self.stream.close()


def _read_counted(monkeypatch, f: corpus_inputs.InputFile):
    """The pieces of `f` and its stream, counted (`_CountingStream`)."""
    opened = []
    real = corpus_inputs.open_input

    def counting(x):
        opened.append(_CountingStream(real(x)))
        return opened[-1]

    monkeypatch.setattr(corpus_inputs, "open_input", counting)
    pieces = list(corpus_inputs.iter_pieces(f, bad_record=print))
    return pieces, opened[0]


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_large_text_is_read_in_pieces_of_a_mebibyte(tmp_path, monkeypatch, compression):
    """What docs/corpus.md promises of the text path, counted: a 6 MB document (one file, a
    line longer than a piece in it too) is read in reads of PIECE_BYTES, never all at once,
    and handed to the cleaning in pieces of at most two of them: memory does not grow with
    the bytes of a file, plain or compressed."""
    import gzip

    P = corpus_inputs.PIECE_BYTES
    line = b"a line of text, " * 40 + b"\n"
    data = line * (3 * P // len(line)) + b"x" * (P + P // 2) + b"\n" + line * (P // len(line))
    path = tmp_path / ("doc.txt.gz" if compression else "doc.txt")
    path.write_bytes(gzip.compress(data, 1) if compression else data)
    (f,) = corpus_inputs.find_inputs([str(path)])
    assert f.compression == compression
    pieces, stream = _read_counted(monkeypatch, f)
    assert b"".join(p for p, _ in pieces) == data and [e for _, e in pieces][-1]
    assert {n for n, _ in stream.reads} == {P}  # every read a piece's size (none of -1)
    assert sum(got for _, got in stream.reads) == len(data) and len(stream.reads) == 7
    assert len(pieces) >= 5 and max(len(p) for p, _ in pieces) <= 2 * P


def test_jsonl_is_read_a_line_at_a_time_and_a_web_page_whole(tmp_path, monkeypatch):
    """The two ways a file is read other than in pieces: a JSONL record is one line (its
    JSON is parsed whole), and an HTML page is read whole, as trafilatura parses the whole
    page (its memory: about 57 bytes per byte of the page, docs/corpus.md)."""
    records = tmp_path / "r.jsonl"
    records.write_text("".join(f'{{"text": "record {i}"}}\n' for i in range(1000)))
    (f,) = corpus_inputs.find_inputs([str(records)])
    pieces, stream = _read_counted(monkeypatch, f)
    assert len(pieces) == 1000 and len(stream.lines) == 1000 and stream.reads == []

    pytest.importorskip("trafilatura")
    page = tmp_path / "p.html"
    body = "".join(f"<p>Paragraph {i} of a page about nothing much at all.</p>" for i in range(500))
    page.write_text(f"<!doctype html><html><body><article>{body}</article></body></html>")
    (f,) = corpus_inputs.find_inputs([str(page)])
    pieces, stream = _read_counted(monkeypatch, f)
    assert stream.reads == [(-1, page.stat().st_size)]
    assert len(pieces) == 1 and b"Paragraph 499" in pieces[0][0]
