"""`--tensorboard`: a run killed and resumed (with a pivot) leaves event files whose scalars
have one value per step, equal to progress.tsv's rows, read back with TensorBoard's own
reader; `plot --tensorboard` converts the same run into the same scalars; without the
package the flag is one line."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from helpers.trainer_kit import run, spawn

from atom_train import plot, train
from atom_train.common.cli import UserError
from atom_train.trainer import loss_log, run_logs, tensorboard_log
from atom_train.trainer.tensorboard_log import TAGS

B = 4  # trainer_kit.TINY's streams: the step axis is ticks x 4


def _read(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()  # (what TensorBoard shows: restart markers drop what they replace)
    return ea


def _scalars(ea) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def _texts(ea, tag: str) -> list[tuple[int, str]]:
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in ea.Tensors(tag)]


@pytest.fixture(scope="module")
def killed_and_resumed(corpus, tmp_path_factory) -> Path:
    """Killed (SIGKILL) at tick 96, after rows up to 80 and a checkpoint at 64; resumed with
    another --lr (a pivot) to tick 128: the rows at 80 and after are written twice."""
    pytest.importorskip("tensorboard")
    out = tmp_path_factory.mktemp("tb") / "run"
    extra = ["--tensorboard", "--ckpt-every", "32", "--sample-every", "64"]
    extra += ["--noise-scale-every", "1"]  # (the noise/ tags: rows at every tick from 32)
    crash = {"ATOM_TEST_CRASH_AT_TICK": "96", "ATOM_TEST_CRASH_SIGNAL": "KILL"}
    proc = spawn(corpus, out, 128, *extra, env=crash)
    proc.communicate(timeout=120)
    assert proc.returncode == -9
    assert run(corpus, out, 128, *extra, "--lr", "1e-3") == 0
    return out


def test_each_step_once_with_progress_tsv_values(killed_and_resumed):
    out = killed_and_resumed
    progress = run_logs.read_progress(out / "progress.tsv")  # the last row for a tick wins
    assert progress.columns["tick"] == [float(t) for t in range(16, 129, 16)]
    ea = _read(out / tensorboard_log.TB_DIR)
    scalars = _scalars(ea)
    for column, tag in TAGS.items():
        want = [(round(x), v) for x, v in progress.points(column)]
        got = scalars.get(tag, [])
        assert [s for s, _ in got] == [s for s, _ in want], tag  # unique, the same steps
        for (_, a), (_, b) in zip(got, want, strict=True):
            # TensorBoard keeps float32, progress.tsv 6 significant digits (5e-6 relative).
            assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-12), (tag, a, b)
    # The gradient norm: a progress.tsv column under the same name, train/grad_norm; each row
    # (one step here: K = --log-every = 16) holds its step's norm as loss.jsonl logged it.
    norms = loss_log.read_grad_norms(out / "loss.jsonl", range(16, 129, 16))
    got = scalars[TAGS["grad_norm"]]
    assert TAGS["grad_norm"] == "train/grad_norm"
    assert [s for s, _ in got] == [t * B for t in range(16, 129, 16)]
    for step, value in got:
        assert math.isclose(value, norms[step // B], rel_tol=1e-5)
    assert [s for s, _ in _texts(ea, "samples/text_summary")] == [64 * B, 128 * B]
    ((step, text),) = _texts(ea, "lifecycle/pivot/text_summary")
    assert step == 64 * B and "lr 0.002 -> 0.001" in text


def test_plot_converts_a_run_into_the_same_scalars(killed_and_resumed, tmp_path, capsys):
    out = killed_and_resumed
    assert plot.main([str(out), "--tensorboard", str(tmp_path)]) == 0
    assert f"wrote {tmp_path / out.name}" in capsys.readouterr().out
    live, converted = _read(out / tensorboard_log.TB_DIR), _read(tmp_path / out.name)
    a, b = _scalars(live), _scalars(converted)
    assert set(a) == set(b)
    for tag in a:
        assert [s for s, _ in a[tag]] == [s for s, _ in b[tag]], tag
        for (_, x), (_, y) in zip(a[tag], b[tag], strict=True):
            assert math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-12), (tag, x, y)
    assert _texts(converted, "lifecycle/pivot/text_summary") == _texts(
        live, "lifecycle/pivot/text_summary"
    )
    # Converting again replaces, never doubles.
    assert plot.main([str(out), "--tensorboard", str(tmp_path)]) == 0
    assert _scalars(_read(tmp_path / out.name)).keys() == b.keys()
    assert len(_scalars(_read(tmp_path / out.name))["train/loss"]) == len(b["train/loss"])


def test_the_flag_without_the_package_is_one_line(corpus, tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else real(name, *a),
    )
    code = train.main(
        ["--data", str(corpus / "train-*.txt"), "--total-ticks", "16", "--tensorboard",
         "--output-dir", str(tmp_path / "run")]
    )  # fmt: skip
    assert code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    want = f"[train] error: --tensorboard needs the tensorboard package: {tensorboard_log.INSTALL}"
    assert err == [want]
    assert not (tmp_path / "run").exists()  # (the folder made for the lock went again)
    with pytest.raises(UserError, match="--tensorboard needs the tensorboard package"):
        plot.convert([], tmp_path / "tb")


def test_the_default_folder_is_the_runs_tb(tmp_path):
    pytest.importorskip("tensorboard")
    assert tensorboard_log.log_dir(None, tmp_path) is None
    assert tensorboard_log.log_dir(tensorboard_log.IN_RUN, tmp_path) == tmp_path / "tb"
    assert tensorboard_log.log_dir("elsewhere", tmp_path) == Path("elsewhere")
    assert tensorboard_log.purge_step("new", 0, 4) == 0
    assert tensorboard_log.purge_step("resume", 64, 4) == 257


def test_a_launch_writes_its_events_after_the_previous_launchs_file(tmp_path):
    """TensorBoard reads event files in name order, names begin with the second the writer
    was made, and a quick relaunch (pid order breaks ties) could sort before the crashed
    launch it continues: a new writer waits until the clock is past the newest file's second."""
    import time

    now = int(time.time())
    (tmp_path / f"events.out.tfevents.{now}.host.99999.0").write_bytes(b"")
    tensorboard_log._after_the_newest_event_file(tmp_path)
    assert time.time() >= now + 1


def test_an_empty_value_turns_it_off_on_a_resume(corpus, tmp_path, monkeypatch, capsys):
    """--tensorboard '' on a resume of a run that had it: said, and no event file is written,
    neither in the run's tb/ nor in the current folder (where SummaryWriter('') would put
    one)."""
    pytest.importorskip("tensorboard")
    out, here = tmp_path / "run", tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    assert run(corpus, out, 32, "--tensorboard") == 0
    files = sorted((out / "tb").iterdir())
    assert len(files) == 1
    capsys.readouterr()
    assert run(corpus, out, 64, "--tensorboard", "") == 0
    assert "tensorboard RUN/tb -> (none)" in capsys.readouterr().err
    assert sorted((out / "tb").iterdir()) == files and not any(here.iterdir())


def test_an_init_runs_tick_0_val_is_plotted_and_converted(corpus, tmp_path, capsys):
    """An --init run validates its weights at tick 0, before any progress row (a `val`
    event in events.jsonl and loss.jsonl): the plot draws it as the first val_bpb point,
    and `plot --tensorboard` converts it as the live run's TensorBoard has it, at step 0."""
    pytest.importorskip("tensorboard")
    src, out = tmp_path / "src", tmp_path / "init"
    assert run(corpus, src, 16) == 0
    val = ["--val", str(corpus / "val.txt"), "--val-every", "16", "--val-bytes", "1024"]
    assert run(corpus, out, 32, "--init", str(src / "ckpt-final.safetensors"), *val,
               "--tensorboard") == 0  # fmt: skip
    (event,) = [e for e in loss_log.read_events(out) if e["event"] == "val"]
    assert event["tick"] == 0
    logged = run_logs.read_progress(out / "progress.tsv").points("val_bpb")
    assert [x for x, _ in logged] == [16 * B, 32 * B]  # (no row at tick 0 in the file)

    r = run_logs.read_run(out)
    fig = plot.figure([r], "init")
    (line,) = [x for x in fig.axes[1].get_lines() if x.get_label() == "val_bpb"]
    assert [tuple(p) for p in line.get_xydata()] == [(0, event["val_bpb"]), *logged]
    assert plot.summary(r).startswith("init: 2 rows; ")  # (the rows of the file)

    capsys.readouterr()
    assert plot.main([str(out), "--tensorboard", str(tmp_path / "tb")]) == 0
    live = _scalars(_read(out / tensorboard_log.TB_DIR))["val/val_bpb"]
    converted = _scalars(_read(tmp_path / "tb" / out.name))["val/val_bpb"]
    assert [s for s, _ in converted] == [s for s, _ in live] == [0, 16 * B, 32 * B]
    for (_, a), (_, b) in zip(live, converted, strict=True):
        assert math.isclose(a, b, rel_tol=1e-5)  # (float32; progress.tsv's 6 digits)
