"""Replay run folders through the divergence guard, offline: what it would have said, when,
and how far each healthy run is from a false alarm (docs/divergence.md).

    .venv/bin/python scripts/divergence_replay.py runs/guard/demo runs/guard/small-10 ...
    .venv/bin/python scripts/divergence_replay.py --loss-spike 5 --json out.json RUN...

Each run's steps come from its loss.jsonl (a line per step: train it with --loss-log-rate 0;
an aggregate line is fed as its slot's means, and counted), its validations from
progress.tsv's val_bpb, the episode length from a checkpoint's model config. The guard
judges them exactly as the trainer feeds it (`atom_train.trainer.divergence.Detector`), and
reads them where the trainer would: at the progress rows and checkpoint ticks, so the lag
printed is the trainer's. For each run it prints every verdict (what fired, the step and
tick, where it began, the step at which the trainer reads it) and, for the spike rules, the
largest threshold at which the run still fires (`--loss-spike`, `--grad-spike`: a healthy
run is that far from a false alarm), and the val margin likewise.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import sys
from dataclasses import replace
from pathlib import Path

from atom_train.common.cli import UserError, say, set_command, user_error_exit
from atom_train.trainer.divergence import Detector, Thresholds
from atom_train.trainer.loss_log import iter_step_lines, read_events
from atom_train.trainer.run_logs import read_progress
from atom_train.trainer.rundir import LOSS_LOG, PROGRESS, checkpoint_metadata


def read_run(folder: Path) -> dict:
    """A run folder's steps (the last line of each step wins: a resume writes the steps after
    its checkpoint again), validations, read points and episode length. A fork's run begins
    with its source run's up to the fork's tick (found beside the source checkpoint), as a
    rewind to that checkpoint would continue the guard's state."""
    events = read_events(folder)
    fork = next((e for e in events[:1] if e.get("event") == "fork"), None)
    if fork is not None:
        source = Path(fork["source"]).parent
        if not source.is_absolute() and not source.exists():
            source = folder.parent / source.name
        if not (source / LOSS_LOG).exists():
            raise UserError(f"{folder} is a fork of {fork['source']}, whose run is not found")
        src = read_run(source)
        at = int(fork["source_tick"])
        src["rows"] = [r for r in src["rows"] if r[1] <= at]
        src["vals"] = [v for v in src["vals"] if v[0] <= at]
        src["reads"] = {t for t in src["reads"] if t <= at}
    steps: dict[int, tuple] = {}
    aggregates = 0
    for line in iter_step_lines(folder / LOSS_LOG):
        if "count" in line:
            aggregates += 1
            values = (line["loss_mean"], line["train_bpb_mean"], line.get("grad_norm_mean"))
        else:
            values = (line["loss"], line["train_bpb"], line.get("grad_norm"))
        steps[int(line["step"])] = (int(line["tick"]), *values)
    rows, prev = [], 0 if fork is None else int(fork["source_tick"])
    for step in sorted(steps):
        tick, loss, bpb, norm = steps[step]
        rows.append((step, tick, tick - prev, _num(loss), _num(bpb), _num(norm)))
        prev = tick
    vals, reads = [], set()
    if (folder / PROGRESS).exists():
        progress = read_progress(folder / PROGRESS)
        for tick, v in zip(
            progress.columns["tick"], progress.columns.get("val_bpb", []), strict=False
        ):
            reads.add(int(tick))
            if not math.isnan(v):
                vals.append((int(tick), v))
    episode, periods = 4096, []
    for e in events:
        policy = e.get("policy") or {}
        periods += [policy.get("ckpt_every") or 0, policy.get("snapshot_every") or 0]
    for ck in sorted(folder.glob("*.safetensors")):
        meta = checkpoint_metadata(ck)
        if meta:
            episode = int(meta["model_config"]["episode_length"])
            break
    ticks = {r[1] for r in rows}
    reads |= {t for t in ticks if any(p and t % p == 0 for p in periods)}
    if fork is not None:
        rows, vals, reads = src["rows"] + rows, src["vals"] + vals, src["reads"] | reads
    return {
        "rows": rows,
        "vals": vals,
        "reads": reads,
        "episode": episode,
        "aggregates": aggregates,
    }


def _short(x: float | None) -> float | None:
    """A value as the recording keeps it: 5 significant digits (what the rules compare moves
    by far more; the recorded figures are the same as from the full values)."""
    return None if x is None or not math.isfinite(x) else float(f"{x:.5g}")


def export(runs: dict[str, dict], path: Path) -> None:
    """The runs' steps (each step's window: from the tick before it), validations and read
    points, compact: JSON in xz (`load_export` reads them back as `read_run` gives them),
    what tests/trainer/test_divergence_replay.py replays."""
    out = {}
    for name, run in runs.items():
        rows = run["rows"]
        out[name] = {
            "episode": run["episode"],
            "reads": sorted(run["reads"]),
            "vals": [[t, _short(v)] for t, v in run["vals"]],
            "step": [r[0] for r in rows],
            "tick": [r[1] for r in rows],
            "loss": [_short(r[3]) for r in rows],
            "train_bpb": [_short(r[4]) for r in rows],
            "grad_norm": [_short(r[5]) for r in rows],
        }
    text = json.dumps({"format": "atom.divergence-recording", "version": 1, "runs": out},
                      separators=(",", ":"))  # fmt: skip
    path.write_bytes(lzma.compress(text.encode(), preset=9))


def load_export(path: Path) -> dict[str, dict]:
    """`export`'s runs, as `read_run` gives a run."""
    data = json.loads(lzma.decompress(path.read_bytes()))
    if data.get("format") != "atom.divergence-recording" or data.get("version") != 1:
        raise UserError(f"{path} is not a divergence recording of version 1")
    runs = {}
    for name, r in data["runs"].items():
        ticks = r["tick"]
        K = [t - prev for t, prev in zip(ticks, [0, *ticks[:-1]], strict=True)]
        columns = (r["step"], ticks, K, r["loss"], r["train_bpb"], r["grad_norm"])
        rows = list(zip(*columns, strict=True))
        runs[name] = {"rows": rows, "vals": [tuple(v) for v in r["vals"]],
                      "reads": set(r["reads"]), "episode": r["episode"], "aggregates": 0}  # fmt: skip
    return runs


def _num(x):
    if x is None:
        return None
    return float(x)  # (a float, or a non-finite one as JSON holds it: "NaN")


def replay(run: dict, t: Thresholds) -> list[dict]:
    """Every verdict of the run under `t`, warned and trained on (as --on-divergence warn),
    with the step at which the trainer would read it."""
    d = Detector(replace(t, episode_length=run["episode"]))
    vals = iter(run["vals"])
    val = next(vals, None)
    out = []
    read_ticks = sorted(run["reads"]) or [run["rows"][-1][1]]
    step_at = {r[1]: r[0] for r in run["rows"]}
    for row in run["rows"]:
        step, tick = row[0], row[1]
        v = d.feed_step(*row)
        verdicts = [v] if v else []
        while val is not None and val[0] <= tick:
            vv = d.feed_val(step_at.get(val[0], step), val[0], val[1])
            if vv:
                verdicts.append(vv)
            val = next(vals, None)
        for v in verdicts:
            read = next((x for x in read_ticks if x >= v.tick), read_ticks[-1])
            out.append({**v.to_dict(), "read_step": step_at.get(read, step),
                        "text": v.describe()})  # fmt: skip
    return out


def excursions(run: dict, t: Thresholds) -> dict:
    """How far each rule's worst stretch of `t.steps` judged steps in a row (validations:
    `t.val_count`) went above its baseline, as the least step of the stretch: in spreads
    (``spreads``, what --loss-spike and --grad-spike compare) and as a ratio to the median
    (``ratio``: the loss's (x - median) / median, against LOSS_FLOOR; the gradient norm's x
    / median, against GRAD_FLOOR); for the val, bits/byte above the best before it. A rule
    fires on a stretch only if both its spreads and its ratio pass their thresholds there,
    so a healthy run has no false alarm while its figure stays below either threshold."""
    d = Detector(replace(t, episode_length=run["episode"]))
    seen = {"loss": ([], []), "grad": ([], [])}
    for step, tick, K, loss, bpb, norm in run["rows"]:
        if d.judged(tick, K) and all(x is not None and math.isfinite(x) for x in (loss, bpb)):
            for key, rule, x in (("loss", d.loss, loss), ("grad", d.grad, norm)):
                base = rule.baseline()
                if x is None or base is None or not math.isfinite(x) or x <= 0:
                    continue
                med, spread = base
                y = math.log(x) if rule.log else x
                seen[key][0].append((y - med) / spread if spread > 0 else math.inf)
                seen[key][1].append(math.exp(y - med) if rule.log else (y - med) / abs(med))
        d.feed_step(step, tick, K, loss, bpb, norm)

    def worst(xs: list[float], n: int) -> float | None:
        if len(xs) < n:
            return None
        return max(min(xs[i : i + n]) for i in range(len(xs) - n + 1))

    out = {k: {"spreads": worst(z, t.steps), "ratio": worst(r, t.steps)}
           for k, (z, r) in seen.items()}  # fmt: skip
    above, best = [], math.inf
    for _, v in run["vals"]:
        if best < math.inf:
            above.append(v - best)
        best = min(best, v)
    out["val"] = {"above_best": worst(above, t.val_count)}
    return out


def main(argv: list[str] | None = None) -> int:
    set_command("divergence_replay")
    d = Thresholds()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run folders")
    p.add_argument("--spike-window", type=int, default=d.window)
    p.add_argument("--spike-steps", type=int, default=d.steps)
    p.add_argument("--loss-spike", type=float, default=d.loss_mads)
    p.add_argument("--grad-spike", type=float, default=d.grad_mads)
    p.add_argument("--val-regression", type=float, default=d.val_margin)
    p.add_argument("--val-regression-count", type=int, default=d.val_count)
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--export", type=Path, metavar="FILE",
                   help="also write the runs' steps, compact (JSON in xz), named by folder")  # fmt: skip
    a = p.parse_args(argv)
    t = Thresholds(a.spike_window, a.spike_steps, a.loss_spike, a.grad_spike,
                   a.val_regression, a.val_regression_count)  # fmt: skip
    results, read = {}, {}
    try:
        for folder in a.runs:
            if not (folder / LOSS_LOG).exists():
                raise UserError(f"{folder / LOSS_LOG} not found: is {folder} a run folder?")
            run = read[folder.name] = read_run(folder)
            verdicts = replay(run, t)
            r = {"steps": len(run["rows"]), "aggregates": run["aggregates"],
                 "vals": len(run["vals"]), "verdicts": verdicts}  # fmt: skip
            r["excursions"] = excursions(run, t)
            results[str(folder)] = r
            first = verdicts[0] if verdicts else None
            head = f"{folder}: {r['steps']} steps, {r['vals']} vals, {len(verdicts)} verdicts"
            if first:
                lag = first["read_step"] - first["began_step"]
                head += (f"; first: {first['text']}; read at step {first['read_step']} "
                         f"({lag} steps from the first bad one)")  # fmt: skip
            say(head)
            say(f"  worst stretches: {json.dumps(r['excursions'])}")
    except UserError as e:
        return user_error_exit(e)
    if a.export:
        export(read, a.export)
    if a.json:
        settings = {"spike_window": t.window, "spike_steps": t.steps, "loss_spike": t.loss_mads,
                    "grad_spike": t.grad_mads, "val_regression": t.val_margin,
                    "val_regression_count": t.val_count}  # fmt: skip
        a.json.write_text(json.dumps({"thresholds": settings, "runs": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
