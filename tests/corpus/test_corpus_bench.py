"""The corpus builder at scale: memory and throughput on generated input (off by default).

    ATOM_CORPUS_BENCH_MB=2000 .venv/bin/python -m pytest tests/corpus/test_corpus_bench.py -s

generates about that many MB of mixed input under a temporary folder (JSONL plain and
gzip-compressed, one "book" per plain, .gz and .xz file, 1% exact duplicates, French text
with accents), builds it with the CLI in a subprocess on all CPUs, prints the figures and
checks that peak resident memory stays under 1 GiB in every process. ATOM_CORPUS_BENCH_DIR
keeps the input and output in a folder of your choice (reused when present).
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO

MB = 10**6
_VOCABULARY = (
    "le la les un une des et est dans pour avec sur par pas plus été où déjà élève "
    "maison rue fenêtre porte jardin soleil nuit matin ville chemin rivière forêt "
    "regarda marchait pensait disait voulait pouvait devait savait ouvrit ferma"
)
_WORDS = _VOCABULARY.split()


def _sentences(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 22))]
        out.append(words[0].capitalize() + " " + " ".join(words[1:]) + rng.choice(".!?."))
    return out


def generate(root: Path, total_mb: int, seed: int = 0) -> None:
    """About `total_mb` MB of input under `root`: 80% JSONL records of 150-1,500 bytes (half
    in .jsonl.gz), 20% "books" of about 100 KB as plain, .gz and .xz files."""
    rng = random.Random(seed)
    pool = _sentences(rng, 20000)
    root.mkdir(parents=True, exist_ok=True)
    doc_id = 0

    def doc(target: int) -> str:
        nonlocal doc_id
        doc_id += 1
        parts, size = [f"[{doc_id}]"], 0
        while size < target:
            s = rng.choice(pool)
            parts.append(s)
            size += len(s) + 1
        return " ".join(parts)

    jsonl_bytes = int(total_mb * MB * 0.8)
    per_file = 50 * MB
    recent: list[str] = []
    for k in range(max(1, jsonl_bytes // per_file)):
        name = root / (f"records-{k:03d}.jsonl" + ("" if k % 2 else ".gz"))
        lines, size = [], 0
        while size < per_file:
            if recent and rng.random() < 0.01:
                text = rng.choice(recent)  # an exact duplicate of an earlier record
            else:
                text = doc(rng.randint(150, 1500))
                if len(recent) < 1000:
                    recent.append(text)
            line = json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n"
            lines.append(line)
            size += len(line.encode())
        data = "".join(lines).encode()
        if name.suffix == ".gz":
            name.write_bytes(gzip.compress(data, compresslevel=1))
        else:
            name.write_bytes(data)
    books = root / "books"
    books.mkdir(exist_ok=True)
    for k in range(int(total_mb * MB * 0.2) // 100_000):
        text = "\n\n".join(doc(rng.randint(300, 3000)) for _ in range(60)).encode()
        if k % 10 == 0:
            (books / f"book-{k:05d}.txt.gz").write_bytes(gzip.compress(text, compresslevel=1))
        elif k % 10 == 1:
            (books / f"book-{k:05d}.txt.xz").write_bytes(lzma.compress(text, preset=0))
        else:
            (books / f"book-{k:05d}.txt").write_bytes(text)


@pytest.mark.skipif("ATOM_CORPUS_BENCH_MB" not in os.environ, reason="set ATOM_CORPUS_BENCH_MB")
def test_build_at_scale(tmp_path):
    total_mb = int(os.environ["ATOM_CORPUS_BENCH_MB"])
    base = Path(os.environ.get("ATOM_CORPUS_BENCH_DIR", tmp_path))
    src = base / f"input-{total_mb}mb"
    if not (src / "books").is_dir():
        t = time.monotonic()
        generate(src, total_mb)
        print(f"generated {src} in {time.monotonic() - t:.0f} s")
    on_disk = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    out = base / f"out-{total_mb}mb"
    cmd = [sys.executable, "-m", "atom_train.corpus", "build", str(src), "--out", str(out),
           "--force"]  # fmt: skip
    t = time.monotonic()
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t
    print(res.stderr[-3000:], res.stdout[-2000:], sep="\n")
    assert res.returncode == 0
    m = re.search(r"([\d,.]+) MB of text read \(([\d,.]+) MB/s\).*peak memory ([\d,]+) MiB"
                  r"(?:, largest child process ([\d,]+) MiB)?", res.stderr)  # fmt: skip
    assert m, res.stderr
    text_mb = float(m.group(1).replace(",", ""))
    main_mib = int(m.group(3).replace(",", ""))
    child_mib = int((m.group(4) or "0").replace(",", ""))
    man = json.loads((out / "manifest.json").read_text())
    c = man["counts"]
    print(f"input on disk {on_disk / MB:,.0f} MB, text {text_mb:,.0f} MB, "
          f"{c['documents_read']:,} documents ({c['duplicates']:,} duplicates), wall {wall:.1f} s "
          f"= {text_mb / wall:.1f} MB/s of text; peak RSS main {main_mib} MiB, "
          f"largest worker {child_mib} MiB")  # fmt: skip
    assert main_mib < 1024 and child_mib < 1024
