"""What a run's logs cost over days: ``python -m atom_train.bench logs`` (or ``python -m
atom_train.bench.logs``).

Writes the logs of a synthetic run of `--days` at `--steps-per-s` optimizer steps per second
(B streams, K ticks per step) in both run folder formats, then times each reader on each:

- format 1: loss.jsonl with one line per step (``bpb``, ``gnorm``, ``bytes``), the events
  among them (written here as a fixture, in large buffered writes);
- format 2: loss.jsonl bounded by time (`trainer.loss_log.StepLines`, the trainer's own
  writer, at --loss-log-rate's default, on a simulated clock), events.jsonl, and
  progress.tsv's grad_norm column;
- both: a ``resume`` event each day and a ``pivot`` on the third; progress.tsv with a row
  every `--row-every-s` seconds of the run.

The readers, each in a fresh process (its time, peak RSS, and the RSS it started reading
from, so the reader's own memory is the difference): the planner's event scan, the plot's
``read_run`` and the TensorBoard conversion (``plot --tensorboard``). ``eval`` reads
checkpoints, not these logs. `--readers-from DIR` runs the readers of another checkout
(an earlier version, for a before/after table); `--mem-cap-gb` caps each reader's address
space, so a reader whose memory grows with the file fails there instead of exhausting the
machine.

    python -m atom_train.bench logs --days 7 --steps-per-s 300 -B 1024 -K 64 --out runs/logbench
    python -m atom_train.bench logs --days 0.01 --out /tmp/logs   # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from atom_train.common.atomic import atomic_write_json
from atom_train.common.cli import (
    ArgumentParser,
    UserError,
    add_shared,
    format_duration,
    say,
    set_command,
    user_error_exit,
)
from atom_train.trainer.loss_log import DEFAULT_RATE, EventLog, StepLines
from atom_train.trainer.rundir import LOSS_LOG, PROGRESS, PROGRESS_COLUMNS, AppendLog

DAY = 86_400
FORMAT_1_COLUMNS = tuple(c for c in PROGRESS_COLUMNS if c != "grad_norm")

# Each reader: a snippet run as `python -c`, given the run folder and a scratch folder; it
# prints what it found. It works with this version's API and with the previous one's.
READERS = {
    "events (the planner)": """
try:
    from atom_train.trainer.loss_log import read_events
except ImportError:  # the previous version: the planner's own scan of loss.jsonl
    from atom_train.trainer.plan import _events as read_events
found = len(read_events(folder))
""",
    "plot (read_run)": """
from atom_train.trainer.run_logs import read_run
run = read_run(folder)
found = len(run.progress) + len(run.log.events)
""",
    "TensorBoard conversion": """
from atom_train.trainer.run_logs import read_run
from atom_train.trainer.tensorboard_log import convert_run
convert_run(read_run(folder), scratch / "tb")
found = sum(1 for _ in (scratch / "tb").iterdir())
""",
}
_PRELUDE = """
import json, sys, time
from pathlib import Path
def rss(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
folder, scratch = Path(sys.argv[1]), Path(sys.argv[2])
import atom_train.trainer.run_logs, atom_train.trainer.tensorboard_log, atom_train.trainer.plan
import torch.utils.tensorboard
base = rss("VmRSS")
t0 = time.perf_counter()
"""
_POSTLUDE = """
print(json.dumps({"s": time.perf_counter() - t0, "peak_rss_mb": rss("VmHWM"),
                  "base_rss_mb": base, "found": found}))
"""


class Values:
    """A step's loss, bits/byte and gradient norm: cheap, deterministic, of the written
    precision, slowly falling as a run's do."""

    def __call__(self, step: int) -> tuple[float, float, float]:
        w = (step * 2654435761) % 1000 / 1000
        loss = 1.0 + 2.0 / math.log(step + 2) + 0.05 * w
        return loss, loss * 1.15, 0.2 + 0.1 * w


def _events_at(steps: int, per_s: float) -> dict[int, dict]:
    """The run's events, by the step they come before: a resume each day, a pivot on day 3."""
    out = {}
    for day in range(1, math.ceil(steps / per_s / DAY)):
        step = int(day * DAY * per_s)
        out[step] = {"event": "resume", "step": step, "checkpoint": "ckpt-rolling.safetensors"}
        if day == 3:
            out[step + 1] = {"event": "pivot", "step": step, "changes": {"lr": [0.002, 0.001]}}
    return out


def _progress(folder: Path, steps: int, per_s: float, K: int, B: int, row_every_s: float,
              columns: tuple[str, ...]) -> int:  # fmt: skip
    rows = max(1, int(steps / per_s / row_every_s))
    every = max(1, steps // rows)
    values = Values()
    with open(folder / PROGRESS, "w") as f:
        f.write("\t".join(columns) + "\n")
        for i in range(1, rows + 1):
            step = i * every
            loss, bpb, gnorm = values(step)
            row = {"tick": step * K, "bytes_seen": step * K * B, "loss": loss,
                   "byte_ce_bpb": bpb, "grad_norm": gnorm, "lr": 1e-3,
                   "elapsed_s": step / per_s}  # fmt: skip
            f.write("\t".join(f"{row[c]:.6g}" if c in row else "" for c in columns) + "\n")
    return rows


def write_format_1(folder: Path, steps: int, per_s: float, B: int, K: int) -> dict:
    """One line per step, the events among them (format 1, as a fixture: buffered)."""
    values, events = Values(), _events_at(steps, per_s)
    t0 = time.perf_counter()
    with open(folder / LOSS_LOG, "w") as f:
        f.write(json.dumps({"event": "start", "tick": 0, "B": B}, separators=(",", ":")) + "\n")
        buf = []
        for step in range(1, steps + 1):
            if step in events:
                buf.append(json.dumps({**events[step], "tick": step * K}, separators=(",", ":")))
            loss, bpb, gnorm = values(step)
            tick = step * K
            buf.append(
                f'{{"step":{step},"tick":{tick},"bytes":{tick * B},"loss":{loss:.6f},'
                f'"bpb":{bpb:.6f},"lr":0.001,"gnorm":{gnorm:.6f}}}'
            )
            if len(buf) >= 65536:
                f.write("\n".join(buf) + "\n")
                buf.clear()
        if buf:
            f.write("\n".join(buf) + "\n")
    return {"write_s": time.perf_counter() - t0}


def write_format_2(
    folder: Path, steps: int, per_s: float, B: int, K: int, rate: float, ckpt_every_s: float
) -> dict:
    """Through the trainer's writers: `StepLines` on a clock that advances 1/per_s a step
    (a checkpoint every `ckpt_every_s` closes the open slot, as the trainer's do), events
    through `EventLog`."""
    values, events = Values(), _events_at(steps, per_s)
    now = [0.0]
    log = AppendLog(folder / LOSS_LOG)
    ev = EventLog(folder, log)
    lines = StepLines(log.write_json, B, rate, clock=lambda: now[0])
    ckpt_steps = max(1, round(ckpt_every_s * per_s))
    ev.write({"event": "start", "tick": 0, "B": B})
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        if step in events:
            lines.close()
            ev.write({**events[step], "tick": step * K})
        loss, bpb, gnorm = values(step)
        lines.write(lines.mark(), step, step * K, 1e-3,
                    {"loss": loss, "train_bpb": bpb, "grad_norm": gnorm})  # fmt: skip
        if step % ckpt_steps == 0:
            lines.close()
        now[0] += 1.0 / per_s
    lines.close()
    took = time.perf_counter() - t0
    ev.close()
    log.close()
    return {"write_s": took, "write_us_per_step": 1e6 * took / steps}


def run_reader(name: str, folder: Path, scratch: Path, readers_from: str | None,
               cap_gb: float, timeout: float) -> dict:  # fmt: skip
    env = dict(os.environ)
    if readers_from:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [readers_from, env.get("PYTHONPATH")]))
    cap = int(cap_gb * 2**30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    code = _PRELUDE + READERS[name] + _POSTLUDE
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, str(folder.resolve()), str(scratch.resolve())],
            capture_output=True, text=True, env=env, timeout=timeout, preexec_fn=limit,
            cwd=readers_from or None,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"reader": name, "error": f"timed out after {timeout:.0f} s"}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1]
        if "MemoryError" in proc.stderr:
            err = f"MemoryError at the {cap_gb:g} GiB cap"
        return {"reader": name, "error": err, "s": time.monotonic() - t0}
    return {"reader": name, **json.loads(proc.stdout.strip().splitlines()[-1])}


def build_parser() -> argparse.ArgumentParser:
    parts = __doc__.split("\n\n")
    p = ArgumentParser(prog="python -m atom_train.bench logs", description=parts[0],
                       epilog="\n\n".join(parts[1:]),
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--days", type=float, default=7.0, help="run length (default: %(default)s)")
    p.add_argument("--steps-per-s", type=float, default=300.0,
                   help="optimizer steps per second (default: %(default)s)")  # fmt: skip
    add_shared(p, "B", type=int, default=1024, help="streams (default: %(default)s)")
    add_shared(p, "bptt", type=int, default=64, metavar="K",
               help="ticks per step (default: %(default)s)")  # fmt: skip
    p.add_argument("--rate", type=float, default=DEFAULT_RATE,
                   help="format 2's --loss-log-rate (default: %(default)s)")  # fmt: skip
    p.add_argument("--ckpt-every-s", type=float, default=600.0,
                   help="a checkpoint (which closes a slot) every this many seconds "
                   "(default: %(default)s)")  # fmt: skip
    p.add_argument("--row-every-s", type=float, default=10.0,
                   help="a progress row every this many seconds (default: %(default)s)")  # fmt: skip
    p.add_argument("--formats", default="1,2", help="which formats (default: %(default)s)")
    p.add_argument("--readers-from", metavar="DIR", help="another checkout's readers")
    p.add_argument("--mem-cap-gb", type=float, default=8.0,
                   help="each reader's address-space cap (default: %(default)s)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=3600.0, help="per reader, seconds")
    add_shared(p, "out", default="runs/logbench", help="folder (default: %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the written logs")
    p.add_argument("--reuse", action="store_true",
                   help="read the logs an earlier --keep run left in --out (same settings) "
                   "instead of writing them again")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    set_command("bench logs")
    try:
        a = build_parser().parse_args(argv)
        formats = [f.strip() for f in a.formats.split(",") if f.strip()]
        if not formats or set(formats) - {"1", "2"}:
            raise UserError(f"--formats takes 1, 2 or 1,2, got {a.formats!r}")
        if a.days <= 0 or a.steps_per_s <= 0 or a.B < 1 or a.bptt < 1:
            raise UserError("--days, --steps-per-s, -B and -K must be positive")
        if a.readers_from and not (Path(a.readers_from) / "atom_train").is_dir():
            raise UserError(f"--readers-from {a.readers_from}: no atom_train package there")
        return run(a, formats)
    except UserError as e:
        return user_error_exit(e)


def run(a: argparse.Namespace, formats: list[str]) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = int(a.days * DAY * a.steps_per_s)
    results = []
    for fmt in formats:
        folder = out / f"format-{fmt}"
        written = folder / "written.json"
        if a.reuse and written.exists():
            w = json.loads(written.read_text())
            say(f"format {fmt}: reading the logs in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            say(
                f"format {fmt}: writing {a.days:g} days at {a.steps_per_s:g} steps/s ({steps:,} steps)"
            )
            if fmt == "1":
                w = write_format_1(folder, steps, a.steps_per_s, a.B, a.bptt)
                cols = FORMAT_1_COLUMNS
            else:
                w = write_format_2(
                    folder, steps, a.steps_per_s, a.B, a.bptt, a.rate, a.ckpt_every_s
                )
                cols = PROGRESS_COLUMNS
            w["progress_rows"] = _progress(
                folder, steps, a.steps_per_s, a.bptt, a.B, a.row_every_s, cols
            )
            atomic_write_json(written, w)
        rows = w["progress_rows"]
        with open(folder / LOSS_LOG, "rb") as f:
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
        r = {"format": fmt, "steps": steps, "loss_jsonl_bytes": (folder / LOSS_LOG).stat().st_size,
             "loss_jsonl_lines": lines, **w, "progress_rows": rows, "readers": []}  # fmt: skip
        for name in READERS:
            say(f"format {fmt}: {name}")
            got = run_reader(name, folder, out / "scratch", a.readers_from, a.mem_cap_gb, a.timeout)
            r["readers"].append(got)
            say("  " + (got.get("error") or f"{got['s']:.2f} s, peak RSS {got['peak_rss_mb']:.0f} MiB "
                        f"({got['peak_rss_mb'] - got['base_rss_mb']:.0f} MiB reading)"))  # fmt: skip
        results.append(r)
        if not a.keep:
            shutil.rmtree(folder, ignore_errors=True)
    report = {"days": a.days, "steps_per_s": a.steps_per_s, "B": a.B, "K": a.bptt, "rate": a.rate,
              "ckpt_every_s": a.ckpt_every_s, "row_every_s": a.row_every_s,
              "readers_from": a.readers_from, "mem_cap_gb": a.mem_cap_gb, "results": results}  # fmt: skip
    atomic_write_json(out / "logbench.json", report)
    print(table(report))
    return 0


def table(report: dict) -> str:
    """The results as a markdown table: per format, the file and each reader."""
    head = "| format | loss.jsonl | lines | " + " | ".join(READERS) + " |"
    lines = [head, "|---|--:|--:|" + "--:|" * len(READERS)]
    for r in report["results"]:
        cells = []
        for got in r["readers"]:
            if got.get("error"):
                cells.append(got["error"])
            else:
                own = got["peak_rss_mb"] - got["base_rss_mb"]
                cells.append(f"{format_duration(got['s'])}, +{own:,.0f} MiB")
        size = r["loss_jsonl_bytes"]
        shown = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
        lines.append(
            f"| {r['format']} | {shown} | {r['loss_jsonl_lines']:,} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
