"""`make mutants`: mutation testing of the code that holds the project's guarantees.

Each tool breaks the code on purpose, one small change (a mutant) at a time, and runs the
tests: a mutant that no test notices (it "survives") is a change of behaviour the tests
would let through. docs/testing.md explains every mutant that survives.

- Rust: cargo-mutants on each crate of `RUST` (config: .cargo/mutants.toml), `cargo test`.
- Python: mutmut on each module of `PYTHON`, against that module's own tests only (the
  whole suite takes ~10 minutes; a module's tests take seconds), each in its own copy of the
  repository under build/mutants/python/<name>/ (mutmut writes its mutated tree there).

Writes build/mutants/report.md (scores, times, every surviving mutant with its diff) and
prints the summary. Exit status 0 when every tool ran to the end, whatever the score: the
score is the report's, and the survivors are read against docs/testing.md.

`--since REV` is for a developer's own loop: only the functions (Python) and the code
(Rust: cargo-mutants' --in-diff) changed since REV (`git diff REV`: commits and the work
tree) are mutated, each against its module's tests as in the full run; a part with nothing
changed is skipped. Its results go to build/mutants/since/ (report.md there), apart from the
full run's.

    python scripts/mutants.py [--only NAME ...] [--skip-rust] [--skip-python] [--since REV]
    (NAME: a Python module's key in PYTHON, or rust-atomdata, rust-atomfield)
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "mutants"

# name -> (module, its tests, the functions to mutate or None for all). A function is named
# as in the module: `name` (a module's function), `Class.method`, or `Class` (its methods).
# The modules that hold the guarantees: checkpoint writing and loading, run state, corpus
# layout, distributed reduction, the training step, the schedules, the supervisor's decision
# (its cannot-start rule among them), the pre-flight's checks and probes, the loss log, the
# noise scale, the corpus's content sniffing and filters, the flag and metric vocabulary,
# the run planner's refusals. Where a module's tests start the code in a child process
# (mutmut sees only what runs in process) or run for minutes, it is the functions that its
# in-process tests reach, against those tests.
# The supervisor's tests that run in process (the others start `python -m
# atom_train.supervise` in a folder of their own, where the mutated copy finds no config).
_SUPERVISOR_TESTS = [
    "test_decision_after_the_trainer_ends",
    "test_backoff_doubles_to_its_cap_and_a_checkpoint_resets_it",
    "test_each_decision_says_what_happened_and_what_follows",
    "test_giving_up_names_the_count_and_the_last_exit",
    "test_the_command_line_is_refused_with_the_fix",
    "test_a_good_command_line_splits_at_the_double_dash",
    "test_the_command_lines_refusals_word_for_word",
    "test_an_exit_is_described_by_its_code_or_signal",
    "test_status_counts_only_when_written_during_this_launch",
    "test_the_checkpoint_set_names_sizes_and_times_only_checkpoints",
    "test_a_crash_after_a_new_checkpoint_says_the_count_was_reset",
    "test_the_checkpoint_set_looks_past_other_files",
    "test_the_checkpoint_set_skips_a_checkpoint_renamed_away_while_it_looked",
    "test_a_trainer_that_cannot_start_is_not_relaunched_unless_it_wrote_a_checkpoint",
    "test_the_last_error_line_is_the_text_a_trainer_wrote_last",
]
# The pre-flight command's tests that run in process (the whole command, a subprocess of a
# minute and more, holds the rest: `evaluate`, `measure`).
_PREFLIGHT_TESTS = [
    "test_the_run_is_projected_from_the_numbers_of_its_plan",
    "test_bad_input_is_one_line_and_exit_2",
    "test_cuda_without_a_gpu_is_refused_with_one_line",
]
PYTHON: dict[str, tuple[str, list[str], list[str] | None]] = {
    "checkpoint-file": (
        "atom_train/trainer/checkpoint_file.py",
        ["tests/trainer/test_checkpoint_file.py", "tests/trainer/test_checkpoint_file_edges.py"],
        None,
    ),
    "atomic-write": (
        "atom_train/common/atomic.py",
        ["tests/common/test_atomic.py", "tests/trainer/test_checkpoint_file.py"],
        None,
    ),
    "checkpointer": (
        "atom_train/trainer/checkpointer.py",
        ["tests/trainer/test_checkpointer.py", "tests/trainer/test_checkpointer_edges.py"],
        None,
    ),
    "train-state": (
        "atom_train/trainer/train_state.py",
        [
            "tests/trainer/test_train_state.py",
            "tests/trainer/test_train_state_refusals.py",
            "tests/trainer/test_checkpointer.py",
        ],
        None,
    ),
    "corpus-layout": ("atom_train/corpus/layout.py", ["tests/corpus/test_corpus_parts.py"], None),
    "distributed": (
        "atom_train/trainer/distributed.py",
        ["tests/trainer/test_distributed_world.py", "tests/trainer/test_distributed_units.py"],
        None,
    ),
    "step": (  # (its NoiseProbe is the noise-probe part's)
        "atom_train/trainer/step.py",
        ["tests/trainer/test_step.py"],
        ["make_optimizer", "clip_grad_norm", "_sq_norm", "WindowStep"],
    ),
    "lr-schedule": (
        "atom_train/trainer/lr_schedule.py",
        ["tests/trainer/test_lr_schedule.py"],
        None,
    ),
    "window-schedule": ("atom_train/model/lockstep.py", ["tests/model/test_lockstep.py"], None),
    "supervisor": (
        "atom_train/supervise.py",
        [f"tests/commands/test_supervise.py::{t}" for t in _SUPERVISOR_TESTS],
        [
            "decide",
            "parse_command_line",
            "checkpoint_set",
            "_describe_exit",
            "_read_status",
            "last_error_line",
        ],
    ),
    "preflight-checks": (
        "atom_train/preflight/checks.py",
        ["tests/preflight/test_checks.py", "tests/preflight/test_checks_word_for_word.py"],
        None,
    ),
    # (the trainer exercised for real, the loader's reads, the memory probe: the command)
    "preflight-probes": (
        "atom_train/preflight/probes.py",
        ["tests/preflight/test_probes.py", "tests/preflight/test_probes_edges.py"],
        [
            "meminfo",
            "free_space",
            "drop_from_cache",
            "cached_fraction",
            "scratch_argv",
            "compare_resume",
            "measure_backoff",
            "on_complete_probe",
        ],
    ),
    "preflight": (
        "atom_train/preflight/command.py",
        [
            *(f"tests/preflight/test_command.py::{t}" for t in _PREFLIGHT_TESTS),
            "tests/preflight/test_command_units.py",
        ],
        ["parse", "shape_of", "open_scratch"],
    ),
    "loss-log": (
        "atom_train/trainer/loss_log.py",
        ["tests/trainer/test_loss_log.py", "tests/trainer/test_loss_log_edges.py"],
        None,
    ),
    "noise-scale": (
        "atom_train/trainer/noise_scale.py",
        ["tests/trainer/test_noise_scale.py", "tests/trainer/test_noise_scale_exact.py"],
        None,
    ),
    "noise-probe": (
        "atom_train/trainer/step.py",
        ["tests/trainer/test_noise_scale.py", "tests/trainer/test_noise_probe_world.py"],
        ["NoiseProbe"],
    ),
    "corpus-sniff": (
        "atom_train/corpus/inputs.py",
        [
            "tests/corpus/test_corpus_libraries.py::test_sniff_by_content_not_by_name",
            "tests/corpus/test_corpus_libraries.py::test_html_inputs_by_name_and_by_content",
            "tests/corpus/test_sniff_edges.py",
        ],
        ["sniff", "_binary_text"],
    ),
    "corpus-filters": (
        "atom_train/corpus/scan.py",
        [
            "tests/corpus/test_corpus.py",
            "tests/corpus/test_corpus_libraries.py::test_language_any_code_and_threshold",
            "tests/corpus/test_document_assembler.py",
        ],
        ["DocumentAssembler"],
    ),
    "flags": (
        "atom_train/trainer/flags.py",
        ["tests/trainer/test_flags.py", "tests/trainer/test_flag_checks.py"],
        None,
    ),
    "cli-vocabulary": (
        "atom_train/common/cli.py",
        [
            "tests/common/test_vocabulary.py",
            "tests/common/test_cli.py",
            "tests/common/test_cli_units.py",
        ],
        None,
    ),
    "metrics": ("atom_train/common/metrics.py", ["tests/trainer/test_metric_names.py"], None),
    "plan-refusals": (
        "atom_train/trainer/plan.py",
        ["tests/trainer/test_plan.py", "tests/trainer/test_plan_refusals.py"],
        [
            "check_config",
            "resolve_total",
            "_check_no_revert",
            "_check_fork_target",
            "_check_refork",
            "_model_config",
            "_check_init_shape",
        ],
    ),
    "backend-refusals": (
        "atom_train/model/backend.py",
        ["tests/trainer/test_plan.py", "tests/model/test_backend_refusals.py"],
        ["resolve_device", "resolve_recurrence"],
    ),
    "loader-state-refusal": (
        "atom_train/data/sources.py",
        ["tests/trainer/test_plan.py", "tests/data/test_loader_state_refusal.py"],
        ["check_loader_state"],
    ),
}

# mutmut stops a mutant's tests after (their time in the clean run + TIMEOUT_CONSTANT_S) x
# TIMEOUT_MULTIPLIER seconds of wall time ("timeout": counted as killed). A test's time there
# leaves out its module-scoped fixtures (mutmut counts a fixture's setup to the first test
# that used it), so mutmut's own bound (15 x (time + 1 s)) stopped tests still waiting for a
# fixture that starts a trainer on a busy machine: "timeouts" that were not hangs, and could
# hide a survivor. This bound lets a fixture of a minute finish; a real hang costs 2 minutes.
TIMEOUT_CONSTANT_S, TIMEOUT_MULTIPLIER = 30.0, 4.0

# Copied beside the package and the tests: what the tests read from the repository.
ALSO_COPY = ["docs", "scripts", "README.md", "Makefile", "pyproject.toml", "atom-py"]


def run(cmd: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> int:
    with log.open("w") as f:
        return subprocess.run(
            cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        ).returncode


def repo_files() -> list[str]:
    """The repository's files as a fresh clone has them (tracked and new, not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [p for p in out.splitlines() if (ROOT / p).is_file()]


def native_modules() -> list[str]:
    found = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "atom_train").glob("_atomdata*.so"))
    if not found:
        sys.exit("error: atom_train has no built _atomdata module: run `make setup` first")
    return found


class ToolFailed(Exception):
    """A tool did not run to the end (the other parts still run; the exit status says it)."""


# ---- Rust ----------------------------------------------------------------------------------


# The plain crates (packages): the loader (atomdata-rs/) and the native field loop
# (atomfield-rs/). The binding crate (atom-py/) is held by pytest, not cargo test.
RUST = ("atomdata", "atomfield")


def rust(package: str, base: Path = OUT, diff: str | None = None) -> dict:
    """cargo-mutants on `package`; with `diff` (a `git diff`), only the code it changes."""
    out = base / "rust" / package
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    only: list[str] = []
    if diff is not None:
        (out / "since.diff").write_text(diff)
        only = ["--in-diff", str(out / "since.diff")]
    t0 = time.monotonic()
    rc = run(
        ["cargo", "mutants", "-p", package, "-o", str(out), "--timeout", "120", *only],
        ROOT,
        out / "cargo-mutants.log",
    )
    seconds = time.monotonic() - t0
    # Exit codes: 0 all caught, 2 some missed, 3 some timed out; anything else is a failure.
    if rc not in (0, 2, 3):
        sys.exit(f"error: cargo mutants failed (exit {rc}): see {out / 'cargo-mutants.log'}")
    if diff is not None and not (out / "mutants.out" / "outcomes.json").exists():
        return {"name": f"{package} (cargo-mutants, the diff)", "total": 0, "killed": 0,
                "survived": 0, "other": "no mutant in the diff", "score": 1.0,
                "seconds": seconds, "survivors": [], "timeouts": []}  # fmt: skip
    result = json.loads((out / "mutants.out" / "outcomes.json").read_text())
    missed = (out / "mutants.out" / "missed.txt").read_text().splitlines()
    timeouts = (out / "mutants.out" / "timeout.txt").read_text().splitlines()
    tested = result["caught"] + result["missed"] + result["timeout"]
    return {
        "name": f"{package} (cargo-mutants)",
        "total": result["total_mutants"],
        "killed": result["caught"] + result["timeout"],
        "survived": result["missed"],
        "other": f"{result['unviable']} unviable (do not build)",
        "score": (result["caught"] + result["timeout"]) / tested if tested else 1.0,
        "seconds": seconds,
        "survivors": [(m, "") for m in missed],
        "timeouts": timeouts,
    }


# ---- Python --------------------------------------------------------------------------------


# mutmut forks a child per mutant from a process that has run tests. Where torch's intra-op
# thread pool (OpenMP) had started in the parent, a child's first matmul waited forever on a
# lock a thread of the parent held at the fork: a "timeout" (counted as killed) for a mutant
# no test had caught. One thread each: no pool to inherit (the tests do not depend on it).
FORK_SAFE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def mutmut(args: list[str], cwd: Path, log: Path) -> int:
    return run([sys.executable, "-m", "mutmut", *args], cwd, log, env=FORK_SAFE_ENV)


# The diffs of many mutants in one process (`mutmut show` is one process each).
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant
json.dump({n: get_diff_for_mutant(n, path=find_mutant(n).path) for n in json.load(sys.stdin)},
          sys.stdout)
"""


def mutant_diffs(names: list[str], work: Path) -> dict[str, str]:
    if not names:
        return {}
    out = subprocess.run(
        [sys.executable, "-c", _DIFFS],
        cwd=work,
        input=json.dumps(names),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def widen_to_all_tests(work: Path) -> int:
    """Map every mutated function to every test mutmut knows of, and mark the mutants that
    survived or met no test as not yet checked. Returns how many were marked."""
    stats_path = work / "mutants" / "mutmut-stats.json"
    stats = json.loads(stats_path.read_text())
    by_function = stats["tests_by_mangled_function_name"]
    every = sorted(
        {t for tests in by_function.values() for t in tests} | set(stats["duration_by_test"])
    )
    marked = 0
    for meta_path in (work / "mutants").rglob("*.meta"):
        meta = json.loads(meta_path.read_text())
        for key, code in meta["exit_code_by_key"].items():
            if code in (0, 33):  # survived, no tests
                meta["exit_code_by_key"][key] = None
                by_function[key.rsplit("__mutmut_", 1)[0]] = every
                marked += 1
        meta_path.write_text(json.dumps(meta))
    for key in by_function:
        by_function[key] = every
    stats_path.write_text(json.dumps(stats))
    return marked


def mutant_patterns(module: str, functions: list[str] | None) -> list[str]:
    """mutmut's names for the mutants of `functions` of `module` (none: every mutant): a
    function `name` (x_name), a method `Class.method` (xǁClassǁmethod), a class's methods
    `Class`."""
    if not functions:
        return []
    dotted = module.removesuffix(".py").replace("/", ".")
    classes = {
        n.name for n in ast.parse((ROOT / module).read_text()).body if isinstance(n, ast.ClassDef)
    }
    out = []
    for f in functions:
        cls, _, method = f.rpartition(".")
        if cls:
            out.append(f"{dotted}.xǁ{cls}ǁ{method}__mutmut_*")
        elif f in classes:
            out.append(f"{dotted}.xǁ{f}ǁ*__mutmut_*")
        else:
            out.append(f"{dotted}.x_{f}__mutmut_*")
    return out


def python_module(
    name: str,
    module: str,
    tests: list[str],
    functions: list[str] | None,
    files: list[str],
    collect_only: bool = False,
    base: Path = OUT,
) -> dict:
    work = base / "python" / name
    patterns = mutant_patterns(module, functions)
    if collect_only:  # the result of an earlier run in `work`, read again
        return collect(work, module, tests, functions, patterns, seconds=0.0)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for rel in files + native_modules():
        dst = work / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst)
    also = [*native_modules(), *(p for p in ALSO_COPY if (work / p).exists())]
    (work / "setup.cfg").write_text(
        "[mutmut]\n"
        "source_paths=atom_train/\n"
        f"only_mutate={module}\n"
        f"timeout_constant={TIMEOUT_CONSTANT_S:g}\n"
        f"timeout_multiplier={TIMEOUT_MULTIPLIER:g}\n"
        "pytest_add_cli_args_test_selection=\n"
        + "".join(f"    {t}\n" for t in tests)
        + "also_copy=\n"
        + "".join(f"    {p}\n" for p in also)
    )
    t0 = time.monotonic()
    rc = mutmut(["run", *patterns], work, work / "mutmut-run.log")
    if rc != 0:
        raise ToolFailed(f"mutmut failed on {module} (exit {rc}): see {work / 'mutmut-run.log'}")
    # mutmut runs a mutant against the tests that called its function while it collected
    # them; a test that uses a module-scoped fixture made by an earlier test never calls
    # what the fixture ran, and would be left out. So every survivor is tried once more
    # against all of the module's tests.
    if widen_to_all_tests(work):
        rc = mutmut(["run", *patterns], work, work / "mutmut-rerun.log")
        if rc != 0:
            raise ToolFailed(f"mutmut failed on {module} (exit {rc}): see mutmut-rerun.log")
    return collect(work, module, tests, functions, patterns, time.monotonic() - t0)


def describe_tests(tests: list[str]) -> str:
    """The tests, shortly: a file's own, or how many of a file's (`file (N of its tests)`)."""
    by_file: dict[str, int] = {}
    for t in tests:
        path, _, name = t.partition("::")
        by_file[path] = by_file.get(path, 0) + (1 if name else 0)
    return ", ".join(f"{f} ({n} of its tests)" if n else f for f, n in by_file.items())


def collect(
    work: Path,
    module: str,
    tests: list[str],
    functions: list[str] | None,
    patterns: list[str],
    seconds: float,
) -> dict:
    listing = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: dict[str, int] = {}
    survivors, timeouts = [], []
    for line in listing.splitlines():
        mutant, _, status = line.strip().rpartition(": ")
        if patterns and not any(fnmatch.fnmatch(mutant, p) for p in patterns):
            continue
        counts[status] = counts.get(status, 0) + 1
        if status in ("survived", "no tests", "suspicious"):
            survivors.append((mutant, status))
        elif status == "timeout":
            timeouts.append(mutant)
    diffs = mutant_diffs([m for m, _ in survivors], work)
    survivors = [
        (f"{m} ({status})", "\n".join(x for x in diffs[m].splitlines() if x[:2] in ("- ", "+ ")))
        for m, status in survivors
    ]
    killed = sum(counts.get(k, 0) for k in ("killed", "timeout", "segfault"))
    survived = sum(counts.get(k, 0) for k in ("survived", "no tests", "suspicious"))
    scope = f"{module} ({', '.join(functions)})" if functions else module
    return {
        "name": f"{scope}, tests: {describe_tests(tests)}",
        "total": sum(counts.values()),
        "killed": killed,
        "survived": survived,
        "other": ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
        "score": killed / (killed + survived) if killed + survived else 1.0,
        "seconds": seconds,
        "survivors": survivors,
        "timeouts": timeouts,
    }


# ---- --since REV: what changed ---------------------------------------------------------------


def git(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def changed_lines(path: str, rev: str, root: Path = ROOT) -> set[int] | None:
    """The lines of `path` (as in the work tree) that differ from `rev`'s; None when `rev`
    has no such file (all of it is new)."""
    if git("cat-file", "-e", f"{rev}:{path}", root=root).returncode != 0:
        return None
    out = git("diff", "-U0", rev, "--", path, root=root)
    if out.returncode != 0:
        sys.exit(f"error: git diff {rev} failed: {out.stderr.strip()}")
    lines: set[int] = set()
    for m in re.finditer(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", out.stdout, re.M):
        start, count = int(m[1]), int(m[2] if m[2] is not None else 1)
        # (lines only removed: the change is between `start` and the line after it)
        lines.update(range(start, start + count) if count else (start, start + 1))
    return lines


def changed_functions(module: str, rev: str, root: Path = ROOT) -> list[str]:
    """The functions (`name`) and methods (`Class.method`) of `module` that a change since
    `rev` touches (their decorators, signature or body)."""
    lines = changed_lines(module, rev, root)
    found = []
    for node in ast.parse((root / module).read_text()).body:
        defs = (
            [(node.name, node)] if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else []
        )
        if isinstance(node, ast.ClassDef):
            defs = [(f"{node.name}.{m.name}", m) for m in node.body
                    if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]  # fmt: skip
        for name, d in defs:
            first = min([d.lineno, *(x.lineno for x in d.decorator_list)])
            if lines is None or any(first <= n <= d.end_lineno for n in lines):
                found.append(name)
    return found


def in_scope(changed: list[str], functions: list[str] | None) -> list[str]:
    """The changed functions that a part mutates (all of them where it lists none)."""
    if functions is None:
        return changed
    return [f for f in changed if f in functions or f.split(".")[0] in functions]


def crate_dirs() -> dict[str, str]:
    """Each Rust package's folder, relative to the repository (from cargo metadata)."""
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {
        pkg["name"]: str(Path(pkg["manifest_path"]).parent.relative_to(ROOT))
        for pkg in json.loads(out)["packages"]
    }


# ---- report --------------------------------------------------------------------------------


def report(rows: list[dict]) -> str:
    seconds = sum(r["seconds"] for r in rows)
    killed, survived = sum(r["killed"] for r in rows), sum(r["survived"] for r in rows)
    lines = [
        "# Mutation testing report (`make mutants`)",
        "",
        f"{killed} of {killed + survived} mutants killed "
        f"({100 * killed / max(1, killed + survived):.1f}%), in {seconds / 60:.1f} min of "
        "tool time.",
        "",
        "| code (tests) | mutants | killed | survived | score | time | notes |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['total']} | {r['killed']} | {r['survived']} | "
            f"{100 * r['score']:.1f}% | {r['seconds'] / 60:.1f} min | {r['other']} |"
        )
    for r in rows:
        lines += ["", f"## Survivors: {r['name']}", ""]
        if not r["survivors"]:
            lines.append("None.")
        for mutant, diff in r["survivors"]:
            lines.append(f"- `{mutant}`")
            if diff:
                lines += ["  ```diff", *("  " + x for x in diff.splitlines()), "  ```"]
        if r.get("timeouts"):  # counted as killed: each is worth a look (a hang, not a catch?)
            lines += ["", "Timed out (counted as killed):", ""]
            lines += [f"- `{m}`" for m in r["timeouts"]]
    return "\n".join(lines) + "\n"


def save_row(key: str, row: dict, base: Path = OUT) -> None:
    """Keep each part's result, so that parts run separately (--only, --skip-*) still make
    one report of the latest result of each."""
    rows = base / "rows"
    rows.mkdir(parents=True, exist_ok=True)
    (rows / f"{key}.json").write_text(json.dumps(row, indent=1))


def saved_rows(base: Path = OUT) -> list[dict]:
    order = [f"rust-{package}" for package in RUST] + list(PYTHON)
    found = {p.stem: json.loads(p.read_text()) for p in (base / "rows").glob("*.json")}
    return [found[k] for k in order if k in found]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    rust_names = [f"rust-{package}" for package in RUST]
    p.add_argument(
        "--only", nargs="+", choices=sorted(PYTHON) + rust_names, help="these parts only"
    )
    p.add_argument("--skip-rust", action="store_true")
    p.add_argument("--skip-python", action="store_true")
    p.add_argument(
        "--collect", action="store_true", help="read the last run's results again, run nothing"
    )
    p.add_argument(
        "--since",
        metavar="REV",
        help="mutate only the functions (Python) and code (Rust) changed since REV (git diff "
        "REV, the work tree included); results in build/mutants/since/",
    )
    a = p.parse_args()
    base = OUT / "since" if a.since else OUT
    if a.since:
        if git("rev-parse", "--verify", "--quiet", f"{a.since}^{{commit}}").returncode != 0:
            p.error(f"--since {a.since}: no such commit here")
        if not a.collect:  # (the report is this run's alone)
            shutil.rmtree(base / "rows", ignore_errors=True)
    t0 = time.monotonic()
    rows: list[dict] = []
    failed: list[str] = []
    if not a.skip_rust and not a.collect:
        dirs = crate_dirs() if a.since else {}
        for package in RUST:
            if a.only and f"rust-{package}" not in a.only:
                continue
            diff = None
            if a.since:
                diff = git("diff", a.since, "--", f":(glob){dirs[package]}/**/*.rs").stdout
                if not diff.strip():
                    print(f"{package}: no Rust changed since {a.since}", flush=True)
                    continue
            print(f"cargo-mutants on {package} ...", flush=True)
            rows.append(rust(package, base, diff))
            save_row(f"rust-{package}", rows[-1], base)
    if not a.skip_python:
        files = repo_files()
        for name in [n for n in a.only if n in PYTHON] if a.only else PYTHON:
            module, tests, functions = PYTHON[name]
            if a.since:
                functions = in_scope(changed_functions(module, a.since), functions)
                if not functions:
                    print(f"{name}: nothing it mutates changed since {a.since}", flush=True)
                    continue
            scope = f" ({', '.join(functions)})" if functions else ""
            print(f"mutmut on {module}{scope} against {describe_tests(tests)} ...", flush=True)
            try:
                rows.append(python_module(name, module, tests, functions, files, a.collect, base))
            except ToolFailed as e:
                print(f"error: {e}", flush=True)
                failed.append(name)
                continue
            if a.collect:
                saved = json.loads((base / "rows" / f"{name}.json").read_text())
                rows[-1]["seconds"] = saved["seconds"]
            save_row(name, rows[-1], base)
            r = rows[-1]
            print(f"  {r['killed']}/{r['total']} killed, {r['survived']} survived", flush=True)
    print(f"this run: {(time.monotonic() - t0) / 60:.1f} min")
    text = report(saved_rows(base))
    base.mkdir(parents=True, exist_ok=True)
    (base / "report.md").write_text(text)
    print(text.split("\n## ")[0])
    print(f"report: {base / 'report.md'}")
    if failed:
        print(f"error: no result for {', '.join(failed)} (see above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
