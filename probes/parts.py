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

The events are not free: each is a host call into the driver, and reading them back takes the
clock's lock from the ticker. Under MPS, with several ranks feeding one GPU from few cores, that
may be a share of a short step. So the clock measures its own cost (``AUTOTUNE_STEP_CLOCK``
unset or ``auto``): over its first `CALIBRATE_STEPS` steps with CUDA up it times every event it
records and every read-back, against the steps' own wall time, then keeps the cheapest timing
whose cost is within `COST_BUDGET` of a step (`choose_every`):

- events on every step, when they cost that little;
- else events on one step in ``every`` (sampled steps: a sampled step records all of its
  boundaries, the others none), the device's sums of those steps scaled by the steps since
  the choice over the sampled ones (the fully timed steps before it count once); a step
  is sampled at least `MIN_SAMPLED_PER_S` times a second, so that each tick's window of the
  breakdown still holds sampled steps and its interval stays what it states;
- else the host's clock alone (``host``), said as such.

``AUTOTUNE_STEP_CLOCK=host`` keeps the host's clock from the start, ``events`` times every step
with events (no measurement). `choice` says what was chosen and why, in one line (the meter
passes it on as a note).
"""

from __future__ import annotations

import math
import threading
import time

from probes.protocol import PARTS

HOST, CUDA = "host", "cuda-events"
AUTO, EVENTS = "auto", "events"  # AUTOTUNE_STEP_CLOCK: measured choice, or events every step
CALIBRATE_STEPS = 20  # steps timed with events on every boundary before the choice
COST_BUDGET = 0.005  # the events' host cost may be this share of a step
MAX_EVERY = 16  # sampled: one step in at most this many...
MIN_SAMPLED_PER_S = 4.0  # ...and at least this many sampled steps a second (one a tick)


def choose_every(cost_s: float, step_s: float) -> int:
    """Pure: record events on one step in this many (1: every step; 0: none, the host's clock)
    for events costing ``cost_s`` of host time a step, in steps of ``step_s`` wall time."""
    if step_s <= 0 or cost_s <= COST_BUDGET * step_s:
        return 1
    need = math.ceil(cost_s / (COST_BUDGET * step_s))
    most = min(MAX_EVERY, max(1, int(1.0 / (MIN_SAMPLED_PER_S * step_s))))
    return need if need <= most else 0


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

    def __init__(self, cuda=None, *, events: bool = True, mode: str = AUTO):
        self.events = events
        self.mode = mode if events else HOST
        self.every = 1  # events on one step in this many (`choose_every`)
        self.choice = ""  # what was chosen and why, once chosen
        self._timed = True  # this step records its events
        self._steps = 0  # steps ended since the first event
        self._in_phase = 0  # steps ended since one in ``every`` was chosen (every > 1)
        self._sampled = 0  # ...of which recorded events
        self._step_t = 0.0  # when the latest step ended (host)
        self._cost_s = 0.0  # host seconds in event calls and read-backs while calibrating
        self._calib_s = 0.0  # wall seconds of the calibration steps
        self.lock = threading.Lock()
        self.total = dict.fromkeys(PARTS, 0.0)  # host seconds
        self.device = dict.fromkeys(PARTS, 0.0)  # CUDA event seconds of steps timed in full
        self.device_sampled = dict.fromkeys(PARTS, 0.0)  # ...of the sampled steps (every > 1)
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
        # (part, start, end, nested, sampled): the part's events, less the pairs nested inside
        # them, and whether they were recorded on a sampled step (scaled) or every step (not)
        self._pending: list[tuple[str, object, object, tuple, bool]] = []

    # -- marks --------------------------------------------------------------------------------
    def _mark(self) -> tuple[float, object]:
        """Now, on the host and (once CUDA is up) on the current stream."""
        return time.monotonic(), self._event()

    @classmethod
    def from_env(cls, value: str | None) -> StepClock:
        """``AUTOTUNE_STEP_CLOCK``: ``host``, ``events``, or the measured choice (else)."""
        value = (value or "").strip().lower()
        return cls(events=value != HOST, mode=EVENTS if value == EVENTS else AUTO)

    def _event(self, force: bool = False):
        if not self.events or not (self._timed or force):
            return None
        cuda = self._cuda
        if cuda is None:  # found once, on the first mark (the script has imported torch by
            cuda = self._cuda = _torch_cuda()  # then): an import a mark cost 1-2 us of a step
        try:
            if cuda is None or not cuda.is_initialized():
                return None
            t0 = time.perf_counter()
            event = cuda.Event(enable_timing=True)
            event.record()
        except Exception:  # noqa: BLE001 - timing never breaks a training step
            return None
        if self._steps < CALIBRATE_STEPS:
            self._cost_s += time.perf_counter() - t0
        return event

    def _step_ended(self, end: float, timed_next: bool) -> None:
        """A step ended at ``end`` (host): counted, and the choice made once calibrated."""
        if self._step_t and self._any_event:
            self._steps += 1
            if self.every > 1:
                self._in_phase += 1
                self._sampled += self._timed
            if self._steps <= CALIBRATE_STEPS:
                self._calib_s += end - self._step_t
            if self._steps == CALIBRATE_STEPS and self.mode == AUTO:
                self._choose()
        self._step_t = end
        self._timed = timed_next

    @property
    def _any_event(self) -> bool:
        return self.clock == CUDA or bool(self._pending)

    def _next_timed(self) -> bool:
        return self.events and (self.every <= 1 or (self._steps + 1) % self.every == 0)

    def _choose(self) -> None:
        cost = self._cost_s / CALIBRATE_STEPS
        step = self._calib_s / CALIBRATE_STEPS
        self.every = choose_every(cost, step)
        said = f"its events cost {cost * 1e6:.0f} us of a {step * 1e3:.1f} ms step"
        if self.every == 1:
            self.choice = f"step clock: CUDA events on every step ({said})"
        elif self.every:
            self.choice = f"step clock: CUDA events on 1 step in {self.every} ({said})"
        else:
            self.events, self.mode = False, HOST
            self.choice = (f"step clock: the host's ({said}: over {COST_BUDGET:.1%} of a step "
                           f"even on 1 step in {MAX_EVERY}, or sampled too rarely)")

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
        timed_next = self._next_timed()
        # the next sampled step's forward runs from this end: recorded when it is sampled
        end, end_ev = time.monotonic(), self._event(force=timed_next)
        start, start_ev = self._optimizer
        sampled = self.every > 1  # this step's phase, before the choice its end may make
        self._step_ended(end, timed_next)
        with self.lock:
            self.total["optimizer"] += max(0.0, (end - start) - self._nested)
            self._settled = (end, end_ev)
            if start_ev is not None and end_ev is not None:  # events: none on the host clock
                nested = tuple(self._nested_events)
                if all(a is not None and b is not None for a, b in nested):
                    self._pair("optimizer", start_ev, end_ev, nested, sampled=sampled)
            self._in_optimizer, self._nested, self._nested_events = False, 0.0, []

    def _pair(self, part: str, start, end, nested: tuple = (), *,
              sampled: bool | None = None) -> None:
        if start is not None and end is not None:
            self._pending.append((part, start, end, nested,
                                  self.every > 1 if sampled is None else sampled))

    # -- reading ------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, float]:
        """The sums so far: the device's where CUDA events timed the step, else the host's. On
        sampled steps the device's sums are scaled to all the steps of that phase; the steps
        timed in full before it (the calibration's, start-up's slow ones among them) count once:
        scaled with the rest, a first step of cuDNN's autotuning grew with every step after it,
        and a window's shares summed to 1.8 on an H200."""
        t0 = time.perf_counter()
        with self.lock:
            self._resolve()
            if self._steps < CALIBRATE_STEPS:  # the read-back is the events' cost too
                self._cost_s += time.perf_counter() - t0
            if self.clock == CUDA and self.mode != HOST:
                scale = self._in_phase / self._sampled if self._sampled else 0.0
                return {p: self.total[p] if p == "data"
                        else self.device[p] + self.device_sampled[p] * scale for p in PARTS}
            self.clock = HOST
            return dict(self.total)

    def _resolve(self) -> None:
        """Add the pairs whose later event has completed; the rest wait for the next tick."""
        waiting = []
        for part, start, end, nested, sampled in self._pending:
            try:
                done = end.query()  # the latest event: the nested ones were recorded before it
                seconds = (start.elapsed_time(end) - sum(a.elapsed_time(b) for a, b in nested)) \
                    / 1000.0 if done else 0.0
            except Exception:  # noqa: BLE001 - an event of a torn-down context: dropped
                continue
            if not done:
                waiting.append((part, start, end, nested, sampled))
                continue
            (self.device_sampled if sampled else self.device)[part] += max(0.0, seconds)
            self.clock = CUDA
        self._pending = waiting
