"""The trainer: exact resume, signals, kill -9, corrupt checkpoints, locks, full disk.

Runs use a tiny model (n_modes 8) and 4 streams, so a run of a hundred ticks takes about a
second; subprocess runs add the interpreter's start-up.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.trainer_kit import (
    REPO,
    args,
    assert_close_state,
    assert_same_state,
    last_by_step,
    run,
    spawn,
    steps,
    wait_for_steps,
)

from atom_train import train
from atom_train.export import export_raw, read_raw
from atom_train.model.field_loops import available
from atom_train.trainer import checkpointer, noise_scale
from atom_train.trainer.checkpoint_file import (
    FINAL,
    ROLLING,
    ROLLING_PREV,
    load_checkpoint,
    snapshot_name,
)
from atom_train.trainer.lr_schedule import LRSchedule
from atom_train.trainer.rundir import PROGRESS_COLUMNS


@pytest.fixture(scope="module")
def straight(corpus, tmp_path_factory) -> Path:
    """The reference: 192 ticks without interruption (checkpoint ticks every 48)."""
    out = tmp_path_factory.mktemp("straight")
    assert run(corpus, out, 192, "--ckpt-every", "48") == 0
    return out


def test_exact_resume_after_stop_mid_flush(corpus, straight, tmp_path):
    # Stop at tick 48: 16 ticks after the flush at 32, so 16 atoms are live, and the run
    # crosses an episode reset (64), flushes (every 32), and dropout masks on both sides.
    assert run(corpus, tmp_path, 48, "--ckpt-every", "48") == 0
    mid = load_checkpoint(tmp_path / FINAL)
    n_atoms = mid.tensors["runtime/n_atoms"]
    assert int(n_atoms.min()) == 16, n_atoms
    assert mid.group("optim"), "the final checkpoint keeps the optimizer state"
    assert run(corpus, tmp_path, 192, "--ckpt-every", "48") == 0
    assert_same_state(tmp_path / FINAL, straight / FINAL)
    assert last_by_step(tmp_path) == last_by_step(straight)
    events = [json.loads(x) for x in (tmp_path / "loss.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if "event" in e] == ["start", "resume"]
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "completed"


def test_rerun_of_a_completed_run_reports_and_exits(corpus, straight, capsys):
    before = (straight / FINAL).read_bytes()
    log = (straight / "loss.jsonl").read_bytes()
    assert run(corpus, straight, 192, "--ckpt-every", "48") == 0
    assert "already complete at tick 192" in capsys.readouterr().err
    assert (straight / FINAL).read_bytes() == before
    # A shorter length is no more work: nothing is appended to the run's logs.
    assert run(corpus, straight, 96, "--ckpt-every", "48") == 0
    assert "already complete at tick 192" in capsys.readouterr().err
    assert (straight / "loss.jsonl").read_bytes() == log
    assert json.loads((straight / "status.json").read_text())["status"] == "completed"


def test_sigterm_stops_within_a_window_and_resumes_exactly(corpus, straight, tmp_path):
    proc = spawn(corpus, tmp_path, 100_000, "--ckpt-every", "48")
    wait_for_steps(tmp_path, 3, proc)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "stopped" and status["signal"] == "SIGTERM"
    ck = load_checkpoint(tmp_path / ROLLING)
    tick = ck.meta["training"]["tick"]
    assert tick % 16 == 0 and tick == status["tick"]
    assert f"stopped by SIGTERM at tick {tick}" in output
    # Within one window: the last logged step is the one the checkpoint holds.
    assert steps(tmp_path)[-1]["tick"] == tick
    if tick >= 192:
        pytest.skip("the machine was too fast for this stop to land before tick 192")
    assert run(corpus, tmp_path, 192, "--ckpt-every", "48") == 0
    assert_same_state(tmp_path / FINAL, straight / FINAL)


def test_sigusr1_checkpoints_and_goes_on(corpus, tmp_path):
    proc = spawn(corpus, tmp_path, 100_000, "--ckpt-every", "0")
    try:
        wait_for_steps(tmp_path, 2, proc)
        assert not (tmp_path / ROLLING).exists()
        proc.send_signal(signal.SIGUSR1)
        t0 = time.time()
        while not (tmp_path / ROLLING).exists() and time.time() - t0 < 60:
            time.sleep(0.05)
        tick = load_checkpoint(tmp_path / ROLLING).meta["training"]["tick"]
        wait_for_steps(tmp_path, len(steps(tmp_path)) + 3, proc)
        assert proc.poll() is None, "SIGUSR1 must not stop training"
        assert steps(tmp_path)[-1]["tick"] > tick
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    assert "SIGUSR1: checkpoint at tick" in output
    assert proc.returncode == 0


_INNER_TEST = """
import os
from pathlib import Path
from helpers.trainer_kit import run
from atom_train.trainer.checkpoint_file import FINAL, load_checkpoint

def test_a_long_run_in_process():
    out = Path(os.environ["RUN_DIR"])
    assert run(Path(os.environ["CORPUS"]), out, 100_000, "--ckpt-every", "0") == 0
    load_checkpoint(out / FINAL)  # (what the CUDA trainer test reads)
"""


def test_sigint_under_pytest_interrupts_the_session_not_the_trainer(corpus, tmp_path):
    """A trainer run in pytest's process (trainer_kit.run) leaves SIGINT to pytest: SIGINT
    while it trains (gpu_check.sh stopping the tests at their bound, a Ctrl-C) interrupts
    the session (exit 2), the test under way is not reported, nothing is reported failed.
    With the trainer's own handler it would stop early with exit 0, and its test would fail
    on the final checkpoint it lacks: a cut reported as a product bug."""
    (tmp_path / "test_inner.py").write_text(_INNER_TEST)
    out, xml = tmp_path / "run", tmp_path / "inner.xml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", str(xml),
         "test_inner.py"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "tests"), "RUN_DIR": str(out),
             "CORPUS": str(corpus)},
    )  # fmt: skip
    try:
        wait_for_steps(out, 2, proc)  # (the trainer under way)
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, output[-3000:]  # pytest: interrupted
    assert "KeyboardInterrupt" in output and "failed" not in output, output[-3000:]
    assert xml.exists() and "<failure" not in xml.read_text() and "<error" not in xml.read_text()
    assert "stopped" not in json.loads((out / "status.json").read_text()).get("status", "")


def test_kill9_at_random_moments_loses_nothing(corpus, straight, tmp_path):
    # A checkpoint at every window, each written slowly (~0.3 s), so kills land in writes.
    env = {"ATOM_TEST_SLOW_CKPT_WRITE": "0.04"}
    rng = random.Random(1234)
    history = ""
    torn = 0
    for attempt in range(6):
        proc = spawn(corpus, tmp_path, 384, "--ckpt-every", "16", env=env)
        # Past start-up (a step logged by this process), then...
        done = len(steps(tmp_path)) if (tmp_path / "loss.jsonl").exists() else 0
        wait_for_steps(tmp_path, done + 1, proc)
        if attempt % 2:
            # ...inside a checkpoint write: the trainer is frozen (SIGSTOP) once its temp file
            # is seen, and killed if the temp file is still there while it is frozen (else
            # the write had just ended: let it go on and catch the next one). No timing.
            while True:
                t0 = time.time()
                while not list(tmp_path.glob(".*.tmp-*")) and time.time() - t0 < 30:
                    time.sleep(0.005)
                proc.send_signal(signal.SIGSTOP)
                if list(tmp_path.glob(".*.tmp-*")):
                    break
                proc.send_signal(signal.SIGCONT)
            torn += 1
        else:
            time.sleep(rng.uniform(0.0, 1.0))  # ...or a random moment.
        proc.kill()
        output = proc.communicate()[0]
        assert "skipping checkpoint" not in output, output
        if attempt:
            assert "resumed from" in output, output
        now = (tmp_path / "loss.jsonl").read_text()
        assert now.startswith(history), "loss.jsonl lost or rewrote a line"
        history = now
    assert torn == 3, "three kills landed inside checkpoint writes"
    assert run(corpus, tmp_path, 384, "--ckpt-every", "16") == 0
    assert (tmp_path / "loss.jsonl").read_text().startswith(history)
    assert not list(tmp_path.glob(".*.tmp-*")), "temp files are cleaned up"
    for line in (tmp_path / "loss.jsonl").read_text().splitlines():
        json.loads(line)  # every line whole
    # Windows are cut at the same ticks (multiples of 16), so the result is the straight run's.
    other = tmp_path.parent / "straight16"
    assert run(corpus, other, 384, "--ckpt-every", "16") == 0
    assert_same_state(tmp_path / FINAL, other / FINAL)


@pytest.mark.parametrize("damage", ["corrupt", "truncate"])
def test_damaged_latest_checkpoint_is_skipped(corpus, straight, tmp_path, capsys, damage):
    out = tmp_path / "run"
    shutil.copytree(straight, out)
    (out / FINAL).unlink()
    latest = out / ROLLING  # tick 144; the one before is .prev at tick 96
    raw = bytearray(latest.read_bytes())
    if damage == "corrupt":
        raw[len(raw) // 2] ^= 0x40
    else:
        raw = raw[: len(raw) // 3]
    latest.write_bytes(bytes(raw))
    assert load_checkpoint(out / ROLLING_PREV).meta["training"]["tick"] == 96
    assert run(corpus, out, 192, "--ckpt-every", "48") == 0
    err = capsys.readouterr().err
    assert "skipping checkpoint" in err and ROLLING in err
    assert f"resumed from {out / ROLLING_PREV} at tick 96" in err
    assert_same_state(out / FINAL, straight / FINAL)


def test_second_trainer_on_the_same_folder_is_refused(corpus, tmp_path, capsys):
    proc = spawn(corpus, tmp_path, 100_000, "--ckpt-every", "0")
    try:
        wait_for_steps(tmp_path, 1, proc)
        assert run(corpus, tmp_path, 100_000) == 2
        err = capsys.readouterr().err
        assert f"another trainer (pid {proc.pid}) is using {tmp_path}" in err
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


@pytest.mark.parametrize("damage", ["bit-flip", "cut-to-a-third"])
def test_snapshots_are_never_overwritten_and_a_damaged_one_is_moved_aside(
    corpus, tmp_path, capsys, damage
):
    argv = ("--ckpt-every", "48", "--snapshot-every", "32")
    assert run(corpus, tmp_path, 96, *argv) == 0
    snaps = sorted(p.name for p in tmp_path.glob("snapshot-*"))
    assert snaps == [snapshot_name(32), snapshot_name(64), snapshot_name(96)]
    # snapshot-96 rots on disk, and the rolling/final checkpoints are gone: the resume comes
    # from snapshot-64 and passes tick 96 again. The damaged snapshot is evidence: it is
    # renamed aside as it is (same file, same bytes) and the snapshot is written again.
    for name in (FINAL, ROLLING, ROLLING_PREV):
        (tmp_path / name).unlink(missing_ok=True)
    rotten = tmp_path / snapshot_name(96)
    raw = bytearray(rotten.read_bytes())
    if damage == "bit-flip":  # (the payload's checksum finds it)
        raw[-7] ^= 0x10
    else:  # a copy cut short, as a full disk or a killed copy leaves it
        raw = raw[: len(raw) // 3]
    rotten.write_bytes(bytes(raw))
    before = {n: ((tmp_path / n).stat().st_ino, (tmp_path / n).read_bytes()) for n in snaps}
    capsys.readouterr()
    assert run(corpus, tmp_path, 96, *argv) == 0
    err = capsys.readouterr().err
    assert f"resumed from {tmp_path / snapshot_name(64)} at tick 64" in err
    aside = tmp_path / (snapshot_name(96) + ".damaged")
    said = [
        line for line in err.splitlines() if f"warning: {snapshot_name(96)} is damaged (" in line
    ]
    assert len(said) == 1, err
    assert said[0].endswith(f"): moved aside to {aside.name}, written again")
    if damage == "bit-flip":
        assert "(checksum mismatch (the file is corrupt))" in said[0]
    assert f"[train] snapshot {snapshot_name(96)}\n" in err
    assert "already exists" not in err
    assert (aside.stat().st_ino, aside.read_bytes()) == before[snapshot_name(96)]
    for n in snaps[:2]:
        assert ((tmp_path / n).stat().st_ino, (tmp_path / n).read_bytes()) == before[n]
    assert load_checkpoint(rotten).meta["training"]["tick"] == 96
    assert load_checkpoint(tmp_path / FINAL).meta["training"]["tick"] == 96
    assert sorted(p.name for p in tmp_path.glob("snapshot-*")) == [*snaps, aside.name]


def test_init_starts_a_new_run_from_weights(corpus, straight, tmp_path, capsys):
    src = straight / FINAL
    assert run(corpus, tmp_path / "new", 16, "--init", str(src), "--ckpt-every", "0") == 0
    ev = json.loads((tmp_path / "new" / "loss.jsonl").read_text().splitlines()[0])
    assert ev["event"] == "start" and ev["init"] == str(src)
    new = load_checkpoint(tmp_path / "new" / FINAL)
    assert new.meta["training"]["tick"] == 16 and new.meta["training"]["step"] == 1
    # Another shape, or another pack mode, cannot take these weights.
    assert run(corpus, tmp_path / "bad", 16, "--init", str(src), "--n-modes", "16") == 2
    assert run(corpus, tmp_path / "bad2", 16, "--init", str(src), "--pack-mode", "plain") == 2
    err = capsys.readouterr().err
    assert "the weights need the same model shape" in err and "pack_mode" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-B", "8"], "was trained with -B 4, not -B 8"),
        (["--atom-dim", "4"], "model flags differ"),
        (["--pack-mode", "plain"], "model flags differ"),
    ],
)
def test_resume_with_other_config_is_refused(corpus, straight, tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    shutil.copytree(straight, out)
    before = (out / FINAL).read_bytes()
    argv = args(corpus, out, 400) + extra
    assert train.main(argv) == 2
    assert message in capsys.readouterr().err
    assert (out / FINAL).read_bytes() == before


def test_resume_on_another_corpus_is_refused(corpus, straight, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(straight, out)
    other = tmp_path / "other.txt"
    other.write_text("un autre texte, tout à fait différent.\n" * 50)
    argv = args(corpus, out, 400)
    argv[argv.index("--data") + 1] = str(other)
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot resume" in err and "--init" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--total-ticks", "10"], "no training data"),
        (["--data", "/nonexistent/*.txt", "--total-ticks", "10"], "/nonexistent/*.txt"),
        (["--data", "{corpus}/train-*.txt"], "say how long to train"),
        (["--data", "{corpus}/train-*.txt", "--total-ticks", "10", "-B", "0"], "-B must be"),
        (["--data", "{corpus}/train-*.txt", "--total-ticks", "10", "--n-modes", "0"], "n_modes"),
    ],
)
def test_user_errors_exit_2_with_one_line(corpus, tmp_path, capsys, argv, message):
    argv = [a.format(corpus=corpus) for a in argv] + ["--output-dir", str(tmp_path / "o")]
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_no_cuda_is_a_clear_error(corpus, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert run(corpus, tmp_path, 16, "--device", "cuda") == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err


def _unshare_ok() -> bool:
    try:
        r = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


needs_unshare = pytest.mark.skipif(
    not _unshare_ok(), reason="needs user+mount namespaces (unshare -rm) for a real small fs"
)


def _in_tmpfs(script: str, tmp_path: Path, size_kib: int) -> subprocess.CompletedProcess:
    """Run a shell script with $MNT a fresh tmpfs of `size_kib` KiB (private mount namespace)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    full = f"set -u; MNT={mnt}; mount -t tmpfs -o size={size_kib}k none $MNT; {script}"
    return subprocess.run(
        ["unshare", "-rm", "bash", "-c", full],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@needs_unshare
def test_disk_fills_up_during_a_run(corpus, straight, tmp_path):
    train_cmd = " ".join(
        [sys.executable, "-m", "atom_train.train"]
        + [f"'{a}'" for a in args(corpus, Path("$MNT/run"), 192, "--ckpt-every", "16")]
    ).replace("'$MNT/run'", '"$MNT/run"')
    script = f"""
    {train_cmd} --total-ticks 32 > /dev/null 2>&1 || exit 90
    cp "$MNT/run/{ROLLING}" /tmp/good-$$ 2>/dev/null
    # fill the disk, leaving less than one checkpoint free
    dd if=/dev/zero of="$MNT/filler" bs=4k 2>/dev/null
    rm "$MNT/filler"; free=$(df -k --output=avail "$MNT" | tail -1)
    dd if=/dev/zero of="$MNT/filler" bs=1k count=$((free - 40)) 2>/dev/null
    {train_cmd} 2> "$MNT/../err.txt"; echo "rc=$?"
    ls -a "$MNT/run"
    python3 -c "import json,sys; print(json.load(open('$MNT/run/status.json'))['status'])" || true
    {sys.executable} -c "from atom_train.trainer.checkpoint_file import load_checkpoint as l; \
print('tick', l('$MNT/run/{FINAL}').meta['training']['tick'])"
    rm "$MNT/filler"
    {train_cmd} > /dev/null 2>&1; echo "rc2=$?"
    cp "$MNT/run/{FINAL}" "$MNT/../final.safetensors"
    """
    r = _in_tmpfs(script, tmp_path, 2048)
    out = r.stdout
    err = (tmp_path / "err.txt").read_text()
    assert "rc=1" in out, (out, r.stderr, err)
    assert "No space left on device" in err and "rerun to resume" in err, err
    assert "Traceback" not in err
    assert ".tmp-" not in out, "the temp file of the failed write is removed"
    assert "tick 32" in out, "the checkpoint from before the disk filled is intact"
    assert "rc2=0" in out, (out, r.stderr)
    assert_same_state(tmp_path / "final.safetensors", straight / FINAL)


@needs_unshare
def test_read_only_output_folder(corpus, tmp_path):
    train_cmd = " ".join(
        [sys.executable, "-m", "atom_train.train"]
        + [f"'{a}'" for a in args(corpus, Path("$MNT/run"), 64, "--ckpt-every", "16")]
    ).replace("'$MNT/run'", '"$MNT/run"')
    script = f"""
    {train_cmd} --total-ticks 32 > /dev/null 2>&1 || exit 90
    sha=$(sha256sum "$MNT/run/{FINAL}")
    mount -o remount,ro "$MNT"
    {train_cmd}; echo "rc=$?"
    echo "$sha" | sha256sum -c --quiet && echo intact
    """
    r = _in_tmpfs(script, tmp_path, 8192)
    assert "rc=2" in r.stdout, (r.stdout, r.stderr)
    assert "Read-only file system" in r.stderr and "--output-dir" in r.stderr
    assert "Traceback" not in r.stderr
    assert "intact" in r.stdout


def test_checkpoint_write_failure_mid_run_keeps_previous(corpus, tmp_path, monkeypatch, capsys):
    """Injected ENOSPC on the second checkpoint write (the tmpfs test does it for real)."""
    from atom_train.trainer import checkpoint_file as ck

    real = ck.save_checkpoint
    calls = {"n": 0}

    def failing(path, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise ck.CheckpointError(f"could not write checkpoint {path} (No space left on device)")
        return real(path, *a, **k)

    monkeypatch.setattr(checkpointer, "save_checkpoint", failing)
    assert run(corpus, tmp_path, 64, "--ckpt-every", "16") == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "rerun to resume" in err
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "failed"
    assert load_checkpoint(tmp_path / ROLLING).meta["training"]["tick"] == 16
    monkeypatch.setattr(checkpointer, "save_checkpoint", real)
    assert run(corpus, tmp_path, 64, "--ckpt-every", "16") == 0


def test_supervisor_relaunches_the_real_trainer_after_a_crash(corpus, straight, tmp_path):
    out = tmp_path / "run"
    marker = tmp_path / "crashed-once"
    cmd = [
        sys.executable, "-m", "atom_train.supervise", "--backoff", "0.2", "--",
        *args(corpus, out, 192, "--ckpt-every", "48"),
    ]  # fmt: skip
    env = {**os.environ, "ATOM_TEST_CRASH_AT_TICK": "112", "ATOM_TEST_CRASH_MARKER": str(marker)}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert marker.read_text() == "112"
    assert "resumed from" in r.stderr and "at tick 96" in r.stderr
    assert_same_state(out / FINAL, straight / FINAL)


def test_export_raw_matches_checkpoint(straight, tmp_path):
    c = load_checkpoint(straight / FINAL)
    side = export_raw(c, tmp_path / "final.bin")
    step, w, m, v = read_raw(tmp_path / "final.bin")
    assert step == c.meta["training"]["step"]
    assert (tmp_path / "final.bin").stat().st_size == 8 + 12 * side["n_params"]
    for p in side["params"]:
        n = int(np.prod(p["shape"]))
        sl = slice(p["offset"], p["offset"] + n)
        name = p["name"]
        assert np.array_equal(w[sl], c.tensors[f"model/{name}"].numpy().ravel())
        assert np.array_equal(m[sl], c.tensors[f"optim/{name}/exp_avg"].numpy().ravel())
        assert np.array_equal(v[sl], c.tensors[f"optim/{name}/exp_avg_sq"].numpy().ravel())
    names = [p["name"] for p in side["params"]]
    assert names == c.meta["optimizer"]["param_names"]
    assert "R" not in names and "W0" not in names  # frozen buffers are not parameters


def test_progress_and_samples_files(corpus, tmp_path):
    val = corpus / "val.txt"
    extra = ["--val", str(val), "--val-every", "32", "--val-bytes", "256", "--val-streams", "4"]
    extra += ["--sample-every", "32", "--sample-bytes", "20", "--ckpt-every", "0"]
    assert run(corpus, tmp_path, 64, *extra) == 0
    text = (tmp_path / "progress.tsv").read_text()
    assert text.splitlines()[0].split("\t") == list(PROGRESS_COLUMNS)
    rows = list(csv.DictReader(io.StringIO(text), delimiter="\t"))
    assert [int(r["tick"]) for r in rows] == [16, 32, 48, 64]
    assert [bool(r["val_bpb"]) for r in rows] == [False, True, False, True]  # val at 32, 64
    assert all(float(r["bytes_per_s"]) > 0 for r in rows)
    # On a CPU the step's wait is the loader's; no GPU, no all-reduce in one process.
    assert all(r["loader_wait_pct"] and not r["gpu_wait_pct"] for r in rows)
    assert all(not r["allreduce_s"] and float(r["optimizer_s"]) > 0 for r in rows)
    assert [int(r["bytes_seen"]) for r in rows] == [4 * int(r["tick"]) for r in rows]
    assert all(float(r["sample_s"]) > 0 for r in (rows[1], rows[3]))
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["tick"] for s in samples] == [32, 64]
    assert all(s["prompt"] == "Bonjour" for s in samples)
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["val_bpb"] == pytest.approx(float(rows[3]["val_bpb"]), rel=1e-5)
    start = json.loads((tmp_path / "loss.jsonl").read_text().splitlines()[0])
    loop = "native" if available("native", torch.device("cpu")) else "fused"  # auto on a CPU
    for record in (start, status):  # the loop auto chose, and why
        assert record["recurrence"] == loop
        assert record["recurrence_reason"] == f"auto: the {loop} loop on cpu"


def test_compact_feature_ids_train_like_dense(corpus, straight, tmp_path):
    """--transport ids ships 17 ids per byte and sums the input layers' columns of those ids
    on the device (an embedding-bag) instead of a [K*B, 320] matmul: the same sums in
    another order. After 12 AdamW steps every tensor of the final checkpoint is within
    1e-4 relative (||a - b|| <= 1e-4 ||b|| + 1e-6) of the dense run's; the loader state and
    counters are identical."""
    assert run(corpus, tmp_path, 192, "--ckpt-every", "48", "--transport", "ids") == 0
    assert_close_state(tmp_path / FINAL, straight / FINAL, 1e-4, 1e-6)


# ---- the gradient noise scale (--noise-scale-every) -----------------------------------------

NOISE = ["--noise-scale-every", "2"]
NOISE_KEYS = ("grad_sq_small", "streams_small", "grad_sq_big", "grad_sq", "trace_cov")


@pytest.fixture(scope="module")
def measured(corpus, tmp_path_factory) -> Path:
    """`straight`, measuring the noise scale every 2 steps."""
    out = tmp_path_factory.mktemp("measured")
    assert run(corpus, out, 192, "--ckpt-every", "48", *NOISE) == 0
    return out


@pytest.fixture(scope="module")
def unmeasured(corpus, tmp_path_factory) -> Path:
    """`straight` with the noise scale off (`straight` builds its probe: the default
    --noise-scale-every is 100, though 12 steps take no measurement)."""
    out = tmp_path_factory.mktemp("unmeasured")
    assert run(corpus, out, 192, "--ckpt-every", "48", "--noise-scale-every", "0") == 0
    return out


def test_measuring_the_noise_scale_leaves_the_run_bit_identical(straight, measured, unmeasured):
    """The weights, AdamW's state, the runtime state, the loader and every generator (torch's
    own included) after 12 steps are those of the run without it, bit for bit, and so is
    every step's loss and gradient norm: measuring every 2 steps, at the default period (the
    probe built, no measurement due) and off (no probe)."""
    off = load_checkpoint(unmeasured / FINAL)
    plain = {s["step"]: (s["loss"], s["train_bpb"], s["grad_norm"]) for s in steps(unmeasured)}
    for run_dir in (straight, measured):
        a = load_checkpoint(run_dir / FINAL)
        assert a.meta["loader_state"] == off.meta["loader_state"]
        assert a.tensors.keys() == off.tensors.keys()
        for k in a.tensors:
            assert torch.equal(a.tensors[k], off.tensors[k]), (run_dir.name, k)
        assert {
            s["step"]: (s["loss"], s["train_bpb"], s["grad_norm"]) for s in steps(run_dir)
        } == plain


def test_the_noise_scale_is_logged_everywhere(measured):
    lines = steps(measured)
    hit = [s for s in lines if "grad_sq_small" in s]
    # K = 16, every 2 steps: in each stretch of 32 ticks, the first full window that does
    # not start in the 16 settling ticks after an episode reset (episodes of 64 ticks).
    assert [s["tick"] - 16 for s in hit] == [16, 32, 80, 96, 144, 160]
    for s in hit:
        assert s["streams_small"] == 2 and s["grad_sq_small"] > 0 and s["grad_sq_big"] > 0
        assert s["b_simple_bytes"] == pytest.approx(16 * s["b_simple"], rel=1e-5)
    assert not any("grad_sq" in s for s in lines if s not in hit)
    # The moving averages, as the estimator makes them from the logged measurements.
    ema = noise_scale.NoiseEMA()
    for s in hit:
        est = noise_scale.estimate(s["grad_sq_small"], s["grad_sq_big"], 2, 4)
        ema.update(est, s["grad_sq_big"])
        assert s["grad_sq"] == pytest.approx(ema.grad_sq, rel=1e-5)
        assert s["trace_cov"] == pytest.approx(ema.trace_cov, rel=1e-5)
    rows = list(
        csv.DictReader(io.StringIO((measured / "progress.tsv").read_text()), delimiter="\t")
    )
    assert float(rows[-1]["b_simple"]) == pytest.approx(ema.b_simple, rel=1e-5)
    status = json.loads((measured / "status.json").read_text())
    assert status["b_simple_bytes"] == pytest.approx(16 * ema.b_simple, rel=1e-9)
    saved = load_checkpoint(measured / FINAL).meta["training"]["noise_scale"]
    assert noise_scale.NoiseEMA.from_dict(saved).b_simple == pytest.approx(ema.b_simple)


def test_a_resumed_run_logs_the_noise_scale_an_uninterrupted_one_does(corpus, measured, tmp_path):
    assert run(corpus, tmp_path, 96, "--ckpt-every", "48", *NOISE) == 0
    assert run(corpus, tmp_path, 192, "--ckpt-every", "48") == 0  # in force: the run's value
    want = {s["step"]: [s.get(k) for k in NOISE_KEYS] for s in steps(measured)}
    assert {s["step"]: [s.get(k) for k in NOISE_KEYS] for s in steps(tmp_path)} == want


def test_the_noise_scale_needs_two_streams(corpus, tmp_path, capsys):
    assert run(corpus, tmp_path / "asked", 16, "-B", "1", *NOISE) == 2
    err = capsys.readouterr().err
    assert "--noise-scale-every" in err and "-B 2" in err and "Traceback" not in err
    # By default (on, every 100 steps) a run of one stream simply does not measure.
    assert run(corpus, tmp_path / "default", 16, "-B", "1") == 0
    assert not any("grad_sq" in s for s in steps(tmp_path / "default"))


def test_the_noise_scale_is_measured_by_default(corpus, tmp_path):
    # Every 100 steps of K = 16 ticks: in the stretches from ticks 0 and 1600, the first
    # windows past the 16 settling ticks of an episode (episodes of 64 ticks here).
    assert run(corpus, tmp_path, 1632, "--log-every", "0") == 0
    assert [s["tick"] - 16 for s in steps(tmp_path) if "grad_sq_small" in s] == [16, 1616]


@pytest.mark.parametrize("restart", ["peak", "hold", "decay"])
def test_extending_a_finished_cosine_run_says_its_schedule_and_can_continue_the_rate(
    corpus, tmp_path, capsys, restart
):
    """--total-ticks 64 -> 128 on a finished cosine run (4 steps of K = 16, then 4 more): the
    launch says the rate before, now and at the end; --lr-restart decides where it starts."""
    cos = ("--lr", "0.01", "--lr-schedule", "cosine", "--min-lr-ratio", "0.1")
    assert run(corpus, tmp_path, 64, *cos) == 0
    floor = [s["lr"] for s in steps(tmp_path)][-1]  # the last step's rate: near the floor
    capsys.readouterr()
    assert run(corpus, tmp_path, 128, *cos, "--lr-restart", restart) == 0
    err = capsys.readouterr().err
    after = [s["lr"] for s in steps(tmp_path) if s["step"] > 4]  # (steps count from 1)
    assert len(after) == 4
    before = LRSchedule(0.01, "cosine", 0, 0.1, 0, 4).at(4)  # the old schedule at step 4
    assert before == pytest.approx(0.001) and floor > before
    if restart == "peak":  # as before: back to --lr, announced with the way out
        assert after[0] == pytest.approx(0.01)
        assert (
            "learning rate 0.001 -> 0.01 now: cosine from 0.01 down to 0.001 at tick 128 "
            "(--lr-restart peak; to continue from 0.001 instead: --lr-restart hold, constant, "
            "or decay, a cosine from it)"
        ) in err
    elif restart == "hold":
        assert after == pytest.approx([0.001] * 4)
        assert "learning rate 0.001 -> 0.001 now: constant 0.001 to tick 128\n" in err
    else:
        assert after[0] == pytest.approx(0.001) and after[-1] < after[0]
        assert (
            "learning rate 0.001 -> 0.001 now: cosine from 0.001 down to 0.0001 at tick 128\n"
            in err
        )
    changed = "total_ticks 64 -> 128" + (
        "" if restart == "peak" else f", lr_restart peak -> {restart}"
    )
    assert f"pivot at tick 64: {changed}\n" in err
