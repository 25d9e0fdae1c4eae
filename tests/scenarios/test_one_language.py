"""Every command speaks one language, and no wrong byte slips into training: each behaviour
checked as a user meets it, by running the command (a subprocess, from a working folder of
its own) and reading what it printed and wrote.

The corpus is built by `python -m atom_train.corpus build` into a folder whose name has a
space (suggested commands must quote it): short one-line documents, each followed by the
builder's seam, a blank line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FAKEBIN, REPO

from atom_train.data.synthetic import synthetic_text

MODEL = ["--n-modes", "8", "--jl-dim", "16", "--mlp-hidden", "32", "--atom-dim", "8",
         "--threads", "1", "--loader-threads", "1"]  # fmt: skip
TIMEOUT = 300


def atom(command: str, *argv, cwd: Path, stdin: str | None = None, timeout: float = TIMEOUT):
    """`python -m atom_train.<command> argv...` run by a user in `cwd`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", f"atom_train.{command}", *map(str, argv)],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spawn(command: str, *argv, cwd: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", f"atom_train.{command}", *map(str, argv)],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip


def one_error(r: subprocess.CompletedProcess, command: str) -> str:
    """The single line of a refusal: exit 2, ``[command] error: ...``, no traceback."""
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"[{command}] error: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("user")


@pytest.fixture(scope="module")
def built(work) -> Path:
    """`corpus build docs --out 'my corpus'`: 300 one-line documents, a 3 kB val."""
    docs = work / "docs"
    docs.mkdir()
    words = synthetic_text(60_000, seed=5).decode("utf-8", "replace").split()
    for n in range(300):
        line = " ".join(words[n * 13 : n * 13 + 8 + n % 12])
        (docs / f"d{n:03d}.txt").write_text(line.capitalize() + ".\n", encoding="utf-8")
    r = atom("corpus", "build", "docs", "--out", "my corpus", "--val-bytes", "3000", cwd=work)
    assert r.returncode == 0, r.stderr
    return work / "my corpus"


@pytest.fixture(scope="module")
def trained(work, built) -> Path:
    """A small model trained on the built corpus (--corpus): its train shards, its val."""
    r = atom("train", "--corpus", built, "--output-dir", "trained", "--total-ticks", "800",
             "-B", "8", "-K", "16", "--episode-length", "1024", "--log-every", "400",
             "--val-every", "400", "--val-bytes", "1024", "--val-streams", "8", "--lr", "3e-2",
             *MODEL, cwd=work)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return work / "trained"


# ---- 1. A built corpus's held-out val among --data files -------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--data", "my corpus/*.txt", "--total-ticks", "8", "--output-dir", "t1"],
        ["tune", "lr", "--data", "my corpus/*.txt", "-B", "4", "--steps", "3", "--out", "t1.json"],
        ["bench", "loader", "--data", "my corpus/*.txt", "-B", "2", "--threads", "1",
         "--seconds", "0.05", "--out", "t1.json"],
        ["eval", "trained", "--data", "my corpus/*.txt"],
    ],
    ids=["train", "tune", "bench", "eval"],
)  # fmt: skip
def test_1_the_val_of_a_built_corpus_among_data_is_refused(work, built, command):
    r = atom(*command, cwd=work)
    line = one_error(r, command[0])
    assert f"{built / 'val.txt'}" in line and "held-out val" in line
    assert f"--corpus '{built}'" in line  # the fix, quoted: the folder's name has a space
    assert not (work / "t1").exists() and not (work / "t1.json").exists()


def test_1_the_glob_of_the_hints_names_the_corpus_folder_instead(work, built):
    r = atom("train", "--data", "my corpus", "--total-ticks", "8", "--output-dir", "t1b",
             cwd=work)  # fmt: skip
    assert "is a corpus built by `python -m atom_train.corpus build`: use --corpus 'my corpus'" in (
        one_error(r, "train")
    )


# ---- 3. Markup is refused like compressed files, with the corpus builder's fix ----------


def test_3_html_is_refused_with_the_builders_fix(work):
    page = work / "manual.html"
    body = "".join(f"<p class='para'>Le texte du paragraphe {i}.</p>\n" for i in range(50))
    page.write_text(f"<!DOCTYPE html>\n<html><head><title>x</title></head><body>{body}</body>")
    r = atom("train", "--data", page, "--total-ticks", "8", "--output-dir", "t3", cwd=work)
    line = one_error(r, "train")
    assert "is HTML/XML markup" in line and "python -m atom_train.corpus build" in line
    assert "--allow-binary" in line


# ---- 4. Chat from a pipe answers each line -----------------------------------------------


def test_4_chat_from_a_pipe_answers_each_of_three_lines(work, trained):
    """A model trained on a built corpus follows a line with the seam's blank line; the
    reply is the text after it, never just that newline."""
    r = atom("chat", "--checkpoint", trained, "--seed", "1", "--max-bytes", "60", cwd=work,
             stdin="Bonjour\nLa maison est grande.\nVoir la ville\n")  # fmt: skip
    assert r.returncode == 0, r.stderr
    replies = r.stdout.split("\n")[:-1]
    assert len(replies) == 3 and all(reply.strip() for reply in replies), r.stdout


# ---- 5. The same flags everywhere, and "did you mean" ------------------------------------


def test_5_k_corpus_and_did_you_mean_in_every_command(work, built):
    r = atom("train", "--corpus", built, "-K", "8", "-B", "4", "--total-ticks", "16",
             "--output-dir", "t5", *MODEL, cwd=work)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads((work / "t5" / "status.json").read_text())["policy"]["bptt"] == 8
    r = atom("tune", "lr", "--corpus", built, "-B", "4", "-K", "8", "--runs", "1e-2",
             "--steps", "3", "--val-bytes", "1024", "--val-streams", "4", "--out", "t5.json",
             *MODEL, cwd=work)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads((work / "t5.json").read_text())["val"] == [str(built / "val.txt")]
    r = subprocess.run(
        [sys.executable, "-m", "atom_train.data.verify", "verify", "--corpus", built, "--bytes",
         "400", "-B", "2"], cwd=work, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stderr
    r = atom("train", "--corpus", built, "--totl-ticks", "5", "--output-dir", "t5b", cwd=work)
    assert "unrecognized arguments: --totl-ticks 5 (did you mean --total-ticks?)" in one_error(
        r, "train"
    )


# ---- 6. One name per metric, one message style; runs named alike ------------------------


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["train", "--output-dir", "t6", "--total-ticks", "4"], "train"),
        (["tune", "lr", "-B", "0", "--data", "x"], "tune"),
        (["eval", "nowhere", "--data", "x"], "eval"),
        (["chat", "--checkpoint", "nowhere"], "chat"),
        (["plot", "nowhere"], "plot"),
        (["export", "nowhere"], "export"),
        (["bench", "loader", "--seconds", "0"], "bench"),
        (["supervise", "--", "--data", "x"], "supervise"),
        (["corpus", "stats", "nowhere"], "corpus"),
        (["kernel_report", "-B", "0"], "kernel_report"),
    ],
)
def test_6_every_command_refuses_in_the_same_style(work, argv, command):
    one_error(atom(*argv, cwd=work), command)


def test_6_the_logs_name_each_metric_once(trained):
    """(The writers in detail: tests/trainer/test_metric_names.py.)"""
    header = (trained / "progress.tsv").read_text().splitlines()[0].split("\t")
    status = json.loads((trained / "status.json").read_text())
    last = json.loads((trained / "loss.jsonl").read_text().splitlines()[-1])
    # (a step's line, or above --loss-log-rate a slot's aggregate: loss_mean, train_bpb_min...)
    step = {k.removesuffix("_mean").removesuffix("_min").removesuffix("_max") for k in last}
    assert {"train_bpb", "val_bpb", "grad_norm"} <= set(header)
    assert "val_bpb" in status and {"train_bpb", "grad_norm", "bytes_seen"} <= step
    for old in ("byte_ce_bpb", "val_ce_bpb", "gnorm", "bpb"):
        assert old not in header and old not in status and old not in step


# ---- 7. No run folder shared by accident -------------------------------------------------


def test_7_a_forgotten_output_dir_is_refused_not_defaulted(work, built):
    r = atom("train", "--corpus", built, "--total-ticks", "8", cwd=work)
    assert "no --output-dir: name the run's folder with --output-dir" in one_error(r, "train")
    assert not (work / "runs").exists()


# ---- 8, 9. status.json on time and final; the lock before anything else ------------------


def test_8_9_status_follows_the_run_and_a_second_trainer_meets_the_lock(work, built):
    """--log-every 0: no progress row until the end, yet status.json moves every few seconds;
    a second trainer on the busy folder hears of the lock, before its missing data; after
    a stop, status.json holds no ETA."""
    out = work / "t8"
    proc = spawn("train", "--corpus", built, "--output-dir", out, "--total-ticks", "1000000",
                 "-B", "4", "-K", "16", "--log-every", "0", "--val-every", "0",
                 "--ckpt-every", "0", *MODEL, cwd=work)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        status: dict = {}
        while time.monotonic() < deadline:
            try:
                status = json.loads((out / "status.json").read_text())
            except (OSError, ValueError):
                status = {}
            if status.get("tick", 0) > 0:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        assert status.get("status") == "running" and status["tick"] > 0, status
        assert status["eta_s"] > 0
        # No progress row yet (the header comes with the first row).
        rows = (out / "progress.tsv").read_text().splitlines()
        assert [r for r in rows if not r.startswith("tick\t")] == [], rows
        second = atom("train", "--output-dir", out, "--total-ticks", "5", cwd=work)
        line = one_error(second, "train")
        assert f"another trainer (pid {proc.pid}) is using {out}" in line
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    final = json.loads((out / "status.json").read_text())
    assert final["status"] == "stopped" and final["tick"] >= status["tick"]
    assert "eta_s" not in final and "eta_at" not in final


# ---- 10. Messages above the bar; one ETA -------------------------------------------------


def test_10_on_a_terminal_messages_go_above_the_bar_which_shows_one_eta(work, built):
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "atom_train.train", "--corpus", str(built), "--output-dir",
         str(work / "t10"), "--total-ticks", "256", "-B", "4", "-K", "16", "--log-every", "16",
         "--val-every", "64", "--val-bytes", "256", "--val-streams", "4", *MODEL],
        cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
    )  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=TIMEOUT) == 0
    screen = b"".join(chunks).decode("utf-8", "replace")
    assert "eta_s=" in screen, screen[-2000:]
    assert "<" not in re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", screen)  # tqdm's own remaining time
    # Every message starts a line of its own (tqdm.write clears the bar first with a
    # carriage return), never after a stale copy of the bar.
    for m in re.finditer(r"\[train\] ", screen):
        assert m.start() == 0 or screen[m.start() - 1] in "\r\n", screen[m.start() - 80 : m.end()]
    assert screen.count("val_bpb") >= 4  # the validations at 64, 128, 192 and 256


# ---- 11. The bench's plot follows its --out ----------------------------------------------


def test_11_each_bench_writes_its_plot_beside_its_json(work):
    for name in ("a", "b"):
        r = atom("bench", "loader", "-B", "2", "--threads", "1", "--seconds", "0.05",
                 "--bptt", "8", "--out", f"t11/{name}.json", cwd=work)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert f"wrote t11/{name}.json and t11/{name}.png" in r.stdout
    assert sorted(p.name for p in (work / "t11").iterdir()) == ["a.json", "a.png", "b.json",
                                                                "b.png"]  # fmt: skip
    assert not (work / "runs").exists()


# ---- 12. plot and eval say when the runs' val differ, and where an --init run came from -


@pytest.fixture(scope="module")
def initialised(work, built, trained) -> Path:
    """A new run from the trained run's weights, validated on another, smaller text."""
    other = work / "other-val.txt"
    other.write_text("Une autre phrase, pour une autre validation.\n" * 30, encoding="utf-8")
    r = atom("train", "--init", trained / "ckpt-final.safetensors", "--data",
             f"{built}/train-*.txt", "--val", other, "--output-dir", "branch", "--total-ticks",
             "64", "-B", "8", "-K", "16", "--log-every", "32", "--val-every", "32",
             "--val-bytes", "4096", "--val-streams", "8", *MODEL, cwd=work)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return work / "branch"


def test_12_plot_does_not_rank_runs_whose_val_differ_and_marks_the_init(work, trained, initialised):
    r = atom("plot", "trained", "branch", "--out", "t12.png", cwd=work)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    branch = next(line for line in lines if line.startswith("branch: "))
    assert "a new run initialised from trained/ckpt-final.safetensors (tick 800)" in branch
    ranking = lines[-1]
    assert ranking.startswith("no ranking: their val_bpb score different text or settings")
    assert "other-val.txt (1,350 bytes) by 8 streams: each byte scored 3.0 times over" in ranking
    assert "lowest last val_bpb" not in r.stdout
    assert any(line.startswith("settings that differ: ") for line in lines)


def test_12_eval_says_the_same_and_names_runs_as_plot_does(work, built, trained, initialised):
    r = atom("eval", "trained", "branch", "--corpus", built, cwd=work)
    assert r.returncode == 0, r.stderr
    rows = [line.split()[0] for line in r.stdout.splitlines()[1:] if not line.startswith("note")]
    assert set(rows) == {"trained", "branch"}  # the folders' names, as plot names them
    notes = [line for line in r.stdout.splitlines() if line.startswith("note: ")]
    assert any("the runs' own validations differ" in n for n in notes), r.stdout
    assert any("branch: a new run initialised from trained/ckpt-final.safetensors" in n
               for n in notes), r.stdout  # fmt: skip


# ---- 13. Hints that lead somewhere -------------------------------------------------------


def test_13_a_raw_folder_given_as_corpus_is_told_a_build_that_works(work):
    raw = work / "raw texts"
    raw.mkdir()
    for i in range(20):
        (raw / f"t{i}.txt").write_text(f"Texte numéro {i}, écrit pour l'essai.\n" * 20)
    line = one_error(atom("train", "--corpus", "raw texts", "--output-dir", "t13",
                          "--total-ticks", "4", cwd=work), "train")  # fmt: skip
    suggested = re.search(r"`(python -m atom_train\.corpus build [^`]+)`", line).group(1)
    assert suggested == "python -m atom_train.corpus build 'raw texts' --out 'raw texts-corpus'"
    r = atom("corpus", *__import__("shlex").split(suggested)[3:], cwd=work)
    assert r.returncode == 0, r.stderr  # the suggestion builds (not "inside the output folder")


@pytest.mark.parametrize("command", ["chat", "export"])
def test_13_a_text_file_is_not_called_a_corrupt_checkpoint(work, built, command):
    args = ["--checkpoint", built / "val.txt"] if command == "chat" else [built / "val.txt"]
    line = one_error(atom(command, *args, cwd=work), command)
    assert "is a text file, not a checkpoint" in line and "header" not in line


def test_13_plot_of_a_checkpoint_names_the_run_folder(work, trained):
    line = one_error(atom("plot", trained / "ckpt-final.safetensors", cwd=work), "plot")
    assert f"is a checkpoint; plot reads a run's logs: pass its run folder ({trained})" in line


def test_13_stats_of_an_unfinished_build_prints_only_the_error(work, built):
    unfinished = work / "unfinished"
    unfinished.mkdir()
    (unfinished / "train-000.txt").write_text("début\n")
    r = atom("corpus", "stats", "unfinished", cwd=work)
    assert r.stdout == ""
    assert "no manifest.json" in one_error(r, "corpus")


# ---- 14. The supervisor tells a trainer that cannot start from a crash -------------------


def test_14_a_trainer_that_cannot_start_is_said_at_once_and_not_relaunched(work):
    (work / "broken_trainer.py").write_text("import no_such_dependency_xyz  # noqa\n")
    env = {**os.environ, "PYTHONPATH": f"{work}{os.pathsep}{REPO}"}
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "atom_train.supervise", "--module", "broken_trainer",
         "--backoff", "30", "--", "--output-dir", "t14"],
        cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert r.returncode == 1 and time.monotonic() - t0 < 30  # no 30 s backoff: no relaunch
    assert r.stderr.count("launch attempt") == 1
    last = r.stderr.strip().splitlines()[-1]
    assert "the trainer cannot start (exit code 1" in last
    assert "ModuleNotFoundError: No module named 'no_such_dependency_xyz'" in last
    # (another process's checkpoints and the failure count: tests/commands/test_supervise.py)


# ---- 15. make setup without an NVIDIA driver: the CPU-only torch ------------------------


def _setup_torch(*argv, env_extra: dict, python: str = sys.executable):
    env = {**os.environ, "NVIDIA_PROC": "/nonexistent", **env_extra}
    env.pop("TORCH_INDEX", None)
    env.update({k: v for k, v in env_extra.items() if k == "TORCH_INDEX"})
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "setup_torch.sh"), *argv, python],
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("smi", "expect"),
    [
        ({"NVIDIA_SMI": "/nonexistent/nvidia-smi"}, "whl/cpu: no NVIDIA driver here"),
        ({"NVIDIA_SMI": str(FAKEBIN / "nvidia-smi"), "FAKE_SMI": "fail"}, "no NVIDIA driver"),
        ({"NVIDIA_SMI": str(FAKEBIN / "nvidia-smi")}, "PyPI's build (the CUDA one)"),
        ({"NVIDIA_SMI": "/nonexistent/nvidia-smi", "TORCH_INDEX": "pypi"}, "PyPI's build"),
    ],
    ids=["no driver", "driver fails", "GPU box", "chosen"],
)
def test_15_setup_picks_the_cpu_torch_without_a_driver(smi, expect):
    r = _setup_torch("--dry-run", env_extra=smi)
    assert r.returncode == 0, r.stderr
    assert expect in r.stdout, r.stdout
    if "whl/cpu" in expect:  # the pip command it would run
        assert "--index-url https://download.pytorch.org/whl/cpu" in r.stdout


def test_15_an_unreachable_index_is_one_line_and_setup_goes_on(tmp_path):
    """In a scratch venv (nothing installed): the index does not answer, one line says what
    happens instead and how to choose, and the set-up continues (exit 0)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=TIMEOUT)
    r = _setup_torch(
        env_extra={"TORCH_INDEX": "http://127.0.0.1:9/simple", "PIP_NO_INPUT": "1"},
        python=str(venv / "bin" / "python"),
    )
    assert r.returncode == 0, r.stderr
    hint = [line for line in r.stderr.splitlines() if line.startswith("[setup] warning: ")]
    assert len(hint) == 1 and "did not answer: installing PyPI's torch" in hint[0], r.stderr
    assert "TORCH_INDEX=" in hint[0]


def test_15_make_setup_runs_the_choice_before_the_other_dependencies():
    r = subprocess.run(["make", "-n", "-B", "setup"], cwd=REPO, capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    torch_line = next(i for i, x in enumerate(lines) if "scripts/setup_torch.sh" in x)
    deps_line = next(i for i, x in enumerate(lines) if "pip install --quiet -r" in x)
    assert torch_line < deps_line
