"""Gradient norms for the gradient noise scale, taken in DDP's communication hook.

The noise scale (McCandlish et al. 2018, appendix A) needs, for one step, the squared norm of a
gradient over a small batch and of one over a large batch. A DDP rank has both: the bucket
tensor its communication hook is handed holds the rank's own gradient over its ``b`` samples,
and the tensor the hook's future returns is the average over all ``n`` ranks, a batch of
``n x b``. Summed over a step's buckets, their squared norms are ``|g_local|^2`` and
``|g_avg|^2`` (bucket by bucket, a sum of squares is a sum of squares).

What the two tensors are: before the hook runs the bucket is the rank's own gradient (with a
hook registered, DDP divides nothing itself: DDP's default ``allreduce_hook`` divides by the
world size in place and then sums, the fp16/bf16 compression hooks likewise), so its norm is
taken before the hook is called. What the future returns is what the optimizer will see, by
DDP's contract the average: a script's own hook that returns a sum, or a lossy one (PowerSGD),
gives that instead. A sum scales both norms alike only if the local one is scaled as well, so
such a hook's estimate is wrong, and nothing here can tell.

A step counts only when its gradient is one batch's:

* under ``no_sync`` (gradient accumulation that skips the allreduce) no hook runs; the step that
  does run it holds the gradient of all the batches since the previous one, and its batch is the
  samples the script took since then (``samples``), so it counts as one large batch. A loss not
  divided by the number of batches scales both norms by the same factor, which the noise scale
  (a ratio) does not see;
* accumulation *with* the allreduce each time leaves the previous average in the gradient the
  next backward pass adds to: only the first synchronised backward pass after an optimizer step
  counts, the others are `skipped`. A script without an optimizer that autotune sees (weights
  updated by hand) cannot be told apart: each synchronised backward pass counts.

Cost: one norm per bucket before the allreduce and one after, on the bucket tensor (a read of
the gradients, small beside the allreduce's own passes), and nothing at all at one rank. The norm
after the allreduce runs in a callback on the communication thread, which must take the
interpreter's lock from the training thread. At two ranks of 7 ms steps on two cores, the
norms and the callback on every step cost about a tenth of the step as the script's own clock
read it (`bench/bench_parity.py`, docs/benchmarks.md "Parity"). So the norms are taken on one
step per `SAMPLE_GAP_S` at most: every step of a script whose steps are longer, one in several
of a fast one; the others run the script's hook untouched. Each step taken is still one sample
of the same means, and a step left out still moves the marks the next counted step's batch is
measured from. On CUDA the norms stay on the device: a step's sums are read by the ticker once
a CUDA event recorded after them has completed, so the training thread never waits for the GPU.
"""

from __future__ import annotations

import threading
import time

# The least time between two steps whose norms are taken: a step that starts its allreduce
# sooner after the last one taken trains untouched.
SAMPLE_GAP_S = 0.05


class GradNorms:
    """Cumulative sums over one rank's counted steps, and the step being gathered."""

    def __init__(self):
        self.lock = threading.Lock()
        self.local_sq = 0.0  # sum over counted steps of |g_local|^2
        self.avg_sq = 0.0  # sum over counted steps of |g_avg|^2
        self.steps = 0  # counted steps
        self.samples = 0  # the samples those steps' local gradients were taken over
        self.skipped = 0  # synchronised backward passes that were not one batch's gradient
        self._before: list = []  # this backward pass's bucket norms (0-d tensors)
        self._after: list = []
        self._pending: list = []  # (event or None, local, avg, samples) awaiting the device
        self._samples_at = 0  # the meter's samples at the previous synchronised backward
        self._steps_at: int | None = None  # its optimizer steps then
        self._taking: bool | None = None  # this backward pass's buckets: norms taken or not
        self._taken_at = -SAMPLE_GAP_S  # when the last step whose norms were taken began
        self._taken_step: int | None = None  # that step's optimizer steps (its later passes)
        self.seen = False  # a bucket has come (`takes`, `before`, `after`): until then a
        # backward pass has nothing to close

    def takes(self, steps: int, now: float | None = None) -> bool:
        """Whether this bucket's norms are taken (``steps``: the meter's optimizer steps).

        The first bucket of a backward pass decides for all of its buckets: the first
        synchronised pass after an optimizer step is taken once `SAMPLE_GAP_S` passed since
        the last one taken; a later pass of the same step never is (it would be skipped)."""
        now = time.perf_counter() if now is None else now
        with self.lock:
            self.seen = True
            if self._taking is None:
                fresh = self._fresh(steps)
                self._taking = fresh and now - self._taken_at >= SAMPLE_GAP_S
                if self._taking:
                    self._taken_at = now
            return self._taking

    def _fresh(self, steps: int) -> bool:
        """Whether a synchronised pass at ``steps`` optimizer steps is the first since the last
        step (with none seen, weights set by hand: every pass is). Under the lock."""
        return self._steps_at is None or steps == 0 or steps != self._steps_at

    def before(self, tensor) -> None:
        """The bucket as the hook gets it: the rank's own gradient."""
        sq = _sq(tensor)
        with self.lock:
            self.seen = True
            self._before.append(sq)

    def after(self, tensor) -> None:
        """The bucket the hook's future returned: the ranks' average."""
        sq = _sq(tensor)
        with self.lock:
            self.seen = True
            self._after.append(sq)

    def close(self, *, samples: int, steps: int) -> None:
        """A backward pass ended (or the next began): its buckets, if any, make one step.

        ``samples``: the meter's training samples so far; ``steps``: its optimizer steps.
        """
        with self.lock:
            before, after, self._before, self._after = self._before, self._after, [], []
            taking, self._taking = self._taking, None
            if taking is False:  # an allreduce ran, its norms not taken: the next counted
                fresh = self._fresh(steps)
                self._samples_at, self._steps_at = samples, steps  # batch starts here
                if not fresh and steps == self._taken_step:
                    self.skipped += 1  # a later pass of a step taken: skipped, as it would be
                return
            if not before and not after:
                return  # no allreduce ran: no_sync, or no backward pass at all
            batch = samples - self._samples_at
            fresh = self._fresh(steps)
            self._samples_at, self._steps_at = samples, steps
            if taking:
                self._taken_step = steps
            if not fresh or len(before) != len(after):
                self.skipped += 1
                return
        local, avg = _total(before), _total(after)
        event = _event(local)
        with self.lock:
            self._pending.append((event, local, avg, batch))

    def snapshot(self) -> dict:
        """The sums of the steps whose norms are known (`probes.protocol.TICK_NOISE`)."""
        with self.lock:
            waiting = []
            for event, local, avg, batch in self._pending:
                if event is not None and not _done(event):
                    waiting.append((event, local, avg, batch))
                    continue
                self.local_sq += float(local)
                self.avg_sq += float(avg)
                self.steps += 1
                self.samples += batch
            self._pending = waiting
            return {"local_sq": self.local_sq, "avg_sq": self.avg_sq, "steps": self.steps,
                    "samples": self.samples, "skipped": self.skipped}


def _sq(tensor):
    """The squared norm of a bucket, a 0-d float tensor on its device (no synchronisation)."""
    import torch

    t = tensor.detach()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return torch.linalg.vector_norm(t).square()


def _total(norms: list):
    total = norms[0]
    for sq in norms[1:]:
        total = total + sq
    return total


def _event(tensor):
    """A CUDA event recorded after ``tensor`` is computed; None off CUDA."""
    if getattr(tensor, "device", None) is None or tensor.device.type != "cuda":
        return None
    import torch

    try:
        event = torch.cuda.Event()
        event.record()
    except Exception:  # noqa: BLE001 - a failed record: the value is read when asked
        return None
    return event


def _done(event) -> bool:
    try:
        return bool(event.query())
    except Exception:  # noqa: BLE001 - a torn-down context: read it anyway, or never
        return True
