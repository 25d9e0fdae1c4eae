"""Prepare the next windows of loader output (and their last-atom masks) while the model
computes on the current one.

The Rust loader releases the GIL while it works, so a plain Python thread calling
``next_window(K, out=...)`` runs truly in parallel with the training step. Windows are written
into a small ring of caller-owned buffers (pinned host memory on CUDA, copied to the device
with ``non_blocking=True``); a buffer goes back to the ring only when the step that used it is
done with it (on CUDA: when its host-to-device copy has completed).

The last-atom dropout masks of a window are drawn here too, in tick order, from the run's
dedicated generator (`MaskDrawer`), and travel with the window through the same pinned
buffers: the training step never builds a host tensor. Each window carries the loader state
(a compact `StreamSnapshot`: the B positions copied in Rust, without the GIL; its state
dict is made only when a checkpoint is written) and the generator state *after* it, so
a checkpoint written after training on a window records exactly the bytes and the draws
consumed, however far ahead the prefetcher has run.

Where the time goes: on CUDA a buffer is refilled only after its last copy to the device
has run, and that copy was queued behind the previous window's kernels; so in a GPU-bound
run the thread waits for the GPU, and the consumer's wait in `get()` (`Window.waited_s`) is
GPU time, not loader time. Each window therefore also says how long the thread worked on it
(`loader_busy_s`: the fill, the masks, the snapshot) and how long it waited for the GPU
first (`gpu_wait_s`): the loader holds training back when its busy share of the wall time
nears 100%, whatever the consumer waited.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from atom_train.data.atomizer import FEATURE_DIM
from atom_train.data.loader import FEATURE_IDS_PER_TICK, StreamSnapshot
from atom_train.model.devices import normalize_device
from atom_train.model.reference import draw_masks


@dataclass
class Window:
    tick0: int
    K: int
    feats: torch.Tensor  # float32 [K, B, 320], or int16 ids [K, B, 17], on the device
    tgt: torch.Tensor  # uint8 [K, B] on the device
    masks: torch.Tensor | None  # float32 [K, B] last-atom masks on the device (training)
    loader_snapshot: StreamSnapshot  # the loader's state after this window
    dropout_state: torch.Tensor | None  # the mask generator's state after this window
    waited_s: float = 0.0  # the consumer's wait in get() (on CUDA: mostly the GPU's time)
    loader_busy_s: float = 0.0  # the thread's own work on this window: fill, masks, snapshot
    gpu_wait_s: float = 0.0  # the thread's wait for the GPU to be done with the buffer first
    _slot: int = -1
    _event: object = field(default=None, repr=False)


class MaskDrawer:
    """The last-atom masks of the run's streams, drawn from its dedicated generator
    (`atom_train.model.reference.draw_masks`: rank-independent, so a rank takes its columns [lo, hi)
    of the global B_all draws)."""

    def __init__(self, generator: torch.Generator, p: float, B_all: int, lo: int, hi: int):
        self.generator, self.p = generator, p
        self.B_all, self.lo, self.hi = B_all, lo, hi

    def draw(self, out: torch.Tensor) -> None:
        """Fill `out` [K, hi - lo] with the next K ticks' masks (0.0 / 1.0)."""
        draw_masks(out, self.p, self.generator, self.B_all, self.lo)


class _Slot:
    def __init__(self, K: int, B: int, compact: bool, masks: bool, pin: bool) -> None:
        width = (FEATURE_IDS_PER_TICK,) if compact else (FEATURE_DIM,)
        dtype = torch.int16 if compact else torch.float32
        self.cur = torch.empty((K, B), dtype=torch.uint8, pin_memory=pin)
        self.feats = torch.empty((K, B, *width), dtype=dtype, pin_memory=pin)
        self.tgt = torch.empty((K, B), dtype=torch.uint8, pin_memory=pin)
        self.masks = torch.empty((K, B), dtype=torch.float32, pin_memory=pin) if masks else None
        self.event = None  # CUDA event recorded after the last copy out of this slot


class WindowPrefetcher:
    """Background producer of windows for ticks [start, total).

    cut(t) gives the tick at which the window starting at t ends (a pure function of t, so a
    resumed run cuts its windows exactly where an uninterrupted one would). masks: the
    drawer of the last-atom masks (None: no masks, e.g. validation).
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
        masks: MaskDrawer | None = None,
        n_slots: int = 2,
    ) -> None:
        self.stream = stream
        self.device = normalize_device(device)
        self.compact = compact
        self.masks = masks
        cuda = self.device.type == "cuda"
        self._slots = [
            _Slot(max_K, stream.B, compact, masks is not None, pin=cuda) for _ in range(n_slots)
        ]
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
                t_free = time.perf_counter()
                if slot.event is not None:
                    slot.event.synchronize()  # its last host->device copy must be done
                t_work = time.perf_counter()
                out = (slot.cur[:K].numpy(), slot.feats[:K].numpy(), slot.tgt[:K].numpy())
                if self.compact:
                    self.stream.next_window_ids(K, out=out)
                else:
                    self.stream.next_window(K, out=out)
                dropout_state = None
                if self.masks is not None:
                    self.masks.draw(slot.masks[:K])
                    dropout_state = self.masks.generator.get_state()
                snapshot = self.stream.snapshot()
                timing = (time.perf_counter() - t_work, t_work - t_free)
                self._ready.put((t, K, i, snapshot, dropout_state, timing))
                t = end
            if t >= total:  # a get() past the last window fails instead of waiting forever
                self._ready.put(EOFError(f"no window at tick {t}: the prefetcher ends at {total}"))
        except BaseException as e:  # handed to the consumer, raised in the main thread
            self._ready.put(e)

    def get(self) -> Window:
        t0 = time.perf_counter()
        item = self._ready.get()
        waited = time.perf_counter() - t0
        if isinstance(item, BaseException):
            raise item
        t, K, i, snapshot, dropout_state, (busy, gpu_wait) = item
        slot = self._slots[i]
        feats, tgt = slot.feats[:K], slot.tgt[:K]
        masks = slot.masks[:K] if slot.masks is not None else None
        event = None
        if self.device.type != "cpu":  # (any device: the tests run this path on `meta`)
            feats = feats.to(self.device, non_blocking=True)
            tgt = tgt.to(self.device, non_blocking=True)
            if masks is not None:
                masks = masks.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return Window(
            tick0=t,
            K=K,
            feats=feats,
            tgt=tgt,
            masks=masks,
            loader_snapshot=snapshot,
            dropout_state=dropout_state,
            waited_s=waited,
            loader_busy_s=busy,
            gpu_wait_s=gpu_wait,
            _slot=i,
            _event=event,
        )

    def release(self, w: Window) -> None:
        """Give the window's buffers back; call when the step no longer needs them (on the
        CPU: after the step, since the window's tensors are views of the slot)."""
        self._slots[w._slot].event = w._event
        self._free.put(w._slot)

    def close(self) -> None:
        self._stop.set()
        self._free.put(-1)
        self._thread.join(timeout=60)
