"""Where every document goes: pure functions of the content hashes and sizes.

The rules, stated once:

- Order: documents are sorted by their content hash (bytewise). The order is a fixed
  shuffle that mixes sources in every shard and depends on nothing but the texts: not on
  the input order, the file grouping or the machine.
- De-duplication: of documents with the same hash only the first (in input order) stays;
  all copies have the same bytes, so which one stays does not change the output.
- Val: documents are taken in hash order, skipping any larger than a quarter of the target
  (so val spans several documents), until val holds the target; if none was small enough,
  the first document is val alone, when it is at most half of the text. Val is therefore
  "the documents whose hashes are smallest": adding documents to a corpus never moves a
  train document into val.
- Train: the other documents in hash order, up to an optional cap (a prefix: the first
  document that would pass the cap ends train).
- Shards: train documents in order fill a shard until the next one would take it past the
  budget; a document larger than the budget is a shard of its own. No document is split.

Sizes include the seam written after each document.
"""

from __future__ import annotations

import numpy as np

from atom_train.common.cli import UserError


def hash_order(h0: np.ndarray, h1: np.ndarray) -> np.ndarray:
    """Indices that sort the records by hash; a stable sort, so equal hashes keep their
    input order."""
    return np.lexsort((h1, h0))


def first_of_each_hash(h0: np.ndarray, h1: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Mask over `order`: True for the first record of each distinct hash."""
    keep = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        a0, a1 = h0[order], h1[order]
        keep[1:] = (a0[1:] != a0[:-1]) | (a1[1:] != a1[:-1])
    return keep


def val_target(total: int, val_bytes: int | None, val_fraction: float | None) -> int:
    """Bytes of val asked for (0: no val). More than half of the text is refused."""
    target = int(val_bytes) if val_bytes is not None else round((val_fraction or 0.0) * total)
    if target > total // 2:
        asked = (
            f"--val-bytes {val_bytes:,}"
            if val_bytes is not None
            else f"--val-fraction {val_fraction}"
        )
        raise UserError(
            f"{asked} asks for {target:,} bytes of val, more than half of the {total:,} bytes "
            "of text kept: lower it"
        )
    return target


def choose_val(sizes: np.ndarray, target: int) -> np.ndarray:
    """Mask of val documents among `sizes` (in hash order); see the module for the rule."""
    val = np.zeros(len(sizes), dtype=bool)
    if target <= 0 or len(sizes) == 0:
        return val
    small = sizes <= max(target // 4, 1)
    taken = np.where(small, sizes, 0)
    before = np.cumsum(taken) - taken  # val bytes before each small document
    val = small & (before < target)
    if not val.any() and sizes[0] <= int(sizes.sum()) // 2:
        val[0] = True
    return val


def cap_prefix(sizes: np.ndarray, cap: int | None) -> int:
    """How many leading documents fit under `cap` bytes (all of them when cap is None)."""
    if cap is None:
        return len(sizes)
    return int(np.searchsorted(np.cumsum(sizes), cap, side="right"))


def shard_ranges(sizes: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """[start, end) document ranges of the train shards (see the module for the rule)."""
    ends = np.cumsum(sizes)
    ranges = []
    start, n = 0, len(sizes)
    while start < n:
        base = int(ends[start - 1]) if start else 0
        end = int(np.searchsorted(ends, base + budget, side="right"))
        end = max(end, start + 1)  # larger than the budget: alone
        ranges.append((start, end))
        start = end
    return ranges


def shard_names(n: int) -> list[str]:
    """train-000.txt, train-001.txt, ...: zero-padded so that name order is shard order
    (the loader sorts shard paths), wider only past 1,000 shards."""
    width = max(3, len(str(n - 1)))
    return [f"train-{i:0{width}d}.txt" for i in range(n)]
