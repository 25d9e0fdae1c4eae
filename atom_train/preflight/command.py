"""Pre-flight for a long run: ``python -m atom_train.preflight [options] -- <train args>``.

Runs the planned command on this machine for a bounded time, in a scratch folder beside its
--output-dir (``<output-dir>.preflight``, removed at the end), and projects the run to its
end. A short benchmark and a long run are different measurements; this measures the run
about to be launched, the way it will run:

1. speed: the trainer's own window at the planned B, K, device, field loop and transport,
   interval by interval (the spread says whether it is steady); the corpus read cold (page
   cache dropped) and warm at the streams' access pattern; whether --resident would help;
2. memory: the peak at the planned B (CUDA: reserved; CPU: RSS), the headroom, the largest
   B that fits;
3. disk: every file the run writes, projected to its end, against the free space;
4. resume at this size: a checkpoint, SIGKILL, a resume, and the loss after it; how long
   writing and loading a checkpoint take, and what the checkpoint cadence costs;
5. the launch: the supervisor's back-off really waits (measured), --on-complete, the lock,
   the signals;
6. the whole run: ETA with its range, passes, bytes, steps, snapshots, validation cost.

Output: a checklist (pass / warn / fail, each with its number and, unless it passed, the
fix) on stdout, and with --json the same as JSON. The trainer's flags go after ``--``, as
the supervisor takes them; --on-complete is the supervisor's (what runs at the end).

Examples::

    python -m atom_train.preflight -- --corpus data/demo -B 128 --bptt 64 \\
        --total-ticks 120000 --threads 2 --lr 4e-2 --output-dir runs/demo
    python -m atom_train.preflight --minutes 10 --on-complete 'sudo poweroff' \\
        --json runs/fr-preflight.json -- --data 'data/fr/train-*.txt' \\
        --val 'data/fr/val/*.txt' -B 1024 --bptt 64 --device cuda --tf32 \\
        --total-bytes 1.2e13 --ckpt-every 10000000 --val-every 10000000 \\
        --snapshot-every 200000000 --log-every 200000 --output-dir runs/fr

Exit codes: 0 = nothing failed (warnings allowed); 1 = a check failed; 2 = a user error
(a bad flag, a run the trainer would refuse, --device cuda without a GPU): one line.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path

from atom_train.common.atomic import atomic_write_json
from atom_train.common.cli import (
    ArgumentParser,
    UserError,
    format_duration,
    say,
    set_command,
    user_error_exit,
)
from atom_train.common.measure import peak_rss_mb
from atom_train.preflight import checks as pc
from atom_train.preflight import probes
from atom_train.trainer.divergence import describe_settings
from atom_train.trainer.guard import settings
from atom_train.trainer.loss_log import typical_line_bytes
from atom_train.trainer.plan import MEMORISE_PASSES, RunPlan, resolve_run
from atom_train.trainer.run_config import parse as parse_command
from atom_train.trainer.rundir import FINAL, ROLLING, ROLLING_PREV, lock_holder

SCRATCH_SUFFIX = ".preflight"
SCRATCH_MARKER = ".atom-preflight"  # marks a scratch folder as the pre-flight's own
JSON_FORMAT, JSON_VERSION = "atom.preflight", 1


def build_parser() -> argparse.ArgumentParser:
    parts = __doc__.split("\n\n")
    p = ArgumentParser(
        prog="python -m atom_train.preflight",
        usage="%(prog)s [options] -- <train args>",
        description=parts[0],
        epilog="\n\n".join(parts[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--minutes", type=float, default=5.0, metavar="M",
                   help="time to measure, about (default: %(default)s)")  # fmt: skip
    p.add_argument("--json", metavar="OUT", help="also write the checks and figures as JSON")
    p.add_argument("--on-complete", metavar="CMD",
                   help="the supervisor's --on-complete the run will be launched with")  # fmt: skip
    p.add_argument(
        "--assume-bytes-per-s", type=float, metavar="R",
        help="project the run at R bytes/s instead of the rate measured here (e.g. another "
        "machine's, from its own pre-flight or scripts/gpu_check.sh)",
    )  # fmt: skip
    p.add_argument("--keep-scratch", action="store_true",
                   help="keep the scratch folder (the trainer's logs, its checkpoints)")  # fmt: skip
    return p


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        build_parser().parse_known_args(argv)  # (--help prints and exits here)
        raise UserError(
            "missing `--` before the trainer's flags: python -m atom_train.preflight [options] "
            "-- --data 'data/*.txt' ... --output-dir runs/x"
        )
    split = argv.index("--")
    ns = build_parser().parse_args(argv[:split])
    train_args = argv[split + 1 :]
    if not train_args:
        raise UserError(
            "no trainer flags after `--` (the planned command's, e.g. --corpus DIR -B 128 ...)"
        )
    if not (ns.minutes > 0 and math.isfinite(ns.minutes)):
        raise UserError(f"--minutes must be a positive number, got {ns.minutes}")
    if ns.assume_bytes_per_s is not None and not ns.assume_bytes_per_s > 0:
        raise UserError(f"--assume-bytes-per-s must be positive, got {ns.assume_bytes_per_s}")
    if ns.json and not Path(ns.json).absolute().parent.is_dir():
        raise UserError(f"--json {ns.json}: its folder does not exist")
    return ns, train_args


def shape_of(plan: RunPlan) -> pc.RunShape:
    tick = int(plan.source.meta["training"]["tick"]) if plan.mode in ("resume", "fork") else 0
    per = plan.periods
    return pc.RunShape(
        B=plan.B,
        K=plan.window_schedule.K,
        tick=tick,
        total=plan.total,
        steps=plan.window_schedule.count_windows(tick),
        corpus_bytes=plan.corpus.size,
        ckpt_every=per.ckpt,
        snapshot_every=per.snapshot,
        val_every=per.val,
        sample_every=per.sample,
        log_every=per.log,
        val=plan.val is not None,
        tensorboard=plan.tensorboard is not None,
        loss_log_rate=plan.loss_log_rate,
        resident=plan.corpus.resident,
    )


def open_scratch(out: Path, keep: bool) -> Path:
    """``<output-dir>.preflight``: made fresh (a previous pre-flight's is replaced; anything
    else by that name is refused)."""
    scratch = out.parent / (out.name + SCRATCH_SUFFIX)
    if scratch.exists():
        if not (scratch / SCRATCH_MARKER).exists():
            raise UserError(
                f"{scratch} exists and is not a pre-flight's scratch folder: move it, or choose "
                "another --output-dir"
            )
        shutil.rmtree(scratch)
    try:
        scratch.mkdir(parents=True)
        (scratch / SCRATCH_MARKER).write_text("the pre-flight's scratch folder: safe to delete\n")
    except OSError as e:
        raise UserError(
            f"cannot create {scratch} ({e.strerror}): the output folder's parent must be writable"
        ) from None
    return scratch


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if isinstance(x, int | float) and not math.isnan(x)]
    return statistics.fmean(xs) if xs else None


def measure(plan: RunPlan, ns: argparse.Namespace, scratch: Path, t_end: float) -> dict:
    """Every measurement, in an order where none disturbs the next: the cold reads first
    (before anything else reads the shards), the probes, the trainer, then the rest."""
    budget = ns.minutes * 60
    m: dict = {"machine": probes.machine(plan)}
    m["machine"]["own_rss_mb"] = peak_rss_mb()
    if plan.corpus.resident:
        m["reads"] = {"sequential_bytes_per_s": probes.sequential_read_rate(
            list(plan.corpus.shards), 256 << 20, max(1.0, 0.02 * budget))}  # fmt: skip
    else:
        say("reading the corpus cold, then warm, as the streams read it")
        m["reads"] = probes.corpus_reads(plan, max(1.0, 0.04 * budget))
    seconds = max(0.5, 0.02 * budget)
    m["probes"] = []
    for B in (plan.B, 2 * plan.B):
        say(f"memory and speed probe at B {B}")
        m["probes"].append(probes.memory_probe(plan, B, seconds, timeout=max(120.0, 0.2 * budget)))
    first = m["probes"][0]
    ticks_per_s = (first.get("bytes_per_s") or 1000.0 * plan.B) / plan.B
    # The trainer gets what is left (less the supervisor's few seconds), and at least half
    # the time: on a busy machine the probes' starts can take minutes, and the trainer's
    # rows are the measurement that matters most.
    left = t_end - time.monotonic() - 6.0
    m["trainer"] = probes.exercise_trainer(
        plan, scratch, max(left, 0.5 * budget, 12.0), ticks_per_s, say
    )
    run = scratch / "run"
    m["sizes"] = probes.run_sizes(run)
    if (run / ROLLING).exists():
        say("loading and writing a checkpoint of the run's size")
        m["checkpoint_io"] = probes.checkpoint_io(run / ROLLING, scratch)
    say("the supervisor's back-off, with a trainer that crashes at once")
    m["backoff"] = probes.measure_backoff(scratch)
    m["on_complete"] = probes.on_complete_probe(ns.on_complete)
    return m


def evaluate(plan: RunPlan, ns: argparse.Namespace, m: dict) -> tuple[list[pc.Check], dict]:
    """The checks, from the measurements."""
    shape = shape_of(plan)
    tr = m["trainer"]
    rows = tr.get("rows", [])
    rates = pc.steady_rates(rows)
    checks = [pc.check_speed(rows, tr.get("error"))]
    measured = statistics.median(rates) if rates else (m["probes"][0].get("bytes_per_s") or 1.0)
    low, high = (min(rates), max(rates)) if rates else (measured, measured)
    if ns.assume_bytes_per_s:
        ratio = ns.assume_bytes_per_s / measured
        measured, low, high = ns.assume_bytes_per_s, low * ratio, high * ratio
    mach = m["machine"]
    peak = max((r.get("peak_rss_mb") or 0.0 for r in rows), default=0.0) or None
    ram = (mach.get("mem_available_bytes") or 0) + mach["own_rss_mb"] * 2**20
    checks.append(
        pc.check_corpus(
            m["reads"], measured, shape.corpus_bytes, ram - (peak or 0) * 2**20,
            shape.bytes_left / max(shape.corpus_bytes, 1), shape.resident,
        )
    )  # fmt: skip
    reads = m["reads"]
    if not shape.resident and reads.get("cold_bytes_per_s") and reads["cold_bytes_per_s"] < low:
        # The disk may hold the step back: the slow end of the range reads at its rate.
        low = reads["cold_bytes_per_s"]
    if plan.device.type == "cuda":
        used, budget_mb = m["probes"][0].get("memory_mb"), mach["gpu_free_bytes"] / 2**20
    else:
        used, budget_mb = peak, ram / 2**20
    checks.append(pc.check_memory(plan.device.type, plan.B, used, budget_mb, m["probes"]))
    val_s = _mean([r.get("val_s") for r in rows if not math.isnan(r.get("val_bpb", math.nan))])
    sample_s = _mean([r.get("sample_s") for r in rows])
    io = m.get("checkpoint_io", {})
    write_s = io.get("write_s", 0.0)
    projection = pc.project_run(shape, measured, low, high, val_s=val_s or 0.0,
                                sample_s=sample_s or 0.0, ckpt_s=write_s)  # fmt: skip
    sizes = m["sizes"]
    ckpt_bytes = io.get("ckpt_bytes") or sizes.get("ckpt_bytes", 0)
    run_s = projection["eta_s"]
    per_slot = max(1, round(shape.steps / max(run_s, 1e-9) / max(shape.loss_log_rate, 1e-9)))
    step_b, agg_b = typical_line_bytes(shape.steps, shape.total, shape.B, per_slot)
    line_sizes = pc.LineSizes(
        step_line=step_b, aggregate_line=agg_b,
        progress_row=sizes.get("progress_row", 200),
        sample_line=sizes.get("sample_line", plan.sample.bytes + 120),
        tensorboard_row=sizes.get("tensorboard_row", 1000),
    )  # fmt: skip
    files = pc.project_files(shape, projection, ckpt_bytes, line_sizes)
    present = sum(
        p.stat().st_size
        for p in (plan.out / n for n in (ROLLING, ROLLING_PREV, FINAL))
        if p.exists()
    )
    if present:  # a resume: its checkpoints are on disk already, and will be replaced
        files.append(
            {"name": "checkpoints already there (replaced)", "bytes": -present, "how": "on disk"}
        )
    checks.append(pc.check_disk(files, mach["free_bytes"], mach["filesystem"]))
    ticks_per_s = measured / plan.B
    checks.append(pc.check_logs(files, run_s, ticks_per_s, shape.K))
    resume = dict(tr.get("resume") or {"resumed": False, "error": tr.get("error", "not tried")})
    resume.update(io)
    checks.append(pc.check_resume(resume, exact=plan.device.type == "cpu"))
    checks.append(pc.check_checkpoints(write_s, shape.ckpt_every, ticks_per_s, shape.K))
    checks.append(
        pc.check_validation(
            val_s, projection["validations"], run_s, shape.val, val_every=shape.val_every
        )
    )
    backoff = dict(m["backoff"])
    backoff["run_backoff"] = (
        "10 s doubling to 300 s, giving up after 5 crashes in a row without a checkpoint (the supervisor's defaults)"
    )
    checks.append(pc.check_backoff(backoff))
    checks.append(pc.check_on_complete(ns.on_complete, *m["on_complete"]))
    checks.append(pc.check_lock(tr.get("second_refused"), lock_holder(plan.out), str(plan.out)))
    checks.append(
        pc.check_signals({k: tr.get(k) for k in ("usr1_s", "term_s", "term_exit", "term_status")})
    )
    checks.append(pc.check_run(projection, max_passes=MEMORISE_PASSES))
    return checks, projection


def header(
    plan: RunPlan, train_args: list[str], m: dict, took: float, scratch: Path, kept: bool, ns
) -> list[str]:
    mach = m["machine"]
    gb = 2**30
    where = "kept" if kept else "removed"
    what = {
        "new": "a new run",
        "resume": f"resumes {plan.out} at tick {shape_of(plan).tick:,}",
        "fork": f"forks {plan.source.path if plan.source else '?'}",
        "init": f"a new run from {plan.source.path if plan.source else '?'}'s weights",
    }[plan.mode]
    device = mach.get("gpu", "cpu") if plan.device.type == "cuda" else "cpu"
    rate = (
        f"; projected at --assume-bytes-per-s {ns.assume_bytes_per_s:g}"
        if ns.assume_bytes_per_s
        else ""
    )
    guard = settings(plan.run_config, plan.config.episode_length)  # (the run's divergence guard)
    return [
        f"pre-flight of: python -m atom_train.train {' '.join(train_args)}",
        f"  {what}; B {plan.B}, K {plan.window_schedule.K}, device {plan.device} ({device}), "
        f"recurrence {plan.recurrence}, transport {plan.transport}",
        f"  this machine: {mach['cpus']} CPUs, {(mach.get('mem_total_bytes') or 0) / gb:.1f} GiB RAM "
        f"({(mach.get('mem_available_bytes') or 0) / gb:.1f} GiB available), "
        f"{mach['free_bytes'] / gb:.1f} GiB free on {mach['filesystem']}",
        f"  measured for {format_duration(took)} in {scratch} ({where}){rate}",
        f"  {describe_settings(*guard, plan.periods.log, plan.window_schedule.K)}",
    ]


def run(ns: argparse.Namespace, train_args: list[str]) -> int:
    t0 = time.monotonic()
    notes: list[str] = []
    plan = resolve_run(*parse_command(train_args), warn=notes.append)
    holder = lock_holder(plan.out)
    if holder is not None:  # first: the launch would be refused whatever was measured
        raise UserError(
            f"another trainer (pid {holder}) is using {plan.out}: stop it first (kill -TERM "
            "its pid), or choose another --output-dir; nothing was measured"
        )
    for note in notes + plan.notes:
        say(note)
    scratch = open_scratch(plan.out, ns.keep_scratch)
    say(f"pre-flight for ~{format_duration(ns.minutes * 60)} in {scratch}")
    try:
        m = measure(plan, ns, scratch, t0 + ns.minutes * 60)
    finally:
        if not ns.keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    checks, projection = evaluate(plan, ns, m)
    took = time.monotonic() - t0
    print(pc.render(checks, header(plan, train_args, m, took, scratch, ns.keep_scratch, ns)))
    if ns.json:
        atomic_write_json(
            ns.json,
            {
                "format": JSON_FORMAT,
                "version": JSON_VERSION,
                "time": time.time(),
                "train_args": train_args,
                "minutes": ns.minutes,
                "measured_s": took,
                "checks": [c.to_json() for c in checks],
                "projection": projection,
                "measured": m,
            },
        )
        say(f"wrote {ns.json}")
    return 1 if any(c.status == pc.FAIL for c in checks) else 0


class Stopped(Exception):
    """SIGTERM: stop, as after Ctrl-C (the scratch trainers killed, the folder removed)."""


def _on_term(signum, frame) -> None:
    raise Stopped


def main(argv: list[str] | None = None) -> int:
    set_command("preflight")
    argv = sys.argv[1:] if argv is None else list(argv)
    previous = signal.signal(signal.SIGTERM, _on_term)
    try:
        ns, train_args = parse(argv)
        return run(ns, train_args)
    except UserError as e:
        return user_error_exit(e)
    except (KeyboardInterrupt, Stopped):
        with contextlib.suppress(Exception):
            say("stopped: the scratch trainers are killed and the scratch folder removed")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
