"""Build a corpus folder from input files (and, for the demo, a document source).

    build(out, ["books/", "dump/*.jsonl.gz"], BuildOptions(val_fraction=0.01))

Two passes, memory that grows only with the number of documents (about 80 bytes each at
the peak), never with their bytes:

1. Scan (`corpus.scan`), in parallel over groups of input files: read, decompress, skip
   files that are not text, split into documents, clean, filter, and spool the kept text
   under OUT/.build/, keeping a 16-byte content hash and the size of each document (and,
   for --near-dup, spooling its MinHash signature).
2. Lay out (`corpus.layout`) from the hashes alone: sort, de-duplicate (and drop near
   duplicates, `corpus.neardup`, from the spooled signatures), choose val, cut shards; then
   write each output file in parallel, copying its documents out of the spool in order,
   each followed by the seam, hashing (SHA-256) as it writes.

Atomic and resumable: everything is written under OUT/.build/ first; finished files are
renamed into OUT, then manifest.json is written (atomically), then .build is removed. A
folder without manifest.json is never a finished corpus. An interrupted build resumes when
rerun with the same options: scan jobs whose inputs did not change are reused. A finished
corpus built with the same inputs and options makes a rerun a no-op; other options or inputs
are refused unless `force` (which replaces the corpus); a folder holding anything else is
refused always.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import multiprocessing
import os
import resource
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

import atom_train
from atom_train.common.atomic import atomic_write_json, fsync_dir
from atom_train.common.cli import UserError, say, some_of
from atom_train.common.measure import peak_rss_mb
from atom_train.corpus import layout
from atom_train.corpus.extras import load
from atom_train.corpus.inputs import (
    FORMATS,
    NOT_TEXT,
    ON_BINARY_CHOICES,
    SPLIT_CHOICES,
    InputFile,
    find_inputs,
    require_codecs,
)
from atom_train.corpus.language import languages
from atom_train.corpus.manifest import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    VAL_NAME,
    file_problems,
    files_of,
)
from atom_train.corpus.neardup import near_duplicates
from atom_train.corpus.normalize import (
    CONTROL_CHOICES,
    INVALID_UTF8_CHOICES,
    NEWLINE_CHOICES,
    UNICODE_CHOICES,
    CleanOptions,
)
from atom_train.corpus.scan import (
    JobPaths,
    ScanCounts,
    ScanOptions,
    load_records,
    scan_files,
    scan_texts,
)

MB = 10**6
# Bump when cleaning, splitting or layout rules change the output for the same options, so
# that a rerun rebuilds instead of calling an old corpus up to date.
CLEANING_VERSION = 2  # 2: HTML by trafilatura, files that are not text skipped
BUILD_DIR = ".build"
# A scan job reads consecutive input files up to about this many bytes on disk (or files):
# big enough that a folder of 50,000 books is not 50,000 jobs, small enough to balance.
JOB_BYTES = 64 << 20
JOB_FILES = 1000
WRITE_BUFFER_BYTES = 8 << 20
READ_MAX = 8 << 20
_ASCII = bytes(range(128))


@dataclass(frozen=True)
class BuildOptions:
    """Every choice that shapes the output (recorded in the manifest; a rerun with other
    values is refused). Sizes in bytes."""

    split_on: str = "file"  # or "blank-lines"
    text_field: str = "text"
    format: str = "auto"  # or force "text", "jsonl", "html" for every input
    glob: str = "*"  # file names taken from input folders
    invalid_utf8: str = "replace"
    unicode: str = "NFC"
    newlines: str = "lf"
    control: str = "drop"
    min_chars: int = 1
    language: tuple[str, ...] | None = None  # keep documents identified as one of these
    language_threshold: float = 0.5
    dedup: bool = True
    near_dup: float | None = None  # drop documents this similar (Jaccard) to a kept one
    val_bytes: int | None = None
    val_fraction: float | None = 0.01
    shard_bytes: int = 256 * MB
    max_train_bytes: int | None = None
    separator: str = "\n\n"
    on_error: str = "stop"  # or "skip"
    on_binary: str = "skip"  # or "fail"

    def scan_options(self) -> ScanOptions:
        clean = CleanOptions(self.invalid_utf8, self.unicode, self.newlines, self.control)
        return ScanOptions(self.split_on, self.text_field, clean, self.min_chars,
                           self.language, self.language_threshold, self.on_error,
                           self.on_binary, signatures=self.near_dup is not None)  # fmt: skip

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["language"] is not None:  # as JSON has it, so a rerun compares equal
            d["language"] = list(d["language"])
        return d


class DocumentSource(Protocol):
    """Documents that do not come from files (the demo's Debian packages). The builder reads
    them in its own process, through the same cleaning as files."""

    def identity(self) -> dict:
        """What defines the source's output ("name" included): recorded in the manifest and
        compared on a rerun, before `documents()` is called."""
        ...

    def documents(self) -> Iterable[str]: ...

    def report(self) -> dict:
        """After `documents()`: what the manifest records about what was read."""
        ...


@dataclass
class BuildResult:
    manifest: dict
    built: bool  # False: the folder already held this corpus
    seconds: float = 0.0
    messages: list[str] = field(default_factory=list)


# ---- the output folder -------------------------------------------------------------------


def _ours(name: str) -> bool:
    """Names a build writes into OUT (a folder with anything else is not ours to touch)."""
    return (
        name in (MANIFEST_NAME, VAL_NAME, BUILD_DIR)
        or (name.startswith("train-") and name.endswith(".txt"))
        or name.startswith(f".{MANIFEST_NAME}.tmp-")
    )


# The options whose command-line flag is not --<option> of the same value (the sizes are
# flags in MB of 10^6 bytes, dedup is --no-dedup): how a change of one reads as flags.
_MB_FLAGS = {"shard_bytes": "--shard-mb", "max_train_bytes": "--max-train-mb"}


def option_change(key: str, old: object, new: object) -> str:
    """A changed build option as the user would type it: ``--shard-mb 0.5 -> 1``."""
    if key in _MB_FLAGS:

        def mb(v: object) -> str:
            return "none" if v is None else f"{v / MB:g}"  # type: ignore[operator]

        return f"{_MB_FLAGS[key]} {mb(old)} -> {mb(new)}"
    if key == "dedup":
        return f"--no-dedup {'added' if new is False else 'dropped'}"
    return f"--{key.replace('_', '-')} {old!r} -> {new!r}"


def _differences(old: dict, plan: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """What differs between a recorded build (manifest or state) and the planned one."""
    diffs = []
    if old.get("cleaning_version") != plan["cleaning_version"]:
        diffs.append("the cleaning rules (another atom version)")
    old_opts = old.get("options") or {}
    diffs += [
        option_change(k, old_opts.get(k), v)
        for k, v in plan["options"].items()
        if old_opts.get(k) != v and k not in ignore
    ]
    if "source" in old and (old["source"] or {}).get("identity") != (plan["source"] or {}).get(
        "identity"
    ):
        diffs.append("the document source")
    if "inputs" in old and old["inputs"] != plan["inputs"]:
        before = {i["path"]: i for i in old["inputs"]}
        now = {i["path"]: i for i in plan["inputs"]}
        added = len(now.keys() - before.keys())
        removed = len(before.keys() - now.keys())
        changed = sum(1 for p in now.keys() & before.keys() if now[p] != before[p])
        diffs.append(f"the inputs ({added} added, {removed} removed, {changed} changed)")
    return diffs


def _clear(out: Path, man: dict | None) -> None:
    """Remove a previous build's files (--force): those its manifest lists, and our names."""
    names = {e["file"] for e in files_of(man)} if man else set()
    names |= {p.name for p in out.iterdir() if _ours(p.name)}
    for name in sorted(names):
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(build_dir: Path) -> Iterator[None]:
    build_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(build_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"another build is running in {build_dir.parent}: wait for it"
            ) from None
        yield
    finally:
        os.close(fd)


def _existing(out: Path, plan: dict, force: bool, log: Callable[[str], None]) -> dict | None:
    """The manifest when OUT already holds exactly this corpus (a no-op); None to build.
    Refuses a folder that is not ours, and one of ours built otherwise unless `force`."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise UserError(f"--out {out} is a file: choose a folder")
    names = sorted(p.name for p in out.iterdir())
    foreign = [n for n in names if not _ours(n)]
    if foreign:
        shown = some_of(foreign, 3)
        raise UserError(
            f"--out {out} is not empty and not a corpus folder (it holds {shown}): choose a new "
            "or empty folder"
        )
    man_path = out / MANIFEST_NAME
    if man_path.is_file():
        try:
            man = json.loads(man_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            man = None
        if not isinstance(man, dict) or man.get("format") != MANIFEST_FORMAT:
            if not force:
                raise UserError(
                    f"{man_path} is unreadable or not a corpus manifest: add --force to rebuild"
                )
            _clear(out, None)
            return None
        diffs = (
            _differences(man, plan)
            if man.get("version") == MANIFEST_VERSION
            else ["the format version"]
        )
        if diffs and not force:
            raise UserError(
                f"{out} holds a corpus built otherwise ({'; '.join(diffs[:4])}): choose another "
                "--out, or add --force to replace it"
            )
        problems = [] if diffs else file_problems(out, man, quick=True)
        if problems and not force:
            raise UserError(
                f"{out}: {problems[0]}: the corpus changed after it was built; add --force to "
                f"rebuild it (`python -m atom_train.corpus check {out}` lists the differences)"
            )
        if force:
            log(f"--force: replacing the corpus in {out}")
            _clear(out, man)
            return None
        if (out / BUILD_DIR).exists():  # a crash between the manifest and the clean-up
            with _locked(out / BUILD_DIR):
                pass
            shutil.rmtree(out / BUILD_DIR, ignore_errors=True)
        return man
    state_path = out / BUILD_DIR / "state.json"
    if state_path.is_file():
        try:
            state = json.loads(state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            state = {}
        # Jobs finished under --on-error stop had no error: a rerun with skip can reuse them.
        diffs = _differences(state, plan, ignore=("on_error",))
        if diffs and not force:
            raise UserError(
                f"{out} holds an unfinished build with other options ({'; '.join(diffs[:4])}): "
                "rerun it with those options to finish it, or add --force to start over"
            )
        if diffs:
            log(f"--force: discarding the unfinished build in {out}")
            with _locked(out / BUILD_DIR):
                pass
            _clear(out, None)
        else:
            log(f"resuming the unfinished build in {out}")
    elif any(not n.startswith(".") for n in names):
        # Shard-like names with no manifest and no build state: nothing says they are ours.
        raise UserError(
            f"--out {out} holds {', '.join(n for n in names if not n.startswith('.'))[:80]} but "
            f"no {MANIFEST_NAME}: choose a new or empty folder"
        )
    elif names:  # only a build folder that died before it wrote its state
        _clear(out, None)
    return None


# ---- pass 1: scan --------------------------------------------------------------------------


def group_jobs(inputs: Sequence[InputFile]) -> list[list[InputFile]]:
    """Consecutive inputs (in path order) grouped into scan jobs of about JOB_BYTES."""
    jobs: list[list[InputFile]] = []
    size = 0
    for f in inputs:
        if not jobs or size >= JOB_BYTES or len(jobs[-1]) >= JOB_FILES:
            jobs.append([])
            size = 0
        jobs[-1].append(f)
        size += f.size
    return jobs


def _reusable(spool: Path, job: int, inputs: list[dict]) -> dict | None:
    paths = JobPaths.of(spool, job)
    try:
        done = json.loads(paths.done.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if done.get("inputs") != inputs or not paths.text.is_file() or not paths.records.is_file():
        return None
    return done


def _counts_of(done: dict) -> ScanCounts:
    counts = ScanCounts()
    counts.add(ScanCounts(**done["counts"]))
    return counts


# ---- pass 2: write -------------------------------------------------------------------------


def _flush(fd: int, buf: bytearray, sha) -> int:
    """Write `buf` to `fd` and the hash; returns its non-ASCII byte count."""
    view = memoryview(buf)
    while view:
        view = view[os.write(fd, view) :]
    sha.update(buf)
    return len(buf.translate(None, _ASCII))


def _rows(*columns: np.ndarray, chunk: int = 1 << 16) -> Iterator[tuple[int, ...]]:
    """The rows of equal-length arrays as Python ints, a chunk at a time (a whole column as
    a list would cost 36 bytes an entry)."""
    for start in range(0, len(columns[0]), chunk):
        yield from zip(*(c[start : start + chunk].tolist() for c in columns), strict=True)


# Where each output document comes from, in output order: written once by the builder,
# read (memory-mapped, a file's slice only) by the writers.
COPY_PLAN = np.dtype([("job", "<i4"), ("offset", "<i8"), ("size", "<i8")])


def write_file(task: tuple) -> dict:
    """Write one output file from the spool (a pool task): the documents of rows [start,
    end) of the copy plan, each followed by the seam. Returns its manifest entry."""
    name, path, spool, plan_path, start, end, seam = task
    rows = np.memmap(plan_path, dtype=COPY_PLAN, mode="r")[start:end]
    sha = hashlib.sha256()
    sources: dict[int, int] = {}
    buf = bytearray()
    written = non_ascii = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for job, offset, size in _rows(rows["job"], rows["offset"], rows["size"]):
            src = sources.get(job)
            if src is None:
                src = sources[job] = os.open(JobPaths.of(spool, job).text, os.O_RDONLY)
            while size:
                data = os.pread(src, min(size, READ_MAX), offset)
                if not data:
                    raise UserError(f"{JobPaths.of(spool, job).text} is shorter than its records: "
                                    "the build folder was changed; add --force to start over")  # fmt: skip
                buf += data
                offset += len(data)
                size -= len(data)
                if len(buf) >= WRITE_BUFFER_BYTES:
                    non_ascii += _flush(fd, buf, sha)
                    written += len(buf)
                    buf.clear()
            buf += seam
        non_ascii += _flush(fd, buf, sha)
        written += len(buf)
        os.fsync(fd)
    finally:
        os.close(fd)
        for src in sources.values():
            os.close(src)
    return {"file": name, "bytes": written, "documents": end - start,
            "non_ascii_bytes": non_ascii, "sha256": sha.hexdigest()}  # fmt: skip


# ---- the build -----------------------------------------------------------------------------


def peak_memory() -> str:
    """Peak resident memory of this process and of its largest finished child (the workers:
    spawned by this process, so their ru_maxrss is their own)."""
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    return f"peak memory {peak_rss_mb():,.0f} MiB" + (
        f", largest child process {workers:,.0f} MiB" if workers else ""
    )


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _plan(out: Path, patterns: Sequence[str], options: BuildOptions, source: DocumentSource | None):
    inputs = (
        find_inputs(patterns, exclude=out, name_glob=options.glob, fmt=options.format)
        if patterns
        else []
    )
    if not inputs and source is None:
        raise UserError("no INPUT given: name files, folders or globs to build from")
    require_codecs(inputs)
    plan = {
        "cleaning_version": CLEANING_VERSION,
        "options": options.to_dict(),
        "inputs": [f.describe() for f in inputs],
        "source": {"identity": source.identity()} if source is not None else None,
    }
    return inputs, plan


def build(
    out: str | os.PathLike,
    patterns: Sequence[str],
    options: BuildOptions | None = None,
    *,
    source: DocumentSource | None = None,
    force: bool = False,
    workers: int | None = None,
    log: Callable[[str], None] = lambda m: say(m, "[corpus]"),
) -> BuildResult:
    """Build (or find already built) the corpus of `patterns` (and `source`) in `out`.

    Raises `UserError` for every mistake the user can fix: bad inputs (unless
    `options.on_error` is "skip"), a folder that is not ours, options that do not fit.
    `workers`: processes for both passes (default: the CPUs this process may use; 1 runs
    everything in this process). They are started with "spawn" (no fork of a process that
    may hold threads), so a script that calls this needs the `if __name__ == "__main__":`
    guard.
    """
    options = options or BuildOptions()
    _check_options(options)
    out = Path(out)
    t0 = time.monotonic()
    inputs, plan = _plan(out, patterns, options, source)
    done_manifest = _existing(out, plan, force, log)
    if done_manifest is not None:
        log(
            f"{out}: already built from the same inputs and options (sizes checked); "
            f"`python -m atom_train.corpus check {out}` re-hashes, --force rebuilds"
        )
        return BuildResult(done_manifest, built=False)
    build_dir = out / BUILD_DIR
    with _locked(build_dir):
        atomic_write_json(
            build_dir / "state.json",
            {k: plan[k] for k in ("cleaning_version", "options", "source")},
        )
        workers = max(1, workers or default_workers())
        if workers == 1:
            manifest, messages = _run(out, inputs, plan, options, source, map, log)
        else:
            # Ctrl-C reaches the whole process group: the workers ignore it (no traceback
            # from each), the main process stops them (the pool's exit terminates them) and
            # says it once (`command.main`); a rerun resumes.
            ignore_sigint = (signal.SIGINT, signal.SIG_IGN)
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(workers, initializer=signal.signal, initargs=ignore_sigint) as pool:
                manifest, messages = _run(
                    out, inputs, plan, options, source, pool.imap_unordered, log
                )
        shutil.rmtree(build_dir, ignore_errors=True)
    seconds = time.monotonic() - t0
    c = manifest["counts"]
    log(f"built {out} in {seconds:.1f} s: {c['bytes_read'] / MB:,.1f} MB of text read "
        f"({c['bytes_read'] / MB / max(seconds, 1e-9):,.1f} MB/s), {c['train_documents']:,} train + "
        f"{c['val_documents']:,} val documents; {peak_memory()}")  # fmt: skip
    return BuildResult(manifest, built=True, seconds=seconds, messages=messages)


def _check_options(o: BuildOptions) -> None:
    choices = {
        "split_on": SPLIT_CHOICES, "format": FORMATS, "invalid_utf8": INVALID_UTF8_CHOICES,
        "unicode": UNICODE_CHOICES, "newlines": NEWLINE_CHOICES, "control": CONTROL_CHOICES,
        "on_error": ("stop", "skip"), "on_binary": ON_BINARY_CHOICES,
    }  # fmt: skip
    for name, allowed in choices.items():
        if getattr(o, name) not in allowed:
            raise UserError(f"{name} {getattr(o, name)!r}: choose one of {allowed}")
    if o.shard_bytes <= 0:
        raise UserError("--shard-mb must be > 0")
    if o.val_bytes is not None and o.val_bytes < 0:
        raise UserError("--val-bytes must be >= 0")
    if o.val_fraction is not None and not 0.0 <= o.val_fraction < 0.5:
        raise UserError("--val-fraction must be in [0, 0.5)")
    if o.max_train_bytes is not None and o.max_train_bytes <= 0:
        raise UserError("--max-train-mb must be > 0")
    if not o.separator:
        raise UserError("--separator must not be empty: it is the seam between documents")
    if o.min_chars < 0:
        raise UserError("--min-chars must be >= 0")
    if o.language is not None:
        known = languages()  # a UserError naming the extra when it is missing
        unknown = [lang for lang in o.language if lang not in known]
        if unknown or not o.language:
            raise UserError(
                f"--language {','.join(o.language)}: {', '.join(unknown) or 'none given'} "
                f"is not a language the identifier knows; it knows {', '.join(known)}"
            )
    if not 0.0 <= o.language_threshold <= 1.0:
        raise UserError("--language-threshold must be in [0, 1]")
    if o.near_dup is not None:
        if not 0.0 < o.near_dup <= 1.0:
            raise UserError("--near-dup must be a similarity in (0, 1], e.g. 0.8")
        load("neardup")


@dataclass
class _Index:
    """Every kept document of pass 1, in job order: hash words, size, spool job and offset."""

    h0: np.ndarray
    h1: np.ndarray
    size: np.ndarray
    job: np.ndarray
    offset: np.ndarray


def _scan(
    inputs, source, spool, scan: ScanOptions, fmt: str, imap, log
) -> tuple[dict[int, dict], ScanCounts]:
    """Pass 1: every scan job's result (reused from an interrupted build where its inputs
    did not change), and the sum of their counts."""
    file_jobs = group_jobs(inputs)
    n_jobs = len(file_jobs) + (source is not None)
    done: dict[int, dict] = {}
    todo = []
    forced = None if fmt == "auto" else fmt
    for k, files in enumerate(file_jobs):
        reuse = _reusable(spool, k, [f.describe() for f in files])
        if reuse is not None:
            done[k] = reuse
        else:
            todo.append((k, files, spool, scan, forced))
    if source is not None:
        reuse = _reusable(spool, len(file_jobs), [])
        if reuse is not None and "report" in reuse:
            done[len(file_jobs)] = reuse
    keep = {f"{k:06d}" for k in done}
    for p in spool.iterdir():
        if p.stem not in keep:
            p.unlink()
    if done:
        log(f"pass 1: reusing {len(done)} of {n_jobs} scan jobs from the interrupted build")
    todo.sort(key=lambda job: -sum(f.size for f in job[1]))  # the largest first: balance
    t1 = last_log = time.monotonic()
    total_read = sum(d["counts"]["bytes_read"] for d in done.values())
    results = imap(scan_files, todo)  # the pool starts on the files ...
    if source is not None and len(file_jobs) not in done:  # ... while this process reads
        log(f"pass 1: reading {source.identity().get('name', 'the document source')}")
        k = len(file_jobs)
        done[k] = scan_texts(source.documents(), k, spool, scan, report=source.report)
    for result in results:
        if "error" in result:
            raise UserError(result["error"])
        done[result["job"]] = result
        total_read += result["counts"]["bytes_read"]
        now = time.monotonic()
        if now - last_log > 5:
            log(f"pass 1: {len(done)}/{n_jobs} jobs, {total_read / MB:,.0f} MB of text read "
                f"({total_read / MB / (now - t1):,.1f} MB/s)")  # fmt: skip
            last_log = now
    counts = ScanCounts()
    for k in range(n_jobs):
        counts.add(_counts_of(done[k]))
    if counts.skipped_binary:
        what = ", ".join(f"{n:,} {NOT_TEXT[r]}" for r, n in sorted(counts.skipped_binary.items()))
        log(f"skipped files that are not text: {what}")
    log(f"pass 1 done in {time.monotonic() - t1:.1f} s")
    return done, counts


def _load_index(spool: Path, n_jobs: int, n: int) -> _Index:
    """The records of all jobs in compact arrays (44 bytes a document)."""
    idx = _Index(np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty(n, np.int64),
                 np.empty(n, np.int32), np.empty(n, np.int64))  # fmt: skip
    at = 0
    for k in range(n_jobs):
        rec = load_records(spool, k)
        m = len(rec)
        if at + m > n:
            break
        part = slice(at, at + m)
        idx.h0[part], idx.h1[part], idx.size[part] = rec["h0"], rec["h1"], rec["size"]
        idx.job[part] = k
        idx.offset[part] = np.cumsum(rec["size"]) - rec["size"]
        at += m
    if at != n:
        raise UserError(f"{spool} does not match its counts: add --force to start over")
    return idx


def _drop_near_duplicates(
    idx: _Index, unique: np.ndarray, spool: Path, n_jobs: int, threshold: float, log
) -> tuple[np.ndarray, dict]:
    """`unique` (in hash order) without its near duplicates, and what the manifest says of
    them: the threshold, how many, and the first few with a document each is near."""
    t = time.monotonic()
    starts = np.searchsorted(idx.job, np.arange(n_jobs))  # the index is in job order
    jobs = idx.job[unique]
    rows = unique - starts[jobs]
    paths = [JobPaths.of(spool, k).signatures for k in range(n_jobs)]
    drop, pairs = near_duplicates(jobs, rows, paths, threshold)

    def head(pos: int, chars: int = 160) -> str:
        i = unique[pos]
        with open(JobPaths.of(spool, int(idx.job[i])).text, "rb") as f:
            f.seek(int(idx.offset[i]))
            data = f.read(min(int(idx.size[i]), 4 * chars))
        return data.decode("utf-8", "replace")[:chars]

    examples = [{"dropped": head(d), "near": head(k), "similarity": round(sim, 3)}
                for d, k, sim in pairs]  # fmt: skip
    log(f"near duplicates: {int(drop.sum()):,} of {len(unique):,} documents at similarity "
        f">= {threshold} ({time.monotonic() - t:.1f} s)")  # fmt: skip
    return unique[~drop], {"threshold": threshold, "dropped": int(drop.sum()), "examples": examples}


@dataclass
class _Layout:
    train: np.ndarray  # indices into the index, in output order
    val: np.ndarray
    ranges: list[tuple[int, int]]  # train shards as [start, end) of `train`
    names: list[str]
    over_cap: int
    duplicates: int
    near: dict | None  # --near-dup: threshold, dropped, examples


def _lay_out(idx: _Index, options: BuildOptions, seam: bytes, spool: Path, n_jobs: int,
             log) -> _Layout:  # fmt: skip
    """Order, de-duplicate, choose val, cut shards (the rules are in `corpus.layout`)."""
    n = len(idx.size)
    order = layout.hash_order(idx.h0, idx.h1)
    first = layout.first_of_each_hash(idx.h0, idx.h1, order) if options.dedup else np.ones(n, bool)
    unique = order[first]
    del order, first
    duplicates = n - len(unique)
    near = None
    if options.near_dup is not None:
        unique, near = _drop_near_duplicates(idx, unique, spool, n_jobs, options.near_dup, log)
    sizes = idx.size[unique] + len(seam)
    target = layout.val_target(int(sizes.sum()), options.val_bytes, options.val_fraction)
    is_val = layout.choose_val(sizes, target)
    train, train_sizes = unique[~is_val], sizes[~is_val]
    val = unique[is_val]
    del unique, sizes, is_val
    n_train = layout.cap_prefix(train_sizes, options.max_train_bytes)
    if n_train == 0:
        raise UserError("no document fits under --max-train-mb: raise it")
    ranges = layout.shard_ranges(train_sizes[:n_train], options.shard_bytes)
    return _Layout(train[:n_train], val, ranges, layout.shard_names(len(ranges)),
                   over_cap=len(train) - n_train, duplicates=duplicates, near=near)  # fmt: skip


def _write(idx: _Index, lay: _Layout, build_dir: Path, seam: bytes, imap, log):
    """Pass 2: every output file under build_dir/out; (train entries, val entry or None)."""
    staging = build_dir / "out"
    staging.mkdir(exist_ok=True)
    order = np.concatenate([lay.train, lay.val])
    plan = np.empty(len(order), COPY_PLAN)
    plan["job"], plan["offset"], plan["size"] = idx.job[order], idx.offset[order], idx.size[order]
    plan_path = build_dir / "copy-plan.bin"
    plan.tofile(plan_path)
    # Each file's planned size, to check what the writers wrote against.
    ends = np.cumsum(plan["size"] + len(seam))
    del order, plan
    files = [(name, a, b) for name, (a, b) in zip(lay.names, lay.ranges, strict=True)]
    if len(lay.val):
        files.append((VAL_NAME, len(lay.train), len(lay.train) + len(lay.val)))
    else:
        log("val is empty (no document was small enough, or val was not asked for)")
    t2 = time.monotonic()
    log(f"pass 2: writing {len(files)} files")
    tasks = [
        (name, staging / name, build_dir / "spool", plan_path, a, b, seam) for name, a, b in files
    ]
    entries = {e["file"]: e for e in imap(write_file, tasks)}
    for name, a, b in files:
        planned = int(ends[b - 1] - (ends[a - 1] if a else 0))
        if entries[name]["bytes"] != planned:  # the spool changed under us
            raise UserError(f"{name} came out at {entries[name]['bytes']:,} bytes, not "
                            f"{planned:,}: the build folder was changed; add --force to start over")  # fmt: skip
    log(f"pass 2 done in {time.monotonic() - t2:.1f} s")
    return [entries[name] for name in lay.names], entries.get(VAL_NAME)


def _publish(out: Path, staging: Path, manifest: dict) -> None:
    """Move the files into OUT, then write the manifest: its presence marks the corpus
    finished, so a crash at any point before leaves no finished-looking folder."""
    final = {e["file"] for e in files_of(manifest)}
    for p in out.iterdir():  # outputs of an interrupted build of other inputs
        if p.is_file() and _ours(p.name) and p.name not in final and p.name != MANIFEST_NAME:
            p.unlink()
    for name in sorted(final):
        os.replace(staging / name, out / name)
    fsync_dir(out)
    atomic_write_json(out / MANIFEST_NAME, manifest)


def _run(out, inputs, plan, options, source, imap, log) -> tuple[dict, list[str]]:
    build_dir = out / BUILD_DIR
    spool = build_dir / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    done, counts = _scan(inputs, source, spool, options.scan_options(), options.format, imap, log)
    for m in counts.skip_messages:
        log(f"skipped: {m}")
    if counts.documents_kept == 0:
        dropped = ", ".join(f"{k} {v}" for k, v in counts.dropped.items() if v) or "none"
        raise UserError(
            f"no documents kept ({counts.documents_read:,} read; dropped: {dropped}): check "
            "the inputs, --text-field, --min-chars, --language and --language-threshold"
        )
    idx = _load_index(spool, len(done), counts.documents_kept)
    seam = options.separator.encode("utf-8")
    lay = _lay_out(idx, options, seam, spool, len(done), log)
    idx.h0 = idx.h1 = np.empty(0, np.uint64)  # the hashes have done their work
    train, val = _write(idx, lay, build_dir, seam, imap, log)
    n_out = len(lay.train) + len(lay.val)
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "tool": "atom_train.corpus",
        "tool_version": atom_train.__version__,
        "cleaning_version": CLEANING_VERSION,
        "options": plan["options"],
        "inputs": plan["inputs"],
        "source": (
            {"identity": plan["source"]["identity"], "report": done[len(done) - 1]["report"]}
            if source is not None
            else None
        ),
        "train": train,
        "val": val,
        "counts": {
            "documents_read": counts.documents_read,
            "documents_kept": n_out,
            "train_documents": len(lay.train),
            "val_documents": len(lay.val),
            "duplicates": lay.duplicates,
            "seams": n_out,
            "dropped": dict(
                counts.dropped,
                over_max_train=lay.over_cap,
                near_duplicate=lay.near["dropped"] if lay.near else 0,
            ),
            "changed": counts.changed,
            "skipped": {
                "files": counts.skipped_files,
                "records": counts.skipped_records,
                "binary": dict(sorted(counts.skipped_binary.items())),
            },
            "bytes_read": counts.bytes_read,
            "bytes_written": sum(e["bytes"] for e in [*train, *([val] if val else [])]),
        },
    }
    if options.language is not None:
        manifest["counts"]["language"] = {
            "detected": dict(sorted(counts.language_detected.items(), key=lambda kv: -kv[1])),
            "confidence": dict(sorted(counts.language_confidence.items())),
        }
    if lay.near is not None:
        manifest["counts"]["near_duplicates"] = lay.near
    _publish(out, build_dir / "out", manifest)
    return manifest, counts.skip_messages
