"""gpu_summary.py OUTDIR: gpu_check.sh's one summary screen, and OUTDIR/summary.json.

Reads what the parts left in OUTDIR (parts.tsv, kernel-report.json, tests.xml, timing.json,
bench.json); a part that is missing or cut short is reported as such, never fatal.
Standard library only: it runs even where the project does not import.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def parts(out: Path) -> list[dict]:
    rows = []
    try:
        lines = (out / "parts.tsv").read_text().splitlines()
    except OSError:
        return rows
    for line in lines:
        name, rc, secs, limit = line.split("\t")
        rows.append({"part": name, "exit": int(rc), "seconds": int(secs), "limit": int(limit)})
    return rows


def tests(out: Path) -> list[dict]:
    """Each test case of the JUnit XML: name, outcome (passed/failed/error/skipped), why."""
    try:
        root = ET.parse(out / "tests.xml").getroot()
    except (OSError, ET.ParseError):
        return []
    rows = []
    for case in root.iter("testcase"):
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                why = (el.get("message") or "").splitlines()[0][:160] if el.get("message") else ""
                break
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        rows.append({"test": name, "outcome": outcome, "why": why, "seconds": case.get("time")})
    return rows


def summarize(out: Path) -> tuple[dict, str]:
    report = _json(out / "kernel-report.json")
    timing = _json(out / "timing.json")
    bench = _json(out / "bench.json")
    summary = {
        "parts": parts(out),
        "tests": tests(out),
        "kernel_report": None,
        "timing": timing["results"] if timing else None,
        "bench_trainer": bench["results"] if bench else None,
    }
    lines = [
        "parts: "
        + ", ".join(f"{p['part']} {p['exit']} ({p['seconds']} s)" for p in summary["parts"])
    ]
    if report:
        failed = [v for v in report["variants"] if not v["ok"]]
        worst = {}
        for v in report["variants"]:
            if v["ok"] and v["dtype"] == "float32":
                worst[v["n"]] = max(worst.get(v["n"], 0), v["spill_store_bytes"])
        summary["kernel_report"] = {
            "triton": report["triton"],
            "target": report["target"],
            "failed": len(failed),
            "worst_float32_spill_stores": worst,
            "launches": report["launches"],
        }
        lines.append(
            f"kernels (Triton {report['triton']}, {report['target']}): "
            f"{len(report['variants']) - len(failed)}/{len(report['variants'])} compiled; "
            "worst float32 spill stores by n: "
            + ", ".join(f"{n}: {b} B" for n, b in sorted(worst.items()))
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
    t = summary["tests"]
    if t:
        counts = {}
        for r in t:
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        lines.append("tests: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        for r in t:
            if r["outcome"] in ("failed", "error"):
                lines.append(f"  {r['outcome'].upper()} {r['test']}: {r['why']}")
    else:
        lines.append("tests: no results")
    if summary["timing"]:
        lines.append(
            f"{'loop':>7} {'n':>4} {'B':>6} {'fwd ms':>9} {'bwd ms':>9} {'window ms':>10} {'MB/s':>8}"
        )
        for r in summary["timing"]:
            head = f"{r['recurrence']:>7} {r['n']:>4} {r['B']:>6} "
            if r.get("error"):
                lines.append(head + f"error: {r['error']}")
            else:
                mbs = (r.get("bytes_per_s") or 0) / 1e6
                lines.append(
                    head
                    + f"{r['fwd_ms']:>9.3f} {r['bwd_ms']:>9.3f} {r['window_ms']:>10.3f} {mbs:>8.2f}"
                )
    else:
        lines.append("timing: no results")
    for r in summary["bench_trainer"] or []:
        if "error" in r:
            lines.append(f"trainer window B {r['B']}: error: {r['error']}")
        else:
            wait = r.get("loader_wait_share")
            lines.append(
                f"trainer window B {r['B']}: {r['bytes_per_s'] / 1e6:.2f} MB/s, loader wait "
                + ("-" if wait is None else f"{100 * wait:.1f}%")
            )
    return summary, "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: gpu_summary.py OUTDIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    summary, text = summarize(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
