"""What a file's first bytes say it is (`atom_train.corpus.inputs.sniff`) at the edges of
each rule: the RIFF and ftyp containers, the two-letter magics that text can start with,
the 64 bytes below which bad UTF-8 is not called binary, the share of bad characters, a
character cut at the head's end, the size of a MIME type alone, and where a web page's root
tag is looked for."""

from __future__ import annotations

from atom_train.corpus.inputs import sniff


def test_riff_and_ftyp_containers_by_their_kind():
    assert sniff(b"RIFF\x24\x10\x00\x00WEBPVP8 ") == "webp"
    assert sniff(b"RIFF\x24\x10\x00\x00AVI LIST") == "video"
    assert sniff(b"RIFF\x24\x10\x00\x00WAVEfmt ") == "audio"
    assert sniff(b"RIFF1234 is how this note begins, then text") == "text"  # another kind
    assert sniff(b"\x00\x00\x00\x18ftypmp42") == "video"


def test_a_two_letter_magic_is_binary_only_with_binary_bytes():
    assert sniff(b"BM\x36\x00\x0c\x00\x00\x00") == "nul_bytes"
    assert sniff(b"MZ" + b"\x90\xff" * 40) == "not_utf8"
    assert sniff(b"BZh is not always bzip2\n" * 4) == "text"


def test_bad_utf8_is_binary_from_64_bytes_and_above_a_quarter_of_the_characters():
    assert sniff(b"\xff" * 63) == "text"  # too little to tell: --invalid-utf8 decides
    assert sniff(b"\xff" * 64) == "not_utf8"
    # 100 characters, 25 of them bad: a quarter is still text; 26 are not.
    assert sniff(b"\xff" * 25 + b"a" * 75) == "text"
    assert sniff(b"\xff" * 26 + b"a" * 74) == "not_utf8"
    # A character cut at the end of the head is the cut, not the file: 25 bad and the cut.
    assert sniff(b"\xff" * 25 + b"a" * 74 + b"\xc3") == "text"
    assert sniff(b"caf\xc3\xa9 " * 20) == "text"  # (valid UTF-8: no bad character)
    # Only the very last character is forgiven: a bad one just before it counts (26 bad).
    assert sniff(b"\xff" * 25 + b"a" * 73 + b"\xffa") == "not_utf8"


def test_a_mime_type_alone_is_metadata_up_to_256_bytes():
    assert sniff(b"application/epub+zip", 256) == "mime_type"
    assert sniff(b"application/epub+zip", 257) == "text"
    assert sniff(b"application/epub+zip") == "text"  # (size unknown)


def test_a_web_pages_root_is_looked_for_in_the_first_kilobyte():
    assert sniff(b"a " * 500 + b"<html lang=fr>") == "html"  # at byte 1000
    assert sniff(b"a " * 510 + b"<html lang=fr>") == "text"  # at 1020: cut at 1024
    assert sniff(b"  <?xml version='1.0'?><rss/>") == "xml"
