"""Figures as files: matplotlib without a display, written atomically. matplotlib is
imported only when a figure is drawn, so the commands that import this stay light.
"""

from __future__ import annotations

import io
from pathlib import Path

from atom_train.common.atomic import atomic_write


def si(x: float, _pos: object = None) -> str:
    """A number with an SI suffix (1.5M, 20k): axis labels and summaries."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), imported only when drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out: Path) -> None:
    """Render `fig` in memory, then replace `out` atomically (a viewer never sees half a
    file); the figure is closed."""
    plt = pyplot()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=110, format=out.suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)
    atomic_write(out, buf.getvalue())
