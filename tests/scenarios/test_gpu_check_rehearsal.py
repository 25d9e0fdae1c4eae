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
in the bench fails here); summary.json parses at every moment of the run (sampled every
0.1 s) and lists the parts finished by then; a run killed (kill -9, the script and every
process under it) in the middle of each part leaves a valid summary.json that lists every
part; OUTDIR given relative to a folder outside the checkout lands there; two project
wheels are refused in one line; a wheel that does not install skips only what needs the
native loader, and says so. About 2-3 minutes on 2 busy cores (the kernel report's 4
compiles, the interpreted kernels and the bench's subprocesses are most of it).
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
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("triton")

from helpers import REPO

SCRIPT = Path("scripts") / "gpu_check.sh"
PARTS = ["probe", "install", "tests", "bench", "kernel-report", "timing"]
RUST_INPUTS = [
    *("Cargo.toml", "Cargo.lock", "pyproject.toml"),
    *("atomdata-rs", "atomfield-rs", "atom-py"),  # the crates and the binding
]


def _summary_module():
    spec = importlib.util.spec_from_file_location(
        "gpu_summary", REPO / "scripts" / "gpu_summary.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_summary = _summary_module()


def _rust_key() -> str:
    h = hashlib.sha256()
    for name in RUST_INPUTS:
        path = REPO / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if "target" in f.relative_to(REPO).parts:
                continue
            h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def wheel() -> Path:
    """The project's wheel, as `make wheel` builds it, cached by the Rust sources' hash."""
    cache = REPO / "target" / "rehearsal-wheel" / _rust_key()
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


def carried_copy(dest: Path, wheels: list[Path]) -> Path:
    """The checkout as the device tool carries it (tracked and untracked files that git does
    not ignore: no native module, no dist/), with `wheels` in dist/."""
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
    return dest


def start(repo: Path, out: str, *options: str, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", str(repo / SCRIPT), "--rehearse", *options, out],
        cwd=cwd or repo,
        env={**os.environ, "PYTHON": sys.executable},
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
    """One whole rehearsal, OUTDIR given relative to a folder outside the checkout, with
    summary.json sampled every 0.1 s while it runs: (outdir, exit code, output, samples)."""
    repo = carried_copy(tmp_path_factory.mktemp("checkout"), [wheel])
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    samples: list[tuple[str | None, str | None]] = []  # (running part, summary.json text)
    proc = start(repo, "out", cwd=elsewhere)
    out = elsewhere / "out"

    def sample():
        while proc.poll() is None:
            try:
                text = (out / "summary.json").read_text()
            except OSError:
                text = None
            samples.append((running_part(out), text))
            time.sleep(0.1)

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        output, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            kill_everything(proc)
        watcher.join()
    return out, proc.returncode, output, samples


def test_rehearsal_runs_every_part_and_lists_each_with_its_exit_code(rehearsal):
    out, code, output, _ = rehearsal
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
    """What a kill -9 at any of the sampled moments would have left: a summary.json that
    parses, with every part that had finished by then and its exit code."""
    _, _, _, samples = rehearsal
    seen = set()
    for running, text in samples:
        if text is None:
            continue  # (before the first summary)
        summary = json.loads(text)
        assert [p["part"] for p in summary["parts"]] == PARTS
        if running in PARTS:
            seen.add(running)
            before = PARTS[: PARTS.index(running)]
            states = {p["part"]: p["state"] for p in summary["parts"]}
            assert all(states[p] == "done" for p in before), (running, states)
    assert seen == set(PARTS)  # sampled inside every part


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
