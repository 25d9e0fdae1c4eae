"""What the tests share: the repository's paths, the trainer kit (a tiny corpus and config,
running the trainer in process or as a user would), torch's precision flags, a fake trainer
for the supervisor's tests, fake programs (fakebin/) for the set-up scripts' tests, and
reading what a figure draws (figure_reading: tick labels, a legend over a line)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
FAKEBIN = Path(__file__).resolve().parent / "fakebin"
