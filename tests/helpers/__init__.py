"""What the tests share: the repository's paths, the trainer kit (a tiny corpus and config,
running the trainer in process or as a user would), torch's precision flags, a fake trainer
for the supervisor's tests and fake programs (fakebin/) for the set-up scripts' tests."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
FAKEBIN = Path(__file__).resolve().parent / "fakebin"
