"""Figures as files: matplotlib without a display, written atomically. matplotlib is
imported only when a figure is drawn, so the commands that import this stay light.

What every figure shares lives here, once: numbers for people (`si`), log axes read in
plain numbers where they span few decades (`log_scale`), ticks at the values a figure
measured (`ticks_at`), and the last step of every figure (`finish`): its layout, and no
legend over a line.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Iterable
from pathlib import Path

from atom_train.common.atomic import atomic_write

# A log axis spanning fewer decades than this reads plain numbers (2, 60, 1.5k); a wider one
# labels only its decades, as powers of ten (10^-4): plain, 0.0001 and 1e-05 read worse.
PLAIN_DECADES = 4


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


# ---- axes ------------------------------------------------------------------------------------


@functools.cache
def _plain_log_formatter():
    from matplotlib.ticker import LogFormatterSciNotation

    class PlainLog(LogFormatterSciNotation):
        """matplotlib's own choice of which log ticks to label (every decade; on a short
        range some ticks between them too), each label a plain number (`si`) where the axis
        spans fewer than PLAIN_DECADES decades, as 2×10^0 ... 6×10^1 read badly."""

        def __call__(self, x, pos=None):
            text = super().__call__(x, pos)
            lo, hi = sorted(self.axis.get_view_interval())
            if not text or lo <= 0 or math.log10(hi / lo) >= PLAIN_DECADES:
                return text
            return si(x)

    return PlainLog


def log_scale(ax, which: str = "y") -> None:
    """`ax`'s x or y axis on a log scale, its labels plain numbers where it spans few decades
    (`PLAIN_DECADES`), major and minor alike."""
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    plain = _plain_log_formatter()
    axis.set_major_formatter(plain(10))
    axis.set_minor_formatter(plain(10, labelOnlyBase=False))


def ticks_at(ax, which: str, values: Iterable[float]) -> None:
    """`ax`'s x or y ticks exactly at `values` (what the figure measured: every B a bench
    ran), each labelled with its number (65,536), and no others."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    axis = getattr(ax, f"{which}axis")
    axis.set_major_locator(FixedLocator(sorted(set(values))))
    axis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:,g}"))
    axis.set_minor_locator(NullLocator())


# ---- the layout ------------------------------------------------------------------------------


def finish(fig):
    """The last step of every figure: a tight layout, then each legend that covers a line
    (or a shaded band) of its axes is moved to matplotlib's best place inside them, or, where
    every place inside covers one, beside them (to the right); returns `fig`."""
    fig.tight_layout()
    moved = False
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None or not covers_data(legend, ax):
            continue
        size = legend.get_texts()[0].get_fontsize() if legend.get_texts() else None
        legend = ax.legend(loc="best", fontsize=size)
        if covers_data(legend, ax):
            legend = ax.legend(
                loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, fontsize=size
            )
            moved = True
    if moved:
        fig.tight_layout()  # (room for the legends beside their axes)
    return fig


def covers_data(legend, ax, pad: float = 2.0) -> bool:
    """Whether `legend`'s box (widened by `pad` pixels: a marker's half) holds a point of one
    of `ax`'s lines or crosses one of its segments, or meets a filled area (an interval)."""
    from matplotlib.path import Path as MplPath

    renderer = ax.figure.canvas.get_renderer()
    box = legend.get_window_extent(renderer).padded(pad)
    for line in ax.get_lines():
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(line.get_xydata())
        xy = xy[[math.isfinite(x) and math.isfinite(y) for x, y in xy]]
        if len(xy) and (
            any(box.contains(x, y) for x, y in xy)
            or (len(xy) > 1 and MplPath(xy).intersects_bbox(box, filled=False))
        ):
            return True
    for coll in ax.collections:
        transform = coll.get_transform()
        for path in coll.get_paths():
            if transform.transform_path(path).intersects_bbox(box, filled=True):
                return True
    return False
