"""The names of the numbers a run reports: one name per metric, the same key in every place it
appears (loss.jsonl, progress.tsv, status.json, TensorBoard, the bench's JSON, the printed
lines). Standard library only.

A name is snake_case and carries its unit as a suffix: ``_s`` seconds, ``_pct`` percent
(0-100), ``_mb`` MiB, ``_bpb`` bits per byte, ``_per_s`` per second. A TensorBoard tag is
``<group>/<name>`` (`tag`). Writers write only these names; readers of files written before
the names were settled also accept the old ones (`OLD_NAMES`, `current_name`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    group: str | None  # TensorBoard's group (train, val, speed, time, memory, noise); None: an axis
    what: str


_M = Metric
METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        _M("tick", None, "ticks since the run began (one byte per stream per tick)"),
        _M("step", None, "optimizer steps since the run began"),
        _M("bytes_seen", None, "bytes read by all streams: tick x B (the step axis of plots)"),
        _M("loss", "train", "the training objective, nats"),
        _M("train_bpb", "train", "byte cross-entropy of training, bits/byte"),
        _M("val_bpb", "val", "byte cross-entropy on the held-out val, bits/byte"),
        _M("grad_norm", "train", "gradient norm before clipping"),
        _M("lr", "train", "learning rate"),
        _M("leak", "train", "mean leak of the field modes"),
        _M("bytes_per_s", "speed", "training throughput (boundary work left out)"),
        _M("bytes_per_s_run", "speed", "throughput since the launch began, all included"),
        _M("loader_wait_pct", "time", "share of wall time the step waited for the loader (CPU)"),
        _M("gpu_wait_pct", "time", "share of wall time the step waited for the GPU (CUDA)"),
        _M("loader_busy_pct", "time", "share of wall time the loader thread worked"),
        _M("elapsed_s", "time", "training wall time of the run, all launches"),
        _M("eta_s", "time", "estimated time to the last tick, at the launch's rate"),
        _M("compute_s", "time", "forward + backward"),
        _M("allreduce_s", "time", "the gradients' all-reduce across ranks (torchrun)"),
        _M("optimizer_s", "time", "clipping, AdamW"),
        _M("boundary_s", "time", "validation + samples + checkpoint writes"),
        _M("val_s", "time", "validation"),
        _M("sample_s", "time", "chat samples"),
        _M("ckpt_s", "time", "checkpoint writes"),
        _M("peak_rss_mb", "memory", "the process's peak resident memory"),
        _M("peak_device_mb", "memory", "CUDA: torch's peak allocation"),
        _M("grad_sq", "noise", "|G|^2, the true gradient's squared norm (moving average)"),
        _M("trace_cov", "noise", "tr(Σ), one stream's gradient covariance (moving average)"),
        _M("b_simple", "noise", "the gradient noise scale tr(Σ) / |G|^2, in streams"),
        _M("b_simple_bytes", "noise", "the noise scale in bytes per step: b_simple x K"),
        _M("grad_sq_small", None, "a measurement's |G_small|^2, over streams_small streams"),
        _M("streams_small", None, "the streams of a measurement's small gradient"),
        _M("grad_sq_big", None, "a measurement's |G_big|^2, over all B streams"),
    )
}

# Names written before the vocabulary was settled -> the name now (readers accept both).
OLD_NAMES: dict[str, str] = {
    "bpb": "train_bpb",  # loss.jsonl's step lines and the bar
    "byte_ce_bpb": "train_bpb",  # progress.tsv and TensorBoard
    "val_ce_bpb": "val_bpb",  # progress.tsv, status.json, checkpoints, loss.jsonl's val event
    "gnorm": "grad_norm",  # loss.jsonl
    "bytes": "bytes_seen",  # loss.jsonl's step lines
}
# TensorBoard tags written before (a run converted again gets the new ones).
OLD_TAGS: dict[str, str] = {
    "train/byte_ce_bpb": "train/train_bpb",
    "val/byte_ce_bpb": "val/val_bpb",
}


def current_name(name: str) -> str:
    """The name a metric has now (an old name's replacement; any other name as it is)."""
    return OLD_NAMES.get(name, name)


def renamed(record: dict) -> dict:
    """A record (a log line, a row) with its old metric names replaced by the current ones;
    a current name already present wins."""
    out = dict(record)
    for old, new in OLD_NAMES.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    return out


def tag(name: str) -> str:
    """The TensorBoard tag of a metric: ``<group>/<name>``."""
    group = METRICS[name].group
    if group is None:
        raise ValueError(f"{name} is an axis, not a TensorBoard scalar")
    return f"{group}/{name}"
