"""The pre-flight's checks (`python -m atom_train.preflight`): each a pure function from
what was measured (`preflight.probes`) to one `Check` (pass, warn or fail, with its
number and, when it is not a pass, the fix), and the projection of the whole run to its end.

No measuring and no I/O here: every threshold and every projection is a function of numbers,
unit-tested on its own (tests/preflight/test_checks.py). Standard library only.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import asdict, dataclass, field

from atom_train.common.cli import format_duration
from atom_train.common.measure import WIDE_SPREAD, usable_memory_mb

PASS, WARN, FAIL = "pass", "warn", "fail"

# Below this many steady intervals a rate is not called steady.
MIN_INTERVALS = 3
# The step waiting for its window more than this share of the time: the loader limits it.
LOADER_WAIT_WARN_PCT = 5.0
# Cold reads slower than this multiple of the training rate would hold the run back.
DISK_HEADROOM = 1.5
# The corpus fits in RAM when it takes at most this share of what is left after training.
RAM_SHARE = 0.8
# Memory use above this share of the usable budget is near the edge (allocator pressure).
MEMORY_EDGE = 0.85
# A checkpoint cadence costing more than this share of the time is flagged; the fix aims at
# FIX_CKPT_SHARE.
CKPT_SHARE_WARN, FIX_CKPT_SHARE = 0.03, 0.01
# Validation taking more than this share of the time is flagged.
VAL_SHARE_WARN = 0.10
# Free space below need x (1 + this) (and 1 GiB more) is too thin a margin.
DISK_MARGIN, DISK_MARGIN_MIN = 0.10, 1 << 30
# A log growing faster than this per day is flagged; the fix aims at a row every
# ROW_EVERY_S seconds.
LOG_BYTES_PER_DAY_WARN, ROW_EVERY_S = 1 << 30, 10.0
# Boundary work (validations, samples, checkpoints, snapshots) above this share of the run.
BOUNDARY_SHARE_WARN = 0.10
# What to raise to do less of each kind of boundary work.
_LESS = {
    "validations": "--val-every",
    "samples": "--sample-every",
    "checkpoints": "--ckpt-every",
    "snapshots": "--snapshot-every",
}
# A stop (SIGTERM to exit) longer than this outlasts common shutdown timeouts (systemd: 90 s).
STOP_WARN_S = 60.0
DAY = 86400.0


@dataclass
class Check:
    """One line of the checklist."""

    name: str
    status: str  # PASS, WARN or FAIL
    value: str  # the number, short
    detail: str  # what was measured, one line
    fix: str | None = None  # what to do, when the status is not PASS
    data: dict = field(default_factory=dict)  # the figures, for the JSON

    def to_json(self) -> dict:
        return asdict(self)


def _mib(n: float) -> str:
    if n >= 1 << 40:
        return f"{n / 2**40:.2f} TiB"
    if n >= 1 << 30:
        return f"{n / 2**30:.1f} GiB"
    if n >= 1 << 20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 1024:.0f} KiB"


def _sig(x: float) -> str:
    """A number to 3 significant digits with an SI suffix: 71.2k, 1.43M, 980."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _rate(bps: float) -> str:
    return f"{_sig(bps)} bytes/s"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x < 0.1 else f"{100 * x:.0f}%"


def _short(name: str) -> str:
    """A file's name without its note ("ckpt-rolling (+ .prev, ...)" -> "ckpt-rolling")."""
    return name.split(" ")[0]


def round_to(n: float, K: int) -> int:
    """`n` ticks rounded up to a multiple of K (at least K)."""
    return max(K, math.ceil(n / K) * K)


# ---- the run, as numbers ---------------------------------------------------------------------


@dataclass(frozen=True)
class RunShape:
    """What the planned run is, in numbers (from its `RunPlan`)."""

    B: int
    K: int
    tick: int  # where it starts (a resume: its checkpoint's tick)
    total: int  # its last tick
    steps: int  # optimizer steps (windows) from tick to total
    corpus_bytes: int
    ckpt_every: int
    snapshot_every: int
    val_every: int
    sample_every: int
    log_every: int
    val: bool
    tensorboard: bool
    loss_log_rate: float
    resident: bool = False

    @property
    def bytes_left(self) -> int:
        return (self.total - self.tick) * self.B

    def multiples(self, every: int) -> int:
        """Multiples of `every` in (tick, total] (0 when every is 0)."""
        return self.total // every - self.tick // every if every > 0 else 0

    def at_period(self, every: int) -> int:
        """How often a task at the first window end at or after each multiple of `every`
        runs, plus once at the last tick (validation, progress rows)."""
        n = min(self.steps, self.multiples(every))
        return n + (every <= 0 or self.total % every != 0)


def project_run(
    shape: RunShape,
    rate: float,
    rate_low: float,
    rate_high: float,
    *,
    val_s: float,
    sample_s: float,
    ckpt_s: float,
) -> dict:
    """The whole run from its start tick: training time at the rate (and its range), plus
    the boundary work: validations, samples, checkpoints and snapshots at their measured
    costs. Rates in bytes/s."""
    s = shape
    n_val = s.at_period(s.val_every) if s.val else 0
    n_samples = s.multiples(s.sample_every)
    n_ckpt = s.multiples(s.ckpt_every) + 1  # (+ the final checkpoint)
    n_snap = s.multiples(s.snapshot_every)
    parts = {
        "validations": n_val * val_s,
        "samples": n_samples * sample_s,
        "checkpoints": n_ckpt * ckpt_s,
        "snapshots": n_snap * ckpt_s,
    }
    boundary = sum(parts.values())

    def eta(r: float) -> float:
        return s.bytes_left / max(r, 1e-9) + boundary

    first_snap = (s.tick // s.snapshot_every + 1) * s.snapshot_every if n_snap else None
    return {
        "eta_s": eta(rate),
        "eta_low_s": eta(rate_high),
        "eta_high_s": eta(rate_low),
        "training_s": s.bytes_left / max(rate, 1e-9),
        "boundary_s": boundary,
        "boundary_parts_s": parts,
        "bytes": s.bytes_left,
        "ticks": s.total - s.tick,
        "steps": s.steps,
        "passes": s.bytes_left / max(s.corpus_bytes, 1),
        "validations": n_val,
        "val_s_each": val_s,
        "samples": n_samples,
        "checkpoints": n_ckpt,
        "snapshots": n_snap,
        "snapshot_ticks": (
            [
                first_snap,
                first_snap + s.snapshot_every,
                (s.total // s.snapshot_every) * s.snapshot_every,
            ]
            if n_snap
            else []
        ),
    }


@dataclass(frozen=True)
class LineSizes:
    """Bytes per line of each log, measured on the pre-flight's own run (progress rows,
    samples, TensorBoard per row) or formatted (loss.jsonl's lines at the run's scale)."""

    step_line: int
    aggregate_line: int
    progress_row: int
    sample_line: int
    tensorboard_row: int


def loss_log_lines(shape: RunShape, run_s: float, n_ckpt: int) -> tuple[int, bool]:
    """loss.jsonl's step and aggregate lines over the run (`loss_log.StepLines`): a line
    per step up to --loss-log-rate steps per second, then rate lines per second (and at most
    one more per checkpoint, which closes a slot). Returns (lines, aggregated)."""
    rate = shape.loss_log_rate
    if rate <= 0 or shape.steps <= rate * run_s:
        return shape.steps, False
    return min(shape.steps, math.ceil(rate * run_s) + n_ckpt), True


def project_files(
    shape: RunShape, projection: dict, ckpt_bytes: int, sizes: LineSizes
) -> list[dict]:
    """Every file the run writes, at its end: name, bytes, and how it was counted."""
    s, p = shape, projection
    run_s = p["eta_s"]
    lines, aggregated = loss_log_lines(s, run_s, p["checkpoints"])
    line_bytes = sizes.aggregate_line if aggregated else sizes.step_line
    rows = s.at_period(s.log_every)
    files = [
        {
            "name": "ckpt-rolling (+ .prev, + the temp file of a write)",
            "bytes": 3 * ckpt_bytes,
            "how": f"3 x {_mib(ckpt_bytes)}",
        },
        {"name": "ckpt-final", "bytes": ckpt_bytes, "how": f"1 x {_mib(ckpt_bytes)}"},
        {
            "name": "snapshots",
            "bytes": p["snapshots"] * ckpt_bytes,
            "how": f"{p['snapshots']:,} x {_mib(ckpt_bytes)}",
        },
        {
            "name": "loss.jsonl",
            "bytes": lines * line_bytes,
            "how": f"{lines:,} {'aggregate ' if aggregated else ''}lines x {line_bytes} B",
        },
        {
            "name": "progress.tsv",
            "bytes": rows * sizes.progress_row,
            "how": f"{rows:,} rows x {sizes.progress_row} B",
        },
    ]
    if p["samples"]:
        files.append(
            {
                "name": "samples.jsonl",
                "bytes": p["samples"] * sizes.sample_line,
                "how": f"{p['samples']:,} x {sizes.sample_line} B",
            }
        )
    if s.tensorboard:
        files.append(
            {
                "name": "tb/ (TensorBoard)",
                "bytes": rows * sizes.tensorboard_row,
                "how": f"{rows:,} rows x {sizes.tensorboard_row} B",
            }
        )
    return files


# ---- the checks ------------------------------------------------------------------------------


# The progress rows past the first are merged into at most this many intervals.
INTERVALS = 12


def steady_intervals(rows: list[dict], most: int = INTERVALS) -> list[tuple[float, float]]:
    """(bytes/s, seconds) of the training (boundary work left out) over consecutive groups
    of progress rows, at most `most` groups of equal row counts: the rows come often enough
    to survive a machine slower than expected, and are merged back into intervals long enough
    to compare. The first row is left out: its time includes the start (compiles, first
    touches, allocations)."""
    spans = []
    for prev, r in itertools.pairwise(rows):
        bps, done = r.get("bytes_per_s"), r.get("bytes_seen", 0) - prev.get("bytes_seen", 0)
        if isinstance(bps, int | float) and bps > 0 and done > 0:
            spans.append((done, done / bps))
    if not spans:
        return []
    groups = min(most, len(spans))
    out = []
    for g in range(groups):
        part = spans[g * len(spans) // groups : (g + 1) * len(spans) // groups]
        done, secs = sum(b for b, _ in part), sum(s for _, s in part)
        out.append((done / secs, secs))
    return out


def steady_rates(rows: list[dict]) -> list[float]:
    """The training rate (bytes/s) of each interval of `steady_intervals`."""
    return [rate for rate, _ in steady_intervals(rows)]


def check_speed(rows: list[dict], error: str | None = None) -> Check:
    """The trainer's own window, as progress.tsv measured it, in intervals (`error`: why the
    trainer stopped early, if it did)."""
    intervals = steady_intervals(rows)
    rates = [r for r, _ in intervals]
    interval_s = statistics.fmean(s for _, s in intervals) if intervals else 0.0
    if not rates:
        return Check(
            "speed",
            FAIL,
            "-",
            "the pre-flight's trainer logged no interval past its first"
            + (f": {error}" if error else ""),
            "give it more time (--minutes), or see the trainer's log in the scratch folder "
            "(--keep-scratch)",
        )
    med = statistics.median(rates)
    spread = (max(rates) - min(rates)) / med if len(rates) > 1 else 0.0
    waits = [
        r["loader_wait_pct"] for r in rows[1:] if isinstance(r.get("loader_wait_pct"), int | float)
    ]
    wait = statistics.fmean(waits) if waits else 0.0
    data = {
        "bytes_per_s": med,
        "bytes_per_s_min": min(rates),
        "bytes_per_s_max": max(rates),
        "spread": spread,
        "intervals": len(rates),
        "interval_s": interval_s,
        "loader_wait_pct": wait,
    }
    detail = (
        f"the trainer's window over {len(rates)} intervals of ~{format_duration(interval_s)}: "
        f"{_rate(min(rates))} to {_rate(max(rates))} (spread {_pct(spread)}); the step "
        f"waited for its window {wait:.1f}% of the time"
    )
    value = _rate(med)
    if len(rates) < MIN_INTERVALS:
        return Check("speed", WARN, value, detail + "; too few intervals to call it steady",
                     "measure longer: --minutes M", data)  # fmt: skip
    if spread > WIDE_SPREAD:
        return Check("speed", WARN, value, detail + "; not steady",
                     "measure longer (--minutes M), on an otherwise idle machine", data)  # fmt: skip
    if wait > LOADER_WAIT_WARN_PCT:
        return Check("speed", WARN, value, detail,
                     "the loader holds the step back: more --loader-threads, or --resident", data)  # fmt: skip
    return Check("speed", PASS, value, detail + ", steady", None, data)


def check_corpus(
    reads: dict,
    train_rate: float,
    corpus_bytes: int,
    ram_left_bytes: float,
    passes: float,
    resident: bool,
) -> Check:
    """Cold reads (from the disk, the page cache dropped) and warm reads of the shards by
    the loader at the run's B and K, against the training rate; whether the corpus fits in
    RAM, and so whether --resident would help."""
    fits = corpus_bytes <= RAM_SHARE * max(ram_left_bytes, 0)
    ram = f"the corpus ({_mib(corpus_bytes)}) {'fits' if fits else 'does not fit'} in RAM ({_mib(max(ram_left_bytes, 0))} left beside training)"
    data = {
        **reads,
        "corpus_bytes": corpus_bytes,
        "ram_left_bytes": ram_left_bytes,
        "fits_in_ram": fits,
    }
    seq = reads.get("sequential_bytes_per_s")
    if resident:
        load = corpus_bytes / seq if seq else None
        return Check("corpus", PASS, "resident",
                     f"--resident: the corpus is copied into RAM at each launch "
                     f"({format_duration(load)} at {_rate(seq or 0)} read cold); {ram}", None, data)  # fmt: skip
    cold, warm = reads.get("cold_bytes_per_s"), reads.get("warm_bytes_per_s")
    if cold is None or warm is None:
        return Check("corpus", WARN, "-", "the shards' read rate was not measured: "
                     + reads.get("error", "no time left"), "give the pre-flight more time (--minutes)", data)  # fmt: skip
    value = f"cold {_rate(cold)}"
    detail = (
        f"the loader at the run's B and K: cold {_rate(cold)} (page cache dropped: "
        f"{reads.get('method', '?')}), warm {_rate(warm)}, training {_rate(train_rate)}; {ram}"
    )
    cached = reads.get("cached_after_drop")
    if cached is not None and cached > 0.5:
        return Check("corpus", WARN, value, detail + f"; {_pct(cached)} of its pages stayed "
                     "cached (mapped or dirty elsewhere): the cold figure is not cold",
                     "rerun when no other process maps the shards", data)  # fmt: skip
    if warm < DISK_HEADROOM * train_rate:
        return Check("corpus", WARN, value, detail + "; even from RAM the loader barely keeps up",
                     "more --loader-threads (or a smaller -B per loader thread)", data)  # fmt: skip
    if cold < DISK_HEADROOM * train_rate:
        if fits:
            fix = (
                "--resident: the corpus fits in RAM (a copy at each launch), or a first "
                f"pass at the disk's rate ({passes:.2f} passes planned)"
            )
        else:
            fix = "every pass reads at the disk's rate: move the corpus to a faster disk (SSD)"
        return Check(
            "corpus", WARN, value, detail + "; the disk would hold the step back", fix, data
        )
    return Check("corpus", PASS, value, detail + "; the disk keeps up", None, data)


# Memory that grows less than this between the probes (MiB, and share) is noise, not a slope.
MIN_GROWTH_MB, MIN_GROWTH_SHARE = 16.0, 0.02


def largest_batch(points: list[tuple[int, float]], usable_mb: float) -> int | None:
    """The largest B whose memory fits `usable_mb`, from memory measured at two or more B
    (a least-squares line: fixed + per stream x B); None when the memory did not grow
    measurably between them (a tiny model, or a B too small to tell from the rest)."""
    if len({b for b, _ in points}) < 2:
        return None
    xs, ys = [b for b, _ in points], [m for _, m in points]
    if max(ys) - min(ys) < max(MIN_GROWTH_MB, MIN_GROWTH_SHARE * max(ys)):
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    if slope <= 0:
        return None
    fixed = my - slope * mx
    return max(0, math.floor((usable_mb - fixed) / slope))


def check_memory(
    device: str,
    B: int,
    used_mb: float | None,
    budget_mb: float,
    probes: list[dict],
) -> Check:
    """Peak memory at the planned B (CUDA: the allocator's reserved memory plus what lies
    outside it; CPU: the trainer's peak RSS) against the budget, and the largest B that
    fits (a line through the probes' memory at B and 2B)."""
    what = "reserved on the GPU" if device == "cuda" else "peak RSS"
    usable = usable_memory_mb(budget_mb)
    points = [(p["B"], p["memory_mb"]) for p in probes if p.get("memory_mb") is not None]
    largest = largest_batch(points, usable)
    data = {"used_mb": used_mb, "budget_mb": budget_mb, "usable_mb": usable,
            "largest_B": largest, "probes": probes, "memory": what}  # fmt: skip
    big = " ".join(
        f"(at B {p['B']}: {p['memory_mb']:.0f} MiB, {_rate(p['bytes_per_s'])})"
        for p in probes
        if p.get("memory_mb") is not None and p.get("bytes_per_s")
    )
    if used_mb is None:
        return Check(
            "memory",
            WARN,
            "-",
            f"{what} was not measured",
            "see the scratch folder's logs (--keep-scratch)",
            data,
        )
    share = used_mb / usable if usable > 0 else math.inf
    fit = (
        f"; the largest B that fits: ~{largest:,}"
        if largest is not None
        else "; memory hardly grows from B to 2B here, so no largest B is estimated"
    )
    detail = (
        f"{what} {used_mb:,.0f} MiB of {usable:,.0f} usable ({_pct(share)}){fit} {big}".rstrip()
    )
    value = f"{used_mb:,.0f} MiB"
    slower = [
        (a, b)
        for a, b in itertools.pairwise(probes)
        if a.get("bytes_per_s")
        and b.get("bytes_per_s")
        and b["B"] > a["B"]
        and b["bytes_per_s"] < a["bytes_per_s"]
    ]
    if share > 1:
        return Check(
            "memory",
            FAIL,
            value,
            detail,
            f"-B {largest or max(1, B // 2)} (or halve --bptt: memory grows with B x K)",
            data,
        )
    if share > MEMORY_EDGE:
        return Check("memory", WARN, value, detail + "; near the edge: allocator pressure slows a long run",
                     f"-B {int(0.8 * (largest or B))} (or halve --bptt)", data)  # fmt: skip
    if slower:
        a, b = slower[0]
        return Check("memory", WARN, value, detail + f"; B {b['B']} is slower than B {a['B']} here",
                     f"keep -B at or below {a['B']} on this machine", data)  # fmt: skip
    return Check("memory", PASS, value, detail, None, data)


def check_disk(files: list[dict], free_bytes: int, where: str) -> Check:
    """Everything the run writes, at its end, against the free space of the output
    filesystem, with a margin."""
    need = sum(f["bytes"] for f in files)
    margin = free_bytes - need
    want = need * DISK_MARGIN + DISK_MARGIN_MIN
    biggest = max(files, key=lambda f: f["bytes"])
    parts = ", ".join(f"{_short(f['name'])} {_mib(f['bytes'])}" for f in files if f["bytes"] > 0)
    detail = f"the run writes {_mib(need)} ({parts}); {_mib(free_bytes)} free on {where}"
    data = {"need_bytes": need, "free_bytes": free_bytes, "margin_bytes": margin, "files": files}
    value = f"{_mib(need)} of {_mib(free_bytes)}"
    if need > free_bytes:
        return Check(
            "disk",
            FAIL,
            value,
            detail,
            f"free {_mib(need - free_bytes + want)}, or write less: {biggest['name']} is the largest ({biggest['how']})",
            data,
        )
    if margin < want:
        return Check("disk", WARN, value, detail + f"; only {_mib(margin)} to spare",
                     f"free space, or write less: {biggest['name']} is the largest ({biggest['how']})", data)  # fmt: skip
    return Check("disk", PASS, value, detail + f"; {_mib(margin)} to spare", None, data)


def check_logs(files: list[dict], run_s: float, ticks_per_s: float, K: int) -> Check:
    """The logs' growth per day: a log that grows by steps rather than by time fills a disk
    over days (and costs its readers)."""
    days = max(run_s / DAY, 1e-9)
    logs = [
        f
        for f in files
        if _short(f["name"]) in ("loss.jsonl", "progress.tsv", "samples.jsonl", "tb/")
    ]
    per_day = {_short(f["name"]): f["bytes"] / days for f in logs}
    worst = max(per_day, key=per_day.get)
    detail = ", ".join(f"{k} {_mib(v)}/day" for k, v in per_day.items())
    data = {"bytes_per_day": per_day}
    value = f"{_mib(sum(per_day.values()))}/day"
    if per_day[worst] > LOG_BYTES_PER_DAY_WARN:
        if worst in ("progress.tsv", "tb/"):
            every = round_to(ticks_per_s * ROW_EVERY_S, K)
            fix = f"--log-every {every} (a progress row every ~{ROW_EVERY_S:.0f} s)"
        elif worst == "loss.jsonl":
            fix = "--loss-log-rate 2 (at most 2 lines a second)"
        else:
            fix = "raise --sample-every"
        return Check(
            "logs", WARN, value, detail + f"; {worst} grows by steps, not by time", fix, data
        )
    return Check("logs", PASS, value, detail, None, data)


def check_resume(r: dict, exact: bool) -> Check:
    """A checkpoint at the run's size, the trainer killed with SIGKILL, resumed: it resumes
    from that checkpoint and the steps redone after it give the killed launch's loss, bit
    for bit, on a CPU and on a GPU alike (the Triton loop sums without atomics, the masks
    are drawn on the CPU: tests/scenarios/test_cuda.py asserts a bit-identical resume on
    CUDA). `exact` (a CPU): any difference fails. Otherwise (a GPU, where a library's
    kernel could still differ from run to run) any difference is a warning naming it, and
    one above 1e-3 of the loss (not rounding: the run continued from elsewhere) fails."""
    data = dict(r)
    timing = (
        f"checkpoint {_mib(r.get('ckpt_bytes', 0))}: write {r.get('write_s', math.nan):.2f} s, "
        f"load {r.get('load_s', math.nan):.2f} s cold"
    )
    if not r.get("resumed"):
        return Check("resume", FAIL, "-", f"{timing}; the killed run did not resume: {r.get('error', '?')}",
                     "see the trainer's log in the scratch folder (--keep-scratch)", data)  # fmt: skip
    pairs = r.get("overlap", [])
    where = f"killed -9 at tick {r['killed_at']:,}, resumed from tick {r['resumed_from']:,}"
    if not pairs:
        return Check("resume", WARN, "resumed", f"{timing}; {where}, but no step was redone to compare",
                     "give it more time (--minutes)", data)  # fmt: skip
    diff = max(abs(a - b) for _, a, b in pairs)
    data["max_loss_diff"] = diff
    tol = 0.0 if exact else 1e-3 * max(abs(a) for _, a, _ in pairs)
    same = "identical" if diff == 0 else f"within {diff:.2g}"
    detail = f"{timing}; {where}: the loss continues ({same} over the {len(pairs)} steps redone)"
    if diff > tol:
        return Check("resume", FAIL, f"diff {diff:.3g}", f"{timing}; {where}: the redone steps' loss differs by {diff:.3g}",
                     "the resume is not exact: report it with the scratch folder (--keep-scratch)", data)  # fmt: skip
    if diff > 0:
        return Check("resume", WARN, f"diff {diff:.3g}", f"{detail}: not bit for bit, as it is in the tests on this device",
                     "report it with the scratch folder (--keep-scratch): the resume should be exact", data)  # fmt: skip
    return Check("resume", PASS, "exact", detail, None, data)


def check_checkpoints(write_s: float, ckpt_every: int, ticks_per_s: float, K: int) -> Check:
    """What the checkpoint cadence costs: one write per --ckpt-every ticks."""
    data = {"write_s": write_s, "ckpt_every": ckpt_every, "ticks_per_s": ticks_per_s}
    if ckpt_every <= 0:
        return Check("checkpoints", WARN, "off", "--ckpt-every 0: checkpoints only at the end and on signals; a crash loses everything since the start",
                     f"--ckpt-every {round_to(ticks_per_s * 600, K)} (every ~10 minutes)", data)  # fmt: skip
    interval = ckpt_every / max(ticks_per_s, 1e-9)
    share = write_s / (interval + write_s)
    data.update(interval_s=interval, share=share)
    detail = f"a {write_s:.2f} s write every {ckpt_every:,} ticks (~{format_duration(interval)})"
    if share > CKPT_SHARE_WARN:
        every = round_to(write_s * ticks_per_s * (1 - FIX_CKPT_SHARE) / FIX_CKPT_SHARE, K)
        return Check("checkpoints", WARN, _pct(share), detail + f": {_pct(share)} of the time",
                     f"--ckpt-every {every} (1% of the time)", data)  # fmt: skip
    return Check(
        "checkpoints", PASS, _pct(share), detail + f": {_pct(share)} of the time", None, data
    )


def check_validation(
    val_s: float | None, n_val: int, run_s: float, val: bool, val_every: int = 0
) -> Check:
    """What validation costs over the run: its measured cost per evaluation x how often;
    over `VAL_SHARE_WARN`, the fix names the --val-every (from this `val_every`) that
    brings it to half of that."""
    if not val:
        return Check("validation", WARN, "off", "no --val: the run reports no held-out bits/byte",
                     "--val GLOB (held-out text), or --corpus DIR with a val", {})  # fmt: skip
    if val_s is None:
        return Check("validation", WARN, "-", "no validation ran in the pre-flight's time",
                     "give it more time (--minutes)", {})  # fmt: skip
    share = n_val * val_s / max(run_s, 1e-9)
    data = {"val_s_each": val_s, "validations": n_val, "share": share}
    detail = f"{val_s:.2f} s per evaluation x {n_val:,} = {_pct(share)} of the run"
    if share > VAL_SHARE_WARN:
        return Check(
            "validation",
            WARN,
            f"{val_s:.2f} s",
            detail,
            _raise_val_every(val_every, share),
            data,
        )
    return Check("validation", PASS, f"{val_s:.2f} s", detail, None, data)


def _raise_val_every(val_every: int, share: float) -> str:
    """The fix of a validation that costs `share` of the run at `val_every`: the period
    (rounded up to 2 significant digits) at which it costs half of `VAL_SHARE_WARN`."""
    if val_every <= 0:
        return "raise --val-every (or lower --val-bytes)"
    target = VAL_SHARE_WARN / 2
    need = math.ceil(val_every * share / target)
    step = 10 ** max(len(str(need)) - 2, 0)
    need = -(-need // step) * step
    return (
        f"raise --val-every to {need:,} or more ({_pct(target)} of the run), or lower --val-bytes"
    )


def check_backoff(b: dict) -> Check:
    """The supervisor, run with a crashing trainer: each relaunch came after its back-off
    (a signal arriving during the wait does not cut it short) and it gave up at the limit."""
    gaps, asked = b.get("gaps_s", []), b.get("asked_s", [])
    data = dict(b)
    if b.get("error"):
        return Check("supervisor", FAIL, "-", f"the supervisor could not be measured: {b['error']}",
                     "see the supervisor's log in the scratch folder (--keep-scratch)", data)  # fmt: skip
    shown = ", ".join(f"{g:.2f} s" for g in gaps)
    want = ", ".join(f"{a:g} s" for a in asked)
    detail = (
        f"the back-off waited {shown} (asked {want}; a SIGUSR1 came during the first wait), "
        f"gave up after {b.get('launches')} crashes (exit {b.get('exit_code')}); the run's: "
        f"{b.get('run_backoff', '?')}"
    )
    short = [(g, a) for g, a in zip(gaps, asked, strict=False) if g < a]
    if len(gaps) < len(asked) or short:
        return Check("supervisor", FAIL, shown or "-", detail + "; the back-off did not wait",
                     "do not launch under this supervisor: report it with supervisor.log", data)  # fmt: skip
    if b.get("exit_code") != 1:
        return Check("supervisor", FAIL, shown, detail + "; it did not give up as it should",
                     "report it with supervisor.log (--keep-scratch)", data)  # fmt: skip
    return Check("supervisor", PASS, shown, detail, None, data)


def check_on_complete(cmd: str | None, program_found: bool | None, sudo_ok: bool | None) -> Check:
    """What runs when training completes (the supervisor's --on-complete)."""
    data = {"on_complete": cmd, "program_found": program_found, "sudo_without_password": sudo_ok}
    if not cmd:
        return Check("on-complete", WARN, "none",
                     "nothing runs when training completes: the box idles (and bills) until someone looks",
                     "launch with scripts/train.sh --on-complete 'sudo poweroff' -- ... (and pass it here)", data)  # fmt: skip
    if program_found is False:
        return Check("on-complete", FAIL, cmd, f"--on-complete {cmd!r}: its program is not on PATH",
                     "fix the command (it runs with sh -c)", data)  # fmt: skip
    if sudo_ok is False:
        return Check("on-complete", WARN, cmd,
                     f"--on-complete {cmd!r}: sudo asks for a password, which a detached run cannot type",
                     "allow it without a password (sudoers: NOPASSWD for that command)", data)  # fmt: skip
    return Check(
        "on-complete",
        PASS,
        cmd,
        f"after training completes (not after a stop) the supervisor runs {cmd!r}",
        None,
        data,
    )


def check_lock(second_refused: bool | None, holder: str | None, out: str) -> Check:
    """The run folder's lock: no trainer holds the planned folder now, and a second trainer
    on the pre-flight's folder was refused (flock works on this filesystem)."""
    data = {"planned_folder_locked_by": holder, "second_trainer_refused": second_refused}
    if holder is not None:
        return Check("lock", FAIL, f"pid {holder}", f"a trainer (pid {holder}) is using {out} now",
                     "stop it first (kill -TERM), or choose another --output-dir", data)  # fmt: skip
    if second_refused is None:
        return Check("lock", WARN, "-", "the lock was not tried (the trainer did not start in time)",
                     "give it more time (--minutes)", data)  # fmt: skip
    if not second_refused:
        return Check("lock", FAIL, "not held", "a second trainer got the lock of a folder in use: flock does not work on this filesystem",
                     "put --output-dir on a local filesystem", data)  # fmt: skip
    return Check(
        "lock",
        PASS,
        "held",
        f"{out} is free; a second trainer on a folder in use is refused (flock)",
        None,
        data,
    )


def check_signals(s: dict) -> Check:
    """The trainer's signals, sent for real: SIGUSR1 writes a checkpoint and training goes
    on; SIGTERM writes one and exits 0 (status "stopped"), and how long that takes."""
    data = dict(s)
    usr1, term = s.get("usr1_s"), s.get("term_s")
    parts = []
    if usr1 is not None:
        parts.append(f"SIGUSR1: a checkpoint {usr1:.1f} s later, training went on")
    if term is not None:
        parts.append(
            f"SIGTERM: checkpoint and exit {s.get('term_exit')} in {term:.1f} s (status {s.get('term_status')!r})"
        )
    detail = "; ".join(parts) or "no signal was sent"
    if usr1 is None or term is None:
        return Check("signals", WARN, "-", detail + "; not all signals were tried in time",
                     "give it more time (--minutes)", data)  # fmt: skip
    if s.get("term_exit") != 0 or s.get("term_status") != "stopped":
        return Check("signals", FAIL, f"exit {s.get('term_exit')}", detail,
                     "see the trainer's log in the scratch folder (--keep-scratch)", data)  # fmt: skip
    if term > STOP_WARN_S:
        return Check("signals", WARN, f"stop {term:.0f} s", detail + "; longer than a shutdown waits (systemd: 90 s)",
                     "raise the shutdown timeout (TimeoutStopSec), or a smaller -B or --bptt", data)  # fmt: skip
    return Check("signals", PASS, f"stop {term:.1f} s", detail, None, data)


def check_run(p: dict, max_passes: float = math.inf) -> Check:
    """The whole run, projected to its end from the measured rate and costs; a warning when
    it reads the corpus more than `max_passes` times over (it will memorise it) or when
    boundary work takes too much of it."""
    snaps = ""
    if p["snapshots"]:
        t = p["snapshot_ticks"]
        snaps = f", {p['snapshots']:,} snapshots (ticks {t[0]:,}, {t[1]:,}, ... {t[2]:,})"
    val = (
        f"{p['validations']:,} validations of {p['val_s_each']:.2f} s"
        if p["val_s_each"]
        else f"{p['validations']:,} validations (cost not measured)"
    )
    detail = (
        f"{format_duration(p['eta_s'])} ({format_duration(p['eta_low_s'])} to "
        f"{format_duration(p['eta_high_s'])}): {_sig(p['bytes'])} bytes = {p['passes']:.2f} "
        f"passes, {p['steps']:,} steps, {val}{snaps}; boundary work "
        f"{format_duration(p['boundary_s'])}"
    )
    value = f"ETA {format_duration(p['eta_s'])}"
    problems, fixes = [], []
    if p["passes"] > max_passes:
        problems.append(f"{p['passes']:,.0f} passes over the corpus: it will memorise it")
        fixes.append("use more text or a shorter run")
    share = p["boundary_s"] / max(p["eta_s"], 1e-9)
    if share > BOUNDARY_SHARE_WARN:
        parts = p["boundary_parts_s"]
        worst = max(parts, key=parts.get)
        spent = ", ".join(f"{k} {format_duration(v)}" for k, v in parts.items() if v)
        problems.append(f"boundary work is {_pct(share)} of it ({spent})")
        fixes.append(f"raise {_LESS[worst]} ({worst} cost the most)")
    if problems:
        return Check("run", WARN, value, "; ".join([detail, *problems]), "; ".join(fixes), p)
    return Check("run", PASS, value, detail, None, p)


# ---- the screen ------------------------------------------------------------------------------


def render(checks: list[Check], header: list[str]) -> str:
    """The checklist: the header lines, then one line per check (status, name, number,
    what was measured) and, under a warn or a fail, its fix."""
    lines = list(header)
    width = max(len(c.name) for c in checks)
    for c in checks:
        lines.append(f"  {c.status.upper():4}  {c.name:<{width}}  {c.value}: {c.detail}")
        if c.fix and c.status != PASS:
            lines.append(f"        {'':<{width}}  -> {c.fix}")
    fails = sum(c.status == FAIL for c in checks)
    warns = sum(c.status == WARN for c in checks)
    lines.append(f"{fails} fail, {warns} warn, {len(checks) - fails - warns} pass")
    return "\n".join(lines)
