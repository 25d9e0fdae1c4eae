"""The HTML extraction table of docs/corpus.md, on the web pages of tests/corpus/web_pages:
the hand-written converter, trafilatura, and the other candidates where installed
(resiliparse, inscriptis: not dependencies of the project). Off by default:

    ATOM_CORPUS_LIBS_BENCH=1 python -m pytest tests/corpus/test_corpus_libraries_bench.py -s
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time

import pytest
from test_corpus_libraries import PAGES, _page, main_text_scores

from atom_train.corpus.markup import html_to_text, web_html_to_text

pytestmark = pytest.mark.skipif(
    not os.environ.get("ATOM_CORPUS_LIBS_BENCH"), reason="set ATOM_CORPUS_LIBS_BENCH=1"
)


def _candidates() -> dict:
    found = {"hand-written (html_to_text)": html_to_text, "trafilatura (adopted)": web_html_to_text}
    with contextlib.suppress(ImportError):
        extract = importlib.import_module("resiliparse.extract.html2text").extract_plain_text
        found["resiliparse, main_content"] = lambda h: extract(h, main_content=True)
    with contextlib.suppress(ImportError):
        found["inscriptis"] = importlib.import_module("inscriptis").get_text
    return found


def test_extraction_table():
    pages = sorted(PAGES.glob("*.html"))
    sources = {p: _page(p) for p in pages}
    print(f"\n{len(pages)} pages; precision / recall of the main text's words (mean), F1")
    for name, extract in _candidates().items():
        ps, rs, cookie = [], [], 0
        t0 = time.process_time()
        for page in pages:
            out = extract(sources[page])
            gold = page.with_suffix(".gold.txt").read_text(encoding="utf-8")
            neutral = page.with_suffix(".neutral.txt").read_text(encoding="utf-8")
            p, r = main_text_scores(out, gold, neutral)
            ps.append(p)
            rs.append(r)
            cookie += "cookie" in out.lower()
        cpu = time.process_time() - t0
        mp, mr = sum(ps) / len(ps), sum(rs) / len(rs)
        print(f"  {name:30s} P {mp:.3f}  R {mr:.3f}  F1 {2 * mp * mr / (mp + mr):.3f}  "
              f"lowest {min(ps):.3f} / {min(rs):.3f}  cookie banner kept {cookie} of "
              f"{len(pages)}  ({cpu * 1000:.0f} ms of CPU)")  # fmt: skip
