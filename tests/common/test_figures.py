"""The figures' shared helper (`atom_train.common.figures`): a log axis over few decades reads
plain numbers (no 2×10^0), ticks sit at the values asked for, and `finish` leaves no legend
on a line: moved to the best place inside, or beside the axes when none inside is free."""

from __future__ import annotations

import re

import pytest
from helpers.figure_reading import legend_on_a_line, outside_right, tick_labels

from atom_train.common import figures

plt = figures.pyplot()
PLAIN = re.compile(r"^\d+(\.\d+)?[kMGT]?$")  # 2, 60, 0.002, 1.5k


def _value(text: str) -> float:
    scale = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    return float(text[:-1]) * scale[text[-1]] if text[-1] in scale else float(text)


@pytest.mark.parametrize(("lo", "hi"), [(2, 60), (20, 60), (150, 9e4), (2e4, 3e7), (0.002, 0.3)])
def test_a_log_axis_over_few_decades_reads_plain_numbers(lo, hi):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [lo, hi])
    figures.log_scale(ax, "y")
    labels = tick_labels(ax, "y")
    assert len(labels) >= 2, labels
    for pos, text in labels:
        # Each label a plain number, and the number of its tick (2 significant digits).
        assert PLAIN.match(text), labels
        assert _value(text) == pytest.approx(pos, rel=0.01)
    plt.close(fig)


def test_a_log_axis_over_many_decades_labels_its_decades_as_powers_of_ten():
    fig, ax = plt.subplots()
    ax.plot([1e-5, 1], [0, 1])
    figures.log_scale(ax, "x")
    labels = [text for _, text in tick_labels(ax, "x")]
    assert labels == [f"$\\mathdefault{{10^{{{k}}}}}$" for k in range(-5, 1)]
    plt.close(fig)


def test_ticks_at_the_values_asked_for_and_no_others():
    fig, ax = plt.subplots()
    ax.plot([24, 96, 384, 65536], [1, 2, 3, 4])
    figures.log_scale(ax, "x")
    figures.ticks_at(ax, "x", [384, 24, 96, 96, 65536])
    assert tick_labels(ax, "x") == [(24, "24"), (96, "96"), (384, "384"), (65536, "65,536")]
    plt.close(fig)


def test_finish_moves_a_legend_off_the_lines_it_covers():
    # A reference line along the top and a curve rising under it: "upper left" sits on it.
    fig, ax = plt.subplots()
    ax.plot(range(10), [1 + x for x in range(10)], label="rising")
    ax.axhline(11.5, ls="--", label="reference")
    ax.set_ylim(0, 12)
    ax.legend(loc="upper left")
    assert legend_on_a_line(ax) == ["reference"]  # (the figure as drawn before)
    figures.finish(fig)
    assert legend_on_a_line(ax) == [] and not outside_right(ax)
    plt.close(fig)

    # Lines over the whole axes: no place inside is free, so the legend goes beside them.
    fig, ax = plt.subplots()
    for y in range(40):
        ax.plot([0, 1], [y, y], label="level" if y == 0 else "_")
    ax.legend(loc="upper right")
    figures.finish(fig)
    assert legend_on_a_line(ax) == [] and outside_right(ax)
    assert fig.get_window_extent().x1 >= ax.get_legend().get_window_extent().x1  # in the file
    plt.close(fig)

    # A legend that covers nothing stays where its figure put it.
    fig, ax = plt.subplots()
    ax.plot(range(10), [9 - x for x in range(10)], label="falling")
    ax.legend(loc="upper right")
    figures.finish(fig)
    assert ax.get_legend()._loc == 1  # (matplotlib's code for "upper right")
    plt.close(fig)
