"""scripts/gpu_check.sh rehearsed on the CPU (`--rehearse`): the GPU check end to end before a
GPU is lent, so its first contact succeeds in one shot.

The rehearsal runs the real script on a copy of the checkout (the files git would carry, as
the device tool carries them: no native module) with the project's wheel in dist/, built
as `make wheel` builds it (`maturin build --release`), once per test session and cached by
the hash of the Rust sources under target/ (about 3 s with cargo's release build already
there, as `make test` leaves it; a cold build takes minutes). In the rehearsal the parts run
with tiny shapes, the Triton kernels under the interpreter, CUDA hidden and a fake
nvidia-smi (tests/helpers/fakebin).

Checked: every part is listed with its exit code and passes; the bench's and the timing's
rows carry the keys scripts/gpu_summary.py reads (`BENCH_KEYS`, `TIMING_KEYS`: a key renamed
in the bench fails here); summary.json is valid at every moment of the run: every version
the script wrote (it replaces the file atomically, so those are all a reader can ever see;
the copy's gpu_summary.py keeps each one as it writes it) parses and lists the parts
finished by then; a run killed (kill -9, the script and every process under it) in the
middle of each part leaves a valid summary.json that lists every part; a budget too small
for the tests cuts them at their bound while a trainer runs in pytest's process, and the
summary says "cut", not FAILED; OUTDIR given relative to a folder outside the checkout
lands there; two project wheels are refused in one line; a wheel that does not install
skips only what needs the native loader, and says so. About 3 minutes on 2 busy cores (the
kernel report's 4 compiles, the interpreted kernels and the bench's subprocesses are most
of it).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("triton")

from helpers import REPO

SCRIPT = Path("scripts") / "gpu_check.sh"
PARTS = ["probe", "install", "tests", "bench", "kernel-report", "timing"]
# What the wheel is built from: the crates, the binding and the Python package it carries (a
# wheel cached by the Rust sources alone would install yesterday's Python).
WHEEL_INPUTS = [
    *("Cargo.toml", "Cargo.lock", "pyproject.toml"),
    *("atomdata-rs", "atomfield-rs", "atom-py"),  # the crates and the binding
    "atom_train",
]


def _summary_module():
    spec = importlib.util.spec_from_file_location(
        "gpu_summary", REPO / "scripts" / "gpu_summary.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_summary = _summary_module()


def _wheel_key() -> str:
    h = hashlib.sha256()
    for name in WHEEL_INPUTS:
        path = REPO / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            rel = f.relative_to(REPO)
            if "target" in rel.parts or "__pycache__" in rel.parts or f.suffix in (".so", ".pyc"):
                continue
            h.update(str(rel).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def wheel() -> Path:
    """The project's wheel, as `make wheel` builds it, cached by its sources' hash."""
    cache = REPO / "target" / "rehearsal-wheel" / _wheel_key()
    found = sorted(cache.glob("atom_train-*.whl"))
    if found:
        return found[0]
    maturin = Path(sys.executable).with_name("maturin")
    if not maturin.exists() or shutil.which("cargo") is None:
        pytest.fail(
            "the rehearsal needs maturin (the dev dependencies) and cargo to build the wheel"
        )
    tmp = cache.with_name(cache.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    r = subprocess.run(
        [str(maturin), "build", "--release", "--out", str(tmp)],
        cwd=REPO,
        env={**os.environ, "PYO3_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    try:
        os.replace(tmp, cache)  # whole, or not at all
    except OSError:  # another session cached it first: theirs is the same build
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(cache.glob("atom_train-*.whl"))[0]


# The copy's scripts/gpu_summary.py when every summary it writes is to be kept: the real one
# (moved next to it), then summary.json copied to OUTDIR/summaries/NNN.json with the part
# under way at that moment (running.tsv) beside it.
_KEEPING_SUMMARY = """
import pathlib, runpy, shutil, sys
out = pathlib.Path(sys.argv[1])
running = out / "running.tsv"
under_way = running.read_text() if running.exists() else ""
try:
    runpy.run_path(str(pathlib.Path(__file__).with_name("gpu_summary_real.py")), run_name="__main__")
finally:
    kept = out / "summaries"
    kept.mkdir(exist_ok=True)
    n = len(list(kept.glob("*.json")))
    (kept / f"{n:03d}.running").write_text(under_way)
    shutil.copy(out / "summary.json", kept / f"{n:03d}.json")
"""


def carried_copy(dest: Path, wheels: list[Path], keep_summaries: bool = False) -> Path:
    """The checkout as the device tool carries it (tracked and untracked files that git does
    not ignore: no native module, no dist/), with `wheels` in dist/; `keep_summaries`: with
    gpu_summary.py keeping every summary it writes (`_KEEPING_SUMMARY`)."""
    r = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    for name in filter(None, r.stdout.decode().split("\0")):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    (dest / "dist").mkdir()
    for w in wheels:
        shutil.copy2(w, dest / "dist" / w.name)
    if keep_summaries:
        scripts = dest / "scripts"
        (scripts / "gpu_summary.py").rename(scripts / "gpu_summary_real.py")
        (scripts / "gpu_summary.py").write_text(_KEEPING_SUMMARY)
    return dest


def start(
    repo: Path, out: str, *options: str, cwd: Path | None = None, env: dict | None = None
) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", str(repo / SCRIPT), "--rehearse", *options, out],
        cwd=cwd or repo,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (`timeout` puts each part in a process group of its own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_everything(proc: subprocess.Popen) -> None:
    """kill -9 the script and every process under it at once, as a machine taken back would."""
    for pid in [*descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()


def running_part(out: Path) -> str | None:
    try:
        return (out / "running.tsv").read_text().split("\t")[0] or None
    except OSError:
        return None


def check_summary(out: Path) -> dict:
    """summary.json parses, lists every part of the plan in order, and gives each part that
    finished its exit code."""
    summary = json.loads((out / "summary.json").read_text())
    assert [p["part"] for p in summary["parts"]] == PARTS
    for p in summary["parts"]:
        assert (p["state"] == "done") == isinstance(p["exit"], int), p
    return summary


@pytest.fixture(scope="module")
def rehearsal(wheel, tmp_path_factory):
    """One whole rehearsal, OUTDIR given relative to a folder outside the checkout, keeping
    every summary it writes: (outdir, exit code, output)."""
    repo = carried_copy(tmp_path_factory.mktemp("checkout"), [wheel], keep_summaries=True)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    proc = start(repo, "out", cwd=elsewhere)
    try:
        output, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            kill_everything(proc)
    return elsewhere / "out", proc.returncode, output


def test_rehearsal_runs_every_part_and_lists_each_with_its_exit_code(rehearsal):
    out, code, output = rehearsal
    assert code == 0, output[-4000:]
    summary = check_summary(out)  # (in the folder the relative OUTDIR named)
    assert [(p["part"], p["exit"]) for p in summary["parts"]] == [(p, 0) for p in PARTS]
    assert summary["problems"] == []
    assert summary["info"]["wheel"].startswith("atom_train-")  # the wheel installed, named
    assert summary["info"]["installed"].startswith("atom_train-")
    screen = (out / "summary.txt").read_text()
    for part in PARTS:
        assert f"  {part} " in screen
    assert summary["kernel_report"]["failed"] == 0 and summary["kernel_report"]["complete"]
    assert {t["outcome"] for t in summary["tests"]} == {"passed"}
    assert (out / "tests.xml").exists() and (out / "tests.jsonl").exists()


def test_rehearsal_rows_carry_every_key_the_summary_reads(rehearsal):
    """A key renamed in the bench or the timing would be missing here (and the summary would
    report it as a problem, not show a silent '-')."""
    out, *_ = rehearsal
    bench = [r for r in json.loads((out / "bench.json").read_text())["results"]]
    timing = json.loads((out / "timing.json").read_text())["results"]
    assert bench and timing
    for rows, keys in ((bench, gpu_summary.BENCH_KEYS), (timing, gpu_summary.TIMING_KEYS)):
        for r in rows:
            assert not r.get("error"), r
            assert set(keys) <= set(r), set(keys) - set(r)


def test_rehearsal_summary_is_valid_at_every_moment_and_lists_what_finished(rehearsal):
    """Every summary.json the run wrote, in order (the file is replaced atomically, so these
    are all a kill -9 at any moment could leave): each parses, lists every part of the plan,
    and gives each part that had finished its exit code; one was written while each part
    was under way (it shows as running, every part before it done)."""
    out, *_ = rehearsal
    versions = sorted((out / "summaries").glob("*.json"))
    assert len(versions) >= 2 * len(PARTS)  # (before and after each part, and the last)
    seen = set()
    for path in versions:
        summary = json.loads(path.read_text())
        assert [p["part"] for p in summary["parts"]] == PARTS
        for p in summary["parts"]:
            assert (p["state"] == "done") == isinstance(p["exit"], int), p
        running = path.with_suffix(".running").read_text().split("\t")[0]
        if running:
            seen.add(running)
            states = {p["part"]: p["state"] for p in summary["parts"]}
            assert states[running] == "running", (path.name, states)
            before = PARTS[: PARTS.index(running)]
            assert all(states[p] == "done" for p in before), (path.name, states)
    assert seen == set(PARTS)  # a summary written inside every part
    final = json.loads(versions[-1].read_text())
    assert [p["state"] for p in final["parts"]] == ["done"] * len(PARTS)


# A first-contact test that is still running a trainer in pytest's process when the tests
# part reaches its bound (carried into the copy's tests/ and selected by PYTEST_ADDOPTS).
_AT_THE_BOUND = """
import pytest
from helpers.trainer_kit import make_corpus, run
from atom_train.trainer.checkpoint_file import FINAL, load_checkpoint

@pytest.mark.first_contact
def test_a_trainer_still_training_at_the_bound_1024(tmp_path):
    corpus = make_corpus(tmp_path)
    assert run(corpus, tmp_path / "run", 10**7, "--ckpt-every", "0") == 0
    load_checkpoint(tmp_path / "run" / FINAL)
"""


def test_rehearsal_cuts_the_tests_at_the_budget_and_says_cut_not_failed(wheel, tmp_path):
    """GPU_CHECK_BUDGET 40: after the install the tests part gets the rest (about 30 s, less
    the 5 s kept for the last summary), not its need (116 x 3 s): it is cut at that bound
    (timeout's exit 124) while a trainer trains in pytest's process (the test first in the
    selection). pytest takes the SIGINT (the trainer leaves it to pytest), and the summary
    says the part was cut and lists no failure. (A script that ignored the budget,
    `bound=$need`, would let the trainer train for minutes: this test's own timeout.)"""
    repo = carried_copy(tmp_path / "checkout", [wheel])
    (repo / "tests" / "at_the_bound.py").write_text(_AT_THE_BOUND)
    out = tmp_path / "out"
    proc = start(
        repo, str(out), "--parts", "tests",
        env={"GPU_CHECK_BUDGET": "40", "PYTEST_ADDOPTS": "tests/at_the_bound.py"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while running_part(out) != "tests":
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the tests part never started"
            time.sleep(0.05)
        bound = int((out / "running.tsv").read_text().split("\t")[2])
        assert bound <= 40 - 5, f"the tests part got {bound} s of a 40 s budget"
        output, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            kill_everything(proc)
    summary = check_summary(out)
    tests = {p["part"]: p for p in summary["parts"]}["tests"]
    assert tests["exit"] == 124 and tests["cut"], (tests, output[-3000:])
    assert tests["bound"] <= 40 - 5 and tests["seconds"] >= tests["bound"]
    outcomes = {t["test"].split("::")[-1]: t["outcome"] for t in summary["tests"]}
    assert "failed" not in outcomes.values() and "error" not in outcomes.values(), outcomes
    assert "test_a_trainer_still_training_at_the_bound_1024" not in outcomes  # (interrupted)
    screen = (out / "summary.txt").read_text()
    assert "cut at its bound" in screen and "FAILED" not in screen and "ERROR" not in screen


@pytest.fixture(scope="module")
def kill_checkout(wheel, tmp_path_factory) -> Path:
    return carried_copy(tmp_path_factory.mktemp("kill-checkout"), [wheel])


@pytest.mark.parametrize("part", PARTS)
def test_rehearsal_killed_in_the_middle_of_a_part_leaves_a_valid_summary(
    kill_checkout, tmp_path, part
):
    out = tmp_path / "out"
    proc = start(kill_checkout, str(out), "--parts", part)
    try:
        deadline = time.monotonic() + 300
        while running_part(out) != part:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, f"{part} never started"
            time.sleep(0.05)
        time.sleep(0.3)  # inside it (the shortest part, the install, takes a second or two)
        assert running_part(out) == part, f"{part} ended too soon: not a kill inside it"
        kill_everything(proc)
    finally:
        if proc.returncode is None:
            kill_everything(proc)
    summary = check_summary(out)
    states = {p["part"]: p for p in summary["parts"]}
    assert states[part]["state"] == "running"  # (no exit code: it was cut)
    if PARTS.index(part) > PARTS.index("install"):
        assert states["install"]["exit"] == 0
    # What the cut part wrote by then is added by running the summary again by hand.
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_summary.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and f"  {part} " in r.stdout, r.stderr


def test_rehearsal_refuses_two_project_wheels_in_one_line(wheel, tmp_path):
    other = tmp_path / wheel.name.replace("-0.", "-9.", 1)
    shutil.copy2(wheel, other)
    repo = carried_copy(tmp_path / "checkout", [wheel, other])
    proc = start(repo, str(tmp_path / "out"))
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    lines = output.strip().splitlines()
    assert len(lines) == 1 and "2 atom_train wheels" in lines[0] and "keep the one" in lines[0]


def test_rehearsal_without_an_installable_wheel_skips_only_what_needs_the_loader(wheel, tmp_path):
    broken = tmp_path / wheel.name
    broken.write_bytes(b"not a wheel")
    repo = carried_copy(tmp_path / "checkout", [broken])
    out = tmp_path / "out"
    proc = start(repo, str(out), "--parts", "tests,bench")
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, output[-3000:]
    parts = {p["part"]: p for p in check_summary(out)["parts"]}
    assert parts["install"]["exit"] != 0
    assert parts["bench"]["state"] == "skipped"
    assert "needs the native loader: the install failed" in parts["bench"]["note"]
    assert parts["tests"]["exit"] == 0  # the kernels' parity needs no loader
    assert "loader-free tests only" in parts["tests"]["note"]
    assert "the install failed" in output
