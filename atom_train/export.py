"""Export a checkpoint to the raw weights + AdamW layout (``atom.raw-adamw``, version 1):
``python -m atom_train.export CKPT OUT.bin``.

Layout (little-endian; docs/design.md#the-export-format), for tools that read raw weights::

    [int32 step][int32 n_params][n_params x f32 weights][n_params x f32 m][n_params x f32 v]

``step`` is the optimizer step count; ``m`` and ``v`` are AdamW's first and second moments.
The parameters are flattened (row-major) and concatenated in the model's
``named_parameters()`` order, which the checkpoint records (``optimizer.param_names``); a JSON
sidecar ``OUT.bin.json`` lists each name, shape and offset. Frozen buffers (the JL matrix
``R`` and the readout ``W0``) are not parameters and are not in the file: they are regenerated
from the model config's ``jl_seed``, which the sidecar carries.

Examples::

    python -m atom_train.export runs/fr/ckpt-final.safetensors runs/fr/final.bin
    python -m atom_train.export runs/fr/ --out runs/fr/latest.bin   # newest valid checkpoint
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from pathlib import Path

import numpy as np

from atom_train.common.atomic import atomic_write, atomic_write_json
from atom_train.common.cli import ArgumentParser, UserError, set_command, user_error_exit, warn
from atom_train.trainer.checkpoint_file import Checkpoint, CheckpointError
from atom_train.trainer.train_state import MODEL, open_checkpoint, optimizer_moments, param_names

# The sidecar's name for the layout below (flat weights, m and v; sidecars
# written before it had a name of its own said "seed001-raw").
RAW_FORMAT = "atom.raw-adamw"
RAW_FORMAT_VERSION = 1


def export_raw(c: Checkpoint, out: Path) -> dict:
    """Write the raw file (atomically) and its sidecar; return the sidecar's content."""
    weights = c.group(MODEL)
    moments = optimizer_moments(c)
    parts_w, parts_m, parts_v, layout = [], [], [], []
    offset = 0
    step = 0
    for name in param_names(c):
        if name not in moments:
            raise CheckpointError(f"{c.path}: no AdamW state for {name}")
        w = weights[name].float().numpy().ravel()
        parts_w.append(w)
        parts_m.append(moments[name]["exp_avg"].float().numpy().ravel())
        parts_v.append(moments[name]["exp_avg_sq"].float().numpy().ravel())
        step = max(step, int(moments[name]["step"]))
        layout.append({"name": name, "shape": list(weights[name].shape), "offset": offset})
        offset += w.size
    n_params = offset
    if n_params >= 2**31 or step >= 2**31:
        raise CheckpointError("too large for the raw format's int32 header")
    header = struct.pack("<ii", step, n_params)
    body = [np.concatenate(p).astype("<f4").tobytes() for p in (parts_w, parts_m, parts_v)]
    atomic_write(out, header + b"".join(body))
    sidecar = {
        "format": RAW_FORMAT,
        "format_version": RAW_FORMAT_VERSION,
        "source": str(c.path),
        "step": step,
        "n_params": n_params,
        "bytes": 8 + 12 * n_params,
        "params": layout,
        "model_config": c.meta["model_config"],
        "provenance": c.meta.get("provenance"),
    }
    atomic_write_json(out.with_name(out.name + ".json"), sidecar)
    return sidecar


def read_raw(path: str | os.PathLike) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """Read a raw file back: (step, weights, m, v)."""
    data = Path(path).read_bytes()
    step, n = struct.unpack("<ii", data[:8])
    if len(data) != 8 + 12 * n:
        raise ValueError(f"{path}: {len(data)} bytes, expected {8 + 12 * n} for {n} params")
    arr = np.frombuffer(data, dtype="<f4", offset=8)
    return step, arr[:n], arr[n : 2 * n], arr[2 * n :]


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m atom_train.export",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    p.add_argument("checkpoint", help="a checkpoint file, or a run folder (its newest)")
    p.add_argument("out", nargs="?", help="output .bin (default: next to the checkpoint)")
    p.add_argument("--out", dest="out_flag", metavar="FILE", help="same as the positional OUT")
    return p


def main(argv: list[str] | None = None) -> int:
    set_command("export")
    out = None
    try:
        a = build_parser().parse_args(argv)
        c = open_checkpoint(a.checkpoint, warn=warn)
        out = Path(a.out_flag or a.out or c.path.with_suffix(".bin"))
        if not out.parent.is_dir():
            raise CheckpointError(
                f"cannot write {out}: the folder {out.parent} does not exist (create it, or "
                "choose another OUT)"
            )
        side = export_raw(c, out)
    except (CheckpointError, UserError) as e:
        return user_error_exit(e)
    except OSError as e:  # (the message of the atomic write names its temp file: not useful)
        return user_error_exit(f"cannot write {out}: {e.strerror or e}")
    print(
        f"wrote {out} ({side['bytes']:,} bytes: step {side['step']}, {side['n_params']:,} "
        f"params) and {out.name}.json"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
