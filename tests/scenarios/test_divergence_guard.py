"""The divergence guard in the training loop (docs/divergence.md): a run that diverges from its
first steps stops as diverged; one pivoted onto a diverging rate is rewound to its last
healthy checkpoint (an automatic pivot, the rate lowered, the streams moved on), and stops
after --max-rewinds with that checkpoint intact; no rolling checkpoint is written while the
run is suspect; a resume continues the detector exactly; the supervisor does not relaunch a
diverged run.

The tiny model diverges at --lr 10 within two steps (train_bpb in the thousands: the ceiling
rule), so each run here is a few dozen steps."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO
from helpers.trainer_kit import args, copy_run, run, steps

from atom_train.common.cli import EXIT_DIVERGED
from atom_train.trainer.checkpoint_file import load_checkpoint
from atom_train.trainer.divergence import GUARD_KEY
from atom_train.trainer.loss_log import read_events
from atom_train.trainer.train_state import LOADER_POSITIONS, run_config_of


def status(out: Path) -> dict:
    return json.loads((out / "status.json").read_text())


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def kinds(out: Path) -> list[str]:
    return [e["event"] for e in read_events(out)]


@pytest.fixture(scope="module")
def healthy(corpus, tmp_path_factory) -> Path:
    """160 ticks at a healthy rate (ckpt-rolling at 80, ckpt-final at 160)."""
    out = tmp_path_factory.mktemp("healthy")
    assert run(corpus, out, 160, "--lr", "0.01", "--ckpt-every", "80") == 0
    return out


def test_a_run_diverging_from_its_first_steps_stops_as_diverged(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(corpus, out, 320, "--lr", "10", "--ckpt-every", "160") == EXIT_DIVERGED
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("[train] diverged: ceiling, train_bpb ")
    assert "it began at tick 0; no rewind tried" in last
    assert "stopped: it diverged from its first steps" in last
    assert "start again with a lower --lr (python -m atom_train.tune lr" in last
    assert "completed" not in err
    st = status(out)
    assert st["status"] == "diverged"
    assert st["divergence"]["verdict"]["signal"] == "ceiling"
    assert st["divergence"]["last_healthy"] is None
    assert not list(out.glob("*.safetensors"))  # (no final, no rolling at 160)
    assert kinds(out) == ["start", "diverged"]
    assert "divergence guard: rewind (at most 3 within 1,600 ticks" in err


def test_a_pivot_onto_a_diverging_rate_is_rewound_then_stops_with_the_healthy_one_intact(
    corpus, healthy, tmp_path, capsys
):
    out = copy_run(healthy, tmp_path)
    final, rolling = out / "ckpt-final.safetensors", out / "ckpt-rolling.safetensors"
    before = sha(final), sha(rolling)
    code = run(corpus, out, 480, "--lr", "10", "--ckpt-every", "80", "--max-rewinds", "1")
    assert code == EXIT_DIVERGED
    err = capsys.readouterr().err
    assert "completed" not in err
    assert (sha(final), sha(rolling)) == before  # the last healthy one, and the older one
    ev = read_events(out)
    assert [e["event"] for e in ev] == [
        "start", "resume", "pivot", "rewind", "resume", "pivot", "diverged",
    ]  # fmt: skip
    person, rewind, auto, stop = ev[2], ev[3], ev[5], ev[6]
    assert person["changes"]["lr"] == [0.01, 10.0] and "auto" not in person
    assert rewind["checkpoint"] == "ckpt-final.safetensors"
    assert (rewind["to_tick"], rewind["given_up"], rewind["lr"]) == (160, [160, 224], [10.0, 5.0])
    assert rewind["verdict"]["began_tick"] == 160 and rewind["skip_ticks"] == 64
    assert (auto["tick"], auto["changes"], auto["auto"], auto["skip_ticks"]) == (
        160, {"lr": [10.0, 5.0]}, "rewind", 64,
    )  # fmt: skip
    assert auto["policy"]["lr"] == 5.0
    assert stop["reason"] == "1 rewind within 800 ticks already (--max-rewinds 1)"
    assert stop["last_healthy"] == {"checkpoint": str(final), "tick": 160, "step": 10}
    st = status(out)
    assert (st["status"], st["checkpoint"], st["policy"]["lr"]) == ("diverged", str(final), 5.0)
    # The given-up steps stay in loss.jsonl: steps 11-14 twice (at lr 10, then at 5).
    lines = [(s["step"], s["lr"]) for s in steps(out) if s["step"] > 10]
    assert lines == [(11, 10.0), (12, 10.0), (13, 10.0), (14, 10.0),
                     (11, 5.0), (12, 5.0), (13, 5.0), (14, 5.0)]  # fmt: skip
    assert "pivot at tick 160: lr 10.0 -> 5.0 (automatic: rewind, every stream moved 64 " in err
    last = err.strip().splitlines()[-1]
    assert "tried 1 rewind (tick 224 back to 160, lr 10 -> 5)" in last
    assert f"last healthy checkpoint: {final} (tick 160); lower --lr" in last


def test_a_rewind_at_a_rate_low_enough_finishes_with_the_streams_moved_on(
    corpus, healthy, tmp_path, capsys
):
    out = copy_run(healthy, tmp_path)
    start = load_checkpoint(out / "ckpt-final.safetensors")
    code = run(corpus, out, 480, "--lr", "10", "--ckpt-every", "80", "--rewind-lr-factor", "1e-3")
    assert code == 0
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("[train] completed at tick 480")
    assert kinds(out) == ["start", "resume", "pivot", "rewind", "resume", "pivot"]
    end = load_checkpoint(out / "ckpt-final.safetensors")
    assert run_config_of(end.meta).value("lr") == pytest.approx(0.01)
    assert end.meta[GUARD_KEY]["health"]["state"] == "healthy"
    # Every stream read 64 bytes further than the rewound checkpoint's (the 64 ticks it
    # had read when it diverged), then the 320 ticks to the end.
    size = sum(p.stat().st_size for p in corpus.glob("train-*.txt"))
    moved = (start.tensors[LOADER_POSITIONS].numpy() + 64 + 320) % size
    assert np.array_equal(end.tensors[LOADER_POSITIONS].numpy(), moved)
    # The command that diverged, run again (as the supervisor relaunches it): the rewind's
    # rate stays in force, said, not a pivot back onto --lr 10.
    code = run(corpus, out, 512, "--lr", "10", "--ckpt-every", "80", "--rewind-lr-factor", "1e-3")
    assert code == 0
    assert (
        "--lr 10.0 not applied: the divergence guard's rewind at tick 160 set 0.01, which stays "
        "in force (--revert-ok applies it)" in capsys.readouterr().err
    )
    assert kinds(out)[-1] == "resume"
    assert run_config_of(load_checkpoint(out / "ckpt-final.safetensors").meta).value("lr") == 0.01


def test_no_rolling_checkpoint_while_suspect_and_a_rerun_resumes_from_the_healthy_one(
    corpus, healthy, tmp_path, capsys
):
    """--ckpt-every 16 after the pivot: the rolling checkpoint at 176 is written (its step was
    clean), those at 192 and 208 are not (bad steps not yet ruled on); at the verdict (224)
    the one at 176, written after the divergence began, is set aside, so that the rerun the
    stop line asks for resumes from the last healthy one."""
    out = copy_run(healthy, tmp_path)
    flags = ("--ckpt-every", "16", "--on-divergence", "stop")
    assert run(corpus, out, 480, "--lr", "10", *flags) == EXIT_DIVERGED
    err = capsys.readouterr().err
    for tick in (192, 208):
        assert (
            f"tick {tick}: no rolling checkpoint: the divergence guard finds the run suspect; "
            "the newest stays ckpt-rolling.safetensors" in err
        )
    assert (
        "set aside, written after the last healthy checkpoint: ckpt-rolling.safetensors -> "
        "ckpt-rolling.safetensors.given-up" in err
    )
    aside = load_checkpoint(out / "ckpt-rolling.safetensors.given-up")
    assert aside.meta["training"]["tick"] == 176
    assert load_checkpoint(out / "ckpt-rolling.prev.safetensors").meta["training"]["tick"] == 80
    assert status(out)["divergence"]["reason"] == "--on-divergence stop"
    assert run(corpus, out, 192, "--lr", "0.01", "--ckpt-every", "16") == 0
    resumed = [e for e in read_events(out) if e["event"] == "resume"][-1]
    assert (resumed["checkpoint"], resumed["tick"]) == ("ckpt-final.safetensors", 160)


def test_a_resume_continues_the_detector_exactly(corpus, tmp_path):
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    assert run(corpus, straight, 256, "--ckpt-every", "128") == 0
    assert run(corpus, halves, 128, "--ckpt-every", "128") == 0
    half = load_checkpoint(halves / "ckpt-final.safetensors").meta[GUARD_KEY]
    # (6 judged steps of 8: the first window of each 64-tick episode is not judged)
    assert half["health"]["state"] == "healthy" and len(half["loss"]["history"]) == 6
    assert run(corpus, halves, 256, "--ckpt-every", "128") == 0
    a = load_checkpoint(straight / "ckpt-final.safetensors").meta[GUARD_KEY]
    b = load_checkpoint(halves / "ckpt-final.safetensors").meta[GUARD_KEY]
    assert a == b


def test_the_supervisor_does_not_relaunch_a_diverged_run(corpus, tmp_path):
    out, marker = tmp_path / "run", tmp_path / "completed"
    cmd = [
        sys.executable, "-m", "atom_train.supervise", "--backoff", "0",
        "--on-complete", f"touch {marker}", "--", *args(corpus, out, 320, "--lr", "10"),
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == EXIT_DIVERGED, p.stderr
    assert not marker.exists()
    assert status(out)["status"] == "diverged"
    assert kinds(out) == ["start", "diverged"]  # one launch
    assert "the run diverged: ceiling, train_bpb" in p.stderr


def test_a_nan_planted_in_one_window_is_rewound_and_the_run_completes(
    corpus, tmp_path, monkeypatch, capsys
):
    """NaN gradients in the window at tick 200 (tests/helpers/faults.py, once): the non-finite
    verdict at its step, a rewind to the rolling checkpoint at 160, the run completes."""
    monkeypatch.setenv("ATOM_TEST_NAN_AT_TICK", "200")
    monkeypatch.setenv("ATOM_TEST_NAN_MARKER", str(tmp_path / "planted"))
    out = tmp_path / "run"
    assert run(corpus, out, 320, "--lr", "0.01", "--ckpt-every", "80") == 0
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("[train] completed at tick 320")
    ev = read_events(out)
    assert [e["event"] for e in ev] == ["start", "rewind", "resume", "pivot"]
    v = ev[1]["verdict"]
    assert (v["signal"], v["what"], v["tick"], v["began_tick"]) == ("nonfinite", "grad_norm",
                                                                    208, 176)  # fmt: skip
    assert (ev[1]["checkpoint"], ev[1]["to_tick"]) == ("ckpt-rolling.safetensors", 160)
    assert ev[3]["auto"] == "rewind" and ev[3]["changes"] == {"lr": [0.01, 0.005]}
    final = load_checkpoint(out / "ckpt-final.safetensors")
    assert final.meta[GUARD_KEY]["health"]["state"] == "healthy"
    assert all(t.isfinite().all() for k, t in final.tensors.items() if k.startswith("model/"))


def test_under_the_supervisor_a_planted_nan_is_survived_without_a_relaunch(corpus, tmp_path):
    """The supervisor's view of a planted NaN (in the trainer it launches, through the
    suite's fault injection): the trainer rewinds by itself, completes, and the supervisor
    runs --on-complete after its one launch; before the guard, the same NaN made every
    relaunch meet it again until the supervisor gave up."""
    import os

    out, marker = tmp_path / "run", tmp_path / "completed"
    env = {
        **os.environ,
        "ATOM_TEST_NAN_AT_TICK": "200",
        "ATOM_TEST_NAN_MARKER": str(tmp_path / "planted"),
    }
    cmd = [
        sys.executable, "-m", "atom_train.supervise", "--backoff", "0",
        "--on-complete", f"touch {marker}", "--",
        *args(corpus, out, 320, "--lr", "0.01", "--ckpt-every", "80"),
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert marker.exists() and (tmp_path / "planted").exists()
    assert status(out)["status"] == "completed"
    assert kinds(out) == ["start", "rewind", "resume", "pivot"]  # one launch, one rewind
    assert read_events(out)[1]["verdict"]["signal"] == "nonfinite"


def test_a_loss_spike_planted_in_the_data_is_detected_within_the_lag_and_survived(tmp_path, capsys):
    """48 random bytes planted where every stream reads ticks 1,232-1,280 (B 4, K 16, the
    streams 6,000 bytes apart): the loss jumps from ~2 to ~10 nats for 3 judged windows.
    The loss-spike rule fires on the 3rd (--spike-steps 3), read at that window's progress
    row: within the stated lag (spike_steps - 1 + P steps of the first bad one, P = 1 here);
    the run goes back to the checkpoint at 1,200 (before it began), moves every stream past
    the bytes read since (so the planted block is not read again), halves the rate and
    completes, every later step under the threshold that fired."""
    import random

    from helpers.trainer_kit import make_corpus

    from atom_train.trainer.divergence import detection_lag_steps

    corpus = make_corpus(tmp_path)
    rng = random.Random(7)
    start, n = 1232, 48
    for shard in range(2):  # streams at 0, 6,000 (shard 0) and 12,000, 18,000 (shard 1)
        p = corpus / f"train-{shard}.txt"
        b = bytearray(p.read_bytes())
        for off in (start, 6000 + start):
            b[off : off + n] = bytes(rng.randrange(256) for _ in range(n))
        p.write_bytes(bytes(b))
    out = tmp_path / "run"
    assert run(corpus, out, 1600, "--lr", "0.02", "--ckpt-every", "80") == 0
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("[train] completed")
    ev = read_events(out)
    assert [e["event"] for e in ev] == ["start", "rewind", "resume", "pivot"]
    rewind, pivot = ev[1], ev[3]
    v = rewind["verdict"]
    assert v["signal"] == "loss_spike" and v["what"] == "loss"
    first_bad = start + 16  # the progress row of the first window that reads the block
    lag = detection_lag_steps(3, 16, 16, 64)
    assert first_bad <= v["tick"] <= first_bad + lag * 16
    assert rewind["to_tick"] == 1200 <= v["began_tick"] < start
    assert rewind["to_tick"] + rewind["skip_ticks"] >= start + n  # the block is not read again
    assert pivot["changes"] == {"lr": [0.02, 0.01]} and pivot["auto"] == "rewind"
    after = [s["loss"] for s in steps(out) if s["lr"] == 0.01]
    assert after and max(after) < v["threshold"]


def test_a_run_memorising_its_corpus_is_warned_not_rewound(corpus, tmp_path, capsys):
    """Many passes over a 24 kB corpus: the val rises while the train loss falls (at tick
    20,480 here). No rewind or lower rate mends that, so the guard says it and the run trains
    on and completes, its rolling checkpoint going on; before, the val rule rewound it three
    times and stopped it as diverged, advising a lower --lr."""
    out = tmp_path / "run"
    val = ["--val", str(corpus / "val.txt"), "--val-bytes", "1024", "--val-streams", "4"]
    code = run(corpus, out, 22528, *val, "--val-every", "1024", "--ckpt-every", "4096")
    assert code == 0
    err = capsys.readouterr().err
    assert "divergence guard: overfitting, val_bpb " in err
    assert "training on (memorising its training text, not diverging: use more text" in err
    assert err.strip().splitlines()[-1].startswith("[train] completed at tick 22528 ")
    ev = read_events(out)
    assert [e["event"] for e in ev] == ["start", "divergence"]
    assert ev[1]["verdict"]["signal"] == "overfitting" and ev[1]["action"] == "warn"
    assert load_checkpoint(out / "ckpt-rolling.safetensors").meta["training"]["tick"] == 20480
