"""One name per metric in every place it is written (`atom_train.common.metrics`): loss.jsonl,
progress.tsv, status.json, TensorBoard's tags, the printed lines and the bench's JSON use the
same keys, and none of the names they replaced."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
from helpers import REPO
from helpers.trainer_kit import args

from atom_train.common.metrics import METRICS, OLD_NAMES, OLD_TAGS, current_name, renamed, tag

OLD = set(OLD_NAMES)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> tuple[Path, str]:
    """A run with validation and TensorBoard, as a user runs it (plain lines: no terminal)."""
    pytest.importorskip("tensorboard")
    out = tmp_path_factory.mktemp("names") / "run"
    extra = ["--val", str(corpus / "val.txt"), "--val-every", "32", "--val-bytes", "256"]
    extra += ["--val-streams", "4", "--tensorboard"]
    r = subprocess.run(
        [sys.executable, "-m", "atom_train.train", *args(corpus, out, 64, *extra)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return out, r.stderr


def test_loss_jsonl_progress_tsv_and_status_json_use_the_metric_names(trained):
    out, _ = trained
    steps = [json.loads(x) for x in (out / "loss.jsonl").read_text().splitlines()]
    step_lines = [s for s in steps if "event" not in s]
    assert step_lines and all(set(s) <= set(METRICS) for s in step_lines), step_lines[0]
    assert all(not (set(s) & OLD) for s in steps)
    header = (out / "progress.tsv").read_text().splitlines()[0].split("\t")
    assert set(header) <= set(METRICS) and {"train_bpb", "val_bpb", "grad_norm"} <= set(header)
    status = json.loads((out / "status.json").read_text())
    assert "val_bpb" in status and not (set(status) & OLD)
    assert status["status"] == "completed" and "eta_s" not in status  # final: no ETA


# status.json's fields that are not metrics: the run's state (docs/checkpoints.md, "The
# logs"), and each time's local ISO-8601 twin (`rundir.write_status`).
STATE_FIELDS = {
    "status", "pid", "time", "time_iso", "total_ticks", "checkpoint", "checkpoint_time",
    "checkpoint_time_iso", "passes", "planned_passes", "policy", "recurrence",
    "recurrence_reason", "world_size", "run_format", "eta_at", "eta_at_iso", "error", "signal",
}  # fmt: skip
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def on_a_terminal(corpus, tmp_path_factory) -> tuple[str, list[dict]]:
    """A run with validation and the noise scale, its stderr a terminal (a pty of 200
    columns: the progress bar draws only on one): what the terminal showed, and every
    status.json the run wrote, read back as written."""
    from atom_train import train
    from atom_train.trainer import reporting

    out = tmp_path_factory.mktemp("terminal") / "run"
    extra = ["--val", str(corpus / "val.txt"), "--val-every", "32", "--val-bytes", "256"]
    extra += ["--val-streams", "4", "--noise-scale-every", "1"]
    statuses: list[dict] = []
    write = reporting.write_status

    def write_status(run_dir, status, **fields):
        write(run_dir, status, **fields)
        statuses.append(json.loads((run_dir / "status.json").read_text()))

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    shown = bytearray()

    def read() -> None:  # (a terminal's buffer is small: it is read while the run writes)
        with contextlib.suppress(OSError):  # EIO: the other end is closed
            while chunk := os.read(master, 1 << 16):
                shown.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with pytest.MonkeyPatch.context() as m, open(slave, "w", closefd=True) as terminal:
        m.setattr(sys, "stderr", terminal)
        m.setattr(reporting, "write_status", write_status)
        code = train.main(args(corpus, out, 64, *extra))
    reader.join(timeout=60)
    os.close(master)
    assert code == 0, shown.decode(errors="replace")
    return _ESCAPE.sub("", shown.decode(errors="replace")), statuses


def test_the_progress_bar_names_the_metrics_as_the_files_do(on_a_terminal):
    shown, _ = on_a_terminal
    bars = [x for x in re.split(r"[\r\n]", shown) if re.search(r"\d+/64 \[.*tick", x)]
    assert bars, shown
    keys = [re.findall(r"(\w+)=", bar[bar.rindex("[") :]) for bar in bars]
    # Beside the metrics, the bar shows the newest checkpoint's time (status.json's name).
    assert {"loss", "train_bpb", "lr", "b_simple", "eta_s"} <= {k for ks in keys for k in ks}
    for bar, names in zip(bars, keys, strict=True):
        assert set(names) <= set(METRICS) | {"checkpoint_time"}, bar
    # The run's lines reach the terminal (above the bar), its progress rows only as the bar.
    assert "[train] completed at tick 64" in shown
    assert not re.search(r"\[train\] tick \d+/\d+ ", shown), "no plain rows beside the bar"


def test_every_key_of_status_json_is_a_metric_or_the_runs_state(on_a_terminal):
    _, statuses = on_a_terminal
    assert [s["status"] for s in statuses][-1] == "completed" and len(statuses) >= 5
    for s in statuses:
        assert set(s) <= set(METRICS) | STATE_FIELDS, sorted(set(s) - set(METRICS) - STATE_FIELDS)
    running = [s for s in statuses if s["status"] == "running"]
    # Once a window is done, the ETA; with the noise scale measured, its moving averages.
    assert all({"eta_s", "tick", "val_bpb", "b_simple", "grad_sq"} <= set(s) for s in running[1:])


def test_tensorboard_tags_are_group_slash_name(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = trained
    ea = EventAccumulator(str(out / "tb"))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {tag("train_bpb"), tag("val_bpb"), tag("grad_norm"), tag("loss")} <= tags
    for t in tags:
        _, name = t.split("/")
        assert name in METRICS and tag(name) == t, t
    assert not (tags & set(OLD_TAGS))


def test_printed_lines_name_the_metrics_as_the_files_do(trained):
    _, err = trained
    rows = [line for line in err.splitlines() if re.match(r"\[train\] tick \d+/\d+ ", line)]
    assert rows, err
    for line in rows:
        words = line.split()[3:]  # after "[train] tick 16/64"
        names = words[0::2]
        assert set(names) <= set(METRICS), line
        assert {"loss", "train_bpb", "bytes_per_s", "eta_s"} <= set(names), line
    vals = [line for line in err.splitlines() if ": val_bpb " in line]
    assert len(vals) == 2, err  # ticks 32 and 64
    for old in (r"\d bits/byte", r" ce \d", r" bpb \d", r"gnorm"):
        assert not re.search(old, err), old
    assert all(line.startswith("[train] ") for line in err.splitlines()), err


def test_the_bench_writes_the_same_names(tmp_path):
    out = tmp_path / "b.json"
    argv = ["loader", "-B", "2", "--threads", "1", "--seconds", "0.05", "--bptt", "8"]
    r = subprocess.run(
        [sys.executable, "-m", "atom_train.bench", *argv, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    results = json.loads(out.read_text())["results"]
    assert all("bytes_per_s" in x and "peak_rss_mb" in x for x in results)
    assert all(not (set(x) & OLD) for x in results)


def test_old_names_read_under_the_new_ones():
    assert current_name("byte_ce_bpb") == current_name("bpb") == "train_bpb"
    assert current_name("val_ce_bpb") == "val_bpb" and current_name("gnorm") == "grad_norm"
    assert current_name("loss") == "loss"
    line = {"step": 1, "tick": 16, "bytes": 64, "bpb": 7.9, "gnorm": 0.5}
    assert renamed(line) == {"step": 1, "tick": 16, "bytes_seen": 64, "train_bpb": 7.9,
                             "grad_norm": 0.5}  # fmt: skip
    # Every current name follows the rules: snake_case, a unit suffix where it has a unit.
    for name in METRICS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        assert name not in OLD_NAMES, name


def test_a_metrics_tag_is_its_group_and_name_and_an_axis_has_none():
    for name, m in METRICS.items():
        if m.group is None:
            with pytest.raises(ValueError, match=f"^{name} is an axis, not a TensorBoard scalar$"):
                tag(name)
        else:
            assert tag(name) == f"{m.group}/{name}"
    assert {m.group for m in METRICS.values()} == {
        None, "train", "val", "speed", "time", "memory", "noise"
    }  # fmt: skip
