"""`python -m atom_train.eval`: a checkpoint's score is the trainer's own validation, to the
last bit; whole-text defaults; run folders (damaged files skipped, equal weights scored
once); the outputs; every bad target refused in one line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from helpers.trainer_kit import run

from atom_train import eval as atom_eval
from atom_train.data.loader import ByteCorpus
from atom_train.model.config import ModelConfig
from atom_train.model.reference import ReferenceModel
from atom_train.model.scoring import score_text
from atom_train.trainer.checkpoint_file import (
    FINAL,
    load_checkpoint,
    save_checkpoint,
    snapshot_name,
)

VAL = ["--val-bytes", "512", "--val-streams", "4"]  # the trainer's val settings, and eval's


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> Path:
    """96 ticks validated every 32 (val.txt: 512 bytes, 4 streams), a snapshot every 32: each
    snapshot records the val of its own tick; the final one shares the last snapshot's."""
    out = tmp_path_factory.mktemp("evalrun") / "run"
    extra = ["--val", str(corpus / "val.txt"), "--val-every", "32", "--snapshot-every", "32"]
    assert run(corpus, out, 96, *extra, *VAL, "--ckpt-every", "0") == 0
    return out


def _eval(capsys, *argv: str) -> tuple[int, str, str]:
    code = atom_eval.main([*map(str, argv), "--threads", "1"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _rows(path: Path) -> list[dict]:
    return json.loads(path.read_text())["rows"]


def test_eval_equals_the_val_the_trainer_logged_exactly(trained, corpus, capsys, tmp_path):
    out = tmp_path / "rows.json"
    code, stdout, _ = _eval(capsys, trained, "--data", corpus / "val.txt", *VAL, "--out", out)
    assert code == 0
    rows = _rows(out)
    assert [r["tick"] for r in rows] == [32, 64, 96]  # tick order; final = snapshot 96
    for r in rows:
        logged = load_checkpoint(trained / r["checkpoint"]).meta["training"]["val_bpb"]
        assert r["val_bpb"] == logged, r["checkpoint"]  # exact, not approximate
        assert r["bytes_scored"] == 512 and r["bytes_seen"] == r["tick"] * 4
    assert rows[-1]["same_weights"] == [FINAL]
    assert rows[0]["delta_bpb"] is None
    assert rows[1]["delta_bpb"] == rows[1]["val_bpb"] - rows[0]["val_bpb"]
    # progress.tsv's val column (6 significant digits) says the same.
    last = (trained / "progress.tsv").read_text().splitlines()[-1].split("\t")
    assert float(last[4]) == pytest.approx(rows[-1]["val_bpb"], rel=1e-6)
    assert snapshot_name(96) in stdout and f"{rows[-1]['val_bpb']:.4f}" in stdout


def test_defaults_score_the_whole_text_the_same_way_every_time(trained, corpus, capsys, tmp_path):
    ck = trained / snapshot_name(64)
    a, b = tmp_path / "a.json", tmp_path / "b.tsv"
    assert _eval(capsys, ck, "--data", corpus / "val.txt", "--out", a)[0] == 0
    assert _eval(capsys, ck, "--data", corpus / "val.txt", "--out", b)[0] == 0
    size = ByteCorpus(str(corpus / "val.txt")).size
    (row,) = _rows(a)
    assert row["bytes_scored"] == size // 64 * 64  # 64 streams (the trainer's default)
    header, line = b.read_text().splitlines()
    tsv = dict(zip(header.split("\t"), line.split("\t"), strict=True))
    assert float(tsv["val_bpb"]) == row["val_bpb"]  # deterministic, printed in full
    assert json.loads(a.read_text())["val_streams"] == 64


def test_score_reports_the_length_ce_inside_the_loss(corpus):
    """loss = byte CE (nats) + length CE + a persistence term >= 0; the bar hears every
    byte scored; the trainer's mode is handed back."""
    cfg = ModelConfig(n_modes=8, jl_dim=16, mlp_hidden=32, atom_dim=8, episode_length=64)
    model = ReferenceModel(cfg)
    heard: list[int] = []
    s = score_text(
        model, ByteCorpus(str(corpus / "val.txt")), streams=4, n_bytes=600, K=16,
        device=torch.device("cpu"), recurrence="fused", progress=heard.append,
    )  # fmt: skip
    assert sum(heard) == s.bytes_scored == 600
    assert s.len_ce > 0
    assert s.loss >= s.val_bpb * math.log(2) + s.len_ce - 1e-5
    assert model.training


def _corrupt_payload(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # a tensor byte: the header still reads, the checksum does not verify
    path.write_bytes(bytes(data))


def test_a_folder_skips_damaged_checkpoints_with_a_warning(trained, corpus, capsys, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(trained, folder)
    _corrupt_payload(folder / snapshot_name(32))
    (folder / snapshot_name(64)).write_bytes(b"\x00" * 5)  # truncated: no header at all
    out = tmp_path / "rows.json"
    code, _, err = _eval(capsys, folder, "--data", corpus / "val.txt", *VAL, "--out", out)
    assert code == 0
    assert [r["tick"] for r in _rows(out)] == [96]
    assert err.count("warning: skipping checkpoint") == 2


def _foreign_features(src: Path, dst: Path) -> Path:
    ck = load_checkpoint(src)
    meta = json.loads(json.dumps(ck.meta))
    meta["provenance"]["feature_version"] = 99
    meta["model_config"]["feature_version"] = 99
    return save_checkpoint(dst, ck.tensors, meta)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "no such checkpoint file or run folder"),
        ("corrupt", "checksum mismatch"),
        ("truncated", "truncated or corrupt"),
        ("features", "features version 99"),
        ("empty folder", "holds no valid checkpoint"),
        ("empty text", "the corpus is empty"),
        ("short text", "cannot feed --val-streams 64"),
        ("bad out", "use a .json or .tsv file name"),
    ],
)
def test_bad_targets_are_one_line_and_exit_2(trained, corpus, capsys, tmp_path, case, message):
    target, data, extra = tmp_path / "ck.safetensors", corpus / "val.txt", []
    if case == "corrupt":
        shutil.copy(trained / FINAL, target)
        _corrupt_payload(target)
    elif case == "truncated":
        target.write_bytes((trained / FINAL).read_bytes()[:100])
    elif case == "features":
        _foreign_features(trained / FINAL, target)
    elif case == "empty folder":
        target = tmp_path
    elif case == "empty text":
        target, data = trained, tmp_path / "empty.txt"
        data.write_bytes(b"")
    elif case == "short text":
        target, data = trained, tmp_path / "short.txt"
        data.write_bytes(b"Bonjour")
    elif case == "bad out":
        target, extra = trained, ["--out", tmp_path / "rows.csv"]
    code, _, err = _eval(capsys, target, "--data", data, *extra)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err, err


def test_a_fork_is_drawn_from_its_source_point(trained, corpus, capsys, tmp_path):
    fork = tmp_path / "fork"
    src = trained / snapshot_name(64)
    assert run(corpus, fork, 96, "--fork", str(src), "--lr", "5e-3", "--snapshot-every", "32") == 0
    out, png = tmp_path / "rows.json", tmp_path / "scaling.png"
    code, _, _ = _eval(capsys, trained, fork, "--data", corpus / "val.txt", *VAL, "--out", out)
    assert code == 0
    rows = [atom_eval.Row(**{k: v for k, v in r.items() if k != "bytes_per_s"}) for r in _rows(out)]
    # Runs are named by their folders, as the plot names them.
    assert [r.run for r in rows] == ["run"] * 3 + ["fork"]
    fig = atom_eval.figure(rows, "t")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert list(lines["fork"].get_xdata()) == [96 * 4]
    (joint,) = [line for line in fig.axes[0].get_lines() if line.get_gid() == "fork"]
    source = next(r for r in rows if r.run == "run" and r.tick == 64)
    assert tuple(joint.get_xydata()[0]) == (64 * 4, source.val_bpb)
    assert atom_eval.main([str(fork), "--data", str(corpus / "val.txt"), "--plot", str(png)]) == 0
    assert png.stat().st_size > 1000


def test_cuda_is_refused_in_one_line_without_a_gpu(trained, corpus, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code, _, err = _eval(capsys, trained, "--data", corpus / "val.txt", "--device", "cuda")
    assert code == 2 and "--device cuda" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cpu_trained_checkpoint_scores_on_cuda_as_on_the_cpu(trained, corpus, capsys, tmp_path):
    cpu, gpu = tmp_path / "cpu.json", tmp_path / "gpu.json"
    data = ["--data", corpus / "val.txt", *VAL]
    assert _eval(capsys, trained / FINAL, *data, "--out", cpu)[0] == 0
    assert _eval(capsys, trained / FINAL, *data, "--device", "cuda", "--out", gpu)[0] == 0
    (a,), (b,) = _rows(cpu), _rows(gpu)
    assert b["val_bpb"] == pytest.approx(a["val_bpb"], rel=1e-4)


def test_the_bench_times_scoring_beside_the_step():
    """`bench step --modes eval` runs (its figures are measured, not asserted: docs/eval.md)."""
    from atom_train.bench.step import measure_step

    r = measure_step(
        {"mode": "eval", "B": 4, "K": 8, "n_modes": 8, "seconds": 0.2, "intervals": 1,
         "corpus_mb": 1}
    )  # fmt: skip
    assert r["recurrence"] == "native"
    # What is known of the figure: each timed call scores 12 windows of K x B bytes, so the
    # rate is 12 * 8 * 4 bytes a call over the measured time.
    assert r["calls"] >= 1
    assert r["bytes_per_s"] == pytest.approx(r["calls"] * 12 * 8 * 4 / r["measured_s"], rel=1e-9)


def test_all_of_a_text_asked_for_is_advised_and_noted_as_what_is_scored(trained, corpus, capsys):
    """--val-bytes SIZE with streams that do not divide SIZE: whole ticks of every stream are
    scored, so the header does not advise the --val-bytes already given, and the header, the
    row and the closing note name the same bytes scored."""
    size = ByteCorpus(str(corpus / "val.txt")).size
    streams = next(s for s in range(7, 64) if size % s)
    scored = size // streams * streams
    code, stdout, err = _eval(capsys, trained / snapshot_name(64), "--data", corpus / "val.txt",
                              "--val-bytes", size, "--val-streams", streams)  # fmt: skip
    assert code == 0
    assert "to score all of it" not in err
    assert f"val: {scored:,} bytes of {corpus / 'val.txt'} (" in err
    assert f"its last {size - scored:,} bytes are left out" in err
    assert f"scored here: {scored:,} bytes of" in stdout + err  # (the note: the run's val differs)
    assert f"{scored:,}" in stdout
