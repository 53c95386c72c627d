"""Where a rank's training time goes: cumulative seconds per part of a step.

The interceptor's hooks mark the boundaries they already sit on; this keeps the sums:

- ``data``: inside the DataLoader iterator's ``__next__`` for a training batch, i.e. the
  training loop waiting for its input (the data stall; near zero when workers keep up);
- ``forward``: from a training batch handed over to the first backward pass after it (the
  forward pass, the loss, and whatever else the script does in between). A script that never
  takes a batch from a DataLoader (word_language_model's slices of one tensor, nanoGPT's
  ``get_batch``) hands nothing over: its forward runs from the previous step's (or backward
  pass's) end to the next backward pass, so cutting its batch counts as forward too;
- ``backward``: inside ``Tensor.backward``, less the exposed communication;
- ``comm``: communication not hidden behind compute. DDP launches a bucket's allreduce from its
  communication hook as soon as the bucket's gradients are ready; once the last bucket is
  launched the backward pass has no compute left, so the time from then until ``backward``
  returns is spent waiting for allreduce;
- ``optimizer``: inside ``optimizer.step``, less the forward and backward passes that run
  inside it. A step that takes a closure (Lightning's automatic optimization, ``LBFGS``, an
  ``optimizer.step`` wrapper) runs the forward and backward passes inside the step: they are
  counted as forward and backward, once, and the optimizer keeps only the rest. Inside a step,
  the time from the step's start (or the previous backward's end) to a backward pass that no
  new batch preceded is that closure's forward.

Everything else in a step (``zero_grad``, logging, checkpoints) is what the wall clock holds
beyond these; the controller calls it "other".

On the CPU the host's clock is the truth. On CUDA the host only queues kernels and runs ahead
until something synchronises, so host times would land wherever the host next waits. Once the
process has initialised CUDA, every boundary also records a CUDA event on the current stream
(``torch.cuda.Event(enable_timing=True).record()``: a few microseconds, no synchronisation), and
forward, backward, exposed communication and the optimizer are the device's time between those
events, read with ``elapsed_time`` once ``query()`` says the later one has completed (at the
next tick; nothing waits for the GPU). The data wait stays the host's: it is the host that waits
for the loader. `clock` says which the sums are.
"""

from __future__ import annotations

import threading
import time

from probes.protocol import PARTS

HOST, CUDA = "host", "cuda-events"


def _torch_cuda():
    try:
        import torch
    except Exception:  # noqa: BLE001 - no torch, no CUDA
        return None
    return torch.cuda


class StepClock:
    """Cumulative seconds per part of one process's training steps.

    ``cuda``: a ``torch.cuda``-like module (tests hand in a fake); None finds torch's. Events are
    recorded only once it reports ``is_initialized()``, and never with ``events`` false (the
    host's clock only: ``AUTOTUNE_STEP_CLOCK=host``).
    """

    def __init__(self, cuda=None, *, events: bool = True):
        self.events = events
        self.lock = threading.Lock()
        self.total = dict.fromkeys(PARTS, 0.0)  # host seconds
        self.device = dict.fromkeys(PARTS, 0.0)  # CUDA event seconds (all but data)
        self.clock = HOST
        self._cuda = cuda
        self._handed = (0.0, None)  # (host time, event) the latest training batch was handed
        self._forward_open = False  # a batch was handed over and no backward has run since
        self._loader = False  # a DataLoader handed over a training batch in this process
        self._settled = (0.0, None)  # the latest step's or backward's end, outside any step
        self._backward = (0.0, None)
        self._optimizer = (0.0, None)
        self._in_optimizer = False
        self._inner = (0.0, None)  # inside a step: up to where forward/backward took the time
        self._nested = 0.0  # host seconds of this step that forward/backward/comm took
        self._nested_events: list[tuple[object, object]] = []  # ...and their event pairs
        self._launch = (0.0, None)  # the latest DDP bucket launched in this backward
        # (part, start, end, nested): the part's events, less the pairs nested inside them
        self._pending: list[tuple[str, object, object, tuple]] = []

    # -- marks --------------------------------------------------------------------------------
    def _mark(self) -> tuple[float, object]:
        """Now, on the host and (once CUDA is up) on the current stream."""
        return time.monotonic(), self._event()

    def _event(self):
        if not self.events:
            return None
        cuda = self._cuda if self._cuda is not None else _torch_cuda()
        try:
            if cuda is None or not cuda.is_initialized():
                return None
            event = cuda.Event(enable_timing=True)
            event.record()
        except Exception:  # noqa: BLE001 - timing never breaks a training step
            return None
        return event

    def data(self, start: float, end: float) -> None:
        """The loader's ``__next__`` ran from ``start`` to ``end`` (host) for a training batch."""
        event = self._event()
        with self.lock:
            self.total["data"] += end - start
            self._handed, self._forward_open, self._loader = (end, event), True, True

    def bucket_launched(self) -> None:
        self._launch = self._mark()

    def backward_begin(self) -> None:
        self._backward = self._mark()

    def backward_end(self) -> None:
        end, end_ev = self._mark()
        start, start_ev = self._backward
        with self.lock:
            if self._forward_open:
                self.total["forward"] += max(0.0, start - self._handed[0])
                self._pair("forward", self._handed[1], start_ev)
                self._forward_open = False
            elif self._in_optimizer:  # a closure's forward, run by the step itself
                self.total["forward"] += max(0.0, start - self._inner[0])
                self._pair("forward", self._inner[1], start_ev)
            elif not self._loader and self._settled[0] > 0:  # no DataLoader: since the last
                self.total["forward"] += max(0.0, start - self._settled[0])  # step's end
                self._pair("forward", self._settled[1], start_ev)
            if not self._in_optimizer:
                self._settled = (end, end_ev)
            if self._in_optimizer:  # all of it since the mark is forward/backward/comm
                self._nested += max(0.0, end - self._inner[0])
                self._nested_events.append((self._inner[1], end_ev))
                self._inner = (end, end_ev)
            launched, launch_ev = self._launch
            exposed = end - launched if start <= launched <= end else 0.0
            self.total["comm"] += exposed
            self.total["backward"] += (end - start) - exposed
            if start <= launched <= end:
                self._pair("backward", start_ev, launch_ev)
                self._pair("comm", launch_ev, end_ev)
            else:
                self._pair("backward", start_ev, end_ev)
            self._launch = (0.0, None)

    def optimizer_begin(self) -> None:
        mark = self._mark()
        with self.lock:
            self._optimizer = self._inner = mark
            self._in_optimizer, self._nested, self._nested_events = True, 0.0, []

    def optimizer_end(self) -> None:
        end, end_ev = self._mark()
        start, start_ev = self._optimizer
        with self.lock:
            self.total["optimizer"] += max(0.0, (end - start) - self._nested)
            self._settled = (end, end_ev)
            nested = tuple(self._nested_events)
            if all(a is not None and b is not None for a, b in nested):
                self._pair("optimizer", start_ev, end_ev, nested)
            self._in_optimizer, self._nested, self._nested_events = False, 0.0, []

    def _pair(self, part: str, start, end, nested: tuple = ()) -> None:
        if start is not None and end is not None:
            self._pending.append((part, start, end, nested))

    # -- reading ------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, float]:
        """The sums so far: the device's where CUDA events timed the step, else the host's."""
        with self.lock:
            self._resolve()
            if self.clock == CUDA:
                return {p: self.total[p] if p == "data" else self.device[p] for p in PARTS}
            return dict(self.total)

    def _resolve(self) -> None:
        """Add the pairs whose later event has completed; the rest wait for the next tick."""
        waiting = []
        for part, start, end, nested in self._pending:
            try:
                done = end.query()  # the latest event: the nested ones were recorded before it
                seconds = (start.elapsed_time(end) - sum(a.elapsed_time(b) for a, b in nested)) \
                    / 1000.0 if done else 0.0
            except Exception:  # noqa: BLE001 - an event of a torn-down context: dropped
                continue
            if not done:
                waiting.append((part, start, end, nested))
                continue
            self.device[part] += max(0.0, seconds)
            self.clock = CUDA
        self._pending = waiting
