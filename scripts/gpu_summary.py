"""gpu_summary.py OUTDIR: gpu_check.sh's one summary screen, OUTDIR/summary.txt and
OUTDIR/summary.json, from what the parts left in OUTDIR so far.

gpu_check.sh runs it before the first part and after every part, so a check killed at any
moment (kill -9, a machine taken back) leaves a summary of every part that finished; run it
again by hand to add what the part that was cut had written by then (the bench, the kernel
timings, the kernel report and the tests all write their results as they go).

Reads: info.tsv (the machine, the install), plan.txt (the parts in order), parts.tsv (each
finished part: exit code, seconds, bound, note, start), running.tsv (the part under way),
kernel-report.json, tests.xml and tests-long.xml (or, when pytest was killed before writing
one, its .jsonl: one line per test as it finished), bench.json and timing.json. Every part
is listed with its exit code, or why it has none (skipped, cut, not run). A part stopped at
its bound (`timeout`'s exit 124, or 137 when it had to be killed) is "cut": a test of it
that failed or erred when it finished at or after the bound is listed as cut, not judged
(what the stop did to it says nothing of the product); one that failed before it stands. A
file that is missing or torn is reported as such, never fatal. The keys read from the bench's and the timing's rows are
BENCH_KEYS and TIMING_KEYS: a row without one of them is reported under "problems" (the
rehearsal's test fails on it), never shown as a silent "-".

Standard library only (and the project's atomic write, itself standard library): it runs
even where torch or the project's native module does not import.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from atom_train.common.atomic import atomic_write, atomic_write_json

# The keys of a bench row (`python -m atom_train.bench step`, mode "trainer") and of a kernel
# timing row (`python -m atom_train.bench.kernels`) this summary reads: one definition, checked
# against every row, so a key renamed in the bench shows here (and fails the rehearsal).
BENCH_KEYS = ("mode", "B", "recurrence", "bytes_per_s", "loader_share", "step_wait_share")
TIMING_KEYS = ("recurrence", "n", "B", "fwd_ms", "bwd_ms", "window_ms", "bytes_per_s", "runs")
# pytest's exit codes, and what `timeout` leaves.
EXIT_MEANING = {
    0: "ok",
    1: "failures",
    2: "interrupted",
    5: "no tests",
    124: "cut at its bound",
    130: "interrupted",
    137: "killed at its bound",
}
CUT_EXITS = (124, 137)
PYTEST_PARTS = ("tests", "tests-long")


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _lines(path: Path) -> list[str]:
    try:
        return [x for x in path.read_text().splitlines() if x.strip()]
    except OSError:
        return []


def info(out: Path) -> dict[str, str]:
    """info.tsv: what the script learnt of the machine and the install, key TAB value."""
    return dict(x.split("\t", 1) for x in _lines(out / "info.tsv") if "\t" in x)


def parts(out: Path) -> list[dict]:
    """Every part of plan.txt in order, with its outcome: exit code (an int; None when it has
    none), seconds, bound, start (epoch seconds, when recorded), `cut` (stopped at its bound:
    CUT_EXITS), and `state`: "done", "skipped" (with the note saying why), "running" (its
    start is the newest thing in the folder), or "not run"."""
    finished: dict[str, dict] = {}
    for line in _lines(out / "parts.tsv"):
        cells = line.split("\t")
        name, rc, secs, bound = cells[:4]
        note = cells[4] if len(cells) > 4 else ""
        skipped = rc == "skipped"
        finished[name] = {
            "part": name,
            "exit": None if skipped else int(rc),
            "state": "skipped" if skipped else "done",
            "seconds": int(secs),
            "bound": int(bound),
            "note": note,
            "start": float(cells[5]) if len(cells) > 5 and cells[5] else None,
            "cut": not skipped and int(rc) in CUT_EXITS,
        }
    running = {}
    for line in _lines(out / "running.tsv")[-1:]:
        name, start, bound = line.split("\t")[:3]
        running = {"part": name, "started": float(start), "bound": int(bound)}
    names = _lines(out / "plan.txt") or list(finished)
    rows = []
    for name in names:
        if name in finished:
            rows.append(finished[name])
        elif running.get("part") == name:
            rows.append(
                {
                    "part": name,
                    "exit": None,
                    "state": "running",
                    "seconds": int(time.time() - running["started"]),
                    "bound": running["bound"],
                    "note": "under way, or cut: no exit code recorded",
                }
            )
        else:
            rows.append({"part": name, "exit": None, "state": "not run", "note": ""})
    return rows


def tests(
    out: Path, part: str = "tests", cut_at: float | None = None
) -> tuple[list[dict], str | None]:
    """Each test of a pytest part: name, outcome (passed/failed/error/skipped, or "cut": it
    failed when it finished at or after `cut_at`, the moment its part was stopped), why,
    seconds, and what it recorded (`properties`); and where they came from: PART.xml (pytest
    finished or was interrupted), else PART.jsonl (the tests that finished before pytest was
    killed), else nothing. The .jsonl also gives each test's finishing time."""
    logged = []
    for line in _lines(out / f"{part}.jsonl"):
        try:
            logged.append(json.loads(line))
        except ValueError:  # the line being written when pytest was killed
            continue
    finished = {r["test"]: r.get("finished") for r in logged}
    try:
        root = ET.parse(out / f"{part}.xml").getroot()
    except (OSError, ET.ParseError):
        root = None
    rows = []
    if root is not None:
        for case in root.iter("testcase"):
            outcome, why = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    why = (
                        (el.get("message") or "").splitlines()[0][:160] if el.get("message") else ""
                    )
                    break
            name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            row = {"test": name, "outcome": outcome, "why": why, "seconds": case.get("time")}
            rows.append({**row, **({"properties": props} if props else {})})
        source = f"{part}.xml"
    else:
        rows, source = logged, (f"{part}.jsonl" if logged else None)
    if cut_at is not None:
        for r in rows:
            done = finished.get(r["test"], r.get("finished"))
            if r["outcome"] in ("failed", "error") and (done is None or done >= cut_at - 1):
                r["outcome"] = "cut"
                r["why"] = "the part was stopped at its bound as this test ran: not judged"
    return rows, source


def error_ratios(rows: list[dict]) -> list[tuple[str, float]]:
    """(test, ratio) for the tests that recorded `error_ratio`: their float32 error from the
    float64 truth, in units of the reference's own (loop_check.judge_float32)."""
    out = []
    for r in rows:
        ratio = (r.get("properties") or {}).get("error_ratio")
        try:
            out.append((r["test"], float(ratio)))
        except (TypeError, ValueError):
            continue
    return out


def missing_keys(rows: list[dict] | None, keys: tuple[str, ...], what: str) -> list[str]:
    """One problem per row (that is not an error row) lacking any of `keys`."""
    problems = []
    for r in rows or []:
        if r.get("error"):
            continue
        lacking = [k for k in keys if k not in r]
        if lacking:
            where = ", ".join(f"{k} {r[k]}" for k in ("mode", "recurrence", "n", "B") if k in r)
            problems.append(f"{what} row ({where}) lacks {', '.join(lacking)}")
    return problems


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def summarize(out: Path) -> tuple[dict, str]:
    report = _json(out / "kernel-report.json")
    timing = _json(out / "timing.json")
    bench = _json(out / "bench.json")
    part_rows = parts(out)
    ran: dict[str, tuple[list[dict], str | None]] = {}
    for p in part_rows:
        if p["part"] in PYTEST_PARTS:
            cut_at = (
                p["start"] + p["bound"] if p.get("cut") and p.get("start") is not None else None
            )
            if p.get("cut") and cut_at is None:
                cut_at = 0.0  # (no start recorded: every failure may be the stop's)
            ran[p["part"]] = tests(out, p["part"], cut_at)
    test_rows, test_source = ran.get("tests", ([], None))
    summary = {
        "info": info(out),
        "parts": part_rows,
        "tests": test_rows,
        "tests_from": test_source,
        "tests_long": ran.get("tests-long", ([], None))[0],
        "kernel_report": None,
        "timing": timing["results"] if timing else None,
        "bench_trainer": [r for r in bench["results"] if r.get("mode") == "trainer"]
        if bench
        else None,
    }
    summary["problems"] = missing_keys(
        summary["bench_trainer"], BENCH_KEYS, "bench"
    ) + missing_keys(summary["timing"], TIMING_KEYS, "timing")
    lines = [f"{k}: {v}" for k, v in summary["info"].items()]
    lines.append("parts (exit code, seconds of the bound):")
    for p in summary["parts"]:
        if p["state"] == "done":
            meaning = EXIT_MEANING.get(p["exit"], "failed")
            head = f"  {p['part']:<14} exit {p['exit']:<3} {meaning:<20} {p['seconds']:>4} of {p['bound']:>3} s"
        elif p["state"] == "running":
            head = (
                f"  {p['part']:<14} {'running or cut':<29} {p['seconds']:>4} of {p['bound']:>3} s"
            )
        else:
            head = f"  {p['part']:<14} {p['state']:<29}"
        lines.append(head + (f"  ({p['note']})" if p["note"] and p["state"] != "running" else ""))
    if report:
        failed = [v for v in report["variants"] if not v["ok"]]
        worst: dict[int, int] = {}
        for v in report["variants"]:
            if v["ok"] and v["dtype"] == "float32":
                worst[v["n"]] = max(worst.get(v["n"], 0), v["spill_store_bytes"])
        compile_s = [v["compile_s"] for v in report["variants"] if v.get("compile_s")]
        summary["kernel_report"] = {
            "triton": report["triton"],
            "target": report["target"],
            "complete": report.get("complete", True),
            "failed": len(failed),
            "worst_float32_spill_stores": worst,
            "compile_s_median": statistics.median(compile_s) if compile_s else None,
            "compile_s_max": max(compile_s) if compile_s else None,
            "launches": report["launches"],
        }
        k = summary["kernel_report"]
        lines.append(
            f"kernels (Triton {report['triton']}, {report['target']}): "
            f"{len(report['variants']) - len(failed)}/{len(report['variants'])} compiled"
            + ("" if k["complete"] else " (cut short)")
            + "; worst float32 spill stores by n: "
            + (", ".join(f"{n}: {b} B" for n, b in sorted(worst.items())) or "-")
            + (
                f"; one compile {k['compile_s_median']:.1f} s median, {k['compile_s_max']:.1f} s max"
                if compile_s
                else ""
            )
        )
        lines.append(
            "launches (B n block grid per-SM waves fill): "
            + "; ".join(
                f"{x['B']} {x['n']} {x['streams_per_program']} {x['grid']} {x['programs_per_sm']} "
                f"{x['waves']} {x['fill']:.2f}"
                for x in report["launches"]
            )
        )
    else:
        lines.append("kernels: no report")
    for part in PYTEST_PARTS:
        if part not in ran:
            continue
        rows, source = ran[part]
        if rows:
            counts: dict[str, int] = {}
            for r in rows:
                counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
            lines.append(
                f"{part}: "
                + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                + ("" if source == f"{part}.xml" else f" (from {source}: pytest was killed)")
            )
            for r in rows:
                if r["outcome"] in ("failed", "error", "cut"):
                    lines.append(f"  {r['outcome'].upper()} {r['test']}: {r['why']}")
            ratios = error_ratios(rows)
            if ratios:
                lines.append(
                    "  float32 error from float64, x the reference's own (allowed 8): "
                    + ", ".join(f"{t.split('::')[-1]} {x:.2f}" for t, x in ratios)
                )
        else:
            lines.append(f"{part}: no results")
    if "tests" not in ran:
        lines.append("tests: no results")
    if summary["timing"]:
        lines.append(
            f"{'loop':>7} {'n':>4} {'B':>6} {'fwd ms':>9} {'bwd ms':>9} {'window ms':>10} {'MB/s':>8}"
        )
        for r in summary["timing"]:
            head = f"{r.get('recurrence')!s:>7} {r.get('n')!s:>4} {r.get('B')!s:>6} "
            if r.get("error"):
                lines.append(head + f"error: {r['error']}")
            elif any(k not in r for k in TIMING_KEYS):
                lines.append(head + "row lacks keys: see problems")
            else:
                mbs = (r["bytes_per_s"] or 0) / 1e6
                lines.append(
                    head
                    + f"{r['fwd_ms']:>9.3f} {r['bwd_ms']:>9.3f} {r['window_ms']:>10.3f} {mbs:>8.2f}"
                )
    else:
        lines.append("timing: no results")
    for r in summary["bench_trainer"] or []:
        if r.get("error"):
            lines.append(f"trainer window B {r.get('B')}: error: {r['error']}")
        elif any(k not in r for k in BENCH_KEYS):
            lines.append(f"trainer window B {r.get('B')}: row lacks keys: see problems")
        else:
            lines.append(
                f"trainer window B {r['B']} ({r['recurrence']}): {r['bytes_per_s'] / 1e6:.3g} MB/s;"
                f" the step waited {_pct(r['step_wait_share'])} of the time (on CUDA the GPU's),"
                f" the loader thread worked {_pct(r['loader_share'])}"
            )
    if not summary["bench_trainer"]:
        lines.append("trainer window: no results")
    for p in summary["problems"]:
        lines.append(f"PROBLEM: {p}")
    return summary, "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: gpu_summary.py OUTDIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    summary, text = summarize(out)
    # Atomic: a kill -9 while writing leaves the previous summary, never a torn one.
    atomic_write_json(out / "summary.json", summary)
    atomic_write(out / "summary.txt", (text + "\n").encode())
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
