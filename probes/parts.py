"""Where a rank's training time goes: cumulative host seconds per part of a step.

The interceptor's hooks mark the boundaries they already sit on; this keeps the sums:

- ``data``: inside the DataLoader iterator's ``__next__`` for a training batch, i.e. the
  training loop waiting for its input (the data stall; near zero when workers keep up);
- ``forward``: from a training batch handed over to the first backward pass after it (the
  forward pass, the loss, and whatever else the script does in between);
- ``backward``: inside ``Tensor.backward``, less the exposed communication;
- ``comm``: communication not hidden behind compute. DDP launches a bucket's allreduce from its
  communication hook as soon as the bucket's gradients are ready; once the last bucket is
  launched the backward pass has no compute left, so the time from then until ``backward``
  returns is spent waiting for allreduce;
- ``optimizer``: inside ``optimizer.step``.

Everything else in a step (``zero_grad``, logging, checkpoints) is what the wall clock holds
beyond these; the controller calls it "other". Times are the host's: on CUDA the host runs
ahead of the device until something synchronises (a ``.item()``, the loss printed, DDP's
allreduce), so a kernel's time shows where the host next waits for it.
"""

from __future__ import annotations

import threading
import time

from probes.protocol import PARTS


class StepClock:
    """Cumulative seconds per part of one process's training steps."""

    def __init__(self):
        self.lock = threading.Lock()
        self.total = dict.fromkeys(PARTS, 0.0)
        self._handed_t = 0.0  # when the latest training batch was handed to the script
        self._forward_open = False  # a batch was handed over and no backward has run since
        self._last_launch_t = 0.0  # the latest DDP bucket launched (0: none in this backward)

    def data(self, start: float, end: float) -> None:
        with self.lock:
            self.total["data"] += end - start
            self._handed_t, self._forward_open = end, True

    def bucket_launched(self) -> None:
        self._last_launch_t = time.monotonic()

    def backward(self, start: float, end: float) -> None:
        with self.lock:
            if self._forward_open:
                self.total["forward"] += max(0.0, start - self._handed_t)
                self._forward_open = False
            launched = self._last_launch_t
            exposed = end - launched if start <= launched <= end else 0.0
            self.total["comm"] += exposed
            self.total["backward"] += (end - start) - exposed
            self._last_launch_t = 0.0

    def optimizer(self, start: float, end: float) -> None:
        with self.lock:
            self.total["optimizer"] += end - start

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            return dict(self.total)
