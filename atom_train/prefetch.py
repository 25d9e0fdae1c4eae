"""Prepare the next window of loader output while the model computes on the current one.

The Rust loader releases the GIL while it works, so a plain Python thread calling
``next_window(K, out=...)`` runs truly in parallel with the training step. Windows are written
into a small ring of caller-owned buffers (pinned host memory on CUDA, copied to the device
with ``non_blocking=True``); a buffer goes back to the ring only when the step that used it is
done with it (on CUDA: when its host-to-device copy has completed).

Each window carries the loader state *after* it, so a checkpoint written after training on a
window records exactly the bytes consumed, however far ahead the prefetcher has run.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from atom_train.data import FEATURE_IDS_PER_TICK, expand_ids

FEATURE_DIM = 320


@dataclass
class Window:
    tick0: int
    K: int
    feats: torch.Tensor  # float32 [K, B, 320] on the training device
    tgt: torch.Tensor  # int64 [K, B] on the training device
    cur: np.ndarray  # uint8 [K, B] (host)
    loader_state: dict  # the loader's state after this window
    _slot: int = -1
    _event: object = field(default=None, repr=False)


class _Slot:
    def __init__(self, K: int, B: int, compact: bool, pin: bool) -> None:
        width = (FEATURE_IDS_PER_TICK,) if compact else (FEATURE_DIM,)
        dtype = torch.int16 if compact else torch.float32
        self.cur = torch.empty((K, B), dtype=torch.uint8, pin_memory=pin)
        self.feats = torch.empty((K, B, *width), dtype=dtype, pin_memory=pin)
        self.tgt = torch.empty((K, B), dtype=torch.uint8, pin_memory=pin)
        self.event = None  # CUDA event recorded after the last copy out of this slot


class WindowPrefetcher:
    """Background producer of loader windows for ticks [start, total).

    cut(t) gives the tick at which the window starting at t ends (a pure function of t, so a
    resumed run cuts its windows exactly where an uninterrupted one would).
    """

    def __init__(
        self,
        stream,
        start: int,
        total: int,
        cut: Callable[[int], int],
        max_K: int,
        device: torch.device,
        compact: bool = False,
        n_slots: int = 2,
    ) -> None:
        self.stream = stream
        self.device = device
        self.compact = compact
        cuda = device.type == "cuda"
        self._slots = [_Slot(max_K, stream.B, compact, pin=cuda) for _ in range(n_slots)]
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(n_slots):
            self._free.put(i)
        self._ready: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._produce, args=(start, total, cut), name="atom-prefetch", daemon=True
        )
        self._thread.start()

    def _produce(self, start: int, total: int, cut: Callable[[int], int]) -> None:
        t = start
        try:
            while t < total and not self._stop.is_set():
                end = cut(t)
                K = end - t
                i = self._free.get()
                if i < 0:
                    return
                slot = self._slots[i]
                if slot.event is not None:
                    slot.event.synchronize()  # its last host->device copy must be done
                out = (slot.cur[:K].numpy(), slot.feats[:K].numpy(), slot.tgt[:K].numpy())
                if self.compact:
                    self.stream.next_window_ids(K, out=out)
                else:
                    self.stream.next_window(K, out=out)
                self._ready.put((t, K, i, self.stream.state_dict()))
                t = end
        except BaseException as e:  # handed to the consumer, raised in the main thread
            self._ready.put(e)

    def get(self) -> Window:
        item = self._ready.get()
        if isinstance(item, BaseException):
            raise item
        t, K, i, state = item
        slot = self._slots[i]
        feats, tgt = slot.feats[:K], slot.tgt[:K]
        event = None
        if self.device.type == "cuda":
            feats = feats.to(self.device, non_blocking=True)
            tgt = tgt.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        if self.compact:
            feats = expand_ids(feats)
        return Window(
            tick0=t,
            K=K,
            feats=feats,
            tgt=tgt.long(),
            cur=slot.cur[:K].numpy(),
            loader_state=state,
            _slot=i,
            _event=event,
        )

    def release(self, w: Window) -> None:
        """Give the window's buffers back; call when the step no longer needs them."""
        self._slots[w._slot].event = w._event
        self._free.put(w._slot)

    def close(self) -> None:
        self._stop.set()
        self._free.put(-1)
        self._thread.join(timeout=60)
