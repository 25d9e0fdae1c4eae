"""Reading what a matplotlib figure draws, as a person looks at it: the tick labels inside an
axis's view, and whether a legend's box sits on a drawn line (each segment sampled densely in
pixels, independently of `common.figures.covers_data`)."""

from __future__ import annotations

import itertools

import numpy as np


def tick_labels(ax, which: str = "y") -> list[tuple[float, str]]:
    """(position, text) of every labelled tick, major and minor, inside the axis's view."""
    fig = ax.figure
    fig.canvas.draw()
    axis = getattr(ax, f"{which}axis")
    lo, hi = sorted(axis.get_view_interval())
    out = []
    for minor in (False, True):
        for tick in axis.get_major_ticks() if not minor else axis.get_minor_ticks():
            pos, text = tick.get_loc(), tick.label1.get_text()
            if text and lo <= pos <= hi:
                out.append((float(pos), text))
    return sorted(out)


def legend_on_a_line(ax) -> list[str]:
    """The labels of `ax`'s lines that have a point inside its legend's box (its segments
    sampled every pixel or closer)."""
    fig = ax.figure
    fig.canvas.draw()
    box = ax.get_legend().get_window_extent(fig.canvas.get_renderer())
    hit = []
    for line in ax.get_lines():
        xy = line.get_transform().transform(line.get_xydata())
        xy = xy[np.isfinite(xy).all(axis=1)]
        pts = [xy]
        for a, b in itertools.pairwise(xy):
            n = int(np.hypot(*(b - a))) + 2
            pts.append(a + np.linspace(0, 1, n)[:, None] * (b - a))
        pts = np.concatenate(pts)
        inside = (
            (pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1)
            & (pts[:, 1] >= box.y0) & (pts[:, 1] <= box.y1)
        )  # fmt: skip
        if inside.any():
            hit.append(line.get_label())
    return hit


def outside_right(ax) -> bool:
    """Whether `ax`'s legend lies beside the axes, to their right."""
    fig = ax.figure
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    return ax.get_legend().get_window_extent(r).x0 >= ax.get_window_extent(r).x1
