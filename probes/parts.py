"""Where a rank's training time goes: cumulative seconds per part of a step.

The interceptor's hooks mark the boundaries they already sit on; this keeps the sums:

- ``data``: inside the DataLoader iterator's ``__next__`` for a training batch, i.e. the
  training loop waiting for its input (the data stall; near zero when workers keep up);
- ``forward``: from a training batch handed over to the first backward pass after it (the
  forward pass, the loss, and whatever else the script does in between). A script that never
  takes a batch from a DataLoader (word_language_model's slices of one tensor, nanoGPT's
  ``get_batch``) hands nothing over: its forward runs from the previous step's (or backward
  pass's) end to the next backward pass, so cutting its batch counts as forward too;
- ``backward``: inside ``torch.autograd.backward`` (``Tensor.backward``'s), less the exposed
  communication;
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

Marking is not free. Each boundary is a few Python calls on the training thread, and inside a
training loop each costs several times what it costs alone: `bench/hook_cost.py` measured a
sampled step's marks at 15-25 us on a 2-core VM, 3-5% of a 0.5 ms step. A CUDA event is a host
call into the driver besides, and reading it back takes the clock's lock from the ticker; under
MPS, with several ranks feeding one GPU from few cores, that may be a share of a short step. So
the clock times one step in ``every`` (sampled steps: a sampled step marks all of its
boundaries, the others none, and the hooks skip their calls), its sums of those steps scaled
by the steps since the choice over the sampled ones (the fully timed steps before it count
once). Over its first `CALIBRATE_STEPS` steps it times every step and measures them, and the
events' own cost with them (``AUTOTUNE_STEP_CLOCK`` unset or ``auto``), then keeps the cheapest
timing whose cost is within `COST_BUDGET` of a step (`choose_every`), the host's marks counted
at `HOST_MARKS_S`; on the host's clock alone, within `HOST_BUDGET` (`host_every`), as the host's
marks need no more sampled steps than the breakdown's interval does:

- every step, when that costs that little;
- else one step in ``every``, where a step is sampled at least `MIN_SAMPLED_PER_S` times a
  second, so that each tick's window of the breakdown still holds sampled steps and its
  interval stays what it states;
- with CUDA, events too costly even so: the host's clock alone (``host``), said as such.

A process that initialises CUDA after the clock chose on the host's clock times every step
again and chooses anew with the events. ``AUTOTUNE_STEP_CLOCK=host`` keeps the host's clock from
the start, ``events`` times every step with events (no measurement). `choice` says what was
chosen for the events and why, in one line (the meter passes it on as a note); the host's
sampling goes unsaid, as it changes no figure.
"""

from __future__ import annotations

import math
import threading
import time

from probes.protocol import PARTS

HOST, CUDA = "host", "cuda-events"
AUTO, EVENTS = "auto", "events"  # AUTOTUNE_STEP_CLOCK: measured choice, or events every step
CALIBRATE_STEPS = 20  # steps timed on every boundary before the choice
COST_BUDGET = 0.005  # the marks' host cost may be this share of a step, with CUDA events...
HOST_BUDGET = 0.002  # ...and on the host's clock alone
# A sampled step's own host time inside a training loop: its marks, and the hooks' slow paths
# it takes (`bench/hook_cost.py`, the clock on against none: 3.2 us a step at 1 in 19 of 0.5 ms
# steps, 2026-12-05; counted at 20 us before, the host's clock cost twice its budget)
HOST_MARKS_S = 60e-6
MAX_EVERY = 64  # sampled: one step in at most this many...
MIN_SAMPLED_PER_S = 4.0  # ...and at least this many sampled steps a second (one a tick)


def choose_every(cost_s: float, step_s: float, budget: float = COST_BUDGET) -> int:
    """Pure: time one step in this many (1: every step; 0: none can be, within ``budget``)
    for marks costing ``cost_s`` of host time a step, in steps of ``step_s`` wall time."""
    if step_s <= 0 or cost_s <= budget * step_s:
        return 1
    need = math.ceil(cost_s / (budget * step_s) - 1e-9)  # 8.000000001 is 8
    return need if need <= most_every(step_s) else 0


def most_every(step_s: float) -> int:
    """Pure: the rarest sampling steps of ``step_s`` allow: at most `MAX_EVERY`, and at least
    `MIN_SAMPLED_PER_S` sampled steps a second."""
    return min(MAX_EVERY, max(1, int(1.0 / (MIN_SAMPLED_PER_S * step_s))))


def host_every(step_s: float) -> int:
    """Pure: time one step in this many on the host's clock alone, in steps of ``step_s``: as
    `choose_every` for the host's marks within `HOST_BUDGET`, or as rarely as a tick's window
    allows when even that costs more (there is nothing cheaper to fall back on)."""
    return choose_every(HOST_MARKS_S, step_s, HOST_BUDGET) or most_every(step_s)


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
    host's clock only: ``AUTOTUNE_STEP_CLOCK=host``). The hooks call the marks only while
    `timed` (a sampled step); a mark called between sampled steps does nothing.
    """

    # Slots, not an instance dict: the hooks read and call the clock on every step, and past 30
    # attributes an instance's dict is its own, where the interpreter's fast paths for its
    # attributes and methods fail on every call (`bench/hook_cost.py`).
    __slots__ = ("events", "mode", "every", "choice", "timed", "skip", "_owed", "_looking",
                 "_evented", "_steps", "_in_phase", "_sampled", "_step_t", "_cost_s", "_calib_s",
                 "lock", "total", "total_sampled", "_sums", "device", "device_sampled", "clock",
                 "_cuda", "_handed", "_forward_open", "_loader", "_settled", "_backward",
                 "_optimizer", "_in_optimizer", "_inner", "_nested", "_nested_events", "_launch",
                 "_pending")

    def __init__(self, cuda=None, *, events: bool = True, mode: str = AUTO):
        self.events = events
        self.mode = mode if events else HOST
        self.every = 1  # one step in this many is timed (`choose_every`, `host_every`)
        self.choice = ""  # what was chosen for the events and why, once chosen
        self.timed = True  # this step marks its boundaries
        # step ends to come that need nothing but counting down (between sampled steps): the
        # hooks count them down themselves, without a call, and `optimizer_end` would too
        self.skip = 0
        self._owed = 0  # ...the steps those were, counted at the next call
        # a mark may record an event: the events on, this step timed, and CUDA not found down
        # since the step began (on the CPU one look a timed step, at its end: each look is a
        # call into torch on the training thread)
        self._looking = events
        self._evented = False  # the calibration under way or done timed CUDA events
        self._steps = 0  # steps ended since the calibration began
        self._in_phase = 0  # steps ended since one in ``every`` was chosen (every > 1)
        self._sampled = 0  # ...of which were timed
        self._step_t = 0.0  # when the latest timed step ended (host)
        self._cost_s = 0.0  # host seconds in event calls and read-backs while calibrating
        self._calib_s = 0.0  # wall seconds of the calibration steps
        self.lock = threading.Lock()
        self.total = dict.fromkeys(PARTS, 0.0)  # host seconds of steps timed in full
        self.total_sampled = dict.fromkeys(PARTS, 0.0)  # ...of the sampled steps (every > 1)
        self._sums = self.total  # where this phase's host seconds go
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

    @classmethod
    def from_env(cls, value: str | None) -> StepClock:
        """``AUTOTUNE_STEP_CLOCK``: ``host``, ``events``, or the measured choice (else)."""
        value = (value or "").strip().lower()
        return cls(events=value != HOST, mode=EVENTS if value == EVENTS else AUTO)

    # -- marks --------------------------------------------------------------------------------
    def _mark(self) -> tuple[float, object]:
        """Now, on the host and (once CUDA is up) on the current stream."""
        return time.monotonic(), self._event() if self._looking else None

    def _event(self, force: bool = False):
        if not self.events or not (self.timed or force):
            return None
        cuda = self._cuda
        if cuda is None:  # found once, on the first mark (the script has imported torch by
            cuda = self._cuda = _torch_cuda()  # then): an import a mark cost 1-2 us of a step
        try:
            if cuda is None or not cuda.is_initialized():
                self._looking = False  # not again before the step's end (`optimizer_end`)
                return None
            t0 = time.perf_counter()
            event = cuda.Event(enable_timing=True)
            event.record()
        except Exception:  # noqa: BLE001 - timing never breaks a training step
            return None
        if self._steps < CALIBRATE_STEPS:
            self._cost_s += time.perf_counter() - t0
        return event

    def _step_ended(self, end: float, timed_next: bool, evented: bool) -> None:
        """A step ended at ``end`` (host; a timed step's, or one before a timed step), its end
        recorded a CUDA event or not: counted, and the choice made once calibrated."""
        if evented and not self._evented:  # CUDA came up: calibrate again, with its events
            self._recalibrate()
        elif self._step_t:
            self._steps += 1
            if self.every > 1:
                self._in_phase += 1
                self._sampled += self.timed
            if self._steps <= CALIBRATE_STEPS:
                self._calib_s += end - self._step_t
            if self._steps == CALIBRATE_STEPS and self.mode != EVENTS:
                self._choose()
        self._step_t = end
        self.timed = timed_next

    def _recalibrate(self) -> None:
        """Time every step again from here: the sampled host sums so far, scaled, join the
        full ones, and the choice is made anew over the next steps."""
        scale = self._in_phase / self._sampled if self._sampled else 0.0
        for part, seconds in self.total_sampled.items():
            self.total[part] += seconds * scale
            self.total_sampled[part] = 0.0
        self._evented, self.every, self._sums, self.choice = True, 1, self.total, ""
        self.skip = self._owed = 0
        self._steps = self._in_phase = self._sampled = 0
        self._cost_s = self._calib_s = 0.0

    def _next_timed(self) -> bool:
        return self.every <= 1 or (self._steps + 1) % self.every == 0

    def _choose(self) -> None:
        step = self._calib_s / CALIBRATE_STEPS
        if self._evented and self.events:
            cost = self._cost_s / CALIBRATE_STEPS
            every = choose_every(cost + HOST_MARKS_S, step)
            said = (f"its events cost {cost * 1e6:.0f} us and its host marks about "
                    f"{HOST_MARKS_S * 1e6:.0f} us of a {step * 1e3:.1f} ms step")
            if every == 1:
                self.choice = f"step clock: CUDA events on every step ({said})"
            elif every:
                self.choice = f"step clock: CUDA events on 1 step in {every} ({said})"
            else:
                self.events, self.mode = False, HOST
                self.choice = (f"step clock: the host's ({said}: over {COST_BUDGET:.1%} of a "
                               f"step even on 1 step in {MAX_EVERY}, or sampled too rarely)")
            if every:
                self._sample(every)
                return
        self._sample(host_every(step))

    def _sample(self, every: int) -> None:
        self.every = every
        self._sums = self.total_sampled if every > 1 else self.total

    def data(self, start: float, end: float) -> None:
        """The loader's ``__next__`` ran from ``start`` to ``end`` (host) for a training batch."""
        if not self.timed:
            return
        self._sums["data"] += end - start
        self._handed = (end, self._event() if self._looking else None)
        self._forward_open = self._loader = True

    def bucket_launched(self) -> None:
        if self.timed:
            self._launch = self._mark()

    def backward_begin(self) -> None:
        if self.timed:
            self._backward = self._mark()

    def backward_end(self) -> None:
        if not self.timed:
            return
        end, end_ev = self._mark()
        start, start_ev = self._backward
        sums, in_optimizer = self._sums, self._in_optimizer
        forward_from = None  # the forward pass's start, when one ends at this backward's start
        if self._forward_open:
            forward_from = self._handed
            self._forward_open = False
        elif in_optimizer:  # a closure's forward, run by the step itself
            forward_from = self._inner
        elif not self._loader and self._settled[0] > 0:  # no DataLoader: since the last
            forward_from = self._settled  # step's end
        if forward_from is not None:
            sums["forward"] += max(0.0, start - forward_from[0])
        if in_optimizer:  # all of it since the mark is forward/backward/comm
            self._nested += max(0.0, end - self._inner[0])
            self._nested_events.append((self._inner[1], end_ev))
            self._inner = (end, end_ev)
        else:
            self._settled = (end, end_ev)
            if not self._step_t:  # no optimizer step seen: a backward pass ends the step
                self._looking = self.events
        launched, launch_ev = self._launch
        exposed = start <= launched <= end
        if exposed:
            sums["comm"] += end - launched
            sums["backward"] += launched - start
        else:
            sums["backward"] += end - start
        if launched:
            self._launch = (0.0, None)
        if end_ev is None:  # the host's clock: no events to keep
            return
        if forward_from is not None:
            self._pair("forward", forward_from[1], start_ev)
        if exposed:
            self._pair("backward", start_ev, launch_ev)
            self._pair("comm", launch_ev, end_ev)
        else:
            self._pair("backward", start_ev, end_ev)

    def optimizer_begin(self) -> None:
        if not self.timed:
            return
        self._optimizer = self._inner = self._mark()
        self._in_optimizer, self._nested = True, 0.0
        if self._nested_events:
            self._nested_events = []

    def optimizer_end(self) -> None:
        """A step ended (every step's end, but those `skip` counts down: it counts them for
        the sampling)."""
        if self.skip:
            self.skip -= 1
            return
        if self._owed:
            self._steps += self._owed
            self._in_phase += self._owed
            self._owed = 0
        timed, timed_next = self.timed, self._next_timed()
        if not (timed or timed_next):  # between sampled steps (the first, after a choice)
            self._steps += 1
            self._in_phase += 1
            self._skip_to_next()
            return
        # this step's optimizer closes here when it was timed, and the next timed step's
        # forward may run from here: the step's one look for CUDA
        end = time.monotonic()
        end_ev = self._event(force=True) if self.events and (timed_next or self._looking) \
            else None
        start, start_ev = self._optimizer
        sums, sampled = self._sums, self.every > 1  # this step's phase, before its end chooses
        self._step_ended(end, timed_next, end_ev is not None)
        if not timed_next:
            self._skip_to_next()
        self._looking = end_ev is not None and self.timed
        self._settled = (end, end_ev)
        if not timed:
            return
        sums["optimizer"] += max(0.0, (end - start) - self._nested)
        if start_ev is not None and end_ev is not None:  # events: none on the host clock
            nested = tuple(self._nested_events)
            if all(a is not None and b is not None for a, b in nested):
                self._pair("optimizer", start_ev, end_ev, nested, sampled=sampled)
        self._in_optimizer, self._nested = False, 0.0
        if self._nested_events:
            self._nested_events = []

    def _skip_to_next(self) -> None:
        """Let the step ends up to the one before the next sampled step pass uncounted: that
        one's end is the next timed step's start, and the next call."""
        every = self.every
        if every > 1:
            self.skip = self._owed = max(0, (self._steps // every + 1) * every - 2 - self._steps)

    def _pair(self, part: str, start, end, nested: tuple = (), *,
              sampled: bool | None = None) -> None:
        """A part's events, kept for the ticker to read back (`_resolve`): under the lock, as
        the ticker swaps the list; the host's sums need none (the ticker only copies them)."""
        if start is not None and end is not None:
            with self.lock:
                self._pending.append((part, start, end, nested,
                                      self.every > 1 if sampled is None else sampled))

    # -- reading ------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, float]:
        """The sums so far: the device's where CUDA events timed the step, else the host's. On
        sampled steps the sums are scaled to all the steps of that phase; the steps timed in
        full before it (the calibration's, start-up's slow ones among them) count once:
        scaled with the rest, a first step of cuDNN's autotuning grew with every step after it,
        and a window's shares summed to 1.8 on an H200."""
        t0 = time.perf_counter()
        with self.lock:
            self._resolve()
            if self._steps < CALIBRATE_STEPS:  # the read-back is the events' cost too
                self._cost_s += time.perf_counter() - t0
            scale = self._in_phase / self._sampled if self._sampled else 0.0
            host = {p: self.total[p] + self.total_sampled[p] * scale for p in PARTS}
            if self.clock == CUDA and self.mode != HOST:
                return {p: host[p] if p == "data"
                        else self.device[p] + self.device_sampled[p] * scale for p in PARTS}
            self.clock = HOST
            return host

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
